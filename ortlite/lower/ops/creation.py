"""Factory ops. With static arguments their values are known at compile time: aten
computes them (so they match eager exactly) and they become initializers, or an Expand
of a scalar where the tensor would be large."""

from __future__ import annotations

import math

import torch

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


def _arange_check(node):
    if not is_static(out_shape(node)):
        return "arange of a symbolic length"
    return "large arange" if math.prod(out_shape(node)) > SMALL * 64 else None


@lower(aten.arange.start_step, aten.arange.default, aten.arange.start, check=_arange_check)
def arange(g, node, *args, **kwargs):
    kwargs = {**kwargs, "device": "cpu", "pin_memory": False}
    return g.op("Identity", g.const(node.target(*args, **kwargs), out_dtype(node)))
