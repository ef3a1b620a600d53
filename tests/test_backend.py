"""The torch.compile backend end to end: scenarios, options, stats, errors, logging."""

import glob
import logging
import os

import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F

import ortlite
from conftest import OPAQUE, assert_same, check_fallback, check_lowered, opaque, run_compiled

torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self, sizes=(64, 64, 64, 10)):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention written out, layer norm, GELU MLP."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def grads_after(model, x, compiled):
    model.zero_grad()
    x = x.clone().requires_grad_()
    out = (torch.compile(model, backend=compiled) if compiled else model)(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()] + [x.grad]


# -- scenarios -------------------------------------------------------------------------


def test_elementwise_one_and_many_outputs():
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    check_lowered(lambda x, y: torch.relu(x * x + y), x, y)
    check_lowered(lambda x, y: (x + y, x * y, torch.sigmoid(x - y)), x, y)


def test_mlp_forward_inference():
    model = MLP().eval()
    with torch.no_grad():
        backend = check_lowered(model, torch.randn(1, 64))
    assert backend.stats.graphs == 1 and backend.stats.sessions == 1


def test_mlp_forward_and_backward_match_eager():
    model = MLP()
    x = torch.randn(4, 64)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    out, grads = grads_after(model, x, backend)
    out_ref, grads_ref = grads_after(model, x, None)
    assert_same(out, out_ref)
    assert_same(grads, grads_ref, rtol=1e-4, atol=1e-5)
    assert backend.stats.graphs == 2  # forward and backward both in ONNX Runtime
    assert backend.stats.fallback_ops == {}


def test_transformer_block_forward():
    block = Block().eval()
    with torch.no_grad():
        check_lowered(block, torch.randn(2, 5, 32))


def test_transformer_block_training_matches_eager():
    block = Block()
    x = torch.randn(2, 5, 32)
    backend = ortlite.Backend()
    out, grads = grads_after(block, x, backend)
    out_ref, grads_ref = grads_after(block, x, None)
    assert_same(out, out_ref)
    assert_same(grads, grads_ref, rtol=1e-4, atol=1e-5)
    assert backend.stats.runs >= 2


def test_sdpa_forward():
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    run_compiled(attention, q, k, v)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.bool])
def test_dtypes(dtype):
    """Correct in every dtype: in ONNX Runtime where it has kernels, else in torch."""
    x = (torch.randn(4, 5) * 5).to(dtype)
    y = (torch.randn(4, 5) * 5).to(dtype)
    if dtype == torch.bool:
        fn = lambda x, y: (x & ~y) | (x == y)  # noqa: E731
    elif dtype.is_floating_point:
        fn = lambda x, y: torch.tanh(x * y + x) - y.abs()  # noqa: E731
    else:
        fn = lambda x, y: (x * y + x - y.abs(), x > y)  # noqa: E731
    backend = run_compiled(fn, x, y, atol=1e-2 if dtype == torch.float16 else 1e-5)
    assert backend.stats.runs + sum(backend.stats.fallback_ops.values()) > 0


def test_graph_without_inputs():
    def make():
        return torch.arange(6).view(2, 3) * 2 + torch.full((2, 3), 1)

    backend = run_compiled(make)
    assert backend.stats.runs == 1


def test_graph_with_nothing_for_onnxruntime_runs_in_torch_without_a_warning(monkeypatch):
    # Dynamo cuts a graph between a check and a graph break whose results are none or only
    # its arguments (torchvision's detection models have them): no session, no warning
    warnings = []
    monkeypatch.setattr(ortlite.dynamo_backend, "warn_once", warnings.append)

    def fn(x):
        x.new_zeros(x.shape)  # dead: the graph returns nothing
        torch._assert(x.shape[0] > 0, "rows")
        torch._dynamo.graph_break()
        return x + 1

    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n in (3, 5):
        x = torch.randn(n)
        assert_same(compiled(x), fn(x))
    assert warnings == []
    assert backend.stats.graphs == 1 and backend.stats.fallback_ops == {}


def test_op_without_lowering_falls_back_and_is_counted(ortlite_log):
    # a custom op has no lowering: it must run in torch, correctly, between ORT graphs
    fn = lambda x: torch.relu(opaque(x * 2)) + 1  # noqa: E731
    x = torch.randn(3, 4)
    backend = check_fallback(fn, x, op=OPAQUE)
    assert backend.stats.fallback_ops == {OPAQUE: 1}
    assert backend.stats.graphs == 2  # the parts before and after run in ORT
    assert any(f"{OPAQUE} runs in torch" in r.message for r in ortlite_log.records)


def test_fallback_error_raises_naming_the_op():
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    with pytest.raises(Exception, match="ortlite_test.opaque"):
        torch.compile(lambda x: opaque(x) * 2, backend=backend)(torch.randn(3))


def test_one_warning_per_cause(ortlite_log):
    backend = ortlite.Backend()
    for n in range(3, 6):
        torch._dynamo.reset()
        torch.compile(lambda x: opaque(x) + 1, backend=backend)(torch.randn(n))
    messages = [r.message for r in ortlite_log.records if "opaque" in r.message]
    assert len(messages) == 1, messages


# -- inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(5, 4).t(),  # transposed
        lambda: torch.randn(6, 9)[1:5, 2:7],  # offset and strided
        lambda: torch.randn(4, 1).expand(4, 5),  # expanded (stride 0)
        lambda: torch.randn(4, 10)[:, ::2],  # step
        lambda: torch.randn(0, 5),  # empty
    ],
)
def test_non_contiguous_inputs(make):
    x, y = make(), torch.randn(make().shape)
    check_lowered(lambda x, y: torch.relu(x * 2 + y), x, y)


def test_recompile_for_non_contiguous_input():
    backend = ortlite.Backend()
    fn = torch.compile(lambda x: x.sin() + 1, backend=backend)
    a = torch.randn(4, 4)
    assert_same(fn(a), a.sin() + 1)
    b = torch.randn(4, 4).t()
    assert_same(fn(b), b.sin() + 1)
    c = torch.randn(4, 8)[:, ::2]
    assert_same(fn(c), c.sin() + 1)


def test_outputs_that_alias_inputs_and_repeat():
    x = torch.randn(3, 4)
    run_compiled(lambda x: (x, x.t(), x + 1, x[1:], x.view(12)), x)
    y = x + 1
    check_lowered(lambda y: (y * 2, y * 2), y)


def test_inference_does_not_change_inputs():
    x = torch.randn(3, 4)
    before = x.clone()
    check_lowered(lambda x: torch.relu(x) * 2, x)
    assert torch.equal(x, before)


# -- sessions, stats -------------------------------------------------------------------


def test_session_reuse_and_stats():
    backend = ortlite.Backend()
    fn = torch.compile(lambda x, y: torch.relu(x * x + y), backend=backend)
    for _ in range(20):
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        assert_same(fn(x, y), torch.relu(x * x + y))
    stats = backend.stats
    assert (stats.graphs, stats.sessions, stats.runs, stats.fallback_ops) == (1, 1, 20, {})
    backend.reset()
    assert (backend.stats.graphs, backend.stats.sessions, backend.stats.runs) == (0, 0, 0)


def test_same_graph_twice_shares_one_session():
    backend = ortlite.Backend()
    x = torch.randn(3, 3)
    torch.compile(lambda x: x.cos() * 3, backend=backend)(x)
    torch.compile(lambda y: y.cos() * 3, backend=backend)(x)
    assert backend.stats.graphs == 2 and backend.stats.sessions == 1


def test_dynamo_reset_resets_the_backend():
    backend = ortlite.Backend()
    torch.compile(lambda x: x.cos() * 3, backend=backend)(torch.randn(3))
    assert backend.stats.sessions == 1
    torch._dynamo.reset()  # Dynamo calls reset() on the backends it cached
    assert (backend.stats.graphs, backend.stats.sessions, backend.stats.runs) == (0, 0, 0)


def test_backend_by_name_and_default_backend():
    assert "ortlite" in torch._dynamo.list_backends()
    x = torch.randn(3, 3)
    runs = ortlite.backend.stats.runs
    assert_same(torch.compile(lambda x: x.exp() - 1, backend="ortlite")(x), x.exp() - 1)
    assert ortlite.backend.stats.runs == runs + 1


def test_options_through_torch_compile_route_to_a_cached_backend():
    x = torch.randn(3, 3)
    fn = torch.compile(lambda x: x * 5, backend=ortlite.backend, options={"default_providers": ["CPUExecutionProvider"]})
    assert_same(fn(x), x * 5)
    routed = ortlite.backend.for_options({"default_providers": ["CPUExecutionProvider"]})
    assert routed is ortlite.backend.for_options(ortlite.Options(default_providers=("CPUExecutionProvider",)))
    assert routed.stats.runs >= 1
    with pytest.raises(Exception, match="unknown ortlite option"):
        torch._dynamo.reset()
        torch.compile(lambda x: x * 5, backend=ortlite.backend, options={"nonsense": 1})(x)


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"fallback": "maybe"}, ValueError, "fallback"),
        ({"sort_ties": "index"}, ValueError, "sort_ties"),
        ({"quantize": "INT8"}, ValueError, "quantize"),
        ({"quantize": 8}, ValueError, "quantize"),
        ({"opset": 11}, ValueError, "opset"),
        ({"opset": "20"}, TypeError, "opset"),
        ({"infer_providers": "yes"}, TypeError, "infer_providers"),
        ({"providers": ["CUDA"]}, ValueError, "providers"),
        ({"providers": [42]}, TypeError, "providers"),
        ({"session_options": {}}, TypeError, "session_options"),
        ({"model_transforms": [1]}, TypeError, "model_transforms"),
        ({"dump_dir": 3}, TypeError, "dump_dir"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        ortlite.Options(**kwargs)


def test_unknown_option_key_is_named():
    with pytest.raises(TypeError, match="colour"):
        ortlite.Backend({"colour": "blue"})


def test_options_are_frozen_and_normalized():
    opts = ortlite.Options(providers=[("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"])
    assert opts.providers == (("CUDAExecutionProvider", (("device_id", "0"),)), ("CPUExecutionProvider", ()))
    with pytest.raises(Exception):
        opts.fallback = "error"
    assert hash(opts) == hash(ortlite.Options(providers=opts.providers))


def test_model_transforms_run_before_the_session():
    seen = []

    def rename(model: onnx.ModelProto):
        seen.append(model.graph.name)
        model.doc_string = "transformed"

    backend = ortlite.Backend(ortlite.Options(model_transforms=[rename]))
    x = torch.randn(3)
    assert_same(torch.compile(lambda x: x + 1, backend=backend)(x), x + 1)
    assert len(seen) == 1


def test_model_transform_that_breaks_the_model_is_caught_by_check_baseline():
    def negate_relu(model: onnx.ModelProto):
        for node in model.graph.node:
            if node.op_type == "Relu":
                node.op_type = "Neg"

    backend = ortlite.Backend(ortlite.Options(model_transforms=[negate_relu], check_baseline=True))
    with pytest.raises(AssertionError, match="differs from torch"):
        torch.compile(lambda x: torch.relu(x) * 2, backend=backend)(torch.randn(5))


def test_check_baseline_passes_on_correct_graphs(monkeypatch):
    monkeypatch.setenv("ORTLITE_CHECK_BASELINE", "1")
    options = ortlite.Options()
    assert options.check_baseline
    run_compiled(lambda x: torch.softmax(x, -1) * 3, torch.randn(4, 5), options=options)


def test_dump_dir_writes_each_graph_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLITE_DUMP_DIR", str(tmp_path))
    backend = ortlite.Backend()
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend=backend)
    for _ in range(5):
        fn(torch.randn(4))
    onnx_files = glob.glob(os.path.join(tmp_path, "*.onnx"))
    fx_files = glob.glob(os.path.join(tmp_path, "*.fx.txt"))
    assert len(onnx_files) == 1 and len(fx_files) == 1
    model = onnx.load(onnx_files[0])
    onnx.checker.check_model(model, full_check=True)
    assert "tanh" in open(fx_files[0]).read()
    sess = onnxruntime.InferenceSession(onnx_files[0], providers=["CPUExecutionProvider"])
    x = torch.randn(4)
    (out,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    assert_same(torch.from_numpy(out), torch.tanh(x) * 2)


def test_session_options_are_used():
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    run_compiled(lambda x: x * 2 + 1, torch.randn(3), options=ortlite.Options(session_options=so))


def test_requested_provider_that_is_not_active_is_reported(ortlite_log):
    # On a machine without a GPU, onnxruntime-gpu lists the CUDA provider but cannot load it.
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers() and torch.cuda.is_available():
        pytest.skip("CUDA works here; this checks the report when it does not")
    options = ortlite.Options(providers=["CUDAExecutionProvider"])
    run_compiled(lambda x: x * 3, torch.randn(3), options=options)
    assert any("not" in r.message and "CUDAExecutionProvider" in r.message for r in ortlite_log.records)


def test_logger_is_named_ortlite():
    assert logging.getLogger("ortlite").name == "ortlite"
