"""Integer size arithmetic (SymInt nodes) in dynamic-shape graphs. Every such node's meta
value is a sympy expression over the input sizes, so one lowering serves them all: the
builder computes the expression in the graph from the inputs' shapes."""

from __future__ import annotations

import operator

import torch

from ..registry import lower, meta
from .common import aten


def _integer_result(node):
    return None if isinstance(meta(node), (int, torch.SymInt)) else f"non-integer result {type(meta(node)).__name__}"


@lower(
    aten.sym_size.int,
    aten.sym_numel.default,
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.mod,
    operator.neg,
    torch.sym_max,
    torch.sym_min,
    check=_integer_result,
)
def size_arithmetic(g, node, *args):
    return g.sym(meta(node))


@lower(operator.truediv)
def size_division(g, node, a, b):
    """size / size is a float (a SymFloat), computed in float64 as Python does."""
    as_float = lambda v: g.cast(v, torch.float64) if isinstance(v, str) else g.const(float(v), torch.float64)  # noqa: E731
    return g.op("Div", as_float(a), as_float(b))
