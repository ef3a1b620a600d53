"""HF generate with a static cache and forward compiled by ortlite, over the decoders in
transformers' static-cache list (`_can_compile_fullgraph`) that bench/zoo.py builds small:
compiled directly and through a wrapper function (`model.forward = torch.compile(f)`, f calling
the original forward), eager's tokens and logits through the same forward.

A wrapper that hides forward's signature (no functools.wraps) changes what generate passes:
generate reads `inspect.signature(model.forward)` to decide whether to pass position_ids and
whether to drop an all-ones attention mask, so through such a wrapper it passes no position_ids
and a 4D static-cache mask. OPT derives its positions from the mask when none are given (a
cumsum meant for a 2D mask) and fails ("too many values to unpack") in eager as under any
backend; the test holds ortlite to eager's outcome there, and to eager's tokens through a
wrapper made with functools.wraps (generate then sees forward's own parameters)."""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch

import ortlite
from conftest import assert_same

pytest.importorskip("transformers", reason="builds transformers models (the test extra)")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import zoo  # noqa: E402

pytestmark = pytest.mark.slow

# zoo's causal LMs in transformers' static-cache list, less the MoE ones (mixtral, qwen2_moe:
# ~20 s each to compile here; their attention is llama's and qwen2's)
DECODERS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "phi", "phi3", "gemma", "gemma2", "opt", "bloom", "falcon", "gpt_neox"]


def generate(model, ids):
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, cache_implementation="static", output_logits=True, return_dict_in_generate=True
        )
    return out.sequences, out.logits


def outcome(model, ids):
    """generate's tokens and logits, or the type of the error it raised."""
    try:
        return generate(model, ids)
    except Exception as e:  # (eager's own error through a signature-hiding wrapper: see the module's doc)
        return type(e)


@pytest.mark.parametrize(
    "name, wrapper", [(n, w) for w in ("direct", "wrapper") for n in DECODERS] + [("opt", "functools.wraps")]  # (the fix for OPT's case)
)
def test_static_cache_generate_direct_and_through_wrappers(name, wrapper):
    torch.manual_seed(0)
    model = zoo.ZOO[name].build().eval().requires_grad_(False)
    assert type(model)._can_compile_fullgraph  # (transformers' static-cache list)
    model.generation_config.pad_token_id = 0
    original = model.forward
    forward = original
    if wrapper != "direct":

        def forward(*args, **kwargs):
            return original(*args, **kwargs)

        if wrapper == "functools.wraps":
            forward = functools.wraps(original)(forward)
    ids = torch.randint(3, zoo.VOCAB, (1, 5))
    model.forward = forward
    expected = outcome(model, ids)
    if wrapper != "wrapper":
        assert not isinstance(expected, type), expected
    model.forward = torch.compile(forward, backend=ortlite.Backend(ortlite.Options()))
    got = outcome(model, ids)
    if isinstance(expected, type):
        assert got is expected
        return
    assert not isinstance(got, type), got
    assert torch.equal(got[0], expected[0])
    assert_same(list(got[1]), list(expected[1]), rtol=1e-4, atol=1e-5)
