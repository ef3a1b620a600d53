"""ortlite's decomposition table for aot_autograd and torch.export."""

from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions

from .lower.registry import LOWERINGS

aten = torch.ops.aten

# Decompositions that are kept out even though ortlite does not lower the op: the core
# table's decomposition of CPU flash attention gives training gradients that differ from
# eager (measured on a LLaMA train step: up to 0.04 against gradients of ~1e-3).
EXCLUDED = {aten._scaled_dot_product_flash_attention_for_cpu.default}


@functools.cache
def decomposition_table() -> dict:
    """Core ATen decompositions, minus the ops ortlite lowers whole (ORT runs them faster
    as one node: gelu, native_layer_norm, _softmax, addmm, ...)."""
    table = dict(core_aten_decompositions())
    return {op: fn for op, fn in table.items() if op not in LOWERINGS and op not in EXCLUDED}
