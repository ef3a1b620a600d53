"""Shape and view ops, copies and dtype conversion. Views become copies: the graphs
aot_autograd hands over are functional, so no caller can observe the difference."""

from __future__ import annotations

import math

import torch

from torch.utils._sympy.functions import Max

from ..builder import SymbolicShapeError, Value, sym_expr
from ..registry import lower, meta
from .common import arg_val, aten, fills_its_storage, has_contiguous_strides, is_static, may_be_zero, norm_dim, out_dtype, out_shape

INT64_MAX = 2**63 - 1


def reshape_to(g, x, shape):
    constant = _constant_reshape(x.shape, shape) if isinstance(x, Value) else None  # (a bare name: shape unknown)
    if constant is not None:  # no shape arithmetic in the graph for ONNX Runtime to run per call
        return g.op("Reshape", x, g.ints(constant))
    # allowzero: a 0 in the target shape means an empty dim, not "copy the input's dim"
    try:
        return g.op("Reshape", x, g.shape(shape), allowzero=1)
    except SymbolicShapeError:
        return g.op("Reshape", x, _inferring_one(g, shape), allowzero=1)


def _inferring_one(g, shape) -> Value:
    """A Reshape target where one size cannot be computed in ONNX (s0 // s1 with s1 an int
    argument whose sign ShapeEnv does not know): -1 there, which Reshape infers from the
    element count, exactly as aten inferred it. Where the other sizes multiply to 0 ONNX
    Runtime refuses at run time, and the node goes to torch."""
    parts, unknown = [], 0
    for d in shape:
        try:
            parts.append(d if isinstance(d, int) else g.sym(d))
        except SymbolicShapeError:
            parts.append(-1)
            unknown += 1
    if unknown != 1:
        raise SymbolicShapeError(f"cannot compute the sizes {list(shape)} of a reshape in ONNX")
    return g.shape(parts)


def _constant_reshape(source, target) -> list[int] | None:
    """A constant ONNX Reshape target for symbolic sizes: 0 (copy the input's dim) where a
    target dim is the input's dim at that position, -1 for at most one other symbolic dim.
    None where that cannot express it, or where a size may be 0 (then 0 and -1 mislead)."""
    if is_static(target) or any(may_be_zero(d) for d in (*source, *target)):
        return None
    constant, inferred = [], 0
    for i, d in enumerate(target):
        if isinstance(d, int):
            constant.append(d)
        elif i < len(source) and sym_expr(source[i]) == sym_expr(d):
            constant.append(0)
        else:
            constant.append(-1)
            inferred += 1
    return constant if inferred <= 1 else None


@lower(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
)
def view(g, node, x, *_):
    return reshape_to(g, x, out_shape(node))


@lower(aten.unsqueeze.default)
def unsqueeze(g, node, x, dim):
    return g.op("Unsqueeze", x, g.ints([norm_dim(dim, x.rank + 1)]))


@lower(aten.permute.default)
def permute(g, node, x, dims):
    return g.op("Transpose", x, perm=[norm_dim(d, x.rank) for d in dims]) if x.rank else g.op("Identity", x)


@lower(aten.transpose.int)
def transpose(g, node, x, dim0, dim1):
    """Left by export's one-trace ATen (ortlite.aot); aot_autograd's table makes it a permute."""
    if x.rank < 2:
        return g.op("Identity", x)
    perm = list(range(x.rank))
    a, b = norm_dim(dim0, x.rank), norm_dim(dim1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return g.op("Transpose", x, perm=perm)


@lower(aten.t.default)
def t(g, node, x):
    return g.op("Transpose", x, perm=[1, 0]) if x.rank == 2 else g.op("Identity", x)


@lower(aten.expand.default)
def expand(g, node, x, *_):
    return g.expand(x, out_shape(node))


@lower(aten.cat.default)
def cat(g, node, tensors, dim=0):
    dtype, rank = out_dtype(node), len(out_shape(node))
    # aten skips legacy empty 1-D tensors when concatenating tensors of higher rank
    parts = [g.cast(t, dtype) for t in tensors if not (_is_legacy_empty(t) and rank != 1)]
    if not parts:
        return g.op("Identity", g.cast(tensors[0], dtype))
    axis = norm_dim(dim, rank)
    # parts of static size 0 along the axis add nothing (an empty KV cache's first update):
    # without them a single part is not copied by a Concat
    sized = [t for t in parts if not (isinstance(t.shape[axis], int) and t.shape[axis] == 0)]
    if len(sized) == 1:
        return g.op("Identity", sized[0])
    return g.op("Concat", *(sized or parts), axis=axis)


def _is_legacy_empty(t) -> bool:
    return len(t.shape) == 1 and isinstance(t.shape[0], int) and t.shape[0] == 0


def _static_step(node):
    step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
    return None if isinstance(step, int) else "symbolic slice step"


@lower(aten.slice.Tensor, check=_static_step)
def slice_(g, node, x, dim=0, start=None, end=None, step=1):
    if x.rank == 0:
        return g.op("Identity", x)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    return g.op("Slice", x, g.shape([start]), g.shape([end]), g.ints([norm_dim(dim, x.rank)]), g.ints([step]))


@lower(aten.select.int)
def select(g, node, x, dim, index):
    index = index if isinstance(index, str) else g.const(index, torch.int64)
    return g.op("Gather", x, index, axis=norm_dim(dim, x.rank))


@lower(aten.clone.default, aten.alias.default, aten.detach.default)
def clone(g, node, x, **_):
    return g.op("Identity", x)


def _to_copy_check(node):
    source = node.args[0].meta["val"]
    if node.meta["val"].device != source.device:
        return "device transfer"
    return None


@lower(aten._to_copy.default, check=_to_copy_check)
def to_copy(g, node, x, **_):
    return g.op("Identity", g.cast(x, out_dtype(node)))


@lower(aten.split_with_sizes.default, aten.split.Tensor)
def split(g, node, x, split, dim=0):
    dim = norm_dim(dim, x.rank)
    sizes = [t.shape[dim] for t in node.meta["val"]]
    if len(sizes) == 1:
        return (g.op("Identity", x),)
    return g.op("Split", x, g.shape(sizes), axis=dim, outputs=len(sizes))


@lower(aten.lift_fresh_copy.default)
def lift_fresh_copy(g, node, x):
    return g.op("Identity", x)


def _complex_pairs_check(node):
    """Complex values stay inside the graph ONNX Runtime runs (it has no complex dtype):
    a view_as_complex only view_as_reals read, a view_as_real of such a view_as_complex (what
    ortlite.complex's decompositions leave of complex arithmetic)."""
    if node.target is aten.view_as_complex.default:
        if not node.users or any(user.target is not aten.view_as_real.default for user in node.users):
            return "a complex value read by ops other than view_as_real (complex values do not enter ONNX Runtime)"
        return None
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.target is not aten.view_as_complex.default:
        return "a complex value made in torch (complex values do not enter ONNX Runtime)"
    return _complex_pairs_check(source)


@lower(aten.view_as_complex.default, aten.view_as_real.default, check=_complex_pairs_check, complex_pairs=True)
def complex_pairs(g, node, x):
    """The same real pairs: ONNX holds a complex value as view_as_real has it."""
    return g.op("Identity", x)


@lower(torch.ops.prims.convert_element_type.default)
def convert_element_type(g, node, x, dtype):
    return g.op("Identity", g.cast(x, out_dtype(node)))


# The *_copy forms the core decompositions leave (the others decompose to their views).
lower(aten.view_copy.default)(view)
lower(aten.permute_copy.default)(permute)
lower(aten.slice_copy.Tensor)(slice_)
lower(aten.select_copy.int)(select)
lower(aten.detach_copy.default)(clone)


@lower(aten.narrow_copy.default)
def narrow_copy(g, node, x, dim, start, length):
    size = x.shape[norm_dim(dim, x.rank)]
    start = start + size if start < 0 else start
    return slice_(g, node, x, dim, start, start + length)


@lower(aten.unbind_copy.int)
def unbind(g, node, x, dim=0):
    dim = norm_dim(dim, x.rank)
    n = x.shape[dim]
    if n == 0:
        return ()
    parts = (x,) if n == 1 else g.op("Split", x, g.ints([1] * n), axis=dim, outputs=n)
    return tuple(g.op("Squeeze", p, g.ints([dim])) for p in parts)


def _slice_bounds(size: int, start, end, step) -> range:
    """The indices aten's slice(start, end, step) takes from a dim of `size`."""
    return range(size)[slice(start, end, step)]


@lower(aten.copy.default)
def copy(g, node, x, src, non_blocking=False):
    return g.op("Expand", g.cast(src, x.dtype), g.ints(x.shape))


@lower(aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default)
def empty(g, node, *args, **kwargs):
    # Any contents are right for an uninitialized tensor: zeros cost least.
    scalar = g.const(0, out_dtype(node))
    shape = out_shape(node)
    return g.op("Expand", scalar, g.ints(shape)) if shape else g.op("Identity", scalar)


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(g, node, x, pad, value=0):
    rank = x.rank
    pad = [meta(p) for p in node.args[1]]  # symbolic pads as SymInts (their signs must be known)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):  # pad lists (left, right) pairs from the last dim
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if not all(isinstance(v, int) for v in pad):  # signs unknown: pad by the positive parts, then crop
        padded = g.op("Pad", x, g.ints([torch.sym_max(v, 0) for v in begins + ends]), g.const(value, x.dtype), mode="constant")
        dims = [d for d in range(rank) if not (isinstance(begins[d], int) and isinstance(ends[d], int) and begins[d] >= 0 and ends[d] >= 0)]
        sizes = [x.shape[d] + torch.sym_max(begins[d], 0) + torch.sym_max(ends[d], 0) for d in dims]
        starts = [torch.sym_max(-begins[d], 0) for d in dims]
        stops = [size + torch.sym_min(ends[d], 0) for d, size in zip(dims, sizes)]
        return g.op("Slice", padded, g.ints(starts), g.ints(stops), g.ints(dims)) if dims else padded
    result = x
    positive = [max(v, 0) for v in begins + ends]
    if any(positive):
        result = g.op("Pad", result, g.ints(positive), g.const(value, x.dtype), mode="constant")
    # Negative pads crop, after padding (a side is either padded or cropped).
    crops = [d for d in range(rank) if begins[d] < 0 or ends[d] < 0]
    if crops:
        starts = [max(-begins[d], 0) for d in crops]
        stops = [ends[d] if ends[d] < 0 else INT64_MAX for d in crops]
        result = g.op("Slice", result, g.ints(starts), g.ints(stops), g.ints(crops))
    return result if result is not x else g.op("Identity", x)


@lower(aten.flip.default)
def flip(g, node, x, dims):
    axes = sorted({norm_dim(d, x.rank) for d in dims}) if x.rank else []
    if not axes:
        return g.op("Identity", x)
    n = len(axes)
    return g.op("Slice", x, g.ints([-1] * n), g.ints([-INT64_MAX - 1] * n), g.ints(axes), g.ints([-1] * n))


@lower(aten.repeat.default)
def repeat(g, node, x, repeats):
    lead = len(repeats) - x.rank
    shape = [1] * lead + list(x.shape)
    if lead:
        x = reshape_to(g, x, shape)
    return g.op("Tile", x, g.ints(repeats))


def _diagonal_positions(g, x: Value, offset, d1: int, d2: int, n) -> Value:
    """The diagonal's flat positions in the (d1, d2) plane of x, n of them: a Range, so that
    sizes and the offset may be symbolic."""
    cols = sym_expr(x.shape[d2])
    offset = sym_expr(offset)
    first = Max(-offset, 0) * cols + Max(offset, 0)
    step = cols + 1
    return Value(g.op("Range", g.sym(first), g.sym(first + sym_expr(n) * step), g.sym(step)), torch.int64, (n,))


@lower(aten.diagonal.default)
def diagonal(g, node, x, offset=0, dim1=0, dim2=1):
    d1, d2 = norm_dim(dim1, x.rank), norm_dim(dim2, x.rank)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    moved = g.op("Transpose", x, perm=rest + [d1, d2])
    flat = reshape_to(g, moved, [x.shape[d] for d in rest] + [x.shape[d1] * x.shape[d2]])
    offset = arg_val(node, 1, "offset", 0)  # a SymInt where symbolic
    return g.op("Gather", flat, _diagonal_positions(g, x, offset, d1, d2, out_shape(node)[-1]), axis=-1)


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(g, node, x, src, offset=0, dim1=0, dim2=1):
    # the diagonal as flat positions of the (dim1, dim2) plane, moved last (as in diagonal)
    d1, d2 = norm_dim(dim1, x.rank), norm_dim(dim2, x.rank)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    rows, cols = x.shape[d1], x.shape[d2]
    n = src.shape[-1]
    if isinstance(n, int) and n == 0:
        return g.op("Identity", x)
    offset = arg_val(node, 2, "offset", 0)  # a SymInt where symbolic
    perm = rest + [d1, d2]
    moved = g.op("Transpose", x, perm=perm)
    lead = [x.shape[d] for d in rest]
    flat = g.op("Reshape", moved, g.shape(lead + [rows * cols]))
    positions = g.op("Reshape", _diagonal_positions(g, x, offset, d1, d2, n), g.ints([1] * len(lead) + [-1]))
    index = g.op("Expand", positions, g.shape(lead + [n]))
    written = g.op("ScatterElements", flat, index, g.cast(src, x.dtype), axis=len(lead))
    back = g.op("Reshape", written, g.shape(lead + [rows, cols]))
    return g.op("Transpose", back, perm=[perm.index(d) for d in range(x.rank)])


def _scatter_along(g, x, src, dim, indices):
    """x with src written at `indices` (a list) along dim; src holds len(indices) there."""
    if not indices:
        return g.op("Identity", x)
    if indices == list(range(indices[0], indices[-1] + 1)):  # contiguous: a concat is cheapest
        parts = []
        if indices[0] > 0:
            parts.append(g.op("Slice", x, g.ints([0]), g.ints([indices[0]]), g.ints([dim])))
        parts.append(src)
        if indices[-1] + 1 < x.shape[dim]:
            parts.append(g.op("Slice", x, g.ints([indices[-1] + 1]), g.ints([INT64_MAX]), g.ints([dim])))
        return g.op("Concat", *parts, axis=dim) if len(parts) > 1 else g.op("Identity", src)
    index_shape = [1] * x.rank
    index_shape[dim] = len(indices)
    index = g.const(torch.tensor(indices, dtype=torch.int64).view(index_shape))
    src_shape = list(x.shape)
    src_shape[dim] = len(indices)
    return g.op("ScatterElements", x, g.op("Expand", index, g.ints(src_shape)), src, axis=dim)


def _scatter_position_check(node):
    """Positions must be ints, except for a unit-step slice (spliced in at any position)."""
    bounds = list(node.args[3:]) if node.target == aten.select_scatter.default else list(node.args[3:6])
    unit_slice = node.target == aten.slice_scatter.default and (len(bounds) < 3 or bounds[2] in (None, 1))
    if not all(b is None or isinstance(b, int) for b in bounds) and not unit_slice:
        return "scatter at a symbolic position"
    return None


def _splice(g, x, src, dim, start):
    """x with the unit-step slice starting at `start` along dim replaced by src: x[:start]
    (Python's negative and out-of-range start, as ONNX Slice reads it), src, and what
    follows the replaced elements, found from the lengths at run time (so that an empty
    slice, say [6:2], replaces nothing)."""
    head = g.op("Slice", x, g.ints([0]), g.ints([start]), g.ints([dim]))
    length = lambda v: Value(g.op("Gather", g.op("Shape", v), g.const(dim, torch.int64), axis=0), torch.int64, ())  # noqa: E731
    after = Value(g.op("Add", length(head), length(src)), torch.int64, ())
    tail = g.op("Slice", x, g.ints([after]), g.ints([INT64_MAX]), g.ints([dim]))
    return g.op("Concat", head, src, tail, axis=dim)


@lower(aten.slice_scatter.default, check=_scatter_position_check)
def slice_scatter(g, node, x, src, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.rank)
    src = g.cast(src, x.dtype)
    symbolic_bound = any(isinstance(b, str) for b in (start, end))
    if (symbolic_bound or not isinstance(x.shape[dim], int)) and step in (None, 1):
        # ONNX Slice reads negative and out-of-range bounds as Python does, at run time
        return _splice(g, x, src, dim, 0 if start is None else start)
    if not isinstance(x.shape[dim], int):  # a strided slice of a symbolic dim: its indices computed
        size = x.shape[dim]
        first, stop = [torch.sym_max(0, torch.sym_min(size, b if b >= 0 else size + b)) for b in (start or 0, min(end or INT64_MAX, INT64_MAX))]
        index = g.op("Range", g.sym(first), g.sym(stop), g.const(step, torch.int64))
        shape = [1] * x.rank
        shape[dim] = -1
        index = g.op("Expand", g.op("Reshape", index, g.ints(shape)), g.ints(src.shape))
        return g.op("ScatterElements", x, index, src, axis=dim)
    indices = list(_slice_bounds(x.shape[dim], start, end, step))
    return _scatter_along(g, x, src, dim, indices)


@lower(aten.select_scatter.default, check=_scatter_position_check)
def select_scatter(g, node, x, src, dim, index):
    dim = norm_dim(dim, x.rank)
    src = g.op("Unsqueeze", g.cast(src, x.dtype), g.ints([dim]))
    if not isinstance(x.shape[dim], int):
        return _splice(g, x, src, dim, index)
    index = index + x.shape[dim] if index < 0 else index
    return _scatter_along(g, x, src, dim, [index])


@lower(aten.unfold.default)
def unfold(g, node, x, dimension, size, step):
    if x.rank == 0:
        return g.op("Reshape", x, g.ints([1]))
    dim = norm_dim(dimension, x.rank)
    windows = out_shape(node)[dim]
    size, step = arg_val(node, 2), arg_val(node, 3)  # SymInts where symbolic
    if is_static([windows, size, step]):
        index = g.const(torch.tensor([[w * step + i for i in range(size)] for w in range(windows)], dtype=torch.int64).view(windows, size))
    else:  # window w, element i: w * step + i
        starts = g.op("Mul", g.arange(windows), g.sym(step))
        index = g.op("Add", g.op("Unsqueeze", starts, g.ints([1])), g.arange(size))
    gathered = g.op("Gather", x, index, axis=dim)
    # Gather puts (windows, size) at dim; aten puts the window elements last
    perm = list(range(dim + 1)) + list(range(dim + 2, x.rank + 1)) + [dim + 1]
    return g.op("Transpose", gathered, perm=perm)


@lower(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(g, node, *args, **kwargs):
    """torch.export's check that a tensor has the metadata tracing saw: true by construction
    of the lowered graph (its inputs are checked by the runner). Nothing to compute."""
    return None


# -- as_strided --------------------------------------------------------------------------

AS_STRIDED_TABLE_MAX = 1 << 20  # elements of the gather index a static as_strided builds


def _as_strided_args(node):
    size, stride = meta(node.args[1]), meta(node.args[2])
    offset = meta(node.args[3]) if len(node.args) > 3 else node.kwargs.get("storage_offset")
    return [meta(s) for s in size], [meta(s) for s in stride], meta(offset) or 0


def _owns_its_storage(node) -> bool:
    """as_strided reads its input's storage: the lowering sees only the input's elements,
    so its storage must hold exactly those, in order, and be made in the graph (a graph
    input's storage and offset are the caller's: Dynamo does not guard them)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    x = meta(node)
    storage = StorageWeakRef(x.untyped_storage())
    for p in node.graph.find_nodes(op="placeholder"):
        if isinstance(meta(p), torch.Tensor) and StorageWeakRef(meta(p).untyped_storage()) == storage:
            return False
    return bool(x.is_contiguous()) and fills_its_storage(x)


def _as_strided_is_reshape(x, size, stride, offset) -> bool:
    """Strides are the contiguous ones of size, offset 0, and as many elements as the
    input: a reshape of the input's elements."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    return known(offset == 0) and known(math.prod(size) == x.numel()) and has_contiguous_strides(size, stride)


def _as_strided_check(node):
    x = meta(node.args[0])
    if not _owns_its_storage(node.args[0]):
        return "as_strided of a tensor that may not own its storage (a view or a graph input)"
    size, stride, offset = _as_strided_args(node)
    if _as_strided_is_reshape(x, size, stride, offset):
        return None
    if not (is_static(size) and is_static(stride) and isinstance(offset, int) and is_static(x.shape)):
        return "symbolic as_strided that is not a reshape"
    if math.prod(size) > AS_STRIDED_TABLE_MAX:
        return "as_strided too large to gather"
    try:
        torch.as_strided(torch.empty(x.numel()), size, stride, offset)
    except RuntimeError:
        return "as_strided past its input's storage (aten raises)"
    return None


@lower(aten.as_strided.default, check=_as_strided_check)
def as_strided(g, node, x, *_):
    size, stride, offset = _as_strided_args(node)
    if _as_strided_is_reshape(meta(node.args[0]), size, stride, offset):
        return reshape_to(g, x, size)
    index = torch.as_strided(torch.arange(math.prod(x.shape)), size, stride, offset)
    return g.op("Gather", g.op("Reshape", x, g.ints([-1])), g.const(index), axis=0)
