"""Matrix products; determinants."""

from __future__ import annotations

import math
import operator

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..builder import Value
from ..registry import lower
from .common import any_true, any_zero, aten, arg_val, as_value, broadcast_shape, is_float, is_static, known_empty, may_be_zero, out_dtype, out_shape
from .reduction import int_sum


def _empty_inner(a) -> bool:
    """A product over an empty inner dim is zeros, which ORT would leave unwritten."""
    return isinstance(a.shape[-1], int) and a.shape[-1] == 0


def _inner_check(node):
    k = node.args[0].meta["val"].shape[-1] if node.target in (aten.mm.default, aten.bmm.default) else node.args[1].meta["val"].shape[-1]
    return "symbolic inner dim that may be 0" if not isinstance(k, int) and may_be_zero(k) else None


def _zeros(g, node):
    return g.op("Expand", g.const(0, out_dtype(node)), g.ints(out_shape(node)))


@lower(aten.mm.default, aten.bmm.default)
def mm(g, node, a, b):
    if _empty_inner(a):
        # ONNX Runtime's MatMul over an empty inner dim leaves a bound output unwritten
        return _zeros(g, node)
    if not isinstance(a.shape[-1], int) and may_be_zero(a.shape[-1]):
        # a symbolic inner dim whose bounds reach 0 (a window's size after a padded window
        # partition: Hp // (Hp // 3), the split torch's view meta computes): checked at run
        # time, zeros where an operand is empty (an empty result either way where M or N is 0)
        empty = any_zero(g, [a.shape[-1]], (a, b))
        (out,) = g.if_(empty, lambda br: [_zeros(br, node)], lambda br: [br.op("MatMul", a, b)], [Value("", out_dtype(node), ())])
        return out
    return g.op("MatMul", a, b)


def _scaled_sum(g, node, product, bias, beta, alpha):
    """beta * bias + alpha * product, where beta == 0 ignores bias (NaN included). alpha and
    beta may be symbolic (a Value): then beta == 0 is decided per call."""
    dtype = out_dtype(node)
    if isinstance(alpha, Value) or alpha != 1:
        product = g.op("Mul", product, as_value(g, alpha, dtype))
    if not isinstance(beta, Value) and beta == 0:
        return product
    bias = g.cast(bias, dtype)
    if isinstance(beta, Value) or beta != 1:
        bias = g.op("Mul", bias, as_value(g, beta, dtype))
    total = g.op("Add", bias, product)
    if isinstance(beta, Value):
        total = g.op("Where", g.op("Equal", beta, g.const(0, beta.dtype)), product, total)
    return total


def _matmul(g, node, a, b):
    return _zeros(g, node) if _empty_inner(a) else g.op("MatMul", a, b)


@lower(aten.addmm.default, check=_inner_check)
def addmm(g, node, bias, a, b, *, beta=1, alpha=1):
    if not is_float(out_dtype(node)) or isinstance(alpha, Value) or isinstance(beta, Value):  # Gemm: float, attributes
        return _scaled_sum(g, node, _matmul(g, node, a, b), bias, beta, alpha)
    if _empty_inner(a):  # a @ b is zeros (and ONNX Runtime's Gemm would leave it unwritten)
        if beta == 0:
            return _zeros(g, node)
        scaled = g.op("Mul", g.cast(bias, out_dtype(node)), g.const(beta, out_dtype(node)))
        return g.op("Expand", scaled, g.ints(out_shape(node)))
    if beta == 0:  # aten ignores the bias entirely, NaN and inf included
        return g.op("Gemm", a, b, alpha=float(alpha))
    return g.op("Gemm", a, b, g.cast(bias, out_dtype(node)), alpha=float(alpha), beta=float(beta))


@lower(aten.addmv.default)
def addmv(g, node, bias, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum(g, node, _matmul(g, node, mat, vec), bias, beta, alpha)


@lower(aten.addbmm.default)
def addbmm(g, node, bias, a, b, *, beta=1, alpha=1):
    if a.shape[0] == 0 or a.shape[-1] == 0:
        product = _zeros(g, node)
    elif a.dtype in (torch.float16, torch.bfloat16) and not isinstance(alpha, Value) and not isinstance(beta, Value):  # all in float32, rounded once
        f32 = torch.float32
        product = g.op("ReduceSum", g.op("MatMul", g.cast(a, f32), g.cast(b, f32)), g.ints([0]), keepdims=0)
        product = g.op("Mul", product, g.const(alpha, f32))
        if beta != 0:
            product = g.op("Add", g.op("Mul", g.cast(bias, f32), g.const(beta, f32)), product)
        return g.cast(Value(product, f32, ()), out_dtype(node))
    elif not is_float(a.dtype):  # summed exactly in int64 (ONNX Runtime's int ReduceSum saturates, and rounds int64)
        products = g.cast(Value(g.op("MatMul", a, b), a.dtype, (a.shape[0], a.shape[1], b.shape[2])), torch.int64)
        product = g.cast(Value(int_sum(g, products, [0], False, a.dtype), torch.int64, ()), a.dtype)
    else:
        product = g.op("ReduceSum", g.op("MatMul", a, b), g.ints([0]), keepdims=0)
    return _scaled_sum(g, node, product, bias, beta, alpha)


@lower(aten._trilinear.default)
def trilinear(g, node, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # each input gains the dims it lacks, then the product is summed over sumdim
    parts = []
    for x, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        parts.append(g.op("Unsqueeze", x, g.ints(sorted(expand))) if expand else x)
    product = g.op("Mul", g.op("Mul", parts[0], parts[1]), parts[2])
    if not sumdim:
        return product
    dtype = out_dtype(node)
    if not is_float(dtype) and dtype != torch.bool:  # summed exactly in int64, as addbmm's
        shapes = []
        for k, expand in enumerate((expand1, expand2, expand3)):
            shape = list(arg_val(node, k).shape)
            for d in sorted(expand):
                shape.insert(d, 1)
            shapes.append(shape)
        shape = broadcast_shape(*shapes)
        return g.cast(Value(int_sum(g, g.cast(Value(product, dtype, shape), torch.int64), sorted(sumdim), False, dtype), torch.int64, ()), dtype)
    return g.op("ReduceSum", product, g.ints(sorted(sumdim)), keepdims=0)


def _uses_mm(node) -> bool:
    """aten's cdist takes the matmul route for p = 2 with more than 25 rows (or when
    asked); its cancellation errors are not reproducible: those stay in torch."""
    x1, x2 = arg_val(node, 0), arg_val(node, 1)
    p, mode = node.args[2], node.args[3] if len(node.args) > 3 else None
    if p != 2 or mode == 2:
        return False
    return mode == 1 or x1.shape[-2] > 25 or x2.shape[-2] > 25


def _cdist_check(node):
    if _uses_mm(node):
        return "cdist through matmul (p=2, more than 25 rows)"
    if not is_float(out_dtype(node)):
        return "non-float cdist"
    if math.isinf(node.args[2]):
        return "inf-norm distances (aten's cdist max ignores some NaN)"
    return None


def _p_distance(g, diff, p, dtype, axis):
    """(sum |diff|^p)^(1/p) over axis, with aten's p = 0, 1, 2 forms."""
    absolute = g.op("Abs", diff)
    if p == 0:  # aten: min(ceil(|d|), 1), so NaN counts as NaN
        ones = g.op("Min", g.op("Ceil", absolute), g.const(1, dtype))
        return g.op("ReduceSum", ones, g.ints([axis]), keepdims=0)
    if math.isinf(p):  # the largest |d|, NaN if any is NaN
        largest = g.op("ReduceMax", absolute, g.ints([axis]), keepdims=0)
        nan = any_true(g, g.op("IsNaN", diff), [axis])
        return g.op("Where", nan, g.const(float("nan"), dtype), largest)
    if p == 1:
        return g.op("ReduceSum", absolute, g.ints([axis]), keepdims=0)
    if p == 2:
        return g.op("Sqrt", g.op("ReduceSum", g.op("Mul", diff, diff), g.ints([axis]), keepdims=0))
    summed = g.op("ReduceSum", g.op("Pow", absolute, g.const(float(p), dtype)), g.ints([axis]), keepdims=0)
    return g.op("Pow", summed, g.const(1.0 / p, dtype))


@lower(aten._cdist_forward.default, check=_cdist_check)
def cdist(g, node, x1, x2, p, compute_mode=None):
    shape = out_shape(node)
    if 0 in shape or x1.shape[-1] == 0:
        return g.op("Expand", g.const(0, x1.dtype), g.ints(shape))
    diff = g.op("Sub", g.op("Unsqueeze", x1, g.ints([-2])), g.op("Unsqueeze", x2, g.ints([-3])))
    return _p_distance(g, diff, p, x1.dtype, -1)


def _pdist_check(node):
    p = node.args[1] if len(node.args) > 1 else 2.0
    if math.isinf(p) and p < 0:
        return "-inf-norm distances"
    return None if is_float(out_dtype(node)) else "non-float pdist"


@lower(aten._pdist_forward.default, check=_pdist_check)
def pdist(g, node, x, p=2.0):
    n = x.shape[0]
    if not is_static(x.shape):
        return _symbolic_pdist(g, x, p)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs or x.shape[1] == 0:
        return g.op("Expand", g.const(0, x.dtype), g.ints(out_shape(node)))
    first = g.op("Gather", x, g.ints([i for i, _ in pairs]), axis=0)
    second = g.op("Gather", x, g.ints([j for _, j in pairs]), axis=0)
    return _p_distance(g, g.op("Sub", first, second), p, x.dtype, 1)


def _symbolic_pdist(g, x: Value, p) -> str:
    """pdist with sizes known only at run time: the distances of all pairs (i, j), then the
    pairs i < j in row-major order, aten's order."""
    rows = g.arange(x.shape[0])
    upper = g.op("Less", g.op("Unsqueeze", rows, g.ints([1])), g.op("Unsqueeze", rows, g.ints([0])))
    diff = g.op("Sub", g.op("Unsqueeze", x, g.ints([1])), g.op("Unsqueeze", x, g.ints([0])))
    distances = _p_distance(g, diff, p, x.dtype, -1)
    if math.isinf(p):  # no columns: ReduceMax of nothing is -inf, aten's distance is 0
        columns = g.op("Gather", g.op("Shape", x), g.const(1, torch.int64))
        distances = g.op("Where", g.op("Equal", columns, g.const(0, torch.int64)), g.const(0.0, x.dtype), distances)
    return g.op("Compress", g.op("Reshape", distances, g.ints([-1])), g.op("Reshape", upper, g.ints([-1])), axis=0)


# ONNX Runtime's Det (an LU factorization like aten's, pivoted differently) is as accurate
# as aten's, but their float32 roundings drift apart with the size: on random matrices the
# largest relative difference was 1e-5 at 8 x 8, 2.5e-5 at 16 x 16, 1e-4 at 32 x 32.
DET_MAX = 16


def _det_check(node):
    x = arg_val(node, 0)
    if x.dtype != torch.float32:
        return f"det of {x.dtype} (ONNX Runtime's Det is float32 only)"
    if any(user.target is not operator.getitem or user.args[1] != 0 for user in node.users):
        return "the LU factors of det are used"
    if statically_known_true(x.shape[-1] > DET_MAX):
        return f"det of a matrix larger than {DET_MAX} x {DET_MAX}"
    return None


@lower(aten._linalg_det.default, check=_det_check)
def linalg_det(g, node, x):
    if known_empty(x.shape):  # a 0 x 0 matrix has determinant 1; no matrices: an empty result
        return g.op("Expand", g.const(1.0, x.dtype), g.ints(out_shape(node))), None, None
    n = x.shape[-1]
    if not statically_known_true(n <= DET_MAX):  # a size known only at run time
        g.fallback_if(g.op("Greater", g.sym(n), g.const(DET_MAX, torch.int64)), f"det of a matrix larger than {DET_MAX} x {DET_MAX}")
    if any(may_be_zero(d) for d in x.shape):
        empty = g.op("Equal", g.op("ReduceMin", g.op("Shape", x), keepdims=0), g.const(0, torch.int64))
        g.fallback_if(empty, "det of an empty batch or a 0 x 0 matrix with symbolic sizes")
    return g.op("Det", x), None, None


def _solve_triangular_check(node):
    a, b = arg_val(node, 0), arg_val(node, 1)
    if a.dtype not in (torch.float32, torch.float64) or b.dtype != a.dtype:
        return f"triangular solve of {a.dtype} and {b.dtype}"
    return None


# A triangular solve of a static size up to this is unrolled (5 ONNX nodes a row); a larger or
# symbolic one is an ONNX Loop over the rows (each iteration ~35 us on the CPU: 64 rows took
# 2.4 ms, unrolled ~0.35 ms, eager ~0.05 ms; 2026-12-07, 4 x 64 x 64 by 64 x 16).
SOLVE_UNROLL_MAX = 128


@lower(aten.linalg_solve_triangular.default, check=_solve_triangular_check)
def linalg_solve_triangular(g, node, a, b, *, upper, left=True, unitriangular=False):
    """A X = B (X A = B where not left) for X, A triangular, by substitution: row after row
    of X (from the last where A is upper), B's row less A's row times the rows solved before
    it, divided by the pivot. Only A's triangle is read (eager ignores the rest, NaN
    included). Eager's trsm may sum the same terms in another order: a result can differ in
    its last bits, and where it holds an inf or a NaN (a zero pivot, an overflow, a
    non-finite input) in where they spread; so a non-finite value in A's triangle, in B or
    in X makes the node run in torch."""
    dtype = out_dtype(node)
    shape = list(out_shape(node))
    if not left:  # X A = B is A^T X^T = B^T, the other triangle
        swap = lambda v: g.op("Transpose", v, perm=list(range(v.rank - 2)) + [v.rank - 1, v.rank - 2])  # noqa: E731
        a, b = Value(swap(a), a.dtype, a.shape), Value(swap(b), b.dtype, b.shape)
        upper, shape = not upper, shape[:-2] + [shape[-1], shape[-2]]
    b = Value(g.expand(b, shape), dtype, shape)  # (B's batch dims broadcast with A's)
    rank, n = a.rank, a.shape[-1]
    size = g.sym(n) if isinstance(n, int) else g.op("Gather", g.op("Shape", a), g.const(rank - 1, torch.int64))
    index = g.arange(size)
    rows, columns = g.op("Unsqueeze", index, g.ints([1])), g.op("Unsqueeze", index, g.ints([0]))
    zero = g.const(0, dtype)
    before = g.op("Greater" if upper else "Less", columns, rows)  # the unknowns a row reads, solved before it
    known = g.op("Where", before, a, zero)  # (the other triangle never read: NaN there stays out)
    diagonal = g.op("Equal", columns, rows)
    pivots = None
    if not unitriangular:  # each row's pivot, as a column
        pivots = Value(g.op("Unsqueeze", g.op("ReduceSum", g.op("Where", diagonal, a, zero), g.ints([rank - 1]), keepdims=0), g.ints([rank - 1])), dtype, (*a.shape[:-1], 1))
    if isinstance(n, int) and n <= SOLVE_UNROLL_MAX:
        x = _substitution_unrolled(g, known, b, pivots, n, rank, upper)
    else:
        x = _substitution_loop(g, known, b, pivots, size, rows, rank, upper, Value("", dtype, shape))
    non_finite = lambda v: any_true(g, g.op("IsNaN", g.op("Sub", v, v)))  # noqa: E731 (inf - inf and NaN are NaN)
    read = before if unitriangular else g.op("Or", before, diagonal)
    flags = [non_finite(g.op("Where", read, a, zero)), non_finite(b), non_finite(x)]
    g.fallback_if(g.op("Or", g.op("Or", *flags[:2]), flags[2]), "a non-finite value in A's triangle, in B or in the solution")
    return swap(Value(x, dtype, shape)) if not left else g.op("Identity", x)


def _substitution_unrolled(g, known, b, pivots, n, rank, upper) -> str:
    """Row by row, the solved rows gathered by Concat."""
    if n == 0:
        return b
    rows = lambda v, start, end: g.op("Slice", v, g.ints([start]), g.ints([end]), g.ints([v.rank - 2]))  # noqa: E731
    solved = None
    for i in reversed(range(n)) if upper else range(n):
        x = rows(b, i, i + 1)
        if solved is not None:  # the rows solved so far: after i where upper, before it where lower
            start, end = (i + 1, n) if upper else (0, i)
            coefficients = g.op("Slice", known, g.ints([i, start]), g.ints([i + 1, end]), g.ints([rank - 2, rank - 1]))
            x = g.op("Sub", x, g.op("MatMul", coefficients, solved))
        if pivots is not None:
            x = g.op("Div", x, rows(pivots, i, i + 1))
        solved = x if solved is None else g.op("Concat", *((x, solved) if upper else (solved, x)), axis=b.rank - 2)
    return solved


def _substitution_loop(g, known, b, pivots, size, rows, rank, upper, like: Value) -> str:
    """The same as an ONNX Loop, one iteration a row (a size known only at run time): X
    starts as zeros, so that A's whole row times X reads the rows solved so far."""
    last = g.op("Sub", size, g.const(1, torch.int64))

    def body(bb, t, x):
        i = bb.op("Sub", last, t) if upper else t
        row = bb.op("Unsqueeze", bb.op("Gather", known, i, axis=rank - 2), bb.ints([rank - 2]))
        solved = bb.op("Sub", bb.op("Unsqueeze", bb.op("Gather", b, i, axis=b.rank - 2), bb.ints([b.rank - 2])), bb.op("MatMul", row, x))
        if pivots is not None:
            solved = bb.op("Div", solved, bb.op("Unsqueeze", bb.op("Gather", pivots, i, axis=rank - 2), bb.ints([rank - 2])))
        return [bb.const(True), Value(bb.op("Where", bb.op("Equal", rows, i), solved, x), like.dtype, like.shape)]

    start = Value(g.op("Expand", g.const(0, like.dtype), g.shape(like.shape)), like.dtype, like.shape)
    (x,) = g.loop(size, None, [start], body)
    return x
