"""Mixture-of-experts language models from transformers, whole in ONNX Runtime: their routing
sorts expert ids (ties on every call), and the proof of lower/tie_order.py lets the sort run
unchecked. Each expert form transformers gives (grouped_mm, its default; batched_mm) under
torch.compile (one graph, dynamic sizes), ahead of time (new inputs, save and load), and in
a training step (gradients through routing and experts). Random weights, tiny configs.

transformers' "eager" experts loop over the experts that a call hits (`nonzero`, then a
Python loop over its result): Dynamo breaks the graph there with any backend
(docs/coverage.md)."""

from __future__ import annotations

import copy

import pytest
import torch

import ortlite

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.moe", reason="transformers registers the grouped mm ops its MoE layers use")

VOCAB = 128


def qwen3_moe():
    return transformers.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, vocab_size=VOCAB,
    )


def gpt_oss():
    """Experts with biases and a clamped gate; sliding and full attention."""
    return transformers.GptOssConfig(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
    )


def phimoe():
    """Sparse-mixer routing: the expert ids come from two max-and-mask steps, concatenated."""
    return transformers.PhimoeConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
    )


MODELS = {
    ("qwen3_moe", "grouped_mm"): qwen3_moe,
    ("qwen3_moe", "batched_mm"): qwen3_moe,
    ("gpt_oss", "grouped_mm"): gpt_oss,
    ("phimoe", "grouped_mm"): phimoe,
}


def model(key, train=False):
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(MODELS[key](), experts_implementation=key[1])
    return m.train(train)


def ids(*shape, seed=0):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def logits(result):
    if isinstance(result, dict):
        return result["logits"]
    return result.logits if hasattr(result, "logits") else result[0]


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(MODELS), ids="-".join)
def test_moe_whole_under_torch_compile_across_sizes(key):
    m = model(key)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        for shape in [(2, 12), (3, 7), (2, 20)]:  # (batch 1: Dynamo specializes sizes of 1)
            x = ids(*shape, seed=shape[1])
            torch.testing.assert_close(compiled(x).logits, m(x).logits, rtol=1e-4, atol=1e-4)
    assert backend.stats.graphs == 1 and backend.stats.fallback_ops == {}


@pytest.mark.slow
@pytest.mark.parametrize("key", [("qwen3_moe", "grouped_mm"), ("gpt_oss", "grouped_mm")], ids="-".join)
def test_moe_ahead_of_time_new_inputs_save_and_load(key, tmp_path):
    """Batch and sequence symbolic: other sizes, other experts, other ties per call."""
    from torch.export import Dim

    m = model(key)
    sizes = {"input_ids": {0: Dim("batch", min=1, max=8), 1: Dim("length", min=2, max=64)}, "use_cache": None}
    compiled = ortlite.compile(m, (ids(2, 12),), {"use_cache": False}, dynamic_shapes=sizes, options=ortlite.Options(fallback="error"))
    path = tmp_path / "moe.onnx"
    compiled.save(path)
    loaded = ortlite.load(path)
    with torch.no_grad():
        for shape in [(1, 5), (3, 17), (2, 12)]:
            x = ids(*shape, seed=shape[1])
            expected = m(x, use_cache=False).logits
            torch.testing.assert_close(logits(compiled(x, use_cache=False)), expected, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(logits(loaded(x, use_cache=False)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("key", [("qwen3_moe", "grouped_mm"), ("qwen3_moe", "batched_mm"), ("gpt_oss", "grouped_mm")], ids="-".join)
def test_moe_training_step_gradients_equal_eager(key):
    eager = model(key, train=True)
    ours = copy.deepcopy(eager)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(ours, backend=backend)
    x = ids(2, 10)
    expected = eager(x, labels=x).loss
    expected.backward()
    got = compiled(x, labels=x).loss
    got.backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 2  # a forward and a backward


GROUPED_OFFSETS = {
    "uneven": [2, 2, 5],  # expert 1 gets no rows
    "all_to_the_last": [0, 0, 7],
    "rows_past_the_end": [3, 5, 6],  # row 6 belongs to no expert: zero gradient
    "none": [0, 0, 0],
    "past_the_rows": [4, 9, 12],  # aten's slices stop at the last row
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(GROUPED_OFFSETS))
def test_grouped_mm_gradients_match_eager(case, dtype):
    """transformers' grouped mm backward (its own custom op) in ONNX Runtime: the input's and
    the weights' gradients, experts without rows and rows without experts included."""
    op = torch.ops.transformers.grouped_mm_fallback
    fn = lambda x, w, offs: (op(x, w, offs) * torch.arange(5.0, dtype=x.dtype)).sum()  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for rows in (7, 9, 7):  # the row count changes between calls
        offs = torch.tensor(GROUPED_OFFSETS[case], dtype=torch.int32)
        x, w = torch.randn(rows, 4, dtype=dtype, requires_grad=True), torch.randn(3, 4, 5, dtype=dtype, requires_grad=True)
        expected = torch.autograd.grad(fn(x, w, offs), (x, w))
        got = torch.autograd.grad(compiled(x, w, offs), (x, w))
        for g_, e_ in zip(got, expected):
            torch.testing.assert_close(g_, e_, rtol=1e-6, atol=1e-6)
    assert backend.stats.fallback_ops == {}


@pytest.mark.slow
def test_moe_static_cache_decode_tokens_equal_eager():
    """ortlite.decode's static-cache step, compiled ahead of time, with no Options: the
    routing's sort runs unchecked, and 24 greedy tokens are eager's."""
    from ortlite.decode import compile_static_cache_step, generate

    m = model(("qwen3_moe", "grouped_mm"))
    prompt = ids(1, 8)
    step = compile_static_cache_step(m, 48)
    tokens = generate(step, prompt, 24)
    with torch.no_grad():
        expected = m.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert tokens[0].tolist() == expected[0, prompt.shape[1]:].tolist()
