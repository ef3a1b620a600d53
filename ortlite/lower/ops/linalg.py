"""Matrix products."""

from __future__ import annotations

from ..registry import lower
from .common import aten, is_float, out_dtype


@lower(aten.mm.default, aten.bmm.default, symbolic=True)
def mm(g, node, a, b):
    return g.op("MatMul", a, b)


def _float_only(node):
    return None if is_float(out_dtype(node)) else "non-float addmm"


@lower(aten.addmm.default, check=_float_only, symbolic=True)
def addmm(g, node, bias, a, b, *, beta=1, alpha=1):
    if beta == 0:  # aten ignores the bias entirely, NaN and inf included
        return g.op("Gemm", a, b, alpha=float(alpha))
    return g.op("Gemm", a, b, g.cast(bias, out_dtype(node)), alpha=float(alpha), beta=float(beta))
