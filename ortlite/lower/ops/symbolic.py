"""Integer size arithmetic (SymInt nodes) in dynamic-shape graphs. Every such node's meta
value is a sympy expression over the input sizes, so one lowering serves them all: the
builder computes the expression in the graph from the inputs' shapes. Where the graph has
no input of some symbol in it (a partition sees h // 2, not h), the node is computed from
its own operands instead."""

from __future__ import annotations

import math
import operator

import torch

from ..builder import TORCH_TO_ONNX, SymbolicShapeError
from ..registry import lower, meta
from .common import aten


def _integer_result(node):
    return None if isinstance(meta(node), (int, torch.SymInt)) else f"non-integer result {type(meta(node)).__name__}"


def _number_result(node):
    return None if isinstance(meta(node), (int, float, torch.SymInt, torch.SymFloat)) else f"result {type(meta(node)).__name__}"


@lower(
    aten.sym_size.int,
    aten.sym_numel.default,
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
    if isinstance(meta(node), (float, torch.SymFloat)):  # Python's float arithmetic, in float64 as Python does
        a, b = [_as_float(g, v) for v in args]
        return g.op(_BINARY[node.target], a, b)
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


@lower(operator.add, operator.sub, operator.mul, check=_number_result)
def number_arithmetic(g, node, *args):
    return size_arithmetic(g, node, *args)


_BINARY = {operator.add: "Add", operator.sub: "Sub", operator.mul: "Mul", operator.floordiv: "Div"}


def _as_float(g, v):
    return g.cast(v, torch.float64) if isinstance(v, str) else g.const(float(v), torch.float64)


@lower(operator.truediv)
def size_division(g, node, a, b):
    """size / size is a float (a SymFloat), computed in float64 as Python does."""
    return g.op("Div", _as_float(g, a), _as_float(g, b))


@lower(torch.sym_float)
def sym_float(g, node, a):
    return _as_float(g, a)


@lower(math.trunc, math.floor, math.ceil, check=_integer_result)
def float_to_size(g, node, x):
    """A float (e.g. a scaled size) to an int, as Python rounds it; Cast truncates."""
    x = _as_float(g, x)
    if node.target is not math.trunc:
        x = g.op("Floor" if node.target is math.floor else "Ceil", x)
    return g.op("Cast", x, to=TORCH_TO_ONNX[torch.int64])
