"""Shape and view ops, copies and dtype conversion. Views become copies: the graphs
aot_autograd hands over are functional, so no caller can observe the difference."""

from __future__ import annotations

import torch

from ..registry import lower
from .common import aten, norm_dim, out_dtype, out_shape

INT64_MAX = 2**63 - 1


def reshape_to(g, x, shape):
    # allowzero: a 0 in the target shape means an empty dim, not "copy the input's dim"
    return g.op("Reshape", x, g.shape(shape), allowzero=1)


@lower(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    symbolic=True,
)
def view(g, node, x, *_):
    return reshape_to(g, x, out_shape(node))


@lower(aten.unsqueeze.default, symbolic=True)
def unsqueeze(g, node, x, dim):
    return g.op("Unsqueeze", x, g.ints([norm_dim(dim, x.rank + 1)]))


@lower(aten.permute.default, symbolic=True)
def permute(g, node, x, dims):
    return g.op("Transpose", x, perm=[norm_dim(d, x.rank) for d in dims]) if x.rank else g.op("Identity", x)


@lower(aten.t.default, symbolic=True)
def t(g, node, x):
    return g.op("Transpose", x, perm=[1, 0]) if x.rank == 2 else g.op("Identity", x)


@lower(aten.expand.default, symbolic=True)
def expand(g, node, x, *_):
    return g.op("Expand", x, g.shape(out_shape(node)))


@lower(aten.cat.default, symbolic=True)
def cat(g, node, tensors, dim=0):
    dtype, rank = out_dtype(node), len(out_shape(node))
    # aten skips legacy empty 1-D tensors when concatenating tensors of higher rank
    parts = [g.cast(t, dtype) for t in tensors if not (_is_legacy_empty(t) and rank != 1)]
    if not parts:
        return g.op("Identity", g.cast(tensors[0], dtype))
    return g.op("Concat", *parts, axis=norm_dim(dim, rank))


def _is_legacy_empty(t) -> bool:
    return len(t.shape) == 1 and isinstance(t.shape[0], int) and t.shape[0] == 0


def _static_step(node):
    step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
    return None if isinstance(step, int) else "symbolic slice step"


@lower(aten.slice.Tensor, check=_static_step, symbolic=True)
def slice_(g, node, x, dim=0, start=None, end=None, step=1):
    if x.rank == 0:
        return g.op("Identity", x)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    return g.op("Slice", x, g.shape([start]), g.shape([end]), g.ints([norm_dim(dim, x.rank)]), g.ints([step]))


@lower(aten.select.int, symbolic=True)
def select(g, node, x, dim, index):
    index = index if isinstance(index, str) else g.const(index, torch.int64)
    return g.op("Gather", x, index, axis=norm_dim(dim, x.rank))


@lower(aten.clone.default, aten.alias.default, aten.detach.default, symbolic=True)
def clone(g, node, x, **_):
    return g.op("Identity", x)


def _to_copy_check(node):
    source = node.args[0].meta["val"]
    if node.meta["val"].device != source.device:
        return "device transfer"
    return None


@lower(aten._to_copy.default, check=_to_copy_check, symbolic=True)
def to_copy(g, node, x, **_):
    return g.op("Identity", g.cast(x, out_dtype(node)))


@lower(aten.split_with_sizes.default, aten.split.Tensor, symbolic=True)
def split(g, node, x, split, dim=0):
    dim = norm_dim(dim, x.rank)
    sizes = [t.shape[dim] for t in node.meta["val"]]
    if len(sizes) == 1:
        return (g.op("Identity", x),)
    return g.op("Split", x, g.shape(sizes), axis=dim, outputs=len(sizes))


@lower(aten.lift_fresh_copy.default, symbolic=True)
def lift_fresh_copy(g, node, x):
    return g.op("Identity", x)


@lower(torch.ops.prims.convert_element_type.default, symbolic=True)
def convert_element_type(g, node, x, dtype):
    return g.op("Identity", g.cast(x, out_dtype(node)))
