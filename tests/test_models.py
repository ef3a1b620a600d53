"""Model families from transformers configs (random weights, no downloads): inference over
several (batch, seq) shapes with dynamic=True and one session per graph, and a training
step whose gradients match eager."""

import copy

import pytest
import torch

import ortlite
from conftest import assert_same

transformers = pytest.importorskip("transformers", reason="model tests need transformers (the test extra)")


def text_input(vocab):
    def make(b, t):
        ids = torch.randint(0, vocab, (b, t))
        torch._dynamo.mark_dynamic(ids, 0)
        torch._dynamo.mark_dynamic(ids, 1)
        return {"input_ids": ids}

    return make


def image_input(b, t):
    pixels = torch.randn(b, 3, 32, 32)
    torch._dynamo.mark_dynamic(pixels, 0)  # a dynamic batch; the image size stays fixed
    return {"pixel_values": pixels}


FAMILIES = {
    "bert": (
        lambda: transformers.BertModel(
            transformers.BertConfig(
                hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=99,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64,
            )
        ),
        text_input(99),
    ),
    "gpt2": (
        lambda: transformers.GPT2Model(
            transformers.GPT2Config(
                n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            )
        ),
        text_input(99),
    ),
    "llama": (
        lambda: transformers.LlamaModel(
            transformers.LlamaConfig(
                hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=99, max_position_embeddings=64,
            )
        ),
        text_input(99),
    ),
    "vit": (
        lambda: transformers.ViTModel(
            transformers.ViTConfig(
                hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            )
        ),
        image_input,
    ),
    "resnet": (
        lambda: transformers.ResNetModel(
            transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
        ),
        image_input,
    ),
}
SHAPES = ((2, 8), (4, 7), (9, 15))


def hidden(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dynamic_inference_one_session_per_graph(family):
    make, inputs = FAMILIES[family]
    torch.manual_seed(0)
    model = make().eval()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for b, t in SHAPES:
            kwargs = inputs(b, t)
            assert_same(hidden(compiled(**kwargs)), hidden(model(**kwargs)), rtol=1e-4, atol=1e-4)
    stats = backend.stats
    assert stats.fallback_ops == {}, stats.fallback_ops  # nothing left to torch
    assert stats.sessions == 1 and stats.runs == len(SHAPES)  # one session serves every shape


@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_step_gradients_match_eager(family):
    make, inputs = FAMILIES[family]
    torch.manual_seed(0)
    model = make().train()
    reference = copy.deepcopy(model)
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    kwargs = inputs(2, 8)
    weights = torch.randn_like(hidden(reference(**kwargs)))
    (hidden(compiled(**kwargs)) * weights).sum().backward()
    (hidden(reference(**kwargs)) * weights).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if q.grad is None:  # unused in the loss; aot_autograd (any backend) gives zeros, not None
            assert p.grad is None or not p.grad.any(), name
            continue
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=lambda m: f"{family} {name}: {m}")
    assert backend.stats.graphs == 2 and backend.stats.fallback_ops == {}  # forward and backward, whole


@pytest.mark.parametrize("family", ["llama", "bert", "vit"])
def test_aot_compile_of_a_model_family(family):
    """torch.export adds metadata assertions (aten._assert_tensor_metadata) ortlite.compile
    must accept; the whole model runs in ONNX Runtime."""
    make, inputs = FAMILIES[family]
    torch.manual_seed(0)
    model = make().eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return hidden(self.model(x))

    (x,) = inputs(2, 8).values()
    compiled = ortlite.compile(Hidden(), (x.clone(),))
    with torch.no_grad():
        assert_same(compiled(x), Hidden()(x), rtol=1e-4, atol=1e-4)


def test_generate_loop_with_a_dynamic_cache_gives_eager_tokens():
    """model.forward compiled inside HuggingFace's generate (a growing DynamicCache, the
    sequence length changing every step, a padded batch): the same tokens as eager, a few
    graphs (prefill, first decode step, the symbolic decode step), nothing left to torch."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 99, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in the second row
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        backend = ortlite.Backend()
        model.forward = torch.compile(model.forward, backend=backend)
        assert torch.equal(model.generate(ids, **kwargs), expected)
        assert torch.equal(model.generate(ids, **kwargs), expected)  # the compiled graphs reused
    stats = backend.stats
    assert stats.fallback_ops == {}, stats.fallback_ops
    # one session more: the symbolic decode step's sizes change at every call, so it is
    # compiled again without its size prelude (SizeConstants.MISSES_BEFORE_REPLACING)
    assert stats.graphs <= 3 and stats.sessions <= 4, stats
    assert sum(r.size_constants is not None and r.size_constants.on_sizes_keep_changing is None for r in backend._runners) == 1
