"""Training through torch.compile: backward graphs in ONNX Runtime, mutations reaching the
caller, sessions reused across shapes and recompiles."""

import glob
import os

import onnx
import pytest
import torch

import ortlite
from conftest import assert_same

torch.manual_seed(0)


def clone_module(module):
    import copy

    return copy.deepcopy(module)


def test_batch_norm_training_updates_running_stats():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    reference = clone_module(model)
    compiled = torch.compile(model, backend=ortlite.Backend())
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8)
        out, expected = compiled(x), reference(x)
        out.sum().backward()
        expected.sum().backward()
        assert_same(out.detach(), expected.detach())
    bn, bn_ref = model[1], reference[1]
    assert_same(bn.running_mean, bn_ref.running_mean)
    assert_same(bn.running_var, bn_ref.running_var)
    assert bn.num_batches_tracked.item() == bn_ref.num_batches_tracked.item() == 3
    assert_same(model[0].weight.grad, reference[0].weight.grad, atol=1e-4)


def test_in_place_op_on_an_input_reaches_the_caller():
    def fn(x, y):
        x.add_(y)
        return x * 2

    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend)
    x, y = torch.randn(4), torch.randn(4)
    x_eager = x.clone()
    assert_same(compiled(x, y), fn(x_eager, y))
    assert_same(x, x_eager)
    assert backend.stats.runs == 1


def test_changed_dtype_gets_its_own_session():
    backend = ortlite.Backend()
    compiled = torch.compile(lambda x: torch.tanh(x) * 3, backend=backend)
    for dtype in (torch.float32, torch.float64, torch.float32):
        x = torch.randn(5, dtype=dtype)
        assert_same(compiled(x), torch.tanh(x) * 3)
    assert backend.stats.sessions == 2 and backend.stats.runs == 3


class DecoderLayer(torch.nn.Module):
    """A LLaMA decoder layer (RMSNorm, rotary attention with GQA, SwiGLU MLP)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config = LlamaConfig(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64
        )
        config._attn_implementation = "sdpa"
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, hidden):
        positions = torch.arange(hidden.shape[1]).unsqueeze(0)
        out = self.layer(hidden, position_embeddings=self.rotary(hidden, positions), attention_mask=None)
        return out[0] if isinstance(out, tuple) else out


def test_llama_decoder_layer_forward_backward_over_shapes(tmp_path):
    model = DecoderLayer()
    reference = clone_module(model)
    backend = ortlite.Backend(ortlite.Options(dump_dir=str(tmp_path)))
    compiled = torch.compile(model, backend=backend, dynamic=True)
    sessions = None
    for batch, seq in ((2, 8), (4, 7), (9, 15)):
        x = torch.randn(batch, seq, 32)
        model.zero_grad()
        reference.zero_grad()
        out, expected = compiled(x), reference(x)
        (out * out).sum().backward()
        (expected * expected).sum().backward()
        assert_same(out.detach(), expected.detach(), atol=1e-5)
        grads = [p.grad for p in model.parameters()]
        assert_same(grads, [p.grad for p in reference.parameters()], rtol=1e-3, atol=1e-4)
        if sessions is None:
            sessions = backend.stats.sessions
    assert backend.stats.sessions == sessions  # one session per graph serves every shape
    assert backend.stats.graphs >= 2  # forward and backward
    dims = [
        d.dim_param
        for path in glob.glob(os.path.join(tmp_path, "*.onnx"))
        for i in onnx.load(path).graph.input
        for d in i.type.tensor_type.shape.dim
    ]
    assert any(dims), "expected symbolic (dim_param) dims in the dumped models"


@pytest.mark.parametrize("dynamic", [False, True])
def test_training_loop_with_optimizer(dynamic):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    reference = clone_module(model)
    compiled = torch.compile(model, backend=ortlite.Backend(), dynamic=dynamic)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(4):
        x, y = torch.randn(6 + 2 * step * dynamic, 8), torch.randn(6 + 2 * step * dynamic, 1)
        for m, o in ((compiled, opt), (reference, opt_ref)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_same(p.detach(), q.detach(), atol=1e-5)
