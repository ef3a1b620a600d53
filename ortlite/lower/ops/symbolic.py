"""Integer size arithmetic (SymInt nodes) in dynamic-shape graphs. Every such node's meta
value is a sympy expression over the input sizes, so one lowering serves them all: the
builder computes the expression in the graph from the inputs' shapes. Where the graph has
no input of some symbol in it (a partition sees h // 2, not h), the node is computed from
its own operands instead."""

from __future__ import annotations

import operator

import torch

from ..builder import SymbolicShapeError
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
    operator.pow,
    torch.sym_max,
    torch.sym_min,
    torch.sym_sum,
    check=_integer_result,
)
def size_arithmetic(g, node, *args):
    try:
        return g.sym(meta(node))
    except SymbolicShapeError:
        if node.target is aten.sym_size.int:
            tensor, dim = args
            return g.op("Gather", g.op("Shape", tensor), g.const(dim, torch.int64), axis=0)
        if node.target not in _BINARY or (node.target is operator.floordiv and not (isinstance(args[1], int) and args[1] > 0)):
            raise  # (floor division by a size that may be zero at run time)
        a, b = [v if isinstance(v, str) else g.sym(v) for v in args]
        if node.target is operator.floordiv:  # Python's floor, for a positive constant divisor
            return g.op("Div", g.op("Sub", a, g.op("Mod", a, b, fmod=0)), b)
        return g.op(_BINARY[node.target], a, b)


_BINARY = {operator.add: "Add", operator.sub: "Sub", operator.mul: "Mul", operator.floordiv: "Div"}


@lower(operator.truediv)
def size_division(g, node, a, b):
    """size / size is a float (a SymFloat), computed in float64 as Python does."""
    as_float = lambda v: g.cast(v, torch.float64) if isinstance(v, str) else g.const(float(v), torch.float64)  # noqa: E731
    return g.op("Div", as_float(a), as_float(b))
