"""Indexing: advanced indexing and index_put, index_select, gather, scatter and its
reductions, masked_scatter, embedding backward."""

from __future__ import annotations

import torch

from ..builder import Value
from ..registry import lower
from .common import aten, arg_val, where, is_float, norm_dim, out_dtype, out_shape

INDEX_DTYPES = (torch.int64, torch.int32)


def _wrap_negative(g, index: Value, size: int) -> str:
    """aten accepts index -k for size - k; GatherND/ScatterND take only what is in range."""
    index = g.cast(index, torch.int64)
    return g.op("Where", g.op("Less", index, g.const(0, torch.int64)), g.op("Add", index, g.const(size, torch.int64)), index)


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


def _gather_layout(g, x: Value, indices):
    """Moves the indexed dims of x to the front (in order) and stacks the broadcast index
    tensors on a last axis: what GatherND / ScatterND take. Returns (moved x, stacked
    indices, perm, broadcast shape, positions of the indexed dims)."""
    positions = [d for d, i in enumerate(indices) if i is not None]
    perm = positions + [d for d in range(x.rank) if d not in positions]
    moved = g.op("Transpose", x, perm=perm) if perm != list(range(x.rank)) else x
    shape = tuple(torch.broadcast_shapes(*(indices[d].shape for d in positions)))
    columns = []
    for d in positions:
        index = _wrap_negative(g, indices[d], x.shape[d])
        index = g.op("Expand", index, g.ints(shape)) if tuple(indices[d].shape) != shape else index
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
        return g.op("Gather", x, g.cast(indices[d], torch.int64), axis=d)  # Gather takes negative indices
    moved, stacked, perm, shape, positions = _gather_layout(g, x, indices)
    result = g.op("GatherND", moved, stacked)
    back = _result_perm(len(shape), positions, x.rank)
    return g.op("Transpose", result, perm=back) if back else result


def _index_put_check(node):
    reason = _index_check(node)
    if reason:
        return reason
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if accumulate and out_dtype(node) == torch.bool:
        return "accumulate into bool"
    return None


@lower(aten.index_put.default, check=_index_put_check)
def index_put(g, node, x, indices, values, accumulate=False):
    indices = list(indices) + [None] * (x.rank - len(indices))
    moved, stacked, perm, shape, positions = _gather_layout(g, x, indices)
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
    result = g.op("ScatterND", moved, stacked, updates, reduction="add" if accumulate else None)
    if perm != list(range(x.rank)):
        result = g.op("Transpose", result, perm=[perm.index(i) for i in range(x.rank)])
    return result


def _rank_check(node):
    return "0-d input" if arg_val(node, 0).dim() == 0 else None


@lower(aten.index_select.default, check=_rank_check)
def index_select(g, node, x, dim, index):
    index = g.op("Reshape", g.cast(index, torch.int64), g.ints([-1])) if index.rank == 0 else g.cast(index, torch.int64)
    return g.op("Gather", x, index, axis=norm_dim(dim, x.rank))


def _gather_check(node):
    x, index = arg_val(node, 0), arg_val(node, 2)
    if x.dim() == 0 or index.dim() != x.dim():
        return "0-d input or index of another rank"
    return None


@lower(aten.gather.default, check=_gather_check, symbolic=True)
def gather(g, node, x, dim, index, sparse_grad=False):
    dim = norm_dim(dim, x.rank)
    if any(isinstance(d, int) and d == 0 for d in index.shape):
        return g.op("Expand", g.const(0, x.dtype), g.shape(index.shape))
    return g.op("GatherElements", x, g.cast(index, torch.int64), axis=dim)


# -- scatter ---------------------------------------------------------------------------

# aten scatter reductions -> ONNX ScatterElements reduction, and the identity element
REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _scatter_check(node):
    x, index = arg_val(node, 0), arg_val(node, 2)
    if x.dim() == 0 or index.dim() != x.dim():
        return "0-d input or index of another rank"
    reduce = _reduce_arg(node)
    if reduce is not None and reduce not in REDUCTIONS and reduce != "mean":
        return f"reduce={reduce!r}"
    if reduce == "mean" and not is_float(x.dtype):
        return "integer scatter mean"
    if reduce in ("amax", "amin") and is_float(x.dtype):
        return "scatter amax/amin of floats (ONNX Runtime does not propagate NaN)"
    if reduce is not None and x.dtype == torch.bool:
        return "scatter reduction on bool"
    return None


def _reduce_arg(node):
    if node.target is aten.scatter_add.default:
        return "sum"
    if node.target is aten.scatter_reduce.two:
        return node.args[4] if len(node.args) > 4 else node.kwargs["reduce"]
    if node.target in (aten.scatter.reduce, aten.scatter.value_reduce):
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
    dim = norm_dim(dim, x.rank)
    reduce = _reduce_arg(node)
    if 0 in index.shape:
        return g.op("Identity", x)
    index = g.cast(index, torch.int64)
    updates = _updates(g, src, index, x.dtype)
    if reduce is None:
        return g.op("ScatterElements", x, index, updates, axis=dim)
    base = x
    if not include_self:  # reduce over src alone where index points
        fill = g.op("Expand", g.const(_identity(x.dtype, reduce), x.dtype), g.ints(index.shape))
        base = g.op("ScatterElements", x, index, fill, axis=dim)
    if reduce == "mean":
        total = g.op("ScatterElements", base, index, updates, axis=dim, reduction="add")
        ones = g.op("Expand", g.const(1, x.dtype), g.ints(x.shape))
        counts = ones
        if not include_self:
            counts = g.op("ScatterElements", ones, index, g.op("Expand", g.const(0, x.dtype), g.ints(index.shape)), axis=dim)
        counts = g.op("ScatterElements", counts, index, g.op("Expand", g.const(1, x.dtype), g.ints(index.shape)), axis=dim, reduction="add")
        return g.op("Div", total, counts)
    return g.op("ScatterElements", base, index, updates, axis=dim, reduction=REDUCTIONS[reduce])


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
