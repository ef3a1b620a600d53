"""The five model families, built from transformers configs with random weights (no
downloads): the forward runs with nothing left to torch and matches eager to 1e-4."""

import logging

import onnx
import pytest
import torch

import ortlite
from conftest import assert_same

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

TEXT = dict(vocab_size=100, max_position_embeddings=64)


def bert():
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, **TEXT)
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0  # a padded sequence
    return transformers.BertModel(cfg), dict(input_ids=ids, attention_mask=mask)


def gpt2():
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    return transformers.GPT2Model(cfg), dict(input_ids=torch.randint(0, 100, (2, 16)), attention_mask=mask)


def llama():
    cfg = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, **TEXT
    )
    return transformers.LlamaModel(cfg), dict(input_ids=torch.randint(0, 100, (2, 16)))


def vit():
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8)
    return transformers.ViTModel(cfg), dict(pixel_values=torch.randn(2, 3, 32, 32))


def resnet():
    cfg = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    return transformers.ResNetModel(cfg), dict(pixel_values=torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("family", [bert, gpt2, llama, vit, resnet], ids=lambda f: f.__name__)
def test_forward_runs_entirely_in_onnx_runtime(family):
    torch.manual_seed(0)
    model, inputs = family()
    model.eval()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    with torch.no_grad():
        expected = model(**inputs)
        got = torch.compile(model, backend=backend, dynamic=False)(**inputs)
    assert backend.stats.fallback_ops == {}
    assert backend.stats.graphs >= 1
    names = [k for k, v in expected.items() if isinstance(v, torch.Tensor)]
    assert names
    for name in names:
        assert_same(got[name], expected[name], rtol=1e-4, atol=1e-4)


def long_prompt(family):
    """A prompt of 320 tokens, where causal attention runs in blocks of queries."""
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100, max_position_embeddings=512)
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=512)
        return transformers.GPT2Model(config), dict(input_ids=torch.randint(0, 100, (1, 320)))
    return transformers.LlamaModel(transformers.LlamaConfig(num_key_value_heads=2, **cfg)), dict(input_ids=torch.randint(0, 100, (2, 320)))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_long_prompt_attention_runs_in_blocks(family, tmp_path):
    torch.manual_seed(0)
    model, inputs = long_prompt(family)
    model.eval()
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        got = torch.compile(model, backend=backend, dynamic=False)(**inputs).last_hidden_state
    assert backend.stats.fallback_ops == {}
    assert_same(got, expected, rtol=1e-4, atol=1e-4)
    attentions = sum(n.op_type == "Attention" for p in tmp_path.glob("*.onnx") for n in onnx.load(p).graph.node)
    assert attentions == 2 * 5, attentions  # two layers, five blocks of 64 query rows each
