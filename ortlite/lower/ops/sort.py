"""topk and sort through ONNX TopK. aten orders NaN above everything; ONNX Runtime's TopK
does not, so float keys are widened and NaN mapped above +inf. TopK breaks ties by the
lower index first, as aten's stable sort does."""

from __future__ import annotations


import torch

from torch.utils._sympy.functions import Min

from ..builder import Value, sym_expr
from ..registry import lower
from ..tie_order import TIE_ORDER, tie_order
from .common import any_true, aten, arg_val, known_empty, norm_dim, out_shape

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
    # topk(sorted=False): aten's order of the k is unspecified (its CPU kernel's differs from
    # its CUDA kernel's, and from the sorted one past a few keys); the sorted order TopK gives
    # is one aten allows, and mixture-of-experts routers (DeepSeek-V3 and its kin) use it.
    # docs/coverage.md, "Known differences from eager"; tests/test_ops_families.py.
    return None


def _tie_order_matters(node) -> bool:
    """Could equal keys make a result differ from aten's? Only a stable sort promises an
    order of ties (TopK's, lower index first); std::sort and std::partial_sort leave it
    open. The verdict (lower.tie_order) comes from the whole graph, marked before it was cut
    into parts; a graph nobody marked is judged alone (its outputs then include all that
    its parts hand on)."""
    verdict = node.meta.get(TIE_ORDER)
    return (verdict if verdict is not None else tie_order(node)).checked


def _topk(g, node, x: Value, k, dim: int, largest: bool):
    values_shape = out_shape(node)
    if x.rank == 0:
        return g.op("Identity", x), g.op("Identity", g.const(0, torch.int64))
    axis = norm_dim(dim, x.rank)
    if known_empty(values_shape):
        return g.op("Expand", g.const(0, x.dtype), g.shape(values_shape)), g.op("Expand", g.const(0, torch.int64), g.shape(values_shape))
    key = _sort_key(g, x)
    n = x.shape[axis]
    if _tie_order_matters(node) and not g.stable_ties:
        # the k + 1 largest keys strictly ordered: then every algorithm picks the same
        # indices in the same order, aten's included; equal ones: torch computes this call
        m = sym_expr(k) + 1
        m = Min(m, sym_expr(n)) if not (m.is_Integer and isinstance(n, int)) else min(int(m), n)
        top, _ = g.op("TopK", key, g.shape([m]), axis=axis, largest=int(largest), sorted=1, outputs=2)
        ends = g.shape([m])
        earlier = g.op("Slice", top, g.ints([0]), g.op("Sub", ends, g.ints([1])), g.ints([axis]))
        later = g.op("Slice", top, g.ints([1]), ends, g.ints([axis]))
        g.fallback_if(any_true(g, g.op("Equal", earlier, later)), "equal values, whose order in the indices aten leaves unspecified")
    _, indices = g.op("TopK", key, g.shape([k]), axis=axis, largest=int(largest), sorted=1, outputs=2)
    return g.op("GatherElements", x, indices, axis=axis), indices


@lower(aten.topk.default, check=_check)
def topk(g, node, x, k, dim=-1, largest=True, sorted=True):
    return _topk(g, node, x, arg_val(node, 1), dim, largest)  # k: a SymInt where symbolic


@lower(aten.sort.default, check=_check)
def sort(g, node, x, dim=-1, descending=False):
    return _topk(g, node, x, x.shape[norm_dim(dim, x.rank)] if x.rank else 1, dim, descending)


@lower(aten.sort.stable, check=_check)
def sort_stable(g, node, x, *, stable=None, dim=-1, descending=False):
    return sort(g, node, x, dim, descending)
