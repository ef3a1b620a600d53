"""Decode loops ahead of time: a causal LM's step compiled with its KV cache held as buffers the
step mutates (a static cache: fixed-size buffers, written at the step's positions), and a greedy
loop over such a step. See docs/decode-loops.md.

A step is any callable step(input_ids=(B, S) int64, cache_position=(S,) int64) -> logits
(B, S, vocab) that keeps its cache itself: transformers' TorchExportableModuleWithStaticCache,
exported and compiled by compile_static_cache_step, is one."""

from __future__ import annotations

import torch

from .options import Options


def compile_static_cache_step(
    model, max_cache_len: int, *, batch_size: int = 1, example_length: int = 2, last_logits_only: bool = True,
    separate_decode: bool | None = None, options: Options | dict | None = None,
):
    """ortlite.compile of a transformers causal LM's step with a static KV cache of
    max_cache_len positions (transformers' TorchExportableModuleWithStaticCache, exported
    with torch.export in strict mode, the sequence length dynamic): a StaticCacheStep,
    called step(input_ids=(B, S), cache_position=(S,)) for the prompt and each new token.

    last_logits_only: the step returns the logits of the last position alone, (B, 1, vocab),
    as generation needs (the model's logits_to_keep=1: the LM head on one row, not on the
    whole prompt). separate_decode: one token (S = 1) runs a graph of its own, compiled with
    static sizes, beside the graph for S >= 2 (both write the same cache buffers); None: so
    where options quantize (int4's 1-row kernel then needs no choice per call; weights are
    held once per graph, so a float32 model keeps one graph by default). Needs transformers
    (imported here only). The cache buffers belong to the step; the model's weights become
    initializers (a later change of the model's weights is not seen)."""
    import inspect

    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    options = Options.coerce(options)
    if separate_decode is None:
        separate_decode = options.quantize is not None
    least = 2 if separate_decode else 1
    if example_length < 2 or example_length > max_cache_len:
        raise ValueError(f"example_length must be in [2, max_cache_len], got {example_length} (torch.export specializes a size of 1)")
    config = model.generation_config
    kept = config.cache_implementation
    config.cache_implementation = "static"  # the wrapper asserts it
    try:
        wrapper = TorchExportableModuleWithStaticCache(model, batch_size=batch_size, max_cache_len=max_cache_len)
    finally:
        config.cache_implementation = kept
    if last_logits_only:
        if "logits_to_keep" not in inspect.signature(type(model).forward).parameters:
            raise ValueError(f"last_logits_only: {type(model).__name__}.forward takes no logits_to_keep")
        wrapper.model = _LastPosition(model)
    from .aot import compile as aot_compile
    from .aot import export_to_aten

    def compiled(length, dynamic):
        kwargs = {"input_ids": torch.zeros((batch_size, length), dtype=torch.long), "cache_position": torch.arange(length)}
        shapes = None
        if dynamic:
            size = torch.export.Dim("sequence_length", min=least, max=max_cache_len)
            shapes = {"input_ids": {1: size}, "cache_position": {0: size}}
        with torch.no_grad():
            # strict: torch 2.13's non-strict export of this wrapper failed later, in run_decompositions
            program = export_to_aten(wrapper, (), kwargs, shapes, strict=True)
            return aot_compile(program, options=options)

    prompt = compiled(example_length, True)
    decode = compiled(1, False) if separate_decode else None
    return StaticCacheStep(prompt, decode)


class StaticCacheStep:
    """A compiled step with a static KV cache (compile_static_cache_step): prompt, a
    CompiledModel for S >= 1 (S >= 2 where decode is one), and decode, one for S = 1 or
    None. Both write the same buffers (`buffers`: name -> tensor)."""

    def __init__(self, prompt, decode=None):
        self.prompt, self.decode = prompt, decode
        self.buffers = prompt._buffers
        if decode is not None:  # the same buffers for both (export keeps the module's own; made so if not)
            weights = list(decode._weights)
            for i, target in enumerate(decode._weight_targets):
                if target in self.buffers:
                    weights[i] = self.buffers[target]
            decode._weights, decode._buffers = tuple(weights), self.buffers

    def __call__(self, *, input_ids, cache_position):
        if self.decode is not None and input_ids.shape[-1] == 1:
            return self.decode(input_ids=input_ids, cache_position=cache_position)
        return self.prompt(input_ids=input_ids, cache_position=cache_position)


class _LastPosition(torch.nn.Module):
    """model(..., logits_to_keep=1): the logits of the last position alone."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, **kwargs):
        return self.inner(**kwargs, logits_to_keep=1)


def generate(step, input_ids: torch.Tensor, max_new_tokens: int, *, eos_token_id: int | None = None, on_token=None) -> torch.Tensor:
    """Greedy decoding with a step that keeps its cache (see the module's doc): the prompt
    input_ids (B, P) in one call at positions 0..P-1, then one call per new token. Returns
    the new tokens (B, max_new_tokens), fewer where every row has made eos_token_id.
    on_token(): called after each new token is chosen (timing)."""
    if input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be a (batch, length) int64 tensor, got {input_ids.dtype} {tuple(input_ids.shape)}")
    batch, length = input_ids.shape
    if max_new_tokens < 1:
        return input_ids.new_empty((batch, 0))
    positions = torch.arange(length + max_new_tokens)
    out = torch.empty((batch, max_new_tokens), dtype=torch.long)
    chosen = out.numpy()  # (numpy's argmax over a vocabulary: ~2 µs, torch's ~45; both take the first of equal maxima, and NaN as the max)
    logits = step(input_ids=input_ids, cache_position=positions[:length])
    chosen[:, 0] = logits[:, -1].detach().numpy().argmax(-1)
    done = None if eos_token_id is None else out[:, 0] == eos_token_id
    if on_token is not None:
        on_token()
    for i in range(1, max_new_tokens):
        if done is not None and bool(done.all()):
            return out[:, :i]
        logits = step(input_ids=out[:, i - 1 : i], cache_position=positions[length + i - 1 : length + i])
        chosen[:, i] = logits[:, -1].detach().numpy().argmax(-1)
        if done is not None:
            out[:, i].masked_fill_(done, eos_token_id)  # a finished row keeps repeating eos
            done |= out[:, i] == eos_token_id
        if on_token is not None:
            on_token()
    return out


def cache_tensors(step) -> list[torch.Tensor]:
    """The buffers a compiled step (a CompiledModel or a StaticCacheStep) mutates (its cache
    and counters), in the step's order."""
    from torch.export.graph_signature import OutputKind

    step = step.prompt if isinstance(step, StaticCacheStep) else step
    return [step._buffers[target] for kind, target in step._mutations if kind == OutputKind.BUFFER_MUTATION]
