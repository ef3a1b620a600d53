"""Frozen weights (Options.freeze_weights, on by default): in inference graphs parameters and
buffers are ONNX Runtime initializers, and every kind of change to a weight between calls is
seen by the next call. Small models: a BatchNorm CNN and a tiny transformers BERT."""

import gc
import logging
import weakref

import pytest
import torch

import ortlite
import ortlite.frozen
import ortlite.session
from conftest import assert_same

transformers = pytest.importorskip("transformers", reason="the transformer cases need transformers (the test extra)")
logging.getLogger("transformers").setLevel(logging.ERROR)


class BNNet(torch.nn.Module):
    """MobileNet-like: conv, BatchNorm, ReLU6, depthwise conv, BatchNorm, pool, linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.nn.functional.relu6(self.bn(self.conv(x)))
        x = torch.nn.functional.relu6(self.bn2(self.dw(x)))
        return self.fc(x.mean((2, 3)))


def bn_net():
    torch.manual_seed(0)
    model = BNNet()
    with torch.no_grad():  # non-trivial statistics
        for bn in (model.bn, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model.eval(), lambda batch=2, size=8: (torch.randn(batch, 3, size, size),)


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=50,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    return model, lambda batch=2, size=8: (torch.randint(0, 50, (batch, size)),)


def out(result):
    return result.last_hidden_state if hasattr(result, "last_hidden_state") else result


def changed_weight(model):
    """A floating-point parameter every model here uses."""
    return model.fc.weight if isinstance(model, BNNet) else model.encoder.layer[0].intermediate.dense.weight


# Each kind of change, done to `model` between two inference calls.
def in_place(model):
    with torch.no_grad():
        changed_weight(model).mul_(2)


def data_assignment(model):
    w = changed_weight(model)
    w.data = torch.randn_like(w)


def replaced_parameter(model):
    if isinstance(model, BNNet):
        model.fc.weight = torch.nn.Parameter(torch.randn_like(model.fc.weight))
    else:
        dense = model.encoder.layer[0].intermediate.dense
        dense.weight = torch.nn.Parameter(torch.randn_like(dense.weight))


def load_state_dict(model):
    state = {k: (v + torch.rand_like(v) * 0.5 if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    model.load_state_dict(state)


def optimizer_step(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()


def running_statistics(model):
    """A training-mode forward (eager) moves BatchNorm's running statistics; LayerNorm-only
    models get their norm weight changed instead."""
    if isinstance(model, BNNet):
        model.train()
        with torch.no_grad():
            model(torch.randn(4, 3, 8, 8, device=model.fc.weight.device) * 3 + 1)
        model.eval()
    else:
        with torch.no_grad():
            model.embeddings.LayerNorm.weight.add_(0.5)


CHANGES = [in_place, data_assignment, replaced_parameter, load_state_dict, optimizer_step, running_statistics]
MODELS = {"bn_cnn": bn_net, "bert": tiny_bert}


def check(compiled, model, args):
    with torch.no_grad():
        assert_same(out(compiled(*args)), out(model(*args)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "make, dynamic",
    # (BERT with dynamic=True: as automatic's second graph, ~10 s more)
    [(bn_net, False), (bn_net, None), (bn_net, True), (tiny_bert, None)],
    ids=["bn_cnn-static", "bn_cnn-automatic", "bn_cnn-dynamic", "bert-automatic"],
)
def test_every_kind_of_weight_change_is_seen_by_the_next_call(make, dynamic, monkeypatch):
    """One compiled model, each kind of change in turn, each checked at two input sizes.
    Automatic: the second size makes Dynamo recompile with sizes symbolic, so two graphs
    (static and symbolic) must each see every change. Each change rebuilds the frozen
    sessions (MIN_CALLS 0: a session is never judged too short-lived to rebuild)."""
    monkeypatch.setattr(ortlite.frozen, "MIN_CALLS", 0)
    model, inputs = make()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    check(compiled, model, inputs())
    check(compiled, model, inputs(batch=3, size=10))
    frozen = backend.stats.frozen
    assert frozen > 0
    for change in CHANGES:
        change(model)
        check(compiled, model, inputs(batch=3, size=10))
        check(compiled, model, inputs(batch=2, size=8))
    assert backend.stats.frozen == frozen  # still frozen: every change rebuilt


# Dynamo's guards on module structure cost up to ~270 µs a call (README, "Frozen weights");
# users who never restructure the model between calls may filter them out.
SKIP_MODULE_GUARDS = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}


@pytest.mark.parametrize("make", [bn_net, tiny_bert], ids=["bn_cnn", "bert"])
def test_weight_changes_are_seen_with_dynamo_module_guards_filtered(make, monkeypatch):
    """Without Dynamo's guards on nn.Modules, ortlite's own per-call check still sees every
    kind of weight change: Dynamo passes the weights each call, read from the module."""
    monkeypatch.setattr(ortlite.frozen, "MIN_CALLS", 0)
    model, inputs = make()
    compiled = torch.compile(model, backend=ortlite.Backend(), options=SKIP_MODULE_GUARDS)
    check(compiled, model, inputs())
    check(compiled, model, inputs(batch=3, size=10))
    for change in CHANGES:
        change(model)
        check(compiled, model, inputs(batch=3, size=10))
        check(compiled, model, inputs(batch=2, size=8))


@pytest.mark.xfail(reason="a known bug, found 2026-12-07: run alone (pytest -n 0 on this test) the bound graph raises "
    "'expected (3, 4), got (5, 4)' for the reshaped weight instead of eager's answer; it passed only after the test above "
    "in the same process, and with the suite in two workers its order varies (closing note of stop 54)", strict=False)
def test_weights_of_another_shape_with_dynamo_module_guards_filtered():
    model = torch.nn.Linear(4, 3)
    compiled = torch.compile(model, backend=ortlite.Backend(), options=SKIP_MODULE_GUARDS)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        model.weight.data, model.bias.data = torch.randn(5, 4), torch.randn(5)
        assert_same(compiled(x), model(x))


def test_weights_are_initializers_only_in_inference_graphs():
    model, inputs = bn_net()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    (x,) = inputs()
    check(compiled, model, (x,))
    frozen = backend.stats.frozen
    assert frozen == 12  # conv and dw weight, fc weight and bias, two BatchNorms' weight, bias, mean and var
    # grad mode with parameters that require grad: a training graph, weights bound as inputs
    model.train()
    compiled(x).sum().backward()
    assert backend.stats.frozen == frozen  # the new forward graph froze nothing
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for got, expected in zip(grads, [p.grad for p in model.parameters()]):
        assert_same(got, expected, atol=1e-4)


def test_nothing_requiring_grad_is_inference_too():
    model, inputs = bn_net()
    model.requires_grad_(False)
    backend = ortlite.Backend()
    (x,) = inputs()
    assert_same(torch.compile(model, backend=backend)(x), model(x))  # grad mode on
    assert backend.stats.frozen == 12


def test_mutated_buffers_are_not_frozen():
    """BatchNorm in training mode under no_grad updates its running statistics in the graph:
    they stay inputs (and are updated as in eager); the rest is frozen."""
    model, inputs = bn_net()
    reference, _ = bn_net()
    model.train(), reference.train()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            (x,) = inputs()
            assert_same(compiled(x), reference(x), atol=1e-4)
    assert_same(model.bn.running_mean, reference.bn.running_mean)
    assert_same(model.bn2.running_var, reference.bn2.running_var)
    assert 0 < backend.stats.frozen < 10


def test_inference_mode():
    """Calls and a change under torch.inference_mode (which still bumps the version counter
    of a normal tensor written in place)."""
    model, inputs = bn_net()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    with torch.inference_mode():
        (x,) = inputs()
        assert_same(compiled(x), model(x))
        model.fc.weight.mul_(2)
        model.bn.running_mean.add_(1)
        assert_same(compiled(x), model(x))
    assert backend.stats.frozen == 12


def test_inference_tensor_weights_are_not_frozen():
    """Weights made under inference_mode have no version counter to watch: bound as inputs."""
    with torch.inference_mode():
        model = torch.nn.Linear(4, 3)
        x = torch.randn(2, 4)
        backend = ortlite.Backend()
        compiled = torch.compile(model, backend=backend)
        assert_same(compiled(x), model(x))
        model.weight.mul_(2)
        assert_same(compiled(x), model(x))
    assert backend.stats.frozen == 0


def test_weights_of_another_shape_or_dtype():
    """`.data =` a tensor of another shape, then dtype: Dynamo recompiles (its guards check
    sizes and dtypes); each graph freezes its own weights."""
    model = torch.nn.Linear(4, 3)
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        model.weight.data, model.bias.data = torch.randn(5, 4), torch.randn(5)
        assert_same(compiled(x), model(x))
        model.weight.data, model.bias.data = model.weight.double(), model.bias.double()
        assert_same(compiled(x.double()), model(x.double()))


def test_freeze_weights_off():
    model, inputs = bn_net()
    backend = ortlite.Backend(ortlite.Options(freeze_weights=False))
    with torch.no_grad():
        check(torch.compile(model, backend=backend), model, inputs())
    assert backend.stats.frozen == 0
    with pytest.raises(TypeError, match="freeze_weights"):
        ortlite.Options(freeze_weights="yes")


def test_user_session_options_are_copied_not_changed(caplog):
    """Frozen sessions add initializers to their SessionOptions: a copy of the user's."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    model, inputs = bn_net()
    backend = ortlite.Backend(ortlite.Options(session_options=so))
    compiled = torch.compile(model, backend=backend)
    check(compiled, model, inputs())
    in_place(model)
    check(compiled, model, inputs())
    assert backend.stats.frozen == 12
    copied = ortlite.session.session_options(backend.options, fresh=True)
    assert copied is not so and copied.intra_op_num_threads == 1
    assert copied.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED


def test_two_modules_with_the_same_graph_do_not_share_weights():
    backend = ortlite.Backend()
    (a, inputs), (b, _) = bn_net(), bn_net()
    with torch.no_grad():
        b.fc.weight.add_(1)
    (x,) = inputs()
    with torch.no_grad():
        got_a = torch.compile(a, backend=backend)(x)
        got_b = torch.compile(b, backend=backend)(x)
        assert_same(got_a, a(x))
        assert_same(got_b, b(x))


def test_weights_that_keep_changing_go_back_to_being_inputs(caplog):
    caplog.set_level(logging.INFO, logger="ortlite")
    model, inputs = bn_net()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    for _ in range(6):
        in_place(model)
        check(compiled, model, inputs())
    assert backend.stats.frozen == 0
    lines = [r.getMessage() for r in caplog.records if "keep changing" in r.getMessage()]
    assert len(lines) == 1, lines
    sessions = backend.stats.sessions
    for _ in range(3):
        in_place(model)
        check(compiled, model, inputs())
    assert backend.stats.sessions == sessions  # no more rebuilds


def test_a_rare_change_rebuilds_and_stays_frozen():
    model, inputs = bn_net()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        for _ in range(5):
            check(compiled, model, inputs())
        in_place(model)
    check(compiled, model, inputs())
    assert backend.stats.frozen == 12


def test_dropping_the_model_frees_its_weights():
    """The backend (and Dynamo's cache) keep the compiled graph, but not the weights: the
    runner holds them by weak reference, and releases its session when one dies."""
    model, inputs = bn_net()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(*inputs())
    assert backend.stats.frozen == 12
    weight = weakref.ref(model.fc.weight)
    del model, compiled
    gc.collect()
    assert weight() is None


def test_check_baseline_with_frozen_weights():
    model, inputs = bn_net()
    backend = ortlite.Backend(ortlite.Options(check_baseline=True))
    compiled = torch.compile(model, backend=backend)
    check(compiled, model, inputs())
    in_place(model)
    check(compiled, model, inputs())
    assert backend.stats.frozen == 12


class Table(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3, dtype=dtype))

    def forward(self, i):
        return torch.index_select(self.weight, 0, i) * 2 + 1


def test_run_failure_retry_keeps_weights_frozen_and_fresh(unchecked_indices):
    """An out-of-bounds index fails the ORT run (with ortlite's index checks off): index_select
    goes to torch from then on (the call raises as eager); the recompiled graph still freezes
    the weight and sees changes."""
    model = Table()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        assert_same(compiled(torch.tensor([0, 3])), model(torch.tensor([0, 3])))
        with pytest.raises(IndexError):
            compiled(torch.tensor([0, 7]))
        model.weight.mul_(3)
        assert_same(compiled(torch.tensor([1, 2])), model(torch.tensor([1, 2])))
    assert "aten.index_select.default" in backend.stats.fallback_ops


class Erf64(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(5, dtype=torch.float64))
        self.shift = torch.nn.Parameter(torch.rand(5, dtype=torch.float64))

    def forward(self, x):
        return torch.special.erf(x * self.scale) * 2 + self.shift


def test_missing_kernel_retry_with_frozen_weights():
    """erf has no float64 kernel on CPU: it goes to torch, the rest runs in ORT partitions
    whose weights are frozen and watched."""
    model = Erf64()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 5, dtype=torch.float64)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        model.scale.mul_(2)
        model.shift.add_(1)
        assert_same(compiled(x), model(x))
    assert backend.stats.frozen == 2


def test_marked_static_tensors_that_are_not_weights_stay_inputs():
    cache = torch.zeros(3, 5)
    torch._dynamo.mark_static_address(cache)
    model = torch.nn.Linear(4, 5)
    backend = ortlite.Backend()
    compiled = torch.compile(lambda x: model(x) + cache.sum(0), backend=backend)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x) + cache.sum(0))
        cache.add_(1)
        assert_same(compiled(x), model(x) + cache.sum(0))
    assert backend.stats.frozen == 2


class _Masked(torch.nn.Module):
    """Buffers of every dtype a model keeps: a bool causal mask (GPT-Neo), int positions."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self.register_buffer("mask", torch.tril(torch.ones(6, 6, dtype=torch.bool)))
        self.register_buffer("positions", torch.arange(6))
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.float64))

    def forward(self, x):
        scores = self.linear(x).masked_fill(~self.mask, -1e9) * self.scale
        return scores.softmax(-1) + self.positions


@pytest.mark.parametrize("path", ["c_api", "pybind"])
def test_buffers_of_every_dtype_are_frozen(path, monkeypatch):
    if path == "pybind":  # sessions through onnxruntime's Python module: weights go in by DLPack
        monkeypatch.setenv("ORTLITE_NO_C_API", "1")
    model = _Masked()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 6, 6)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        model.mask[0, 0] = False  # a change to the bool buffer is seen
        assert_same(compiled(x), model(x))
    assert backend.stats.frozen == 5


CUDA_REASON = "needs a CUDA GPU" if not torch.cuda.is_available() else ""


@pytest.mark.cuda
@pytest.mark.skipif(bool(CUDA_REASON), reason=CUDA_REASON or "CUDA available")
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__)
def test_weight_changes_on_cuda(change):
    model, inputs = bn_net()
    model = model.cuda()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend)
    args = [a.cuda() for a in inputs()]
    check(compiled, model, args)
    assert backend.stats.frozen == 8  # parameters; buffers on CUDA stay inputs
    change(model)
    check(compiled, model, args)
