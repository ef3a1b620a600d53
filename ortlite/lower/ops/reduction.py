"""Reductions over dim lists, keepdim and dtype."""

from __future__ import annotations

import torch

from ..builder import TORCH_TO_ONNX, Value
from ..registry import lower
from .common import aten, is_float, may_be_zero, norm_dims, out_dtype


def _reduce(g, node, op_type, x, dims, keepdim):
    x = g.cast(x, out_dtype(node))
    if x.rank == 0:
        return g.op("Identity", x)
    # aten: an empty (or absent) dim list reduces every dim
    axes = norm_dims(dims, x.rank) if dims else []
    if not axes:
        return g.op(op_type, x, keepdims=int(keepdim))
    return g.op(op_type, x, g.ints(axes), keepdims=int(keepdim))


def _nonempty_check(node):
    """mean/amax/amin over no elements: NaN or an error in aten, 0 or -inf in ORT."""
    x = node.args[0].meta["val"]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if x.dim() == 0:
        return None
    axes = norm_dims(dims, x.dim()) if dims else range(x.dim())
    return "reduction over a dim that may be empty" if any(may_be_zero(x.shape[a]) for a in axes) else None


@lower(aten.sum.dim_IntList, aten.sum.default, symbolic=True)
def sum_(g, node, x, dim=None, keepdim=False, *, dtype=None):
    return _reduce(g, node, "ReduceSum", x, dim, keepdim)


@lower(aten.mean.dim, aten.mean.default, check=_nonempty_check, symbolic=True)
def mean(g, node, x, dim=None, keepdim=False, *, dtype=None):
    return _reduce(g, node, "ReduceMean", x, dim, keepdim)


@lower(aten.amax.default, check=_nonempty_check, symbolic=True)
def amax(g, node, x, dim=(), keepdim=False):
    return _propagate_nan(g, node, x, dim, keepdim, _reduce(g, node, "ReduceMax", x, dim, keepdim))


@lower(aten.amin.default, check=_nonempty_check, symbolic=True)
def amin(g, node, x, dim=(), keepdim=False):
    return _propagate_nan(g, node, x, dim, keepdim, _reduce(g, node, "ReduceMin", x, dim, keepdim))


def _propagate_nan(g, node, x, dim, keepdim, reduced):
    """aten's max/min reductions return NaN where any reduced element is NaN; ORT's do not."""
    if not is_float(x.dtype) or x.rank == 0:
        return reduced
    any_nan = _reduce(g, node, "ReduceMax", Value(g.op("Cast", g.op("IsNaN", x), to=TORCH_TO_ONNX[x.dtype]), x.dtype, x.shape), dim, keepdim)
    return g.op("Where", g.op("Cast", any_nan, to=TORCH_TO_ONNX[torch.bool]), g.const(float("nan"), x.dtype), reduced)
