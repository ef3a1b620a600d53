"""Symbolic shapes: one ONNX model with dim_param dims serves every shape."""

import functools
import glob
import operator
import os

import onnx
import pytest
import torch
from torch.export import Dim

import ortlite
from conftest import assert_same
from test_backend import MLP

torch.manual_seed(0)


def test_elementwise_over_batch_sizes_one_session():
    backend = ortlite.Backend()
    fn = torch.compile(lambda x, y: torch.relu(x * x + y) - x.mean(), backend=backend, dynamic=True)
    for batch in (2, 4, 6, 8, 10):
        x, y = torch.randn(batch, 5), torch.randn(batch, 5)
        assert_same(fn(x, y), torch.relu(x * x + y) - x.mean())
    assert backend.stats.sessions == 1 and backend.stats.runs == 5 and backend.stats.fallback_ops == {}


def test_mlp_inference_and_training_over_batch_sizes():
    model = MLP()
    backend = ortlite.Backend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for batch in (2, 4, 6, 8, 10):
        x = torch.randn(batch, 64)
        model.zero_grad()
        out = compiled(x)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expected = model(x)
        expected.square().sum().backward()
        assert_same(out.detach(), expected.detach())
        assert_same(grads, [p.grad for p in model.parameters()], atol=1e-4)
    stats = backend.stats
    assert stats.fallback_ops == {}
    assert stats.sessions == 2  # forward and backward, for every batch size
    assert stats.runs == 10


def test_sets_of_sizes_have_memory_plan_keys_of_their_own_up_to_a_bound():
    """ONNX Runtime caches a session's memory plan under the XOR of every fed dim: inputs of
    equal shapes cancel out (b^s^b^s = 0 for input_ids and attention_mask) and (2, 16)
    meets (3, 17), so a symbolic session kept the plan of the first sizes it ran and at
    other sizes allocated each intermediate on its own (LLaMA at zoo size: 10% slower). The
    runner feeds a (N, 0) input whose N makes the key ONNX Runtime computes differ for each
    set of sizes and int arguments, and stay the same for the same ones; but ORT keeps
    every plan it makes, so past MAX_PATTERN_KEYS sets of sizes a runner's later ones all
    share one key."""
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    fn = torch.compile(lambda ids, mask, n: (ids * mask)[:, :n] + n, backend=backend, dynamic=True)
    cases = [((2, 16), 3), ((3, 17), 3), ((16, 2), 3), ((2, 16), 4), ((6, 3), 3), ((3, 6), 3), ((3, 17), 5), ((5, 9), 2), ((9, 5), 2)]
    keys = {}  # runner -> {sizes: ORT keys}, in the order the sizes came
    for (b, s), n in cases + cases:
        ids, mask = torch.randn(b, s), torch.randn(b, s)
        before = {id(r): r.runs for r in backend._runners}
        assert_same(fn(ids, mask, n), (ids * mask)[:, :n] + n)
        (runner,) = [r for r in backend._runners if r.runs != before.get(id(r), 0)]  # (Dynamo guards n <= s)
        fed = [shape for _, _, shape in runner.describe_inputs()]
        assert fed[:2] == [(-1, -1), (-1, -1)]  # ids and mask; the int arguments are 0-d (no dims)
        # then the size constants (ortlite.lower.hoist), here of static shapes
        assert all(-1 not in shape for shape in fed[2:])
        others = functools.reduce(operator.xor, [d for shape in fed[2:] for d in shape], 0)
        ort_key = b ^ s ^ b ^ s ^ others ^ runner.fed_pattern_key()
        keys.setdefault(id(runner), {}).setdefault((b, s, n), set()).add(ort_key)
    assert max(len(by_sizes) for by_sizes in keys.values()) > MAX_PATTERN_KEYS  # some runner went past the bound
    for by_sizes in keys.values():
        assert all(len(k) == 1 for k in by_sizes.values()), by_sizes  # the same sizes, the same key
        firsts = [k for (k,) in list(by_sizes.values())[:MAX_PATTERN_KEYS]]
        later = {k for (k,) in list(by_sizes.values())[MAX_PATTERN_KEYS:]}
        assert len(set(firsts)) == len(firsts) and len(later) <= 1 and not later & set(firsts), by_sizes
    static = ortlite.Backend()
    torch.compile(lambda x: x * 2, backend=static, dynamic=False)(torch.randn(3, 4))
    assert static._runners[0].fed_pattern_key() is None  # fixed sizes: one plan, ORT's key is enough


MAX_PATTERN_KEYS = 4  # ortlite/_fast.pyx


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
def test_memory_stays_bounded_over_ever_new_sizes():
    """ONNX Runtime keeps a memory plan per key, each holding about a run's intermediates:
    fed ever new sizes, a session grew without bound (this loop: about 120 MB; 16k sizes of
    it: 17 GB)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).eval()
    fn = torch.compile(model, backend=ortlite.Backend(), dynamic=True)
    with torch.no_grad():
        for n in (2, 3, 1000, 1001):  # the arena reaches about the largest size's needs
            fn(torch.randn(n, 64))
        start = _rss_mb()
        for n in range(4, 1000):
            x = torch.randn(n, 64)
            if n % 97 == 0:
                assert_same(fn(x), model(x))
            else:
                fn(x)
    assert _rss_mb() - start < 40


def test_batch_one_is_its_own_graph():
    backend = ortlite.Backend()
    fn = torch.compile(lambda x: x * 2 + 1, backend=backend, dynamic=True)
    for batch in (3, 5, 1):
        x = torch.randn(batch, 4)
        assert_same(fn(x), x * 2 + 1)
    assert backend.stats.sessions == 2  # Dynamo specializes size 1


def test_python_int_argument_and_size_outputs():
    def fn(x, y, n):
        z = x.view(-1, 4) * y.sum() + n
        return torch.cat([z, torch.full((x.shape[0] * 2, 4), 1.0)]), x.shape[0] * 3

    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for batch, n in ((3, 4), (5, -2), (7, 10)):
        x, y = torch.randn(batch, 2, 2), torch.randn(5)
        got = compiled(x, y, n)
        expected = fn(x, y, n)
        assert_same(got[0], expected[0])
        assert got[1] == expected[1] and type(got[1]) is int
    assert backend.stats.sessions == 1


def test_dumped_model_has_dim_params(tmp_path):
    backend = ortlite.Backend(ortlite.Options(dump_dir=str(tmp_path)))
    fn = torch.compile(lambda x: torch.softmax(x, -1) * 3, backend=backend, dynamic=True)
    for shape in ((2, 8), (4, 7), (9, 15)):
        x = torch.randn(shape)
        assert_same(fn(x), torch.softmax(x, -1) * 3)
    (path,) = glob.glob(os.path.join(tmp_path, "*.onnx"))
    model = onnx.load(path)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert all(d.dim_param for d in dims), dims
    assert backend.stats.sessions == 1


def test_views_expand_slices_with_symbolic_sizes():
    def fn(x, y):
        b, t, d = x.shape
        z = x.reshape(b * t, d)[: t + 1] + y[1:-1].expand(t + 1, d)
        return z.unsqueeze(0).expand(b, -1, -1).permute(0, 2, 1), x[:, -1], x.sum(1) / t

    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for b, t in ((2, 8), (4, 7), (9, 15)):
        x, y = torch.randn(b, t, 6), torch.randn(3, 6)
        assert_same(compiled(x, y), fn(x, y))
    assert backend.stats.sessions == 1


# -- AOT with torch.export Dims ---------------------------------------------------------


def test_aot_dynamic_batch():
    model = MLP().eval()
    batch = Dim("batch", min=1, max=64)
    compiled = ortlite.compile(model, (torch.randn(4, 64),), dynamic_shapes={"x": {0: batch}})
    with torch.no_grad():
        for n in (1, 3, 17):
            x = torch.randn(n, 64)
            assert_same(compiled(x), model(x))
    with pytest.raises(ValueError, match=r"argument 0 dim 0 is 65, outside the range \[1, 64\]"):
        compiled(torch.randn(65, 64))
    with pytest.raises(ValueError, match=r"shape \(\?, 64\)"):
        compiled(torch.randn(3, 65))


# reductions and normalizations over the Dim, and ops whose ONNX Runtime kernels refuse empty inputs
_OVER_A_DIM = {
    "mean": lambda x: x.mean(1),
    "var": lambda x: x.var(1),
    "std": lambda x: x.std(1),
    "logsumexp": lambda x: x.logsumexp(1),
    "softmax": lambda x: x.softmax(1),
    "sum": lambda x: x.sum(1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (6,)),
    "attention": lambda x: torch.nn.functional.scaled_dot_product_attention(*[x.reshape(1, 1, x.shape[0], 6)] * 3),
    "adaptive_avg_pool": lambda x: torch.nn.functional.adaptive_avg_pool1d(x.unsqueeze(0), 3),
    "cat": lambda x: torch.cat([x, x * 2], 1),
}


@pytest.mark.parametrize("name", list(_OVER_A_DIM))
def test_aot_dims_that_allow_zero(name):
    """torch.export traces with sizes of at least 2 but takes its Dims' whole range (a Dim's
    default minimum is 0). ortlite's lowerings assume inputs that are not empty: a mean over
    the Dim gave a number where eager gives NaN, layer norm and attention failed inside ONNX
    Runtime. A Dim that allows 0 now runs from 1: a 0 is a named error, 1 and up eager's."""
    fn = _OVER_A_DIM[name]
    dim = 0 if name in ("attention", "adaptive_avg_pool", "layer_norm") else 1

    class Model(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    model = Model()
    compiled = ortlite.compile(model, (torch.randn(5, 6),), dynamic_shapes=({dim: Dim("n", max=64)},))
    with torch.no_grad():
        for n in (1, 2, 7):
            x = torch.randn(*[n if d == dim else (5, 6)[d] for d in (0, 1)])
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        empty = torch.randn(*[0 if d == dim else (5, 6)[d] for d in (0, 1)])
        with pytest.raises(ValueError, match=rf"dim {dim} is 0, outside the range \[1, 64\].*not empty"):
            compiled(empty)


# int arguments that bound slices: export traces them under guards (0 <= n <= x.shape[1], n != 1)
_INT_BOUNDS = {
    "slice_end": lambda x, n: x[:, :n].mean(1),
    "slice_start": lambda x, n: x[:, n:].sum(1),
    "narrow": lambda x, n: x.narrow(1, n, 2) * 2,
    "select": lambda x, n: x.select(1, n) + 1,
}


@pytest.mark.parametrize("name", list(_INT_BOUNDS))
def test_aot_int_arguments_outside_the_exported_guards(name, tmp_path):
    """torch.export traces x[:, :n] with a symbolic n under guards its module checks per call
    (n within [0, x.shape[1]], not 1, ...). ortlite.compile ignored them: n past the end or
    negative gave a mean over the wrong count. Every call now either raises a ValueError
    where the exported program raises, or gives its result; so does the saved file, loaded."""
    fn = _INT_BOUNDS[name]

    class Model(torch.nn.Module):
        def forward(self, x, n: int):
            return fn(x, n)

    args = (torch.randn(3, 8), 3)
    shapes = {"x": {1: Dim("s", min=3, max=64)}, "n": Dim.DYNAMIC}
    program = torch.export.export(Model(), args, dynamic_shapes=shapes)
    compiled = ortlite.compile(Model(), args, dynamic_shapes=shapes)
    compiled.save(tmp_path / "m.onnx")
    loaded = ortlite.load(tmp_path / "m.onnx")
    raised = 0
    for s, n in [(8, 3), (8, 0), (8, 1), (8, 8), (5, 9), (6, -2), (6, -6), (6, -7), (7, 6), (3, 1)]:
        x = torch.randn(3, s)
        try:
            expected = program.module()(x, n)
        except Exception:
            raised += 1
            for runner in (compiled, loaded):
                with pytest.raises(ValueError, match="exported program was traced under|outside the range"):
                    runner(x, n)
            continue
        assert_same(compiled(x, n), expected)
        assert_same(loaded(x, n), expected)
    assert 0 < raised < 10


def test_aot_sizes_that_must_agree():
    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    n = Dim("n")
    compiled = ortlite.compile(Add(), (torch.randn(4, 3), torch.randn(4, 3)), dynamic_shapes=({0: n}, {0: n}))
    x, y = torch.randn(6, 3), torch.randn(6, 3)
    assert_same(compiled(x, y), x + y)
    with pytest.raises(ValueError, match="must equal"):
        compiled(torch.randn(6, 3), torch.randn(5, 3))


def test_partition_whose_sizes_are_expressions_of_outer_symbols():
    """After a torch island, a partition sees sizes like (s0 - 1)//2 + 1 but not s0 itself:
    its outputs are allocated by ORT and handed over by DLPack."""
    from conftest import opaque

    conv1, conv2 = torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.Conv2d(4, 2, 3, stride=2)

    def fn(x):
        y = opaque(conv1(x).flatten()).view(x.shape[0], 4, (x.shape[2] - 3) // 2 + 1, -1)
        return conv2(torch.relu(y)) * 2

    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch, size in ((2, 17), (3, 21), (5, 33)):
            x = torch.randn(batch, 3, size, size)
            assert_same(compiled(x), fn(x), rtol=1e-3, atol=1e-4)  # cumsum in opaque grows the values
    assert backend.stats.runs >= 6 and "ortlite_test.opaque.default" in backend.stats.fallback_ops


def test_slice_and_select_scatter_along_a_symbolic_dim():
    """The backward of slicing along a sequence dim (e.g. BERT's pooler taking token 0)."""

    def fn(x, s):
        return (
            torch.ops.aten.slice_scatter(x, s, 1, 2, None),
            torch.ops.aten.select_scatter(x, s[:, 0], 1, -1),
            torch.ops.aten.select_scatter(x, s[:, 0], 1, 0),
            torch.ops.aten.slice_scatter(x, s[:, :2], 1, -3, -1),
        )

    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    sessions = []
    for n in (5, 7, 9, 11):
        x, s = torch.randn(3, n), torch.randn(3, n - 2)
        assert_same(compiled(x, s), fn(x, s))
        sessions.append(backend.stats.sessions)
    assert sessions[1] == sessions[-1]  # after Dynamo's recompile, one session serves all


def test_outputs_with_symbolic_sizes_are_recycled_and_never_visible():
    """aot_autograd stamps every output with symbolic sizes with an attribute
    (_dynamo_propagated_dynamic_indices); a dropped result is still refilled, without the
    attributes it had, and a result whose attributes someone still holds never is."""
    from ortlite import _fast

    fn = torch.compile(lambda x: torch.relu(x * 2 + 1), backend=ortlite.Backend(), dynamic=True)
    with torch.no_grad():
        fn(torch.randn(3, 4))
        x = torch.randn(5, 4)
        want = torch.relu(x * 2 + 1)
        first = fn(x)
        assert hasattr(first, "_dynamo_propagated_dynamic_indices")  # what used to block recycling
        del first
        pointers = set()
        for _ in range(6):
            out = fn(x)
            assert_same(out, want)
            pointers.add(out.data_ptr())
        assert len(pointers) == (2 if _fast.raw_counts() else 6)  # the loop `y = f(x)` alternates two buffers
        del out
        tagged = fn(x)
        tagged.note = "mine"
        del tagged
        held = fn(x)
        held.note = "kept"
        attributes = held.__dict__
        del held
        for _ in range(4):
            out = fn(x + 1)
            assert_same(out, torch.relu((x + 1) * 2 + 1))
            assert not hasattr(out, "note")
        assert attributes["note"] == "kept"


def test_sessions_whose_sizes_vary_without_a_key_make_no_memory_plans(monkeypatch, tmp_path):
    """Where the graph has no key input (CUDA graphs; CPU graphs saved before it existed),
    ONNX Runtime's own key is distinct per size and it would keep every plan: such
    sessions are made with memory patterns off. (On CPU here: the key input is taken away.)"""
    import ortlite.loading
    import ortlite.lower
    import ortlite.session

    monkeypatch.setattr(ortlite.lower, "_sizes_vary", lambda inputs, outputs: False)
    made = []
    real = ortlite.session.create_session
    record = lambda *a, **k: made.append(real(*a, **k)) or made[-1]  # noqa: E731
    monkeypatch.setattr(ortlite.session, "create_session", record)
    monkeypatch.setattr(ortlite.loading, "create_session", record)  # (ortlite.load's, imported from session)
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend=ortlite.Backend(), dynamic=True)
    static = torch.compile(lambda x: torch.relu(x) * 3, backend=ortlite.Backend(), dynamic=False)
    for n in (2, 3, 4):
        x = torch.randn(n, 5)
        assert_same(fn(x), torch.relu(x) * 2)
        assert_same(static(x), torch.relu(x) * 3)
    planned = [getattr(getattr(s, "session_options", None), "enable_mem_pattern", None) for s in made]
    assert planned[0] is False  # the symbolic graph's session: pybind, no plans
    assert all(p is not False for p in planned[1:])  # static graphs keep them (the C API session)
    # ahead of time, and a saved file loaded (as one written before the key input existed)
    made.clear()
    compiled = ortlite.compile(Relu2(), (torch.randn(3, 5),), dynamic_shapes=({0: Dim("n")},))
    path = str(tmp_path / "unkeyed.onnx")
    compiled.save(path)
    loaded = ortlite.load(path)
    for n in (2, 6):
        x = torch.randn(n, 5)
        assert_same(compiled(x), torch.relu(x) * 2)
        assert_same(loaded(x), torch.relu(x) * 2)
    assert [s.session_options.enable_mem_pattern for s in made] == [False, False]


class Relu2(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2
