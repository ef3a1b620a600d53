"""Matrix products."""

from __future__ import annotations

from ..registry import lower
from .common import aten, is_float, out_dtype, out_shape


def _zeros(g, node):
    return g.op("Expand", g.const(0, out_dtype(node)), g.ints(out_shape(node)))


@lower(aten.mm.default, aten.bmm.default, symbolic=True)
def mm(g, node, a, b):
    if a.shape[-1] == 0:
        # ONNX Runtime's MatMul over an empty inner dim leaves a bound output unwritten
        return _zeros(g, node)
    return g.op("MatMul", a, b)


def _float_only(node):
    return None if is_float(out_dtype(node)) else "non-float addmm"


@lower(aten.addmm.default, check=_float_only, symbolic=True)
def addmm(g, node, bias, a, b, *, beta=1, alpha=1):
    if a.shape[-1] == 0:  # a @ b is zeros (and ONNX Runtime's Gemm would leave it unwritten)
        if beta == 0:
            return _zeros(g, node)
        scaled = g.op("Mul", g.cast(bias, out_dtype(node)), g.const(beta, out_dtype(node)))
        return g.op("Expand", scaled, g.ints(out_shape(node)))
    if beta == 0:  # aten ignores the bias entirely, NaN and inf included
        return g.op("Gemm", a, b, alpha=float(alpha))
    return g.op("Gemm", a, b, g.cast(bias, out_dtype(node)), alpha=float(alpha), beta=float(beta))
