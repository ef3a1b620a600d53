"""Factory ops. With static arguments their values are known at compile time: aten
computes them (so they match eager exactly) and they become initializers, or an Expand
of a scalar where the tensor would be large."""

from __future__ import annotations

import math

import torch

from ..builder import Value
from ..registry import lower
from .common import as_value, aten, is_float, is_static, out_dtype, out_shape

SMALL = 4096


def _fill(g, node, value):
    dtype, shape = out_dtype(node), out_shape(node)
    scalar = as_value(g, value, dtype)  # a number, or a size computed in the graph
    if not shape:  # the constant itself: ONNX Runtime's fusions (and ortlite's) match initializers
        return scalar
    return g.op("Expand", scalar, g.shape(shape))


@lower(aten.full.default)
def full(g, node, size, fill_value, **_):
    return _fill(g, node, fill_value)


@lower(aten.full_like.default)
def full_like(g, node, x, fill_value, **_):
    return _fill(g, node, fill_value)


@lower(aten.zeros.default, aten.zeros_like.default, aten.empty_like.default)  # empty_like: any contents are right, zeros cost least
def zeros(g, node, *_, **__):
    return _fill(g, node, 0)


@lower(aten.fill.Scalar)
def fill(g, node, x, value):
    return _fill(g, node, value)


@lower(aten.ones.default, aten.ones_like.default)
def ones(g, node, *_, **__):
    return _fill(g, node, 1)


@lower(aten.scalar_tensor.default)
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


@lower(aten.arange.start_step, aten.arange.default, aten.arange.start, check=_arange_check)
def arange(g, node, *args, **kwargs):
    dtype = out_dtype(node)
    bounds = _arange_bounds(node.target, args, kwargs)
    if not is_static(out_shape(node)) or any(isinstance(b, Value) for b in bounds):  # (a size node's value)
        start, end, step = (as_value(g, b, torch.int64) for b in bounds)
        return g.op("Identity", g.cast(Value(g.op("Range", start, end, step), torch.int64, out_shape(node)), dtype))
    kwargs = {**kwargs, "device": "cpu", "pin_memory": False}
    return g.op("Identity", g.const(node.target(*args, **kwargs), dtype))


def _space_check(node):
    return "large linspace" if math.prod(out_shape(node)) > SMALL * 64 else None


def _constant_check(node):
    if not is_static(out_shape(node)):
        return "symbolic sizes"
    return "large constant" if math.prod(out_shape(node)) > SMALL * 64 else None


@lower(aten.triu_indices.default, aten.tril_indices.default, check=_constant_check)
def triangle_indices(g, node, *args, **kwargs):
    kwargs = {**kwargs, "device": "cpu", "pin_memory": False}
    return g.op("Identity", g.const(node.target(*args, **kwargs), out_dtype(node)))


# Whole, not decomposed: the core decomposition of linspace rounds integer results
# differently from aten's kernel (linspace(4.3, 0, 50, dtype=int64) is off by one in 8 places).
@lower(aten.linspace.default, aten.logspace.default, check=_space_check)
def linspace(g, node, *args, **kwargs):
    kwargs = {**kwargs, "device": "cpu", "pin_memory": False}
    return g.op("Identity", g.const(node.target(*args, **kwargs), out_dtype(node)))


def _linspace_tensor_check(node):
    if not is_float(out_dtype(node)):
        return "integer linspace from tensors (aten's rounding; its decomposition's differs)"
    return _space_check(node)


@lower(aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor, check=_linspace_tensor_check)
def linspace_tensors(g, node, start, end, steps, **_):
    # aten's kernel: start + step * i for the first half, end - step * (steps - 1 - i) after
    dtype = out_dtype(node)
    start = g.op("Reshape", as_value(g, start, dtype), g.ints([1]))
    end = g.op("Reshape", as_value(g, end, dtype), g.ints([1]))
    if steps == 1:
        return g.op("Identity", start)
    if steps == 0:
        return g.op("Expand", g.const(0, dtype), g.ints([0]))
    step = g.op("Div", g.op("Sub", end, start), g.const(steps - 1, dtype))
    half = steps // 2
    i = torch.arange(steps)
    first = g.op("Add", start, g.op("Mul", step, g.const(i.to(dtype))))
    second = g.op("Sub", end, g.op("Mul", step, g.const((steps - 1 - i).to(dtype))))
    return g.op("Where", g.const(i < half), first, second)
