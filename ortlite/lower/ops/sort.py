"""topk and sort through ONNX TopK. aten orders NaN above everything; ONNX Runtime's TopK
does not, so float keys are widened and NaN mapped above +inf. TopK breaks ties by the
lower index first, as aten's stable sort does."""

from __future__ import annotations


import torch

from ..builder import Value
from ..registry import lower
from .common import aten, arg_val, indices_used, norm_dim, out_shape

WIDER = {torch.float32: torch.float64, torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _sort_key(g, x: Value) -> str:
    """A key whose order is aten's: finite < inf < NaN (NaN is the largest)."""
    if x.dtype == torch.bool:
        return g.cast(x, torch.uint8)
    if x.dtype not in WIDER:
        return x  # integers
    wide = WIDER[x.dtype]
    w = g.cast(x, wide)
    top = torch.finfo(wide).max
    w = g.op("Where", g.op("IsInf", x, detect_negative=0), g.const(top, wide), w)
    return g.op("Where", g.op("IsNaN", x), g.const(float("inf"), wide), w)


def _check(node):
    x = arg_val(node, 0)
    if x.dtype == torch.float64:
        return "float64 keys (no wider dtype to order NaN above inf)"
    if node.target is aten.topk.default:
        k = node.args[1]
        is_sorted = node.args[5] if len(node.args) > 5 else node.kwargs.get("sorted", True)
        if not is_sorted and k > 1:
            return "topk(sorted=False): aten's order is unspecified"
    stable = node.target is aten.sort.stable and node.kwargs.get("stable")
    if indices_used(node) and not stable:
        return "indices of equal values: aten's order is unspecified (only stable=True sorts are reproducible)"
    return None


def _topk(g, node, x: Value, k: int, dim: int, largest: bool):
    values_shape = out_shape(node)
    if x.rank == 0:
        return g.op("Identity", x), g.op("Identity", g.const(0, torch.int64))
    axis = norm_dim(dim, x.rank)
    if 0 in values_shape:
        return g.op("Expand", g.const(0, x.dtype), g.ints(values_shape)), g.op("Expand", g.const(0, torch.int64), g.ints(values_shape))
    _, indices = g.op("TopK", _sort_key(g, x), g.ints([k]), axis=axis, largest=int(largest), sorted=1, outputs=2)
    return g.op("GatherElements", x, indices, axis=axis), indices


@lower(aten.topk.default, check=_check)
def topk(g, node, x, k, dim=-1, largest=True, sorted=True):
    return _topk(g, node, x, k, dim, largest)


@lower(aten.sort.default, check=_check)
def sort(g, node, x, dim=-1, descending=False):
    return _topk(g, node, x, x.shape[norm_dim(dim, x.rank)] if x.rank else 1, dim, descending)


@lower(aten.sort.stable, check=_check)
def sort_stable(g, node, x, *, stable=None, dim=-1, descending=False):
    return sort(g, node, x, dim, descending)
