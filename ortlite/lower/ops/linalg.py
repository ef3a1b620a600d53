"""Matrix products."""

from __future__ import annotations

from ..registry import lower
from .common import aten, is_float, may_be_zero, out_dtype, out_shape


def _empty_inner(a) -> bool:
    """A product over an empty inner dim is zeros, which ORT would leave unwritten."""
    return isinstance(a.shape[-1], int) and a.shape[-1] == 0


def _inner_check(node):
    k = node.args[0].meta["val"].shape[-1] if node.target in (aten.mm.default, aten.bmm.default) else node.args[1].meta["val"].shape[-1]
    return "symbolic inner dim that may be 0" if not isinstance(k, int) and may_be_zero(k) else None


def _zeros(g, node):
    return g.op("Expand", g.const(0, out_dtype(node)), g.ints(out_shape(node)))


@lower(aten.mm.default, aten.bmm.default, check=_inner_check, symbolic=True)
def mm(g, node, a, b):
    if _empty_inner(a):
        # ONNX Runtime's MatMul over an empty inner dim leaves a bound output unwritten
        return _zeros(g, node)
    return g.op("MatMul", a, b)


def _scaled_sum(g, node, product, bias, beta, alpha):
    """beta * bias + alpha * product, where beta == 0 ignores bias (NaN included)."""
    dtype = out_dtype(node)
    if alpha != 1:
        product = g.op("Mul", product, g.const(alpha, dtype))
    if beta == 0:
        return product
    bias = g.cast(bias, dtype)
    if beta != 1:
        bias = g.op("Mul", bias, g.const(beta, dtype))
    return g.op("Add", bias, product)


def _matmul(g, node, a, b):
    return _zeros(g, node) if _empty_inner(a) else g.op("MatMul", a, b)


@lower(aten.addmm.default, check=_inner_check, symbolic=True)
def addmm(g, node, bias, a, b, *, beta=1, alpha=1):
    if not is_float(out_dtype(node)):  # Gemm is float-only
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
    else:
        product = g.op("ReduceSum", g.op("MatMul", a, b), g.ints([0]), keepdims=0)
    return _scaled_sum(g, node, product, bias, beta, alpha)
