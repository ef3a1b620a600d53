"""Options(size_constants=True): what integer arguments, sizes and constants alone determine
is computed apart (ortlite.lower.hoist), once per set of their values, and fed to the graph.
A stale or misplaced value would be a silently wrong result, so every case is called in a
loop whose sizes and ints change, come back (cache hits) and outnumber the cache (evictions),
each call compared with eager."""

import random

import pytest
import torch

import ortlite
import ortlite.runner
from conftest import assert_same
from test_changing_shapes import Program, assert_like_eager

ON = ortlite.Options(size_constants=True, fallback="error")


def _causal(x):  # a causal mask from the sizes, applied to data
    s = x.shape[-1]
    return x.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -1.0)


def _padding_gather(x, mask):  # transformers' padding mask: mask[batch_idx, kv_idx]
    b, s = mask.shape
    rows = torch.arange(b)[:, None].expand(b, s)
    cols = torch.arange(s)[None, :].expand(b, s)
    return x * mask[rows, cols]


def _positions(x):  # rotary-like: angles from a position range
    pos = torch.arange(x.shape[1], dtype=torch.float32)
    freq = 1.0 / (10000 ** (torch.arange(0, 4, 2, dtype=torch.float32) / 4))
    angles = pos[:, None] * freq[None, :]
    return x * torch.cat([angles.cos(), angles.sin()], -1).sum(-1)


def _window(x, n):  # an int argument: a band of width n
    s = x.shape[1]
    i = torch.arange(s)
    return x * ((i[:, None] - i[None, :]).abs() < n).float().sum(0)


def _counts(x):
    return x + torch.ones(x.shape[0], 1).cumsum(0) * x.shape[1]


def _negative_index(x):  # indices normalized against a symbolic size
    s = x.shape[1]
    return x[:, torch.arange(-s, 0)]


CASES = {
    "causal": (_causal, lambda s: (torch.randn(s, s),)),
    "padding_gather": (_padding_gather, lambda s: (torch.randn(3, s), (torch.rand(3, s) > 0.3).float())),
    "positions": (_positions, lambda s: (torch.randn(2, s),)),
    "window": (_window, lambda s: (torch.randn(2, s), s // 3 + 1)),
    "counts": (_counts, lambda s: (torch.randn(s, 5),)),
    "negative_index": (_negative_index, lambda s: (torch.randn(2, s),)),
}
# first two calls at one size (Dynamo's first compile), then new sizes, repeats and more
# distinct sizes than SizeConstants keeps
SIZES = [4, 4, 7, 9, 7, 4, 11, 13, 5, 6, 8, 10, 12, 14, 15, 4, 9]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_size_constants_match_eager_as_sizes_change(case, dynamic):
    fn, make = CASES[case]
    backend = ortlite.Backend(ON)
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    torch.manual_seed(0)
    for s in SIZES:
        args = make(s)
        assert_same(compiled(*args), fn(*args))
    hoisted = [r.size_constants for r in backend._runners if r.size_constants is not None]
    assert hoisted, "nothing was computed apart"
    assert sum(len(h.cache) for h in hoisted) > 0
    assert all(len(h.cache) <= h.MAX_ENTRIES for h in hoisted)
    assert all(h.bytes == sum(t.nbytes for ts in h.cache.values() for t in ts) <= h.MAX_BYTES for h in hoisted)
    # fewer prelude runs than calls with symbolic sizes: repeated sizes were served from the cache
    assert sum(h.misses for h in hoisted) < sum(r.runs for r in backend._runners if r.size_constants is not None)


def test_on_by_default_and_off_gives_the_same_results():
    assert ortlite.Options().size_constants is True
    fn, make = CASES["padding_gather"]
    off, on = ortlite.Backend(ortlite.Options(size_constants=False)), ortlite.Backend()
    f_off, f_on = torch.compile(fn, backend=off, dynamic=True), torch.compile(fn, backend=on, dynamic=True)
    for s in SIZES[:6]:
        args = make(s)
        torch.testing.assert_close(f_on(*args), f_off(*args), rtol=0, atol=0)
    assert all(r.size_constants is None for r in off._runners)


class _RelativeBias(torch.nn.Module):
    """What static graphs fold and symbolic ones computed per call: a relative-position bias
    gathered from a parameter by indices built from the sequence length (BEiT, Swin), and
    rotary angles from a buffer (LLaMA's inv_freq)."""

    def __init__(self, span: int = 32):
        super().__init__()
        self.span = span
        self.table = torch.nn.Parameter(torch.randn(2 * span - 1, 3))
        self.register_buffer("inv_freq", 1.0 / (100 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)))

    def forward(self, x):  # x: (batch, sequence, 8)
        s = x.shape[1]
        i = torch.arange(s)
        bias = self.table[(i[:, None] - i[None, :]).clamp(-self.span + 1, self.span - 1) + self.span - 1]  # (s, s, 3)
        angles = torch.arange(s, dtype=torch.float32)[:, None] * self.inv_freq[None, :]  # (s, 4)
        rotary = torch.cat([angles.cos(), angles.sin()], -1)  # (s, 8)
        return (x * rotary) @ x.transpose(1, 2) + bias.sum(-1)


def _change_table_in_place(model):
    model.table.mul_(1.5)


def _load_state_dict(model):
    model.load_state_dict({k: v + 0.25 for k, v in model.state_dict().items()})


def _replace_table_data(model):
    model.table.data = torch.randn_like(model.table)


def _write_buffer_bypassing_its_version(model):
    model.inv_freq.numpy()[:] *= 2  # (the bytes of a frozen buffer are compared every call)


CHANGES = {f.__name__.removeprefix("_"): f for f in
           (_change_table_in_place, _load_state_dict, _replace_table_data, _write_buffer_bypassing_its_version)}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_what_weights_and_sizes_determine_follows_every_weight_change(change, dynamic):
    """The size prelude also computes what frozen weights and sizes together determine, and
    keeps it per set of sizes: a weight change between calls must reach the next call at
    sizes seen before (cache hits), and a graph whose weights change at every call (bound
    as inputs from then on) stays right too."""
    torch.manual_seed(0)
    model = _RelativeBias()
    backend = ortlite.Backend(ON)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    sizes = [5, 5, 8, 5, 8, 5, 11, 8]
    with torch.no_grad():
        for s in sizes:  # weights unchanged: sizes come back, served from the prelude's cache
            x = torch.randn(2, s, 8)
            assert_same(compiled(x), model(x))
        preludes = [r.size_constants for r in backend._runners if r.size_constants is not None]
        assert any(p.weights for p in preludes), "nothing of the weights was computed apart"
        assert sum(p.misses for p in preludes) < sum(r.runs for r in backend._runners if r.size_constants is not None)
        for step, s in enumerate(sizes + sizes):  # a change every other call, then every call
            if step % 2 or step >= len(sizes):
                CHANGES[change](model)
            x = torch.randn(2, s, 8)
            assert_same(compiled(x), model(x))


def _model_and_reference(cls):
    """Two instances with the same weights: one compiled, one eager."""
    torch.manual_seed(0)
    model, reference = cls(), cls()
    reference.load_state_dict(model.state_dict())
    return model, reference


def test_training_graphs_keep_their_weights_out_of_the_size_constants():
    """Weights that require grad are bound inputs, not watched for changes: what they
    determine is computed in the graph (an optimizer step changes them every call)."""
    model, reference = _model_and_reference(_RelativeBias)
    backend = ortlite.Backend(ON)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for s in [5, 7, 5, 7]:
        x = torch.randn(2, s, 8)
        for m, optimizer in zip((compiled, reference), optimizers):
            m(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert_same(model.table, reference.table)
    assert all(not r.size_constants.weights for r in backend._runners if r.size_constants is not None)


def test_results_too_large_to_keep_are_computed_every_call(monkeypatch):
    monkeypatch.setattr(ortlite.runner.SizeConstants, "MAX_BYTES", 0)
    fn, make = CASES["causal"]
    backend = ortlite.Backend(ON)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for s in [6, 6, 9, 6, 9]:
        args = make(s)
        assert_same(compiled(*args), fn(*args))
    hoisted = [r.size_constants for r in backend._runners if r.size_constants is not None]
    assert hoisted and all(not h.cache for h in hoisted)
    assert sum(h.misses for h in hoisted) == sum(r.runs for r in backend._runners if r.size_constants is not None)


def test_what_is_kept_stays_within_its_byte_budget(monkeypatch):
    """MAX_BYTES bounds all results kept together: the oldest sets of sizes go first."""
    fn, make = CASES["causal"]  # results: an s x s bool mask
    monkeypatch.setattr(ortlite.runner.SizeConstants, "MAX_BYTES", 2 * 13 * 13)
    backend = ortlite.Backend(ON)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    kept = []
    for s in [6, 6, 9, 12, 13, 5, 13, 6]:
        args = make(s)
        assert_same(compiled(*args), fn(*args))
        (h,) = [r.size_constants for r in backend._runners if r.size_constants is not None]
        assert h.bytes == sum(t.nbytes for ts in h.cache.values() for t in ts) <= h.MAX_BYTES
        kept.append(len(h.cache))
    assert max(kept) >= 2 and min(kept[2:]) < max(kept), kept  # some sets were kept, older ones let go


def _hoisted(backend):
    return [r for r in backend._runners if r.size_constants is not None]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sizes_that_change_every_call_go_to_the_graph_without_a_prelude(case, dynamic, caplog):
    """Past MISSES_BEFORE_REPLACING misses (generate's growing cache: a new size every call)
    the runner hands its calls to the graph compiled without a prelude; every call before,
    at and after the switch gives eager's result, and one log line says so."""
    fn, make = CASES[case]
    backend = ortlite.Backend(ON)
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    torch.manual_seed(0)
    with caplog.at_level("INFO", logger="ortlite"):
        for s in range(3, 3 + 2 * ortlite.runner.SizeConstants.MISSES_BEFORE_REPLACING + 6):
            args = make(s)
            assert_same(compiled(*args), fn(*args))
    (replaced,) = [r for r in _hoisted(backend) if r.size_constants.on_sizes_keep_changing is None]
    assert replaced.size_constants.misses == replaced.size_constants.MISSES_BEFORE_REPLACING  # none after the switch
    unhoisted = [r for r in backend._runners if r.size_constants is None and r.runs]
    assert unhoisted and sum(r.runs for r in unhoisted) >= ortlite.runner.SizeConstants.MISSES_BEFORE_REPLACING
    assert sum("compiled again without size constants" in r.message for r in caplog.records) == 1


def test_sizes_that_come_back_keep_the_prelude():
    fn, make = CASES["causal"]
    backend = ortlite.Backend(ON)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for s in [3, 4, 5, 6, 7, 8] * 8:  # 6 sets of sizes: hits after the first round
        args = make(s)
        assert_same(compiled(*args), fn(*args))
    (hoisted,) = _hoisted(backend)
    assert hoisted.runs == 48 and hoisted.size_constants.misses == 6
    assert hoisted.size_constants.on_sizes_keep_changing is not None


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_graph_without_a_prelude_keeps_its_weights_frozen_and_watched(change):
    """After the switch, the weights the prelude read are initializers of the new graph,
    and a change to them still reaches the next call."""
    torch.manual_seed(0)
    model = _RelativeBias()
    backend = ortlite.Backend(ON)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for step, s in enumerate(range(4, 44)):
            if step in (30, 35):  # after the switch
                CHANGES[change](model)
            x = torch.randn(2, s, 8)
            assert_same(compiled(x), model(x))
    (replaced,) = [r for r in _hoisted(backend) if r.size_constants.on_sizes_keep_changing is None]
    assert replaced.size_constants.weights
    (unhoisted,) = [r for r in backend._runners if r.size_constants is None and r.runs]
    assert unhoisted.frozen_tensors()


def test_a_bad_argument_is_named_not_crashed_on(monkeypatch):
    calls = []
    call = ortlite.runner.SizeConstants.__call__
    monkeypatch.setattr(ortlite.runner.SizeConstants, "__call__", lambda self, args: calls.append(args) or call(self, args))
    fn, make = CASES["window"]
    backend = ortlite.Backend(ON)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for s in [6, 8]:
        compiled(*make(s))
    (runner,) = [r for r in backend._runners if r.size_constants is not None]
    args = list(calls[-1])
    for position, bad in [(next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)), "a string"),
                          (next(i for i, a in enumerate(args) if type(a) is int), 2.5)]:
        wrong = list(args)
        wrong[position] = bad
        with pytest.raises((TypeError, ValueError), match=rf"ortlite graph .*argument {position}"):
            runner(wrong)


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("seed", range(8))
def test_random_view_chains_with_size_constants_match_eager(seed, dynamic):
    """test_changing_shapes' random chains of views and int arguments, with values that
    come back (cache hits) between new ones."""
    program = Program(random.Random(seed))
    fn = program.function()
    compiled = torch.compile(fn, backend=ortlite.Backend(ortlite.Options(size_constants=True)), dynamic=dynamic)
    for call in [0, 1, 2, 1, 3, 2, 4, 1]:
        program.rng = random.Random(seed * 100 + call)  # the same ints whenever a call number comes back
        t, ints = program.arguments(call)
        assert_like_eager(compiled(t, *ints), fn(t, *ints), [t], f"{program.describe()} call {call} ints {ints} shape {list(t.shape)}")
    torch._dynamo.reset()


class _MaskedAttention(torch.nn.Module):
    """Scores masked by a causal mask and positions built from the sequence length."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        s = x.shape[1]
        h = self.proj(x) + torch.arange(s, dtype=torch.float32)[None, :, None] / s
        scores = h @ h.transpose(1, 2)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1) @ h


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_training_with_size_constants_matches_eager_gradients(dynamic):
    """Backward graphs are compiled the same way: their size constants too."""
    model, reference = _model_and_reference(_MaskedAttention)
    backend = ortlite.Backend(ON)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    for s in [5, 5, 7, 9, 7, 5]:
        x = torch.randn(2, s, 8, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, expected = compiled(x), reference(x_ref)
        assert_same(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        assert_same(x.grad, x_ref.grad)
        for p, q in zip(model.parameters(), reference.parameters()):
            assert_same(p.grad, q.grad)
            p.grad = q.grad = None
    assert any(r.size_constants is not None for r in backend._runners)
