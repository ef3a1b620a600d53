"""Indexing: advanced indexing and index_put, index_select, gather, scatter and its
reductions, masked_scatter, embedding backward, put; searching and counting
(searchsorted, bucketize, nonzero_static, repeat_interleave)."""

from __future__ import annotations

import math

import torch
from onnx import TensorProto
from torch.utils._sympy.functions import Max

from ..builder import TORCH_TO_ONNX, Value, sym_expr
from ..registry import lower, node_tensors
from .common import any_true, aten, arg_val, broadcast_shape, where, is_float, known_empty, may_be_empty, norm_dim, out_dtype, out_shape, same_shape

INDEX_DTYPES = (torch.int64, torch.int32)


def checked_index(g, node, index: Value, size, *, negative: bool, message: str, error: type = IndexError, wrap: bool = False) -> Value:
    """An index (as int64) for a dim of `size`, checked against aten's range: [0, size), or
    [-size, size) where aten takes negative indices (negative=True; wrap=True: returned as
    its place in [0, size)). aten raises for an index outside; ONNX's Gather and Scatter
    family take [-size, size) and fail the run beyond. On the CPU the call raises
    error(message) for an element outside (the runner reads the condition after the
    run; error: aten's exception type for it), and such elements are read as 0 so that ONNX Runtime's kernel runs: an unsigned
    comparison, a bool ReduceMax, a Where or Mod (4 or 5 nodes). On CUDA, where aten's
    out-of-range index is a device-side assert, the index goes as it is (a check there would
    need a device-to-host copy and a synchronization every call)."""
    index = g.cast(index, torch.int64)
    if any(t.device.type != "cpu" for t in node_tensors(node)) or known_empty(index.shape):
        return Value(_wrap_negative(g, index, size), torch.int64, index.shape) if negative and wrap else index
    static = isinstance(size, int)
    n = g.const(size, torch.int64) if static else g.sym(size)
    # index in [low, low + span) <=> index - low, as an unsigned number, is below span
    span = g.const(2 * size if negative else size, torch.int64) if static else (g.op("Add", n, n) if negative else n)
    shifted = g.op("Add", index, n) if negative else index  # (wrapping past INT64_MAX: then huge, outside)
    unsigned = lambda v: g.op("Cast", v, to=TensorProto.UINT64)  # noqa: E731
    outside = g.op("GreaterOrEqual", unsigned(shifted), unsigned(span))
    if g.opset >= 20 and not may_be_empty(index):  # (ONNX Runtime reduces bools from opset 20, not an empty set)
        g.fail_if(g.op("ReduceMax", outside, keepdims=0), message, error)
    else:
        g.fail_if(any_true(g, outside), message, error)
    if negative and static and size > 0:  # inside: index mod size is its place, as wrap wants
        return Value(g.op("Mod", shifted, n, fmod=0), torch.int64, index.shape)
    safe = Value(g.op("Where", outside, g.const(0, torch.int64), index), torch.int64, index.shape)
    return Value(_wrap_negative(g, safe, size), torch.int64, index.shape) if negative and wrap else safe


def out_of_bounds(dim: int, size) -> str:
    """aten's message for an index outside a dim (without the index: the check sees them all)."""
    return f"index out of bounds for dimension {dim} with size {size}"


OUT_OF_RANGE = "index out of range in self"  # aten's for embedding, index_select, index_reduce
# (by name: the op a node's meta names as its origin need not be the same object)
NLL_LOSSES = ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")


def _wrap_negative(g, index: Value, size) -> str:
    """aten accepts index -k for size - k; GatherND/ScatterND take only what is in range."""
    index = g.cast(index, torch.int64)
    return g.op("Where", g.op("Less", index, g.const(0, torch.int64)), g.op("Add", index, g.sym(size)), index)


def _index_check(node):
    indices = node.args[1]
    if not any(i is not None for i in indices):
        return "no index tensors"
    for i in indices:
        if i is not None and i.meta["val"].dtype not in INDEX_DTYPES:
            return f"{i.meta['val'].dtype} index (a mask)"
    if arg_val(node, 0).dim() == 0:
        return "indexing a 0-d tensor"
    return None


def _gather_layout(g, node, x: Value, indices):
    """Moves the indexed dims of x to the front (in order) and stacks the broadcast index
    tensors on a last axis: what GatherND / ScatterND take. Returns (moved x, stacked
    indices, perm, broadcast shape, positions of the indexed dims)."""
    positions = [d for d, i in enumerate(indices) if i is not None]
    perm = positions + [d for d in range(x.rank) if d not in positions]
    moved = g.op("Transpose", x, perm=perm) if perm != list(range(x.rank)) else x
    shape = broadcast_shape(*(indices[d].shape for d in positions))
    columns = []
    for d in positions:
        index = checked_index(g, node, indices[d], x.shape[d], negative=True, message=out_of_bounds(d, x.shape[d]), wrap=True)
        index = g.expand(Value(index, torch.int64, indices[d].shape), shape) if not same_shape(indices[d].shape, shape) else index
        columns.append(g.op("Unsqueeze", index, g.ints([len(shape)])))
    stacked = g.op("Concat", *columns, axis=-1) if len(columns) > 1 else columns[0]
    return moved, stacked, perm, shape, positions


def _result_perm(rank_b: int, positions: list[int], x_rank: int) -> list[int] | None:
    """aten puts the broadcast index dims where the first indexed dim was when the indexed
    dims are adjacent, else first. GatherND's result has them first: the permutation to
    aten's layout, or None when it is already that."""
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    if not adjacent or positions[0] == 0:
        return None
    before = positions[0]
    rest = x_rank - len(positions)
    # GatherND layout: [B..., before..., after...] -> [before..., B..., after...]
    return list(range(rank_b, rank_b + before)) + list(range(rank_b)) + list(range(rank_b + before, rank_b + rest))


@lower(aten.index.Tensor, check=_index_check)
def index(g, node, x, indices):
    indices = list(indices) + [None] * (x.rank - len(indices))
    positions = [d for d, i in enumerate(indices) if i is not None]
    if len(positions) == 1:
        (d,) = positions
        index = checked_index(g, node, indices[d], x.shape[d], negative=True, message=out_of_bounds(d, x.shape[d]))
        return g.op("Gather", x, index, axis=d)  # Gather takes negative indices
    moved, stacked, perm, shape, positions = _gather_layout(g, node, x, indices)
    result = g.op("GatherND", moved, stacked)
    back = _result_perm(len(shape), positions, x.rank)
    return g.op("Transpose", result, perm=back) if back else result


def _mask_put(node):
    """For index_put with one bool mask: (position, mask rank) when the values do not
    depend on how many elements the mask selects; else None."""
    indices = node.args[1]
    masks = [(d, i.meta["val"]) for d, i in enumerate(indices) if i is not None]
    if len(masks) != 1 or masks[0][1].dtype not in (torch.bool, torch.uint8):
        return None
    (position, mask), x, values = masks[0], arg_val(node, 0), arg_val(node, 2)
    rest = x.dim() - position - mask.dim()
    selected_axis = values.dim() - rest - 1  # the values axis that lines up with the selected elements
    if selected_axis >= 0 and values.shape[selected_axis] != 1:
        return None
    return position, mask.dim()


def _index_put_check(node):
    indices = [i for i in node.args[1] if i is not None]
    if any(i.meta["val"].dtype in (torch.bool, torch.uint8) for i in indices):
        return None if _mask_put(node) else "mask index whose values depend on the number of selected elements"
    return _index_check(node)


@lower(aten.index_put.default, check=_index_put_check)
def index_put(g, node, x, indices, values, accumulate=False):
    mask_put = _mask_put(node)
    if mask_put:
        return _mask_index_put(g, node, x, indices, values, accumulate, *mask_put)
    indices = list(indices) + [None] * (x.rank - len(indices))
    moved, stacked, perm, shape, positions = _gather_layout(g, node, x, indices)
    # values broadcast to x[indices] (aten's layout), then into GatherND's layout
    rest = [x.shape[d] for d in perm[len(positions):]]
    back = _result_perm(len(shape), positions, x.rank)
    if back:
        before = positions[0]
        target = rest[:before] + list(shape) + rest[before:]
    else:
        target = list(shape) + rest
    updates = g.op("Expand", g.cast(values, x.dtype), g.ints(target))
    if back:
        inverse = [back.index(i) for i in range(len(back))]
        updates = g.op("Transpose", updates, perm=inverse)
    if accumulate and x.dtype == torch.bool:  # adding bools is "or": count, then nonzero
        moved = g.op("Cast", moved, to=TORCH_TO_ONNX[torch.int32])
        updates = g.op("Cast", updates, to=TORCH_TO_ONNX[torch.int32])
    result = g.op("ScatterND", moved, stacked, updates, reduction="add" if accumulate else None)
    if accumulate and x.dtype == torch.bool:
        result = g.op("Cast", result, to=TORCH_TO_ONNX[torch.bool])
    if perm != list(range(x.rank)):
        result = g.op("Transpose", result, perm=[perm.index(i) for i in range(x.rank)])
    return result


def _mask_index_put(g, node, x, indices, values, accumulate, position, mask_rank):
    mask = [i for i in indices if i is not None][0]
    rest = x.rank - position - mask_rank
    # values in x's layout: the axis facing the selected elements becomes mask_rank ones
    v_shape = list(values.shape)
    keep = v_shape[max(0, len(v_shape) - rest):] if rest else []
    lead = v_shape[: max(0, len(v_shape) - rest - 1)]
    layout = lead + [1] * mask_rank + keep
    values = g.cast(values, x.dtype)
    if layout != v_shape:
        values = g.op("Reshape", values, g.ints(layout))
    mask = g.op("Reshape", g.cast(mask, torch.bool), g.ints([1] * position + list(mask.shape) + [1] * rest))
    if accumulate:
        if x.dtype == torch.bool:
            return g.op("Or", x, g.op("And", mask, values))
        added = g.op("Add", x, g.op("Expand", values, g.ints(x.shape)))
        return where(g, mask, added, x, x.dtype)
    return where(g, mask, g.op("Expand", values, g.ints(x.shape)), x, x.dtype)


def _as_1d(g, x: Value) -> Value:
    """aten treats a 0-d tensor like a 1-element 1-d one in gather/scatter/index_select."""
    return Value(g.op("Reshape", x, g.ints([1])), x.dtype, (1,)) if x.rank == 0 else x


@lower(aten.index_select.default)
def index_select(g, node, x, dim, index):
    x1, axis = _as_1d(g, x), norm_dim(dim, max(x.rank, 1))
    if axis == 1:  # aten's CPU kernel for dim 1 raises another error (of its gather's)
        message, error = f"INDICES element is out of DATA bounds, axis_dim={x1.shape[axis]}", RuntimeError
    else:
        message, error = OUT_OF_RANGE, IndexError
    index = checked_index(g, node, _as_1d(g, index), x1.shape[axis], negative=False, message=message, error=error)
    result = g.op("Gather", x1, index, axis=axis)
    return g.op("Reshape", result, g.ints(out_shape(node))) if x.rank == 0 else result


def _gather_check(node):
    x, index = arg_val(node, 0), arg_val(node, 2)
    if max(index.dim(), 1) != max(x.dim(), 1) and index.numel() != 0:
        return "index of another rank"
    return None


@lower(aten.gather.default, check=_gather_check)
def gather(g, node, x, dim, index, sparse_grad=False):
    if any(isinstance(d, int) and d == 0 for d in index.shape):
        return g.op("Expand", g.const(0, x.dtype), g.shape(index.shape))
    x1, axis = _as_1d(g, x), norm_dim(dim, max(x.rank, 1))
    if str(node.meta.get("original_aten")) in NLL_LOSSES:  # a loss's decomposition: aten's error is the loss's
        message, error = "Target is out of bounds.", IndexError
    else:
        message, error = out_of_bounds(axis, x1.shape[axis]), RuntimeError
    checked = checked_index(g, node, _as_1d(g, index), x1.shape[axis], negative=False, message=message, error=error)
    result = g.op("GatherElements", x1, checked, axis=axis)
    return g.op("Reshape", result, g.shape(out_shape(node))) if index.rank == 0 else result


# -- scatter ---------------------------------------------------------------------------

# aten scatter reductions -> ONNX ScatterElements reduction, and the identity element
REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _scatter_check(node):
    x, index = arg_val(node, 0), arg_val(node, 2)
    if max(index.dim(), 1) != max(x.dim(), 1):
        return "index of another rank"
    reduce = _reduce_arg(node)
    if reduce is not None and reduce not in REDUCTIONS and reduce != "mean":
        return f"reduce={reduce!r}"
    if reduce == "mean" and x.dtype == torch.bool:
        return "scatter mean on bool"
    return None


def _reduce_arg(node):
    if node.target is aten.scatter_add.default:
        return "sum"
    if node.target in (aten.scatter_reduce.two, aten.scatter.reduce, aten.scatter.value_reduce, aten.index_reduce.default):
        return node.args[4] if len(node.args) > 4 else node.kwargs["reduce"]
    return None


def _updates(g, src, index: Value, dtype):
    """src as ScatterElements updates: index's shape (aten reads only that corner of src)."""
    if not isinstance(src, Value):
        return g.op("Expand", g.const(src, dtype), g.ints(index.shape))
    src = g.cast(src, dtype)
    if tuple(src.shape) != tuple(index.shape):
        src = g.op("Slice", src, g.ints([0] * index.rank), g.ints(index.shape), g.ints(range(index.rank)))
    return src


def _identity(dtype, reduce):
    if reduce in ("sum", "add", "mean"):
        return 0
    if reduce in ("prod", "multiply"):
        return 1
    info = torch.finfo(dtype) if is_float(dtype) else torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@lower(
    aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
    aten.scatter_add.default, aten.scatter_reduce.two, check=_scatter_check,
)  # fmt: skip
def scatter(g, node, x, dim, index, src, reduce=None, *, include_self=True):
    if 0 in index.shape:
        return g.op("Identity", x)
    x1 = _as_1d(g, x)
    axis = norm_dim(dim, x1.rank)
    index = checked_index(g, node, _as_1d(g, index), x1.shape[axis], negative=False, message=out_of_bounds(axis, x1.shape[axis]), error=RuntimeError)
    src = _as_1d(g, src) if isinstance(src, Value) else src
    result = _scatter_elements(g, x1, axis, index, _updates(g, src, index, x.dtype), _reduce_arg(node), include_self)
    return g.op("Reshape", result, g.ints([])) if x.rank == 0 else result


def _scatter_elements(g, x: Value, dim: int, index: Value, updates: str, reduce, include_self: bool) -> str:
    """aten's scatter / scatter_reduce with ONNX ScatterElements."""
    if reduce is None:
        return g.op("ScatterElements", x, index, updates, axis=dim)
    if x.dtype == torch.bool:  # sum/amax are "any", prod/amin "all": reduce 0/1 as int32
        as_int = lambda v: g.op("Cast", v, to=TORCH_TO_ONNX[torch.int32])  # noqa: E731
        reduced = _scatter_elements(g, Value(as_int(x), torch.int32, x.shape), dim, index, as_int(updates), reduce, include_self)
        return g.op("Cast", reduced, to=TORCH_TO_ONNX[torch.bool])
    fill_like_index = lambda value: g.op("Expand", g.const(value, x.dtype), g.ints(index.shape))  # noqa: E731
    base = x
    if not include_self:  # reduce over src alone where index points
        base = g.op("ScatterElements", x, index, fill_like_index(_identity(x.dtype, reduce)), axis=dim)
    if reduce == "mean":
        total = g.op("ScatterElements", base, index, updates, axis=dim, reduction="add")
        counts = g.op("Expand", g.const(1, x.dtype), g.ints(x.shape))
        if not include_self:
            counts = g.op("ScatterElements", counts, index, fill_like_index(0), axis=dim)
        counts = g.op("ScatterElements", counts, index, fill_like_index(1), axis=dim, reduction="add")
        if is_float(x.dtype):
            return g.op("Div", total, counts)
        # integer means round down; counts are >= 1 so this Div cannot be by zero
        return g.op("Div", g.op("Sub", total, g.op("Mod", total, counts, fmod=0)), counts)
    result = g.op("ScatterElements", base, index, updates, axis=dim, reduction=REDUCTIONS[reduce])
    if reduce in ("amax", "amin") and is_float(x.dtype):
        # aten's max/min propagate NaN from src (and self); ONNX Runtime's do not
        nan_src = g.op("Cast", g.op("IsNaN", updates), to=TORCH_TO_ONNX[x.dtype])
        zeros = g.op("Expand", g.const(0, x.dtype), g.ints(x.shape))
        hit = g.op("Greater", g.op("ScatterElements", zeros, index, nan_src, axis=dim, reduction="max"), g.const(0, x.dtype))
        if include_self:
            hit = g.op("Or", hit, g.op("IsNaN", x))
        result = g.op("Where", hit, g.const(float("nan"), x.dtype), result)
    return result


def _index_reduce_check(node):
    x = arg_val(node, 0)
    reduce = _reduce_arg(node)
    if reduce not in ("prod", "mean", "amax", "amin"):
        return f"reduce={reduce!r}"
    if x.dtype == torch.bool:
        return "index_reduce on bool"
    return None


@lower(aten.index_reduce.default, check=_index_reduce_check)
def index_reduce(g, node, x, dim, index, source, reduce, *, include_self=True):
    # index picks whole slices along dim: scatter with the index spread over source's shape
    if 0 in source.shape:
        return g.op("Identity", x)
    if x.rank == 0:
        result = index_reduce(g, node, _as_1d(g, x), dim, index, _as_1d(g, source), reduce, include_self=include_self)
        return g.op("Reshape", result, g.ints([]))
    dim = norm_dim(dim, x.rank)
    index = checked_index(g, node, index, x.shape[dim], negative=False, message=OUT_OF_RANGE)
    return _scatter_elements(g, x, dim, _spread_index(g, index, source, dim), g.cast(source, x.dtype), reduce, include_self)


def _spread_index(g, index: Value, source: Value, dim: int) -> Value:
    """An index of whole slices along dim, spread over source's shape (ScatterElements')."""
    shape = [1] * source.rank
    shape[dim] = source.shape[dim]
    return Value(g.op("Expand", g.op("Reshape", index, g.ints(shape)), g.ints(source.shape)), torch.int64, source.shape)


def _index_add_check(node):
    x, index, source = arg_val(node, 0), arg_val(node, 2), arg_val(node, 3)
    alpha = node.kwargs.get("alpha", 1)
    if max(x.dim(), 1) != max(source.dim(), 1) or index.dim() > 1:
        return "index_add of a source of another rank"
    if x.dtype == torch.bool and alpha != 1:
        return "index_add of bools with alpha"
    return None


@lower(aten.index_add.default, check=_index_add_check)
def index_add(g, node, x, dim, index, source, *, alpha=1):
    """aten's index_add takes indices in [0, n) only (its decomposition into index_put
    would take [-n, n))."""
    if x.rank == 0 or source.rank == 0:
        result = index_add(g, node, _as_1d(g, x), 0, index, _as_1d(g, source), alpha=alpha)
        return g.op("Reshape", result, g.ints(out_shape(node)))
    dim = norm_dim(dim, x.rank)
    if index.dtype == torch.int32:  # aten's kernel checks int32 indices elsewhere, with another error
        message, error = OUT_OF_RANGE, IndexError
    else:
        message, error = out_of_bounds(dim, x.shape[dim]), RuntimeError
    index = checked_index(g, node, _as_1d(g, index), x.shape[dim], negative=False, message=message, error=error)
    if known_empty(source.shape):
        return g.op("Identity", x)
    updates = g.cast(source, x.dtype)
    if alpha != 1:
        updates = Value(g.op("Mul", updates, g.const(alpha, x.dtype)), x.dtype, source.shape)
    return _scatter_elements(g, x, dim, _spread_index(g, index, source, dim), updates, "sum", True)


def _index_fill_check(node):
    index, value = arg_val(node, 2), arg_val(node, 3)
    if index.dtype != torch.int64:
        return f"index_fill with a {index.dtype} index (aten raises)"
    if index.dim() > 1:
        return "index_fill with an index of rank > 1"
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        return "index_fill with a value that is not 0-d"
    return None


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, check=_index_fill_check)
def index_fill(g, node, x, dim, index, value):
    """aten's index_fill takes indices in [-n, n) (its decomposition goes through
    index_copy, which takes [0, n))."""
    if x.rank == 0:
        result = index_fill(g, node, _as_1d(g, x), 0, index, value)
        return g.op("Reshape", result, g.ints([]))
    dim = norm_dim(dim, x.rank)
    index = _as_1d(g, index)
    shape = list(x.shape)
    shape[dim] = index.shape[0]
    index = checked_index(g, node, index, x.shape[dim], negative=True, message=out_of_bounds(dim, x.shape[dim]), wrap=True)
    if known_empty(shape):
        return g.op("Identity", x)
    fill = g.op("Expand", g.cast(value, x.dtype) if isinstance(value, Value) else g.const(value, x.dtype), g.shape(shape))
    spread = _spread_index(g, index, Value(fill, x.dtype, shape), dim)
    return g.op("ScatterElements", x, spread, fill, axis=dim)


def _index_copy_check(node):
    x, index, source = arg_val(node, 0), arg_val(node, 2), arg_val(node, 3)
    if index.dtype != torch.int64:
        return f"index_copy with a {index.dtype} index (aten raises)"
    if max(x.dim(), 1) != max(source.dim(), 1) or index.dim() > 1:
        return "index_copy of a source of another rank"
    return None


@lower(aten.index_copy.default, check=_index_copy_check)
def index_copy(g, node, x, dim, index, source):
    """aten's index_copy takes indices in [0, n) only (its decomposition into index_put
    would take [-n, n)). Repeated indices: the last copy wins (aten leaves it unspecified)."""
    if x.rank == 0 or source.rank == 0:
        result = index_copy(g, node, _as_1d(g, x), 0, index, _as_1d(g, source))
        return g.op("Reshape", result, g.ints(out_shape(node)))
    dim = norm_dim(dim, x.rank)
    index = checked_index(g, node, _as_1d(g, index), x.shape[dim], negative=False, message="index_copy_(): " + out_of_bounds(dim, x.shape[dim]))
    if known_empty(source.shape):
        return g.op("Identity", x)
    return g.op("ScatterElements", x, _spread_index(g, index, source, dim), g.cast(source, x.dtype), axis=dim)


def _masked_scatter_check(node):
    if arg_val(node, 2).numel() == 0:
        return "empty source"
    return None


@lower(aten.masked_scatter.default, check=_masked_scatter_check)
def masked_scatter(g, node, x, mask, source):
    shape = out_shape(node)
    n = 1
    for d in shape:
        n *= d
    mask_flat = g.op("Reshape", g.op("Expand", g.cast(mask, torch.bool), g.ints(shape)), g.ints([n]))
    # the k-th True of the mask takes source's k-th element
    position = g.op("Sub", g.op("CumSum", g.cast(Value(mask_flat, torch.bool, (n,)), torch.int64), g.const(0, torch.int64)), g.const(1, torch.int64))
    position = g.op("Max", position, g.const(0, torch.int64))
    taken = g.op("Gather", g.op("Reshape", g.cast(source, x.dtype), g.ints([-1])), position, axis=0)
    x_flat = g.op("Reshape", g.op("Expand", x, g.ints(shape)), g.ints([n]))
    return g.op("Reshape", where(g, mask_flat, taken, x_flat, x.dtype), g.ints(shape))


def _embedding_backward_check(node):
    scale_grad_by_freq = node.args[4] if len(node.args) > 4 else node.kwargs.get("scale_grad_by_freq", False)
    return "scale_grad_by_freq" if scale_grad_by_freq else None


@lower(aten.embedding_dense_backward.default, check=_embedding_backward_check)
def embedding_dense_backward(g, node, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad.shape[-1]
    rows = g.op("Reshape", grad, g.ints([-1, dim]))
    index = g.op("Reshape", g.cast(indices, torch.int64), g.ints([-1, 1]))
    if padding_idx >= 0:  # the padding row gets no gradient
        rows = g.op("Where", g.op("Equal", index, g.const(padding_idx, torch.int64)), g.const(0, grad.dtype), rows)
    zeros = g.op("Expand", g.const(0, grad.dtype), g.ints([num_weights, dim]))
    return g.op("ScatterND", zeros, index, rows, reduction="add")


def _renorm_check(node):
    weight = arg_val(node, 0)
    return None if is_float(weight.dtype) and weight.dim() == 2 else "embedding_renorm of a non-float or non-2-d weight"


@lower(aten.embedding_renorm.default, check=_renorm_check)
def embedding_renorm(g, node, weight, indices, max_norm, norm_type):
    """aten's embedding_renorm_: each row indices name (once, however often named) whose
    norm exceeds max_norm is scaled by max_norm / (norm + 1e-7), computed in double."""
    rows = weight.shape[0]
    flat = Value(g.op("Reshape", g.cast(indices, torch.int64), g.ints([-1])), torch.int64, (math.prod(indices.shape),))
    flat = checked_index(g, node, flat, rows, negative=False, message=OUT_OF_RANGE)
    named = g.op("ScatterElements", g.const(torch.zeros(rows)), flat, g.op("Expand", g.const(1.0), g.shape([math.prod(indices.shape)])), axis=0, reduction="max")
    magnitude = g.op("Abs", weight)
    axes = g.ints([1])
    if norm_type == 2:
        norm = g.op("ReduceL2", weight, axes, keepdims=1)
    elif norm_type == 1:
        norm = g.op("ReduceSum", magnitude, axes, keepdims=1)
    elif norm_type == math.inf:
        norm = g.op("ReduceMax", magnitude, axes, keepdims=1)
    else:
        p = g.const(float(norm_type), weight.dtype)
        norm = g.op("Pow", g.op("ReduceSum", g.op("Pow", magnitude, p), axes, keepdims=1), g.const(1 / float(norm_type), weight.dtype))
    norm = g.cast(Value(norm, weight.dtype, (rows, 1)), torch.float64)
    scale = g.cast(Value(g.op("Div", g.const(float(max_norm), torch.float64), g.op("Add", norm, g.const(1e-7, torch.float64))), torch.float64, (rows, 1)), weight.dtype)
    renorm = g.op("And", g.op("Greater", norm, g.const(float(max_norm), torch.float64)), g.op("Unsqueeze", g.op("Greater", named, g.const(0.0)), axes))
    return g.op("Where", renorm, g.op("Mul", weight, scale), weight)


# -- searching and counting ------------------------------------------------------------


def _histc_check(node):
    x = arg_val(node, 0)
    if x.dtype not in (torch.float32, torch.float64):
        return f"histc of {x.dtype}"
    low, high = (arg_val(node, i, name, 0) for i, name in ((2, "min"), (3, "max")))
    if low == high and x.device.type != "cpu":
        return "histc over the data's range on CUDA"  # its range errors are raised on the CPU
    return None


@lower(aten.histc.default, check=_histc_check)
def histc(g, node, x, bins=100, min=0, max=0):
    """aten's histc: bins over [min, max], or over the data's range when min == max
    (widened by 1 each way when that is one point; a NaN or inf in it raises, as aten);
    bin = trunc((x - left) * bins / (right - left)) in x's dtype, the right edge in the last
    bin, values outside and NaN skipped."""
    dtype = x.dtype
    flat = g.op("Reshape", x, g.ints([-1]))
    if min != max:
        left, right = g.const(min, dtype), g.const(max, dtype)
    elif math.prod(x.shape) == 0:
        left, right = g.const(min - 1, dtype), g.const(max + 1, dtype)
    else:
        low, high = g.op("ReduceMin", flat, keepdims=0), g.op("ReduceMax", flat, keepdims=0)
        g.fail_if(any_true(g, g.op("Or", g.op("IsNaN", flat), g.op("IsInf", flat))), "torch.histc: range of the input is not finite")
        one_point = g.op("Equal", low, high)
        left = g.op("Where", one_point, g.op("Sub", low, g.const(1, dtype)), low)
        right = g.op("Where", one_point, g.op("Add", high, g.const(1, dtype)), high)
    inside = g.op("And", g.op("GreaterOrEqual", flat, left), g.op("LessOrEqual", flat, right))
    scaled = g.op("Div", g.op("Mul", g.op("Sub", flat, left), g.const(bins, dtype)), g.op("Sub", right, left))
    position = g.op("Cast", scaled, to=TORCH_TO_ONNX[torch.int64])  # clipped: an inf range gives NaN here, then raises
    position = g.op("Min", g.op("Max", position, g.const(0, torch.int64)), g.const(bins - 1, torch.int64))
    position = g.op("Where", inside, position, g.const(0, torch.int64))
    counts = g.op("Cast", inside, to=TORCH_TO_ONNX[dtype])
    return g.op("ScatterElements", g.op("Expand", g.const(0, dtype), g.ints([bins])), position, counts, axis=0, reduction="add")


def _searchsorted_check(node):
    seq = arg_val(node, 0) if node.target in (aten.searchsorted.Tensor, aten.searchsorted.Scalar) else arg_val(node, 1)
    if seq.dim() == 0:
        return "0-d boundaries"
    values = arg_val(node, 1) if node.target in (aten.searchsorted.Tensor, aten.searchsorted.Scalar) else arg_val(node, 0)
    if seq.dim() > 1 and (not isinstance(values, torch.Tensor) or tuple(values.shape[:-1]) != tuple(seq.shape[:-1])):
        return "batched boundaries whose leading dims differ from the values'"
    return None


def _binary_search(g, node, seq: Value, values, right: bool, out_int32: bool):
    """aten's cus_lower_bound / cus_upper_bound, its loop unrolled: the same answer for any
    input, sorted or not, NaN included."""
    n = seq.shape[-1]
    shape = out_shape(node)
    dtype = torch.promote_types(seq.dtype, values.dtype) if isinstance(values, Value) else seq.dtype
    seq = g.cast(seq, dtype)
    values = g.cast(values, dtype) if isinstance(values, Value) else g.const(values, dtype)
    if seq.rank == 1:  # one sequence for every value: search a flat list of them
        flat = g.op("Reshape", values, g.ints([-1]))
        count = math.prod(shape)
    else:
        flat, count = values, None
    index_shape = [count] if seq.rank == 1 else list(shape)
    start = g.op("Expand", g.const(0, torch.int64), g.ints(index_shape))
    end = g.op("Expand", g.sym(n), g.ints(index_shape))
    last = g.sym(Max(sym_expr(n) - 1, 0))

    def step(b, start, end):
        active = b.op("Less", start, end)
        mid = b.op("Add", start, b.op("Div", b.op("Sub", end, start), b.const(2, torch.int64)))
        at = b.op("Min", mid, last)
        mid_val = b.op("Gather", seq, at, axis=0) if seq.rank == 1 else b.op("GatherElements", seq, at, axis=-1)
        keeps_going = b.op("Not", b.op("Greater" if right else "GreaterOrEqual", mid_val, flat))
        go_right = b.op("And", active, keeps_going)
        go_left = b.op("And", active, b.op("Not", keeps_going))
        start = b.op("Where", go_right, b.op("Add", mid, b.const(1, torch.int64)), start)
        return start, b.op("Where", go_left, mid, end)

    if isinstance(n, int):  # unrolled: bit_length(n) halvings reach every answer
        for _ in range(max(n, 1).bit_length()):
            start, end = step(g, start, end)
    else:  # halve until no search is open

        def body(b, i, start, end):
            start, end = step(b, start, end)
            return [any_true(b, b.op("Less", start, end)), Value(start, torch.int64, ()), Value(end, torch.int64, ())]

        carried = [Value(start, torch.int64, ()), Value(end, torch.int64, ())]
        start, _ = g.loop(None, any_true(g, g.op("Less", start, end)), carried, body)
    result = g.op("Reshape", start, g.ints(shape)) if seq.rank == 1 else start
    return g.op("Cast", result, to=TORCH_TO_ONNX[torch.int32]) if out_int32 else result


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar, check=_searchsorted_check)
def searchsorted(g, node, seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    if known_empty(out_shape(node)) or known_empty(seq.shape[-1:]):
        return g.op("Expand", g.const(0, out_dtype(node)), g.ints(out_shape(node)))
    if sorter is not None:  # aten reads the sequence through sorter
        sorter = checked_index(g, node, sorter, seq.shape[-1], negative=False, message="torch.searchsorted(): sorter index out of range", error=RuntimeError)
        seq = Value(g.op("GatherElements", seq, sorter, axis=-1), seq.dtype, seq.shape)
    return _binary_search(g, node, seq, values, right or side == "right", out_int32)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar, check=_searchsorted_check)
def bucketize(g, node, values, boundaries, *, out_int32=False, right=False):
    if known_empty(out_shape(node)) or known_empty(boundaries.shape[-1:]):
        return g.op("Expand", g.const(0, out_dtype(node)), g.ints(out_shape(node)))
    return _binary_search(g, node, boundaries, values, right, out_int32)


def _put_check(node):
    index = arg_val(node, 1)
    return None if index.dtype == torch.int64 else f"put with a {index.dtype} index (aten raises)"


@lower(aten.put.default, check=_put_check)
def put(g, node, x, index, source, accumulate=False):
    n = math.prod(x.shape)
    if math.prod(index.shape) == 0:
        return g.op("Identity", x)
    flat_index = Value(g.op("Reshape", index, g.ints([-1])), index.dtype, (math.prod(index.shape),))
    message = f"out of range: tried to access an index outside a tensor of {n} elements"
    flat_index = checked_index(g, node, flat_index, n, negative=True, message=message, wrap=True)
    flat = g.op("Reshape", x, g.ints([n]))  # a 0-d x too
    updates = g.op("Reshape", g.cast(source, x.dtype), g.ints([-1]))
    if accumulate and x.dtype == torch.bool:  # adding bools is "or": count, then nonzero
        flat, updates = (g.op("Cast", v, to=TORCH_TO_ONNX[torch.int32]) for v in (flat, updates))
    written = g.op("ScatterElements", flat, flat_index, updates, axis=0, reduction="add" if accumulate else None)
    if accumulate and x.dtype == torch.bool:
        written = g.op("Cast", written, to=TORCH_TO_ONNX[torch.bool])
    return g.op("Reshape", written, g.ints(x.shape))


@lower(aten.nonzero_static.default)
def nonzero_static(g, node, x, *, size, fill_value=-1):
    # the k-th nonzero's flat position is the count of positions whose running count of
    # nonzeros is still <= k
    n = math.prod(x.shape)
    shape = out_shape(node)
    size = arg_val(node, 1, "size")  # a SymInt where symbolic
    if known_empty(shape):
        return g.op("Expand", g.const(0, torch.int64), g.ints(shape))
    if isinstance(n, int) and n == 0:
        return g.op("Expand", g.const(fill_value, torch.int64), g.ints(shape))
    mask = g.op("Cast", g.op("Reshape", g.cast(x, torch.bool), g.shape([1, n])), to=TORCH_TO_ONNX[torch.int64])
    running = g.op("CumSum", mask, g.const(1, torch.int64))
    k = g.op("Unsqueeze", g.arange(size), g.ints([1]))
    flat = g.op("ReduceSum", g.op("Cast", g.op("LessOrEqual", running, k), to=TORCH_TO_ONNX[torch.int64]), g.ints([1]), keepdims=1)
    strides = [math.prod(x.shape[d + 1 :]) for d in range(x.rank)]
    # the divisors are sizes: 0 only when x is empty, and then no row reads them
    sizes = g.op("Max", g.shape(x.shape), g.const(1, torch.int64))
    coords = g.op("Mod", g.op("Div", flat, g.op("Max", g.shape(strides), g.const(1, torch.int64))), sizes, fmod=0)
    total = g.op("ReduceSum", mask, keepdims=0)
    valid = g.op("Less", k, total)
    return g.op("Where", valid, coords, g.const(fill_value, torch.int64))


def _repeat_interleave_check(node):
    repeats = arg_val(node, 0)
    return None if repeats.dim() == 1 else "repeats of rank other than 1"


@lower(aten.repeat_interleave.Tensor, check=_repeat_interleave_check)
def repeat_interleave(g, node, repeats, *, output_size=None):
    # output j holds the i whose repeats end after j: the count of running ends <= j
    length = out_shape(node)[0]
    if known_empty([length]):
        return g.op("Expand", g.const(0, out_dtype(node)), g.ints([0]))
    ends = g.op("CumSum", g.op("Reshape", g.cast(repeats, torch.int64), g.ints([1, -1])), g.const(1, torch.int64))
    if isinstance(length, int):
        j = g.const(torch.arange(length, dtype=torch.int64).view(length, 1))
    else:
        j = g.op("Unsqueeze", g.arange(length), g.ints([1]))
    counts = g.op("ReduceSum", g.op("Cast", g.op("LessOrEqual", ends, j), to=TORCH_TO_ONNX[torch.int64]), g.ints([1]), keepdims=0)
    return g.cast(Value(counts, torch.int64, (length,)), out_dtype(node))
