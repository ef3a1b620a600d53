"""Random ops in training graphs (Options.random). "onnxruntime" draws other values than
eager: it is checked by properties (rates within binomial bounds, dropout's scaling, the
backward reusing the forward's mask, seeds), never by equality with eager. "torch" (the
default) draws eager's values: checked by equality, and by the graph staying whole."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import ortlite

ORT = {"random": "onnxruntime"}


def _compiled(fn, options=None):
    backend = ortlite.Backend(options)
    return torch.compile(fn, backend=backend), backend


def _within_binomial(hits: int, n: int, p: float, sigmas: float = 6.0) -> bool:
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_in_onnxruntime_rate_scaling_and_backward_mask(p):
    fn, backend = _compiled(lambda x: F.dropout(x, p, training=True) * 3.0, ORT)
    x = (torch.rand(64, 300) + 0.5).requires_grad_()
    out = fn(x)
    kept = out != 0
    assert _within_binomial(int(kept.sum()), kept.numel(), 1 - p)
    torch.testing.assert_close(out[kept], (x * 3.0 / (1 - p))[kept].detach(), rtol=1e-6, atol=0)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    # the backward's mask is the forward's: zero gradient exactly where the output was dropped
    torch.testing.assert_close(x.grad, upstream * kept * (3.0 / (1 - p)), rtol=1e-6, atol=0)
    assert backend.stats.fallback_ops == {}, backend.stats.fallback_ops
    kinds = sorted(r.name.split("_")[0] for r in backend.graph_reports)
    assert kinds == ["backward", "forward"] and all(r.sessions for r in backend.graph_reports)
    assert backend.graph_reports[0].ort_ops.get("ortlite.dropout.default") == 1


def test_dropout_in_onnxruntime_draws_anew_per_call_and_per_node():
    fn, _ = _compiled(lambda x: (F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True)), ORT)
    x = torch.ones(4096)
    a1, b1 = fn(x)
    a2, _ = fn(x)
    n = x.numel()
    # independent masks agree on about half the elements
    for one, other in ((a1, a2), (a1, b1)):
        assert _within_binomial(int(((one != 0) == (other != 0)).sum()), n, 0.5), "masks not independent"


def test_dropout_in_onnxruntime_masks_are_independent_call_to_call():
    """Each element's mask from call to call is a fair coin, not a pattern: ONNX Runtime's
    Dropout kernel, reseeding its generator with seed + 1 each call, dropped element 0 in
    every call and repeated about 5% of elements in >= 95% of consecutive calls (aggregate
    rates stayed right)."""
    fn, _ = _compiled(lambda x: F.dropout(x, 0.5, training=True), ORT)
    x = torch.ones(2048)
    calls = 64
    masks = torch.stack([fn(x) != 0 for _ in range(calls)])
    kept = masks.sum(0)
    assert 0 < kept.min() and kept.max() < calls, "an element kept or dropped in every call"
    agreement = (masks[1:] == masks[:-1]).double().mean(0)  # per element: Binomial(calls - 1, 1/2) / (calls - 1)
    assert agreement.std() < 1.5 * math.sqrt(0.25 / (calls - 1)), f"masks follow a pattern across calls: sd {agreement.std():.3f}"


def _masks(seed: int, calls: int = 3) -> list[torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(seed)
    fn, _ = _compiled(lambda x: F.dropout(x, 0.3, training=True), ORT)
    x = torch.ones(2048)
    return [fn(x) != 0 for _ in range(calls)]


def test_same_manual_seed_gives_the_same_masks():
    first, again, other = _masks(1), _masks(1), _masks(2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], first[1])
    assert not any(torch.equal(a, b) for a, b in zip(first, other))


def test_graphs_compiled_apart_draw_apart():
    """Each session's generators start from a seed fixed when its graph is lowered: a graph
    compiled again (new sizes, the same ops) or anew after torch's generator moved on must
    not start where an earlier session did, else it repeats that session's masks call by call."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    backend = ortlite.Backend(ORT)
    fn = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend=backend, dynamic=False)
    first = fn(torch.ones(4096)) != 0
    resized = fn(torch.ones(4097))[:4096] != 0
    assert backend.stats.graphs == 2
    torch.rand(1)  # (the program's own draws move torch's generator on)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend=ortlite.Backend(ORT), dynamic=False)
    rebuilt = fn(torch.ones(4096)) != 0
    for other in (resized, rebuilt):
        assert _within_binomial(int((first == other).sum()), first.numel(), 0.5), "a session repeated another's masks"


def test_eval_mode_is_untouched():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)).eval()
    fn, backend = _compiled(model, ORT)
    x = torch.randn(8, 16)
    torch.testing.assert_close(fn(x), model(x))
    assert not any("dropout" in op or "uniform" in op for r in backend.graph_reports for op in r.ort_ops)


def test_rand_and_bernoulli_in_onnxruntime():
    def fn(x):
        return torch.rand(4096), torch.rand_like(x), torch.bernoulli(torch.full_like(x, 0.2)), torch.bernoulli(x, 0.7)

    compiled, backend = _compiled(fn, ORT)
    x = torch.zeros(64, 64, dtype=torch.float64)
    uniform, uniform_like, rate_02, rate_07 = compiled(x)
    for u in (uniform, uniform_like):
        assert u.min() >= 0 and u.max() < 1
        assert _within_binomial(int((u < 0.25).sum()), u.numel(), 0.25)
    assert uniform_like.dtype == torch.float64 and uniform_like.shape == x.shape
    assert _within_binomial(int(rate_02.sum()), x.numel(), 0.2) and set(rate_02.unique().tolist()) <= {0.0, 1.0}
    assert _within_binomial(int(rate_07.sum()), x.numel(), 0.7)
    assert backend.stats.fallback_ops == {}, backend.stats.fallback_ops
    assert not torch.equal(compiled(x)[0], uniform)


def test_dropout_in_torch_draws_eagers_masks_and_keeps_the_graph_whole():
    """The default: torch draws each mask ahead of the graph, so the values are eager's and
    the forward is one ONNX Runtime session, not one per stretch between dropouts."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = F.dropout(torch.tanh(layer(x)), 0.2, training=True)
            return x

    torch.manual_seed(0)
    model = Net()
    fn, backend = _compiled(model)
    x = torch.randn(16, 32, requires_grad=True)
    for seed in range(2):
        torch.manual_seed(seed)
        expected = model(x)
        (eager_grad,) = torch.autograd.grad(expected.sum(), x)
        torch.manual_seed(seed)
        got = fn(x)
        (grad,) = torch.autograd.grad(got.sum(), x)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, eager_grad, rtol=1e-6, atol=1e-6)
    assert backend.stats.graphs == 2, backend.stats
    assert backend.stats.fallback_ops == {"ortlite.dropout_mask.default": 3}


def test_gpt2_training_step_is_one_forward_and_one_backward_graph():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
    ids = torch.randint(0, 256, (2, 16))
    for options in (None, ORT):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).train()
        model.loss_type = "ForCausalLM"  # (unset, transformers logs a warning in forward: a graph break)
        fn, backend = _compiled(model, options)
        fn(input_ids=ids, labels=ids).loss.backward()
        assert backend.stats.graphs == 2, (options, backend.stats)


def test_random_option_is_checked():
    with pytest.raises(ValueError, match="Options.random"):
        ortlite.Options(random="numpy")
