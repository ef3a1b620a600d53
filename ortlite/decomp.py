"""ortlite's decomposition tables for aot_autograd and torch.export."""

from __future__ import annotations

import functools

import torch

from . import complex as complex_ops
from .lower.ops import random
from .lower.registry import LOWERINGS

aten = torch.ops.aten

# Decompositions that are kept out even though ortlite does not lower the op: the core
# table's decomposition of CPU flash attention gives training gradients that differ from
# eager (measured on a LLaMA train step: up to 0.04 against gradients of ~1e-3).
EXCLUDED = {aten._scaled_dot_product_flash_attention_for_cpu.default}


# Lowered for ortlite.compile, where export's one-trace ATen keeps them (ortlite.aot), yet
# still decomposed by aot_autograd, so torch.compile's graphs stay as they were proven: its
# replay of output views over ONNX Runtime's compact outputs is proven on permute (a transpose
# left in a Qwen3-MoE training step's graph broke that replay), its strides on full and empty.
AUTOGRAD_DECOMPOSED = {
    aten.transpose.int, aten.zeros.default, aten.zeros_like.default, aten.empty_like.default,
    aten.ones.default, aten.ones_like.default, aten.fill.Scalar, aten.floor_divide.default,
}


def _without_lowered(table, keep=frozenset()) -> dict:
    return {op: fn for op, fn in table.items() if (op not in LOWERINGS or op in keep) and op not in EXCLUDED}


@functools.cache
def decomposition_table(random_ops: str = "torch") -> dict:
    """Core ATen decompositions, minus the ops ortlite lowers whole (ORT runs them faster
    as one node: gelu, native_layer_norm, _softmax, addmm, ...), plus complex arithmetic as
    real (ortlite.complex) and those of random ops that Options.random picks (random_ops:
    its value; see RANDOM). For aot_autograd, which
    decomposes CompositeImplicitAutograd ops itself: only the post-autograd part, built in
    milliseconds (the full table takes ~0.25 s, a third of a first call)."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd as post_autograd
    except ImportError:
        from torch._decomp import core_aten_decompositions as post_autograd
    table = {**_without_lowered(post_autograd(), keep=AUTOGRAD_DECOMPOSED), **RANDOM[random_ops]}
    return {**table, **complex_ops.chained(table)}  # complex arithmetic as real (ortlite.complex)


def _dropout_drawn_by_torch(x, p, train):
    """native_dropout on CPU: the mask drawn by torch from x's size alone (eager's draws),
    the rest arithmetic ONNX Runtime runs; the graph is not cut at each dropout."""
    if not train or x.device.type != "cpu" or not x.is_floating_point() or not isinstance(p, float) or not 0 < p < 1:
        return NotImplemented
    keep = random.dropout_mask(x.shape, p, x.device, next(random.CALLS))
    return x * keep * (1.0 / (1.0 - p)), keep


def _dropout_drawn_by_ort(x, p, train):
    if not train or not x.is_floating_point() or not isinstance(p, float):
        return NotImplemented
    return tuple(random.dropout(x, p, next(random.CALLS)))


def _uniform(size, dtype, device):
    dtype = dtype or torch.get_default_dtype()
    return random.uniform(size, dtype, device or torch.device("cpu"), next(random.CALLS)) if dtype.is_floating_point else NotImplemented


def _rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _uniform(size, dtype, device)


def _rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _uniform(x.shape, dtype or x.dtype, device or x.device)


def _bernoulli_p(x, p=0.5, *, generator=None):
    if generator is not None or not x.is_floating_point():
        return NotImplemented
    return (random.uniform(x.shape, torch.float32, x.device, next(random.CALLS)) < p).to(x.dtype)


def _bernoulli(x, *, generator=None):
    if generator is not None or not x.is_floating_point():
        return NotImplemented
    return (random.uniform(x.shape, x.dtype, x.device, next(random.CALLS)) < x).to(x.dtype)


# Options.random -> decompositions of random ops. (ONNX's Bernoulli is not used: ONNX
# Runtime 1.31's CPU kernel draws 1 with probability 1 - p.)
RANDOM = {
    "torch": {aten.native_dropout.default: _dropout_drawn_by_torch},
    "onnxruntime": {
        aten.native_dropout.default: _dropout_drawn_by_ort,
        aten.rand.default: _rand,
        aten.rand_like.default: _rand_like,
        aten.bernoulli.p: _bernoulli_p,
        aten.bernoulli.default: _bernoulli,
    },
}


@functools.cache
def export_decomposition_table() -> dict:
    """The same for ExportedProgram.run_decompositions, which also needs the
    CompositeImplicitAutograd entries."""
    from torch._decomp import core_aten_decompositions

    table = _without_lowered(core_aten_decompositions())
    return {**table, **complex_ops.chained(table)}
