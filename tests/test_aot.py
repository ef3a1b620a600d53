"""ortlite.compile: the ahead-of-time path through torch.export."""

import math
import threading
import weakref

import onnx
import onnxruntime
import pytest
import torch
from torch.export import Dim

import ortlite
from conftest import Wrap, assert_same, opaque
from test_backend import MLP, Block

torch.manual_seed(0)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 4, 3, stride=2)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        return self.fc(torch.flatten(torch.relu(self.conv2(x)), 1))


class Elementwise(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x * x + y)


@pytest.mark.parametrize(
    "model,shape",
    [(MLP(), (3, 64)), (ConvNet(), (2, 3, 16, 16)), (Block(), (2, 5, 32))],
    ids=["mlp", "convnet", "transformer_block"],
)
def test_matches_eager(model, shape):
    model.eval()
    x = torch.randn(shape)
    compiled = ortlite.compile(model, (x,))
    assert isinstance(compiled, ortlite.CompiledModel)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        x2 = torch.randn(shape)
        assert_same(compiled(x2), model(x2))


def test_onnx_model_save_and_plain_onnxruntime(tmp_path):
    model = MLP().eval()
    x = torch.randn(2, 64)
    compiled = ortlite.compile(model, (x,))
    assert compiled.providers == ["CPUExecutionProvider"]
    assert isinstance(compiled.onnx_model, onnx.ModelProto)
    path = tmp_path / "mlp.onnx"
    compiled.save(path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        assert_same(torch.from_numpy(out), model(x))


def test_bound_weights_see_in_place_updates_and_save(tmp_path):
    model = MLP().eval()
    x = torch.randn(2, 64)
    by_value = ortlite.compile(model, (x,))
    bound = ortlite.compile(model, (x,), bind_weights=True)
    assert len(bound.onnx_model.graph.initializer) < len(by_value.onnx_model.graph.initializer)
    with torch.no_grad():
        model.layers[0].weight.mul_(2)
        expected = model(x)
    assert_same(bound(x), expected)
    assert not torch.allclose(by_value(x), expected)  # initializers are a copy
    bound.save(tmp_path / "bound.onnx")  # current weights become initializers
    sess = onnxruntime.InferenceSession(str(tmp_path / "bound.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["x"]
    (out,) = sess.run(None, {"x": x.numpy()})
    assert_same(torch.from_numpy(out), expected)


def test_bound_weights_follow_data_reassignment():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    compiled = ortlite.compile(lin, (x,), bind_weights=True)
    lin.weight.data = torch.randn(3, 4)  # new memory: bound by its new pointer
    with torch.no_grad():
        assert_same(compiled(x), lin(x))


class KwargsAndNested(torch.nn.Module):
    def forward(self, x, pair, *, scale):
        a, b = pair
        return {"sum": x + a * scale, "parts": (a - b, torch.relu(b))}


def test_kwargs_and_nested_outputs():
    x, a, b, s = (torch.randn(3, 4) for _ in range(4))
    compiled = ortlite.compile(KwargsAndNested(), (x, (a, b)), {"scale": s})
    got = compiled(x, (a, b), scale=s)
    expected = KwargsAndNested()(x, (a, b), scale=s)
    assert set(got) == {"sum", "parts"}
    assert_same(got["sum"], expected["sum"])
    assert_same(list(got["parts"]), list(expected["parts"]))
    with pytest.raises(TypeError, match="structured"):
        compiled(x, a, scale=s)


def test_tuple_output_and_passthrough():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return x * 2, y, x + y

    x, y = torch.randn(3), torch.randn(3)
    got = ortlite.compile(M(), (x, y))(x, y)
    assert isinstance(got, tuple) and len(got) == 3
    assert_same(list(got), [x * 2, y, x + y])


def test_bad_inputs_raise_clear_errors():
    compiled = ortlite.compile(Elementwise(), (torch.randn(8, 8), torch.randn(8, 8)))
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    with pytest.raises(TypeError, match=r"expected 2 arguments, got 1"):
        compiled(x)
    with pytest.raises(TypeError, match=r"argument 1 \(y\): expected a torch.float32 tensor.*got a torch.int64"):
        compiled(x, y.long())
    with pytest.raises(ValueError, match=r"argument 0 \(x\): expected .* shape \(8, 8\).*got .*\(8, 9\)"):
        compiled(torch.randn(8, 9), y)
    with pytest.raises(ValueError, match=r"argument 0 \(x\).*on cpu, got .* on meta"):
        compiled(torch.empty(8, 8, device="meta"), y)
    with pytest.raises(TypeError, match="got float"):
        compiled(x, 1.0)


def test_unsupported_op_is_a_clear_compile_error():
    class Opaque(torch.nn.Module):
        def forward(self, x):
            return opaque(x) * 2

    with pytest.raises(ortlite.CompileError, match=r"(?s)ortlite_test.opaque.default.*test_aot.py.*torch.compile"):
        ortlite.compile(Opaque(), (torch.randn(4),))


def test_buffer_mutation_in_train_mode_updates_the_module():
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))
            self.register_buffer("total", torch.zeros(4))

        def forward(self, x):
            self.count.add_(1)
            self.total.add_(x.sum(0))
            return x - self.total / self.count

    eager, model = Norm(), Norm()
    compiled = ortlite.compile(model, (torch.randn(3, 4),))
    for _ in range(3):
        x = torch.randn(3, 4)
        assert_same(compiled(x), eager(x))
    assert_same(model.count, eager.count)
    assert_same(model.total, eager.total)


def test_input_mutation_reaches_the_caller():
    class AddInPlace(torch.nn.Module):
        def forward(self, x, y):
            x.add_(y)
            return x * 2

    x, y = torch.randn(4), torch.randn(4)
    x_eager = x.clone()
    compiled = ortlite.compile(AddInPlace(), (x.clone(), y))
    expected = AddInPlace()(x_eager, y)
    got = compiled(x, y)
    assert_same(got, expected)
    assert_same(x, x_eager)


def test_concurrent_calls_from_threads():
    model = MLP().eval()
    compiled = ortlite.compile(model, (torch.randn(2, 64),))
    inputs = [torch.randn(2, 64) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors = []

    def work(k):  # each thread cycles through the inputs: pointers change under every binding
        try:
            for i in range(300):
                j = (i + k) % len(inputs)
                torch.testing.assert_close(compiled(inputs[j]), expected[j])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_recycled_outputs_are_never_visible_to_the_caller():
    """Small CPU outputs are refilled only when nothing can observe the old tensor."""
    compiled = ortlite.compile(Elementwise(), (torch.randn(8, 8), torch.randn(8, 8)))
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    want = lambda i: torch.relu((x + i) * (x + i) + y)  # noqa: E731
    held = [compiled(x + i, y) for i in range(4)]  # held results
    view = compiled(x + 4, y).view(64)  # a view keeps the storage
    array = compiled(x + 5, y).numpy()  # so does numpy
    ref_target = compiled(x + 6, y)
    ref = weakref.ref(ref_target)  # a weak reference is observable too
    grad_out = compiled(x + 7, y)
    grad_out.requires_grad_()
    tagged = compiled(x + 8, y)
    tagged.note = "mine"
    storage = compiled(x + 9, y).untyped_storage()  # and its storage object
    del ref_target
    for _ in range(10):
        compiled(x + 100, y)
    for i, h in enumerate(held):
        assert_same(h, want(i))
    assert_same(view.view(8, 8), want(4))
    assert_same(torch.from_numpy(array), want(5))
    assert ref() is None
    assert_same(grad_out.detach(), want(7))
    assert_same(tagged, want(8)) and tagged.note == "mine"
    assert_same(torch.tensor([], dtype=torch.float32).set_(storage).view(8, 8), want(9))
    # a dropped result is refilled: the loop `y = f(x)` alternates two buffers
    pointers = set()
    for i in range(6):
        out = compiled(x, y)
        pointers.add(out.data_ptr())
    from ortlite import _fast

    assert len(pointers) == (2 if _fast.raw_counts() else 6)  # without torch's counts: never recycled
    for _ in range(3):  # a dropped result made to require grad is not refilled
        dropped = compiled(x, y)
        dropped.requires_grad_()
        del dropped
        assert not any(compiled(x, y).requires_grad for _ in range(2))  # (two bindings in turn)


def test_exported_program_input():
    model = MLP().eval()
    x = torch.randn(2, 64)
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        assert_same(ortlite.compile(program, (x,))(x), model(x))


def test_compile_rejects_other_things():
    with pytest.raises(TypeError, match="nn.Module or an ExportedProgram"):
        ortlite.compile(lambda x: x, (torch.randn(2),))


def test_outputs_that_are_weights_or_inputs():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))

        def forward(self, x):
            return self.w, x, x * self.w

    model = M()
    x = torch.randn(3)
    got = ortlite.compile(model, (x,))(x)
    assert_same([g.detach() for g in got], [model.w.detach(), x, (x * model.w).detach()])


def test_integer_division_by_zero_raises_as_aten():
    class Divide(torch.nn.Module):
        def forward(self, a, b):
            return a // b + a % b

    a, b = torch.arange(-4, 4), torch.tensor([3, -2, 5, 1, 7, 2, -1, 4])
    compiled = ortlite.compile(Divide(), (a, b))
    assert torch.equal(compiled(a, b), Divide()(a, b))
    b[3] = 0
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        compiled(a, b)
    b[3] = 1
    assert torch.equal(compiled(a, b), Divide()(a, b))


class Views(torch.nn.Module):
    """Outputs eager returns as views of an input, beside one it does not."""

    def forward(self, x, y):
        return x[1:], x.t(), x.transpose(0, 1)[0], x.unsqueeze(0).expand(2, -1, -1), y.add_(1), x * 2


@pytest.mark.parametrize("dynamic", [False, True])
def test_outputs_that_are_views_of_inputs_alias_them_as_in_eager(tmp_path, dynamic):
    x, y = torch.randn(4, 3), torch.randn(3)
    shapes = ({0: Dim("rows", min=3)}, None) if dynamic else None
    compiled = ortlite.compile(Views(), (x.clone(), y.clone()), dynamic_shapes=shapes)
    compiled.save(tmp_path / "views.onnx")
    for model in (compiled, ortlite.load(tmp_path / "views.onnx")):
        for rows in (4, 6) if dynamic else (4,):
            x, y = torch.randn(rows, 3), torch.randn(3)
            ex, ey = x.clone(), y.clone()
            expected = Views()(ex, ey)
            got = model(x, y)
            for g, e in zip(got, expected):
                assert torch.equal(g, e) and g.shape == e.shape and g.stride() == e.stride()
            *views, returned, product = got
            assert all(v._base is x for v in views) and returned is y and product._base is None
            x[1, 0] = 100.0  # a view sees its input's writes, as eager's does
            assert got[0][0, 0] == 100.0 and got[1][0, 1] == 100.0


def test_a_list_argument_is_an_argument_not_a_boxed_call():
    compiled = ortlite.compile(MLP(), (torch.randn(3, 64),))
    argument = [torch.randn(3, 64)]
    with pytest.raises(TypeError, match="argument 0 .* got list"):
        compiled(argument)
    assert len(argument) == 1  # the caller's list is left alone


class NothingToRun(torch.nn.Module):
    """Results that are all arguments, constants or sizes: no node for ONNX Runtime."""

    def forward(self, x, n: int):
        return x, x.shape[0] * 2, n + 1


def test_a_graph_with_nothing_for_onnxruntime_runs_and_saves(tmp_path):
    compiled = ortlite.compile(NothingToRun(), (torch.randn(3, 2), 4), dynamic_shapes=({0: Dim("rows")}, Dim.DYNAMIC))
    compiled.save(tmp_path / "nothing.onnx")
    for model in (compiled, ortlite.load(tmp_path / "nothing.onnx")):
        x = torch.randn(5, 2)
        got = model(x, 7)
        assert got[0] is x and got[1:] == (10, 8)


class ExportComposites(torch.nn.Module):
    """Ops torch.export's own IR keeps composite (linear, layer_norm, scaled_dot_product_attention,
    dropout, transpose), an in-place add, and a transpose of an odd rank and negative dims."""

    def __init__(self, dim=16):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q = self.proj(self.norm(x)).view(b, t, 2, d // 2).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        y = torch.nn.functional.dropout(a.transpose(-3, -2).reshape(b, t, d), 0.1, self.training)
        y += x
        return y, x.transpose(0, -1).sum(0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_exported_in_one_trace_where_the_table_lowers_it_all(monkeypatch, dynamic):
    """Export straight to ATen leaves nothing to decompose: run_decompositions, a second trace of
    the whole program that took longer than the export, is not called; the results are eager's,
    with the sequence length changing between calls."""

    def second_trace(*args, **kwargs):
        raise AssertionError("run_decompositions called")

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", second_trace)
    model = ExportComposites().eval()
    shapes = ({1: Dim("t", min=2, max=64)},) if dynamic else None
    compiled = ortlite.compile(model, (torch.randn(2, 8, 16),), dynamic_shapes=shapes)
    for t in (8, 3, 17) if dynamic else (8,):
        x = torch.randn(2, t, 16)
        with torch.no_grad():
            assert_same(compiled(x), model(x))


def test_decomposed_where_the_table_needs_it(monkeypatch):
    """An op outside the table (hardswish), a program from torch.export.export (its IR keeps
    linear) and an export to ATen that fails: each goes through run_decompositions as before,
    with eager's results."""
    decomposed = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", lambda self, *a, **k: decomposed.append(1) or original(self, *a, **k))

    class Hardswish(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.hardswish(x) * 2

    x = torch.linspace(-5, 5, 21)
    assert_same(ortlite.compile(Hardswish(), (x,))(x), Hardswish()(x))
    assert decomposed == [1]

    model, x = MLP().eval(), torch.randn(2, 64)
    with torch.no_grad():
        assert_same(ortlite.compile(torch.export.export(model, (x,)), (x,))(x), model(x))
    assert decomposed == [1, 1]

    from torch.export import _trace

    def to_aten_fails(*args, pre_dispatch=True, **kwargs):
        if not pre_dispatch:
            raise RuntimeError("no export to ATen here")
        return exporter(*args, pre_dispatch=pre_dispatch, **kwargs)

    exporter = _trace._export
    monkeypatch.setattr(_trace, "_export", to_aten_fails)
    with torch.no_grad():
        assert_same(ortlite.compile(model, (x,))(x), model(x))
    assert decomposed == [1, 1, 1]


# Ops that only ortlite.compile lowers as they stand (aot_autograd decomposes them for
# torch.compile, so the op-info sweep does not reach these lowerings): each against eager on
# odd inputs, with the leading size static and symbolic, and called with several sizes.
EXPORT_ONLY = {
    "transpose": (lambda x: (x.transpose(0, -1), x.transpose(-2, 1), x.transpose(1, 1)), [(3, 4, 5), (6, 2, 1), (0, 2, 3), (1, 1, 1)]),
    "transpose_rank1": (lambda x: x.transpose(0, -1) + 1, [(5,), (2,), (0,), (1,)]),
    "transpose_0d": (lambda x: x[0, 0].transpose(-1, 0) * 2, [(2, 2), (5, 1)]),
    "zeros_ones": (
        lambda x: (torch.zeros_like(x), torch.ones_like(x.t(), dtype=torch.int32), torch.zeros(x.shape[0], 3, dtype=x.dtype), torch.ones(2, x.shape[1]) + x.sum()),
        [(3, 4), (7, 1), (0, 4), (1, 1)],
    ),
    "empty_like_fill": (lambda x: (torch.empty_like(x.t()).shape[0] * x, torch.empty_like(x, dtype=torch.bool).fill_(True) & (x > 0), x.clone().fill_(2.5)), [(3, 4), (5, 2), (0, 4), (1, 1)]),
    "floor_divide": (lambda x: (torch.floor_divide(x, 3), torch.floor_divide(x * 7, -x.flip(0) - 1)), [(6, 4), (3, 2), (0, 4), (1, 3)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("case", list(EXPORT_ONLY))
def test_export_only_lowerings_match_eager(monkeypatch, case, dynamic, dtype):
    """Static: one compile a shape (empty and size-1 included). Symbolic: one compile, called
    with leading sizes that change (within the exported range: 2 or more)."""
    fn, shapes = EXPORT_ONLY[case]
    if dtype is torch.bool and case == "floor_divide":
        pytest.skip("aten has no floor_divide of bool tensors")

    def second_trace(*args, **kwargs):
        raise AssertionError("run_decompositions called: the lowering under test was not reached")

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", second_trace)

    def sample(shape):
        values = torch.arange(math.prod(shape)).reshape(shape) * 5 - 7
        return (values > 0) if dtype is torch.bool else values.to(dtype) / (3 if dtype.is_floating_point else 1)

    if dynamic:
        ranged = [(n, *shapes[0][1:]) for n in (shapes[0][0], 2, 9, shapes[0][0])]
        compiled = ortlite.compile(Wrap(fn), (sample(ranged[0]),), dynamic_shapes=(({0: Dim("n", min=2, max=64)},),))  # Wrap takes *args
        calls = [(compiled, sample(s)) for s in ranged]
    else:
        calls = [(ortlite.compile(Wrap(fn), (sample(s),)), sample(s)) for s in shapes]
    for compiled, x in calls:
        assert_same(compiled(x), fn(x), rtol=0, atol=0)


def test_large_weights_reach_the_session_beside_the_serialized_model(monkeypatch, tmp_path):
    """A weight of 1 MiB or more goes to ONNX Runtime as an external initializer, not inside the
    serialized model (whose serializing and parsing were most of a large model's session time);
    small ones stay in it. Results are eager's, and the saved file still holds every weight."""
    import ortlite.session

    seen = []
    original = ortlite.session.create_session

    def recording(model_bytes, options, providers, devices, disabled_optimizers=(), weights=None, unplanned=False):
        seen.append((len(model_bytes), {n: tuple(t.shape) for n, t in (weights or {}).items()}))
        return original(model_bytes, options, providers, devices, disabled_optimizers, weights, unplanned=unplanned)

    monkeypatch.setattr(ortlite.session, "create_session", recording)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8)).eval()
    x = torch.randn(3, 256)
    compiled = ortlite.compile(model, (x,))
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    (size, weights), = seen
    assert list(weights.values()) in ([(1024, 256)], [(256, 1024)]), weights  # the 1 MiB weight, as lowered
    assert size < 256 * 1024, size  # the 1 MiB weight is not in the bytes; the 32 KiB one is
    compiled.save(tmp_path / "m.onnx")
    monkeypatch.setattr(ortlite.session, "create_session", original)
    with torch.no_grad():
        assert_same(ortlite.load(tmp_path / "m.onnx")(x), model(x))
