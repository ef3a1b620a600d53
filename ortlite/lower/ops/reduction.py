"""Reductions over dim lists, keepdim and dtype."""

from __future__ import annotations

import math

import torch

from ..builder import TORCH_TO_ONNX, Value
from ..registry import lower
from .common import INT_DTYPES, any_true, arg_val, aten, is_float, known_empty, may_be_zero, norm_dims, out_dtype, where


def _reduce(g, node, op_type, x, dims, keepdim):
    x = g.cast(x, out_dtype(node))
    if x.rank == 0:
        return g.op("Identity", x)
    # aten: an empty (or absent) dim list reduces every dim
    axes = norm_dims(dims, x.rank) if dims else []
    if not axes:
        return g.op(op_type, x, keepdims=int(keepdim))
    return g.op(op_type, x, g.ints(axes), keepdims=int(keepdim))


def _nonempty_check(node):
    """mean/amax/amin over no elements: NaN or an error in aten, 0 or -inf in ORT."""
    x = node.args[0].meta["val"]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if x.dim() == 0:
        return None
    axes = norm_dims(dims, x.dim()) if dims else range(x.dim())
    return "reduction over a dim that may be empty" if any(may_be_zero(x.shape[a]) for a in axes) else None


@lower(aten.sum.dim_IntList, aten.sum.default)
def sum_(g, node, x, dim=None, keepdim=False, *, dtype=None):
    if out_dtype(node) in INT_DTYPES:
        return _int_reduce(g, node, x, dim, keepdim, int_sum)
    return _reduce(g, node, "ReduceSum", x, dim, keepdim)


# -- integers: ONNX Runtime's (1.31, CPU) int64 ReduceSum and ReduceProd accumulate in double
# (not exact past 2**53, saturating where aten wraps), its int32 ones saturate, and its int64
# ReduceMax/ReduceMin (8 elements and more) and Max/Min compare values in [2**31, 2**32) and
# [-2**32, -2**31) wrongly. Integer reductions are computed in int64 from exact kernels
# (CumSum, Mul, ArgMax/ArgMin, Gather), then cast to the result dtype: wrapping as aten's do.


def _int_reduce(g, node, x: Value, dims, keepdim, exact):
    """An integer sum or prod over dims (None or []: all) by exact(g, x64, axes, keepdim),
    computed in int64 and cast to the node's dtype."""
    x64 = g.cast(x, torch.int64)
    if x.rank == 0:
        return g.cast(Value(g.op("Identity", x64), torch.int64, ()), out_dtype(node))
    axes = sorted(norm_dims(dims, x.rank)) if dims else list(range(x.rank))
    total = exact(g, x64, axes, keepdim, source_dtype=x.dtype)
    return g.cast(Value(total, torch.int64, ()), out_dtype(node))


def _sums_exactly_in_double(dtype: torch.dtype, count) -> bool:
    """Does ORT's ReduceSum (accumulating in double) give the exact sum of `count` values of
    dtype? When every partial sum stays below 2**53: for count * the largest magnitude below
    2**53 known now; always for bool and 8-bit values (2**46 of them: 64 TiB)."""
    if dtype == torch.bool or dtype in (torch.int8, torch.uint8):
        return True
    info = torch.iinfo(dtype) if dtype in INT_DTYPES else None
    return info is not None and isinstance(count, int) and count * max(-info.min, info.max) < 2**53


def int_sum(g, x: Value, axes: list[int], keepdim: bool, source_dtype: torch.dtype) -> str:
    """The exact sum of int64 x over (sorted) axes, wrapping as aten's; source_dtype: the
    dtype x's values came from (what bounds them)."""
    count = math.prod(x.shape[a] for a in axes)
    if _sums_exactly_in_double(source_dtype, count):
        return g.op("ReduceSum", x, g.ints(axes), keepdims=int(keepdim))
    # the last of a running sum (CumSum adds in int64, wrapping as aten does)
    y, axis = _merged(g, x, axes)
    if may_be_zero(y.shape[axis]):  # a 0 first: the sum of nothing is 0
        pads = [0] * (2 * y.rank)
        pads[axis] = 1
        y = Value(g.op("Pad", y, g.ints(pads), g.const(0, torch.int64)), y.dtype, y.shape[:axis] + (y.shape[axis] + 1,) + y.shape[axis + 1 :])
    running = g.op("CumSum", y, g.const(axis, torch.int64))
    return _unmerged(g, g.op("Slice", running, g.ints([-1]), g.ints([2**62]), g.ints([axis])), axes, axis, keepdim)


def _exact_prod(g, x: Value, axes, keepdim, source_dtype=None):
    """The product by halving: the first half times the second, until one is left (int64 Mul
    wraps as aten's does, and a product modulo 2**64 does not depend on the order). Of bools
    (0 and 1): ReduceProd."""
    if source_dtype == torch.bool:
        return g.op("ReduceProd", x, g.ints(axes), keepdims=int(keepdim))
    y, axis = _merged(g, x, axes)
    n = y.shape[axis]
    if not isinstance(n, int):  # the last of a running product: ceil(log2 n) doubling steps
        pads = [0] * (2 * y.rank)
        pads[axis] = 1  # a 1 first: the product of nothing is 1
        y = Value(g.op("Pad", y, g.ints(pads), g.const(1, torch.int64)), y.dtype, y.shape[:axis] + (n + 1,) + y.shape[axis + 1 :])
        (running,) = _scan(g, [y], axis, [1], lambda b, earlier, later: [b.op("Mul", earlier[0], later[0])])
        return _unmerged(g, g.op("Slice", running, g.ints([-1]), g.ints([2**62]), g.ints([axis])), axes, axis, keepdim)
    if n == 0:
        shape = list(y.shape)
        shape[axis] = 1
        return _unmerged(g, g.op("Expand", g.const(1, torch.int64), g.shape(shape)), axes, axis, keepdim)
    while n > 1:
        half = n // 2
        product = g.op("Mul", g.op("Slice", y, g.ints([0]), g.ints([half]), g.ints([axis])), g.op("Slice", y, g.ints([half]), g.ints([2 * half]), g.ints([axis])))
        if n % 2:
            product = g.op("Concat", product, g.op("Slice", y, g.ints([2 * half]), g.ints([n]), g.ints([axis])), axis=axis)
        n = half + n % 2
        y = Value(product, y.dtype, y.shape[:axis] + (n,) + y.shape[axis + 1 :])
    return _unmerged(g, y, axes, axis, keepdim)


def int64_extreme(g, x: Value, axes: list[int], keepdim: bool, largest: bool) -> str:
    """amax/amin of int64 values: the value ArgMax/ArgMin point at (both exact)."""
    y, axis = _merged(g, x, axes)
    index = g.op("ArgMax" if largest else "ArgMin", y, axis=axis, keepdims=1, select_last_index=0)
    return _unmerged(g, g.op("GatherElements", y, index, axis=axis), axes, axis, keepdim)


def _merged(g, x: Value, axes: list[int]) -> tuple[Value, int]:
    """x with the (sorted) reduced axes as one: the axis itself where there is one, else
    those axes moved last and merged. Returns (that value, the axis)."""
    if len(axes) == 1:
        return x, axes[0]
    kept = [d for d in range(x.rank) if d not in axes]
    perm = kept + list(axes)
    moved = g.op("Transpose", x, perm=perm) if perm != list(range(x.rank)) else x
    shape = [x.shape[d] for d in kept] + [math.prod(x.shape[a] for a in axes)]
    return Value(g.op("Reshape", moved, g.shape(shape), allowzero=1), x.dtype, shape), len(kept)


def _unmerged(g, reduced: str, axes: list[int], axis: int, keepdim: bool) -> str:
    """A reduction over _merged's axis (there of size 1) in aten's layout."""
    if len(axes) == 1:
        return reduced if keepdim else g.op("Squeeze", reduced, g.ints([axis]))
    squeezed = g.op("Squeeze", reduced, g.ints([axis]))
    return g.op("Unsqueeze", squeezed, g.ints(axes)) if keepdim else squeezed


@lower(aten.mean.dim, aten.mean.default)
def mean(g, node, x, dim=None, keepdim=False, *, dtype=None):
    count = _reduced_count_of(arg_val(node, 0), dim)
    if not may_be_zero(count):
        return _reduce(g, node, "ReduceMean", x, dim, keepdim)
    # over no elements aten's mean is NaN (0 / 0), ORT's ReduceMean 0
    total = _reduce(g, node, "ReduceSum", x, dim, keepdim)
    return g.op("Div", total, g.cast(g.sym(count), out_dtype(node)))


@lower(aten.amax.default, check=_nonempty_check)
def amax(g, node, x, dim=(), keepdim=False):
    return _propagate_nan(g, node, x, dim, keepdim, _extreme(g, node, x, dim, keepdim, largest=True))


@lower(aten.amin.default, check=_nonempty_check)
def amin(g, node, x, dim=(), keepdim=False):
    return _propagate_nan(g, node, x, dim, keepdim, _extreme(g, node, x, dim, keepdim, largest=False))


def _extreme(g, node, x: Value, dims, keepdim, largest: bool) -> str:
    """ReduceMax/ReduceMin over dims (None or []: all), exact for int64 too."""
    if x.dtype == torch.int64 and x.rank:
        return int64_extreme(g, x, sorted(norm_dims(dims, x.rank)) if dims else list(range(x.rank)), keepdim, largest)
    return _reduce(g, node, "ReduceMax" if largest else "ReduceMin", x, dims, keepdim)


def _propagate_nan(g, node, x, dim, keepdim, reduced):
    """aten's max/min reductions return NaN where any reduced element is NaN; ORT's do not."""
    if not is_float(x.dtype) or x.rank == 0:
        return reduced
    any_nan = _reduce(g, node, "ReduceMax", Value(g.op("Cast", g.op("IsNaN", x), to=TORCH_TO_ONNX[x.dtype]), x.dtype, x.shape), dim, keepdim)
    return g.op("Where", g.op("Cast", any_nan, to=TORCH_TO_ONNX[torch.bool]), g.const(float("nan"), x.dtype), reduced)


def _reduced_count_of(x, dims) -> int:
    if x.dim() == 0:
        return 1
    axes = norm_dims(dims, x.dim()) if dims else range(x.dim())
    return math.prod(x.shape[a] for a in axes)


@lower(aten.prod.dim_int, aten.prod.default)
def prod(g, node, x, dim=None, keepdim=False, *, dtype=None):
    if node.target is aten.prod.default:
        dim = None
    elif isinstance(dim, int):
        dim = [dim]
    if out_dtype(node) in INT_DTYPES:
        return _int_reduce(g, node, x, dim, keepdim, _exact_prod)
    return _reduce(g, node, "ReduceProd", x, dim, keepdim)


@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any_(g, node, x, dim=None, keepdim=False):
    if isinstance(dim, int):
        dim = [dim]
    # any(x) == sum(x != 0) > 0, which is also right for an empty reduction
    nonzero = Value(g.op("Cast", g.cast(x, torch.bool), to=TORCH_TO_ONNX[torch.int64]), torch.int64, x.shape)
    if x.rank == 0:
        count = g.op("Identity", nonzero)
    else:
        axes = norm_dims(dim, x.rank) if dim else []
        count = g.op("ReduceSum", nonzero, *([g.ints(axes)] if axes else []), keepdims=int(keepdim))
    result = g.op("Greater", count, g.const(0, torch.int64))
    return g.cast(Value(result, torch.bool, ()), out_dtype(node))


def _arg_check(node):
    x = node.args[0].meta["val"]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dim is None or x.dim() == 0:
        empty = x.numel() == 0
    else:
        empty = x.shape[norm_dims(dim, x.dim())[0]] == 0
    if empty:
        return "arg reduction over an empty dim (aten raises)"
    return None


def _arg_reduce(g, x: Value, axis: int, keepdim: bool, largest: bool) -> str:
    """ArgMax/ArgMin along axis; aten takes the first NaN (NaN wins) and the first of ties."""
    op_type = "ArgMax" if largest else "ArgMin"
    if x.dtype == torch.bool:
        x = g.cast(x, torch.uint8)
    result = g.op(op_type, x, axis=axis, keepdims=int(keepdim), select_last_index=0)
    if is_float(x.dtype):
        nan = g.op("Cast", g.op("IsNaN", x), to=TORCH_TO_ONNX[torch.uint8])
        first_nan = g.op("ArgMax", nan, axis=axis, keepdims=int(keepdim), select_last_index=0)
        any_nan = g.op("Cast", g.op("ReduceMax", nan, g.ints([axis]), keepdims=int(keepdim)), to=TORCH_TO_ONNX[torch.bool])
        result = g.op("Where", any_nan, first_nan, result)
    return result


def _argmax_argmin(g, node, x, dim, keepdim, largest):
    if x.rank == 0:
        return g.op("Identity", g.const(0, torch.int64))
    if dim is None:
        flat = Value(g.op("Reshape", x, g.ints([-1])), x.dtype, (math.prod(x.shape),))
        result = _arg_reduce(g, flat, 0, False, largest)
        return g.op("Reshape", result, g.ints(out_val_shape(node))) if keepdim else result
    return _arg_reduce(g, x, norm_dims(dim, x.rank)[0], keepdim, largest)


def out_val_shape(node):
    return tuple(node.meta["val"].shape)


@lower(aten.argmax.default, check=_arg_check)
def argmax(g, node, x, dim=None, keepdim=False):
    return _argmax_argmin(g, node, x, dim, keepdim, True)


@lower(aten.argmin.default, check=_arg_check)
def argmin(g, node, x, dim=None, keepdim=False):
    return _argmax_argmin(g, node, x, dim, keepdim, False)


@lower(aten.max.dim, aten.min.dim, check=_arg_check)
def max_dim(g, node, x, dim, keepdim=False):
    largest = node.target is aten.max.dim
    if x.rank == 0:
        return g.op("Identity", x), g.op("Identity", g.const(0, torch.int64))
    values = _propagate_nan(g, node, x, [dim], keepdim, _extreme(g, node, x, [dim], keepdim, largest))
    return values, _arg_reduce(g, x, norm_dims(dim, x.rank)[0], keepdim, largest)


@lower(aten.max.default, aten.min.default, check=_arg_check)
def max_all(g, node, x):
    return _propagate_nan(g, node, x, None, False, _extreme(g, node, x, None, False, largest=node.target is aten.max.default))


def _correction(node):
    correction = node.kwargs.get("correction")
    if correction is None:
        return 1
    return int(correction) if float(correction).is_integer() else correction  # N - 1 stays a size


def _var_check(node):
    return None if is_float(out_dtype(node)) else "var of a non-float tensor"


@lower(aten.var.correction, aten.var_mean.correction, check=_var_check)
def var(g, node, x, dim=None, *, correction=None, keepdim=False):
    dims = [dim] if isinstance(dim, int) else dim
    count = _reduced_count_of(node.args[0].meta["val"], dims)
    if x.rank == 0:
        mean = g.op("Identity", x)
        squares = g.op("Mul", g.op("Sub", x, x), g.op("Sub", x, x))
        total = squares
    else:
        axes = g.ints(norm_dims(dims, x.rank) if dims else range(x.rank))
        # ReduceMean of nothing is 0 in ONNX Runtime; aten's mean of nothing is NaN
        mean = g.op("ReduceMean", x, axes, keepdims=1) if count else g.op("Div", g.op("ReduceSum", x, axes, keepdims=1), g.const(0.0, x.dtype))
        diff = g.op("Sub", x, mean)
        total = g.op("ReduceSum", g.op("Mul", diff, diff), axes, keepdims=int(keepdim))
        if not keepdim:
            mean = g.op("Squeeze", mean, axes) if dims or x.rank else mean
    # aten divides by max(0, N - correction): inf or NaN where that is 0
    divisor = torch.sym_max(0, count - _correction(node))
    divisor = g.cast(g.sym(divisor), x.dtype) if isinstance(divisor, torch.SymInt) else g.const(float(divisor), x.dtype)
    result = g.op("Div", total, divisor)
    if node.target is aten.var_mean.correction:
        return result, mean
    return result


@lower(aten.cumsum.default)
def cumsum(g, node, x, dim, *, dtype=None):
    # integers add in int64 (ONNX Runtime's CumSum has no 8- and 16-bit kernels), wrapping
    # as aten's do, then are cast to the result dtype
    x = g.cast(x, torch.int64 if out_dtype(node) in INT_DTYPES else out_dtype(node))
    if x.rank == 0:
        return g.cast(Value(g.op("Identity", x), x.dtype, ()), out_dtype(node))
    return g.cast(Value(g.op("CumSum", x, g.const(norm_dims(dim, x.rank)[0], torch.int64)), x.dtype, x.shape), out_dtype(node))


def _norm_check(node):
    ord_ = node.args[1] if len(node.args) > 1 else node.kwargs.get("ord", 2)
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    x = node.args[0].meta["val"]
    if not is_float(out_dtype(node)):
        return "non-float norm"
    if math.isinf(ord_) and _reduced_count_of(x, dim) == 0:
        return "inf-norm over an empty dim"
    return None


@lower(aten.linalg_vector_norm.default, check=_norm_check)
def linalg_vector_norm(g, node, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(g, node, g.cast(x, out_dtype(node)), ord, dim, keepdim, node.args[0].meta["val"].dim())


def _dist_check(node):
    a, b = node.args[0].meta["val"], node.args[1].meta["val"]
    p = node.args[2] if len(node.args) > 2 else node.kwargs.get("p", 2)
    if math.isinf(p) and math.prod(torch.broadcast_shapes(a.shape, b.shape)) == 0:
        return "inf-norm of nothing"
    return None if is_float(out_dtype(node)) else "non-float dist"


@lower(aten.dist.default, check=_dist_check)
def dist(g, node, a, b, p=2):
    dtype = out_dtype(node)
    diff = g.op("Sub", g.cast(a, dtype), g.cast(b, dtype))
    shape = torch.broadcast_shapes(a.shape, b.shape)
    return _vector_norm(g, node, Value(diff, dtype, shape), p, None, False, len(shape))


def _vector_norm(g, node, x, ord, dim, keepdim, input_rank):
    dims = [dim] if isinstance(dim, int) else dim
    if x.rank == 0:
        x = Value(g.op("Reshape", x, g.ints([1])), x.dtype, (1,))
        dims = None
    absx = Value(g.op("Abs", x), x.dtype, x.shape)
    if ord == 2:
        result = _reduce(g, node, "ReduceL2", x, dims, keepdim)
    elif ord == 1:
        result = _reduce(g, node, "ReduceL1", x, dims, keepdim)
    elif math.isinf(ord):
        op_type = "ReduceMax" if ord > 0 else "ReduceMin"
        result = _propagate_nan(g, node, x, dims, keepdim, _reduce(g, node, op_type, absx, dims, keepdim))
    elif ord == 0:
        nonzero = Value(g.op("Cast", g.op("Not", g.op("Equal", x, g.const(0, x.dtype))), to=TORCH_TO_ONNX[x.dtype]), x.dtype, x.shape)
        result = _reduce(g, node, "ReduceSum", nonzero, dims, keepdim)
    else:
        powered = Value(g.op("Pow", absx, g.const(float(ord), x.dtype)), x.dtype, x.shape)
        result = g.op("Pow", _reduce(g, node, "ReduceSum", powered, dims, keepdim), g.const(1.0 / ord, x.dtype))
    if input_rank == 0 and out_val_shape(node) == ():
        result = g.op("Reshape", result, g.ints([]))
    return result


@lower(aten.cumprod.default)
def cumprod(g, node, x, dim, *, dtype=None):
    x = g.cast(x, out_dtype(node))
    if x.rank == 0 or known_empty(x.shape):
        return g.op("Identity", x)
    axis = norm_dims(dim, x.rank)[0]
    if _spreads(x, axis) and is_float(x.dtype):  # (ReduceProd is not exact for integers)
        # out[i] = prod over j <= i, as a ReduceProd of x spread over a new axis with ones
        # above the diagonal
        return g.op("ReduceProd", _spread(g, x, axis, 1), g.ints([axis + 1]), keepdims=0)
    (product,) = _scan(g, [_accumulated(g, x)], axis, [1], lambda b, earlier, later: [b.op("Mul", earlier[0], later[0])])
    return g.cast(product, x.dtype)


def _median_check(node):
    x = node.args[0].meta["val"]
    if x.numel() == 0:
        return "median of nothing"
    if x.dtype == torch.float64:
        return "float64 keys"
    return None


def _median_dim_check(node):
    x = arg_val(node, 0)
    if x.dtype == torch.float64:
        return "float64 keys"
    if x.dim() and x.shape[norm_dims(arg_val(node, 1, "dim", 0), x.dim())[0]] == 0:
        return "median of nothing"
    return None


@lower(aten.median.dim, check=_median_dim_check)
def median_dim(g, node, x, dim=0, keepdim=False):
    """aten's median along a dim: the (n - 1) // 2-th in stable sorted order (its index too:
    aten breaks ties by position), or the first NaN if there is one."""
    from .sort import _sort_key

    if x.rank == 0:
        return g.op("Identity", x), g.op("Identity", g.const(0, torch.int64))
    axis = norm_dims(dim, x.rank)[0]
    k = (x.shape[axis] - 1) // 2 + 1
    _, order = g.op("TopK", _sort_key(g, x), g.ints([k]), axis=axis, largest=0, sorted=1, outputs=2)
    index = g.op("Slice", order, g.ints([k - 1]), g.ints([k]), g.ints([axis]))
    value = g.op("GatherElements", x, index, axis=axis)
    if is_float(x.dtype):
        is_nan = g.op("Cast", g.op("IsNaN", x), to=TORCH_TO_ONNX[torch.int32])
        any_nan = g.op("Cast", g.op("ReduceMax", is_nan, g.ints([axis]), keepdims=1), to=TORCH_TO_ONNX[torch.bool])
        first_nan = g.op("ArgMax", is_nan, axis=axis, keepdims=1, select_last_index=0)
        index = g.op("Where", any_nan, first_nan, index)
        value = g.op("Where", any_nan, g.const(float("nan"), x.dtype), value)
    if not keepdim:
        value, index = (g.op("Squeeze", v, g.ints([axis])) for v in (value, index))
    return value, index


@lower(aten.median.default, check=_median_check)
def median(g, node, x):
    # aten's median is the lower one, (n - 1) // 2 in sorted order; NaN if any is NaN
    from .sort import _sort_key

    n = math.prod(x.shape)
    flat = Value(g.op("Reshape", x, g.ints([n])), x.dtype, (n,))
    k = (n - 1) // 2 + 1
    _, indices = g.op("TopK", _sort_key(g, flat), g.ints([k]), axis=0, largest=0, sorted=1, outputs=2)
    last = g.op("Slice", indices, g.ints([k - 1]), g.ints([k]))
    result = g.op("Reshape", g.op("Gather", flat, last, axis=0), g.ints([]))
    if is_float(x.dtype):
        any_nan = any_true(g, g.op("IsNaN", flat))
        result = g.op("Where", any_nan, g.const(float("nan"), x.dtype), result)
    return result


SPREAD_MAX = 256  # cumulative ops as reductions over a triangular (n, n) spread up to this n


def _spreads(x: Value, axis: int) -> bool:
    """Scan along axis by a triangular spread (one fused reduction; n * n memory) rather
    than by doubling steps in a Loop (_scan)?"""
    n = x.shape[axis]
    return isinstance(n, int) and n <= SPREAD_MAX


def _spread(g, x: Value, axis: int, fill):
    """x spread to (..., n [i], n [j], ...) with x[j] where j <= i and fill elsewhere."""
    n = x.shape[axis]
    lower = torch.ones(n, n, dtype=torch.bool).tril().view([n, n] + [1] * (x.rank - axis - 1))
    return g.op("Where", g.const(lower), g.op("Unsqueeze", x, g.ints([axis])), g.const(fill, x.dtype))


def _accumulated(g, x: Value) -> Value:
    """x in the dtype aten's CPU cumulative kernels accumulate in (acc_type: double for
    float32, float for half types); integers in int64 (ONNX Runtime multiplies no 8- and
    16-bit ones; the product modulo 2**bits is the same)."""
    acc = {torch.float32: torch.float64, torch.float16: torch.float32, torch.bfloat16: torch.float32}.get(x.dtype, x.dtype)
    acc = torch.int64 if acc in INT_DTYPES else acc
    return g.cast(x, acc)


def _scan(g, xs: list[Value], axis: int, fills: list, combine) -> tuple[Value, ...]:
    """Inclusive scans of same-shaped xs along axis, for any length n (symbolic too):
    ceil(log2 n) doubling steps in an ONNX Loop; step k combines every element with the
    one 2**k before it (fills, identities of combine, stand before the first).
    combine(b, earlier, later) -> list: associative; it sees lists of Values."""
    n = g.sym(xs[0].shape[axis])
    one = g.const(1, torch.int64)

    def step(b, i, shift, *ys):
        kept = b.op("Sub", n, shift)
        pads = b.op("Concat", b.op("Reshape", shift, b.ints([1])), b.ints([0]), axis=0)
        earlier = [
            Value(b.op("Pad", b.op("Slice", y, b.ints([0]), b.op("Reshape", kept, b.ints([1])), b.ints([axis])), pads, b.const(fill, y.dtype), b.ints([axis])), y.dtype, y.shape)
            for y, fill in zip(ys, fills)
        ]
        combined = combine(b, earlier, list(ys))
        doubled = b.op("Mul", shift, b.const(2, torch.int64))
        return [b.op("Less", doubled, n), Value(doubled, torch.int64, ()), *[Value(v, y.dtype, y.shape) for v, y in zip(combined, ys)]]

    _, *results = g.loop(None, g.op("Less", one, n), [Value(one, torch.int64, ()), *xs], step)
    return tuple(results)


@lower(aten.logcumsumexp.default)
def logcumsumexp(g, node, x, dim):
    x = g.cast(x, out_dtype(node))
    if x.rank == 0 or known_empty(x.shape):
        return g.op("Identity", x)
    axis = norm_dims(dim, x.rank)[0]
    if not _spreads(x, axis):
        (total,) = _scan(g, [_accumulated(g, x)], axis, [float("-inf")], lambda b, earlier, later: [_log_add_exp(b, earlier[0], later[0])])
        return g.cast(total, x.dtype)
    spread = _spread(g, x, axis, float("-inf"))
    j = g.ints([axis + 1])
    top = g.op("ReduceMax", spread, j, keepdims=1)
    top = g.op("Where", g.op("IsInf", top), g.const(0.0, x.dtype), top)  # all -inf (or an inf): no shift
    total = g.op("ReduceSum", g.op("Exp", g.op("Sub", spread, top)), j, keepdims=1)
    return g.op("Squeeze", g.op("Add", g.op("Log", total), top), j)


def _log_add_exp(g, a: Value, b: Value) -> str:
    top = g.op("Max", a, b)
    top = g.op("Where", g.op("IsInf", top), g.const(0.0, a.dtype), top)  # both -inf (or an inf): no shift
    total = g.op("Add", g.op("Exp", g.op("Sub", a, top)), g.op("Exp", g.op("Sub", b, top)))
    return g.op("Add", g.op("Log", total), top)


@lower(aten.cummax.default, aten.cummin.default)
def cummax(g, node, x, dim):
    largest = node.target is aten.cummax.default
    if x.rank == 0 or known_empty(x.shape):
        return g.op("Identity", x), g.op("Expand", g.const(0, torch.int64), g.shape(x.shape))
    if x.dtype == torch.bool:  # as 0/1 integers
        values, index = cummax(g, node, g.cast(x, torch.int32), dim)
        return g.op("Cast", values, to=TORCH_TO_ONNX[torch.bool]), index
    axis = norm_dims(dim, x.rank)[0]
    if not _spreads(x, axis):
        return _scanned_cummax(g, x, axis, largest)
    n = x.shape[axis]
    info = torch.finfo(x.dtype) if is_float(x.dtype) else torch.iinfo(x.dtype)
    spread = _spread(g, x, axis, info.min if largest else info.max)
    j = g.ints([axis + 1])
    if x.dtype == torch.int64:
        values = int64_extreme(g, Value(spread, x.dtype, x.shape[:axis] + (n, n) + x.shape[axis + 1 :]), [axis + 1], True, largest)
    else:
        values = g.op("ReduceMax" if largest else "ReduceMin", spread, j, keepdims=1)
    # aten's index: the last j <= i holding the running max (>= / <= keep moving it);
    # once a NaN is seen the value is NaN and the index the last NaN
    position = g.const(torch.arange(n, dtype=torch.int64).view([1, n] + [1] * (x.rank - axis - 1)))
    lower = g.const(torch.ones(n, n, dtype=torch.bool).tril().view([n, n] + [1] * (x.rank - axis - 1)))
    hits = g.op("And", lower, g.op("Equal", spread, values))
    if is_float(x.dtype):
        is_nan = g.op("And", lower, g.op("IsNaN", g.op("Unsqueeze", x, g.ints([axis]))))
        any_nan = any_true(g, is_nan, [axis + 1], keepdims=True)
        values = g.op("Where", any_nan, g.const(float("nan"), x.dtype), values)
        hits = where(g, any_nan, is_nan, hits, torch.bool)
    index = g.op("ReduceMax", g.op("Where", hits, position, g.const(-1, torch.int64)), j, keepdims=1)
    return g.op("Squeeze", values, j), g.op("Squeeze", index, j)


def _scanned_cummax(g, x: Value, axis: int, largest: bool):
    """cummax/cummin as a scan of (value, index) pairs: the later pair wins when its value
    is NaN, or when it is >= (<=) the earlier one and that is not NaN, which is aten's
    rule (the index of the last running max; once a NaN is seen, NaN and the last NaN)."""
    shape = [1] * x.rank
    shape[axis] = -1
    n = g.sym(x.shape[axis])
    positions = g.op("Reshape", g.arange(n), g.ints(shape))
    index = Value(g.op("Expand", positions, g.shape(x.shape)), torch.int64, x.shape)
    fill = float("-inf" if largest else "inf") if is_float(x.dtype) else (torch.iinfo(x.dtype).min if largest else torch.iinfo(x.dtype).max)

    def combine(b, earlier, later):
        wins = b.op("GreaterOrEqual" if largest else "LessOrEqual", later[0], earlier[0])
        if is_float(x.dtype):
            wins = b.op("Or", b.op("IsNaN", later[0]), b.op("And", wins, b.op("Not", b.op("IsNaN", earlier[0]))))
        return [b.op("Where", wins, later[0], earlier[0]), b.op("Where", wins, later[1], earlier[1])]

    return _scan(g, [x, index], axis, [fill, -1], combine)
