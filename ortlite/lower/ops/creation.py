"""Factory ops. With static arguments their values are known at compile time: aten
computes them (so they match eager exactly) and they become initializers, or an Expand
of a scalar where the tensor would be large."""

from __future__ import annotations

import math

import torch

from ..builder import Value
from ..registry import lower
from .common import as_value, aten, is_static, out_dtype, out_shape

SMALL = 4096


def _fill(g, node, value):
    dtype, shape = out_dtype(node), out_shape(node)
    scalar = as_value(g, value, dtype)  # a number, or a size computed in the graph
    if not shape:
        return g.op("Identity", scalar)
    return g.op("Expand", scalar, g.shape(shape))


@lower(aten.full.default, symbolic=True)
def full(g, node, size, fill_value, **_):
    return _fill(g, node, fill_value)


@lower(aten.full_like.default, symbolic=True)
def full_like(g, node, x, fill_value, **_):
    return _fill(g, node, fill_value)


@lower(aten.scalar_tensor.default, symbolic=True)
def scalar_tensor(g, node, value, **_):
    return _fill(g, node, value)


def _arange_bounds(target, args, kwargs) -> tuple:
    """(start, end, step) of an arange call: numbers, or size nodes / their values."""
    if target == aten.arange.default:
        return 0, args[0], 1
    if target == aten.arange.start:
        return args[0], args[1], 1
    return args[0], args[1], args[2] if len(args) > 2 else kwargs.get("step", 1)


def _arange_check(node):
    if is_static(out_shape(node)):
        return "large arange" if math.prod(out_shape(node)) > SMALL * 64 else None
    # symbolic length: ONNX Range over int64 gives aten's values exactly for integer bounds
    if any(isinstance(b, float) for b in _arange_bounds(node.target, node.args, node.kwargs)):
        return "arange with float bounds and a symbolic length"
    return None


@lower(aten.arange.start_step, aten.arange.default, aten.arange.start, check=_arange_check, symbolic=True)
def arange(g, node, *args, **kwargs):
    dtype = out_dtype(node)
    if not is_static(out_shape(node)):
        start, end, step = (as_value(g, b, torch.int64) for b in _arange_bounds(node.target, args, kwargs))
        return g.op("Identity", g.cast(Value(g.op("Range", start, end, step), torch.int64, out_shape(node)), dtype))
    kwargs = {**kwargs, "device": "cpu", "pin_memory": False}
    return g.op("Identity", g.const(node.target(*args, **kwargs), dtype))

