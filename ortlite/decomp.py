"""ortlite's decomposition tables for aot_autograd and torch.export."""

from __future__ import annotations

import functools

import torch

from .lower.registry import LOWERINGS

aten = torch.ops.aten

# Decompositions that are kept out even though ortlite does not lower the op: the core
# table's decomposition of CPU flash attention gives training gradients that differ from
# eager (measured on a LLaMA train step: up to 0.04 against gradients of ~1e-3).
EXCLUDED = {aten._scaled_dot_product_flash_attention_for_cpu.default}


def _without_lowered(table) -> dict:
    return {op: fn for op, fn in table.items() if op not in LOWERINGS and op not in EXCLUDED}


@functools.cache
def decomposition_table() -> dict:
    """Core ATen decompositions, minus the ops ortlite lowers whole (ORT runs them faster
    as one node: gelu, native_layer_norm, _softmax, addmm, ...). For aot_autograd, which
    decomposes CompositeImplicitAutograd ops itself: only the post-autograd part, built
    in milliseconds (the full table takes ~0.25 s, a third of a first call)."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd as post_autograd
    except ImportError:
        from torch._decomp import core_aten_decompositions as post_autograd
    return _without_lowered(post_autograd())


@functools.cache
def export_decomposition_table() -> dict:
    """The same for ExportedProgram.run_decompositions, which also needs the
    CompositeImplicitAutograd entries."""
    from torch._decomp import core_aten_decompositions

    return _without_lowered(core_aten_decompositions())
