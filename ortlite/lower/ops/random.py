"""Random ops of training graphs (Options.random; the decompositions that make these nodes
are in ortlite.decomp).

- ortlite::dropout_mask (random="torch", the default): dropout's keep-mask drawn by torch's
  generator exactly as eager's CPU kernel draws it (bernoulli_ on a fresh tensor of the
  input's size), from sizes alone: it runs in torch ahead of the graph, whose arithmetic
  stays in one ONNX Runtime session. Never lowered.
- ortlite::dropout and ortlite::uniform (random="onnxruntime"): drawn by ONNX Runtime
  (RandomUniform[Like]; dropout compares its values with p). Each node's generator lives in its
  session's kernel, seeded when the graph is lowered (see _seed); its torch implementation
  (where a node is left to torch) draws from torch's generator.
"""

from __future__ import annotations

import hashlib
import itertools
import weakref
from collections.abc import Sequence

import torch

from ..builder import TORCH_TO_ONNX
from ..registry import lower
from .common import as_value, out_dtype, out_shape

DRAWN_BY_TORCH = "a dropout mask drawn by torch's generator ahead of the graph, as eager draws it (Options(random='onnxruntime') draws it in ONNX Runtime)"


@torch.library.custom_op("ortlite::dropout_mask", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def dropout_mask(size: Sequence[int], p: float, device: torch.device, call: int) -> torch.Tensor:
    """True where native_dropout(x, p, True) keeps an element of x (x of this size): the
    same draws as aten's CPU kernel. (call: a number of its own per call, see CALLS.)"""
    return torch.empty(size, dtype=torch.bool, device=device).bernoulli_(1 - p)


@dropout_mask.register_fake
def _(size, p, device, call):
    return torch.empty(size, dtype=torch.bool, device=device)


@torch.library.custom_op("ortlite::dropout", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def dropout(x: torch.Tensor, p: float, call: int) -> tuple[torch.Tensor, torch.Tensor]:
    """native_dropout(x, p, train=True), drawn in ONNX Runtime where lowered."""
    out, mask = torch.ops.aten.native_dropout.default(x, p, True)
    return out, mask


@dropout.register_fake
def _(x, p, call):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


@torch.library.custom_op("ortlite::uniform", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def uniform(size: Sequence[int], dtype: torch.dtype, device: torch.device, call: int) -> torch.Tensor:
    """torch.rand(size), drawn in ONNX Runtime where lowered."""
    return torch.rand(size, dtype=dtype, device=device)


@uniform.register_fake
def _(size, dtype, device, call):
    return torch.empty(size, dtype=dtype, device=device)


# aot_autograd's common-subexpression pass merges equal calls of ops it does not list as
# random (compile_utils.rand_ops; the nondeterministic_seeded tag is not read): each
# call these ops take a number of its own, from here, so that no two are equal.
CALLS = itertools.count()
NUMBERED = (torch.ops.ortlite.dropout_mask.default, torch.ops.ortlite.dropout.default, torch.ops.ortlite.uniform.default)


@lower(torch.ops.ortlite.dropout_mask.default, check=lambda node: DRAWN_BY_TORCH)
def _dropout_mask(g, node, *args):
    raise AssertionError("ortlite::dropout_mask runs in torch")  # (its check refuses every node)


_graph_seeds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _seed(node: torch.fx.Node, bits: int) -> int:
    """The seed of a random node's ONNX Runtime generator: a hash of torch's CPU generator
    state when the graph is lowered (read, not advanced), the graph (its nodes with their
    arguments and sizes) and the node's name. The same program after the same
    torch.manual_seed draws the same masks; two nodes draw apart, and so do graphs that
    differ in sizes or constants alone (a recompile for new sizes, a specialization: with
    their ops alone hashed, each such session repeated the first one's masks call by call).
    Hashed: ORT's RandomUniform generator is a linear congruential one, whose streams from
    adjacent seeds are alike. The generator then advances call by call: each call gets
    new masks."""
    graph = node.graph
    base = _graph_seeds.get(graph)
    if base is None:
        digest = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
        for n in graph.nodes:
            val = n.meta.get("val")
            args = n.args[:-1] if n.target in NUMBERED else n.args  # (not the call's number: it differs per trace)
            digest.update(f"{n.op} {n.target} {n.name} {args} {n.kwargs} {tuple(val.shape) if isinstance(val, torch.Tensor) else ''}\n".encode())
        base = _graph_seeds[graph] = digest.hexdigest()
    digest = hashlib.sha256(f"{base} {node.name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (1 << bits)


def _dropout_check(node):
    p = node.args[1]
    if not isinstance(p, float) or not 0 <= p < 1:
        return "dropout probability not a number in [0, 1)"  # (ONNX's ratio is < 1)
    return None


@lower(torch.ops.ortlite.dropout.default, check=_dropout_check)
def _dropout(g, node, x, p, call):
    # Not ONNX's Dropout: ONNX Runtime's CPU kernel seeds a new linear congruential generator
    # with seed + 1 at each call, so call j's value at element k is call 0's shifted by a
    # constant of k (16807**k / (2**31 - 1), mod 1): element 0 kept or dropped call after
    # call, each element's masks far from independent. RandomUniformLike keeps one stream a
    # node, continued call to call.
    uniform = g.op("RandomUniformLike", x, dtype=TORCH_TO_ONNX[torch.float32], low=0.0, high=1.0, seed=float(_seed(node, 24)))
    keep = g.op("GreaterOrEqual", uniform, g.const(p, torch.float32))
    kept = g.op("Where", keep, x, g.const(0.0, x.dtype))
    return g.op("Mul", kept, g.const(1.0 / (1.0 - p), x.dtype)), keep


def _uniform_check(node):
    return None if out_dtype(node) in (torch.float16, torch.float32, torch.float64) else f"random values of dtype {out_dtype(node)}"


@lower(torch.ops.ortlite.uniform.default, check=_uniform_check)
def _uniform(g, node, size, dtype, device, call):
    shape, onnx_dtype = out_shape(node), TORCH_TO_ONNX[out_dtype(node)]
    # aten's values are in [0, 1); ORT's float generator can round up to its high end
    high = float(torch.tensor(1.0, dtype=dtype).nextafter(torch.tensor(0.0, dtype=dtype)))
    seed = float(_seed(node, 24))  # (a float attribute: integers past 2**24 would round)
    if all(isinstance(d, int) for d in shape):
        return g.op("RandomUniform", dtype=onnx_dtype, shape=list(shape), low=0.0, high=high, seed=seed)
    like = g.op("Expand", as_value(g, 0, dtype), g.shape(shape))
    return g.op("RandomUniformLike", like, dtype=onnx_dtype, low=0.0, high=high, seed=seed)
