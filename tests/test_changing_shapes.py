"""Changing sizes and int arguments between calls: the same compiled function called in a
loop, as Dynamo's automatic dynamic makes it symbolic at the second call (and with
dynamic=True). Results must equal eager's in value, dtype, shape and aliasing: an output
that is a view of an input is that view (same strides and storage offset)."""

import math
import random

import pytest
import sympy
import onnx
import torch
import torch.nn.functional as F
import torch.utils._sympy.functions as sympy_functions

import ortlite
from ortlite.runner import sizes_function


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel() > 0


def assert_like_eager(got, expected, inputs, where=""):
    got = got if isinstance(got, (tuple, list)) else [got]
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected), where
    for k, (g, e) in enumerate(zip(got, expected)):
        what = f"{where} output {k}"
        assert g.dtype == e.dtype and g.shape == e.shape, f"{what}: {g.dtype}{list(g.shape)} != eager's {e.dtype}{list(e.shape)}"
        assert torch.equal(g, e), f"{what}: values differ from eager"
        for x in inputs:
            eager_alias = _same_storage(e, x)
            assert _same_storage(g, x) == eager_alias, f"{what}: aliases an input: {_same_storage(g, x)}, eager: {eager_alias}"
            if eager_alias:
                assert (g.stride(), g.storage_offset()) == (e.stride(), e.storage_offset()), f"{what}: view metadata differs"


# --- the cases the issue found, each called in a loop ---------------------------------

VIEW_CASES = {
    "slice": (lambda t, i: t[:, i : i + 4], lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "slice_step": (lambda t, i: t[:, i::3], lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "select": (lambda t, i: t.select(1, i), lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "select_negative": (lambda t, i: t.select(1, -i - 1), lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "narrow": (lambda t, i: t.narrow(1, i, 3), lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "index_int": (lambda t, i: t[i], lambda i: (torch.arange(60.0).reshape(12, 5), i)),
    "split": (lambda t, i: t.split(3, 1)[i % 3], lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "split_n": (lambda t, n: t.split(n, 1), lambda i: (torch.arange(60.0).reshape(3, 20), i + 2)),
    "expand_as": (lambda t, u: t.expand_as(u), lambda i: (torch.arange(5.0).reshape(1, 5), torch.zeros(i + 2, 5))),
    "expand": (lambda t, n: t.expand(n, -1), lambda i: (torch.arange(5.0).reshape(1, 5), i + 2)),
    "broadcast_tensors": (lambda t, u: torch.broadcast_tensors(t, u), lambda i: (torch.arange(5.0).reshape(1, 5), torch.ones(i + 2, 1))),
    "view_of_computed_and_base": (lambda t, i: (lambda y: (y, y[:, i : i + 3].t()))(t + 1), lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "split_of_computed": (lambda t, n: (t * 2).split(n, 1), lambda i: (torch.arange(60.0).reshape(3, 20), i + 2)),
    "view_and_reduction": (lambda t, i: (t[:, i : i + 2], t.sum(1)), lambda i: (torch.arange(60.0).reshape(3, 20), i)),
    "growing_input": (lambda t, i: t[1:, i], lambda i: (torch.arange(6.0 * (i + 3)).reshape(6, i + 3), i)),
    "noncontiguous_input": (lambda t, i: t[i:, 1:], lambda i: (torch.arange(80.0).reshape(4, 20).t(), i)),
}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("case", sorted(VIEW_CASES))
def test_views_with_changing_int_arguments(case, dynamic):
    fn, make = VIEW_CASES[case]
    compiled = torch.compile(fn, backend=ortlite.Backend(), dynamic=dynamic)
    for i in range(5):
        args = make(i)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        assert_like_eager(compiled(*args), fn(*args), inputs, f"call {i}")


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear"])
@pytest.mark.parametrize("scale", [1.7, 1 / 3, 0.6, 2.5])
def test_interpolate_with_a_float_scale_and_symbolic_sizes(mode, scale):
    """Output sizes trunc(float(s) * scale) in float64, as Python computes them: checked
    over many sizes, where a rounding difference would show as a wrong shape."""
    fn = lambda t: F.interpolate(t, scale_factor=scale, mode=mode)  # noqa: E731
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n in range(3, 40, 3):
        t = torch.randn(1, 2, n, n + 1)
        torch.testing.assert_close(compiled(t), fn(t), rtol=1e-5, atol=1e-5, msg=lambda m: f"size {n}: {m}")
    assert backend.stats.fallback_ops == {}
    assert backend.stats.sessions <= 2  # one symbolic graph (and one where Dynamo specializes an output size of 1)


# --- property: random chains of views, slices, expands and arithmetic ------------------


class Program:
    """A random chain of view ops (and some arithmetic) over one tensor, with int arguments
    that change between calls. `ranges` are the ints' valid ranges for every input size the
    test uses (each dim is at least `low` of the size chosen at generation)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.rank = rng.randint(1, 4)
        self.low = [rng.randint(2, 6) for _ in range(self.rank)]
        self.grow = [rng.random() < 0.5 for _ in range(self.rank)]  # dims whose size changes
        self.noncontiguous = rng.random() < 0.25
        self.ranges: list[tuple[int, int]] = []
        self.steps: list[tuple] = []
        self.keep: list[int] = []  # steps whose results are also returned
        shape = list(self.low)
        for _ in range(rng.randint(1, 5)):
            step, shape = self._step(shape)
            if step is None:
                continue
            self.steps.append(step)
            if rng.random() < 0.2:
                self.keep.append(len(self.steps) - 1)
        self.return_base = rng.random() < 0.15

    def _int(self, low: int, high: int) -> int:
        self.ranges.append((low, max(low, high)))
        return len(self.ranges) - 1

    def _step(self, shape):
        rng, rank = self.rng, len(shape)
        kinds = ["mul", "add_int"] + (["slice", "select", "narrow", "transpose", "split", "unsqueeze", "diagonal", "flatten", "unfold"] if rank else [])
        kinds += ["expand"] if rank < 5 else []
        kind = rng.choice(kinds)
        d = rng.randrange(rank) if rank else 0
        if kind == "slice":
            a = self._int(0, shape[d])
            width, step = rng.randint(0, 4), rng.choice([1, 1, 2, 3])
            return ("slice", d, a, width, step), shape[:d] + [0] + shape[d + 1 :]
        if kind == "select" and shape[d] > 0:
            a = self._int(0, shape[d] - 1)
            return ("select", d, a, rng.random() < 0.5), shape[:d] + shape[d + 1 :]
        if kind == "narrow" and shape[d] > 0:
            length = rng.randint(0, shape[d])
            a = self._int(0, shape[d] - length)
            return ("narrow", d, a, length), shape[:d] + [length] + shape[d + 1 :]
        if kind == "transpose" and rank >= 2:
            d2 = rng.randrange(rank)
            shape = list(shape)
            shape[d], shape[d2] = shape[d2], shape[d]
            return ("transpose", d, d2), shape
        if kind == "split" and shape[d] > 0:
            a = self._int(1, shape[d])
            return ("split", d, a, rng.choice([0, -1])), shape[:d] + [1] + shape[d + 1 :]
        if kind == "unsqueeze":
            d = rng.randint(-rank - 1, rank)
            pos = d if d >= 0 else d + rank + 1
            return ("unsqueeze", d), shape[:pos] + [1] + shape[pos:]
        if kind == "expand":
            a = self._int(0, 3)
            return ("expand", a), [0] + shape
        if kind == "diagonal" and rank >= 2:
            d2 = (d + 1) % rank
            return ("diagonal", d, d2), [s for i, s in enumerate(shape) if i not in (d, d2)] + [0]
        if kind == "flatten" and rank >= 2:
            return ("flatten",), [0]
        if kind == "unfold" and shape[d] > 0:
            size = rng.randint(1, shape[d])
            return ("unfold", d, size, rng.randint(1, 3)), shape[:d] + [0] + shape[d + 1 :] + [size]
        if kind == "mul":
            return ("mul",), shape
        if kind == "add_int":
            return ("add_int", self._int(-3, 3)), shape
        return None, shape

    def function(self):
        """The program as a plain function (Dynamo traced a callable instance's __call__
        wrongly here, with its eager backend too: an output went missing)."""
        steps, keep, return_base, apply = list(self.steps), set(self.keep), self.return_base, self._apply

        def program(t: torch.Tensor, *ints: int):
            results = [t] if return_base else []
            for k, step in enumerate(steps):
                t = apply(t, step, ints)
                if k in keep:
                    results.append(t)
            return (*results, t)

        return program

    @staticmethod
    def _apply(t, step, ints):
        kind = step[0]
        if kind == "slice":
            _, d, a, width, stride = step
            return t[(slice(None),) * d + (slice(ints[a], ints[a] + width, stride),)]
        if kind == "select":
            _, d, a, negative = step
            return t.select(d, -1 - ints[a] if negative else ints[a])
        if kind == "narrow":
            return t.narrow(step[1], ints[step[2]], step[3])
        if kind == "transpose":
            return t.transpose(step[1], step[2])
        if kind == "split":
            _, d, a, which = step
            return t.split(ints[a], d)[which]
        if kind == "unsqueeze":
            return t.unsqueeze(step[1])
        if kind == "expand":
            return t.expand(ints[step[1]] + 1, *t.shape)
        if kind == "diagonal":
            return t.diagonal(0, step[1], step[2])
        if kind == "flatten":
            return t.flatten()
        if kind == "unfold":
            return t.unfold(step[1], step[2], step[3])
        if kind == "mul":
            return t * 2
        if kind == "add_int":
            return t + ints[step[1]]
        raise AssertionError(kind)

    def arguments(self, call: int):
        shape = [low + (call % 3 if grow else 0) for low, grow in zip(self.low, self.grow)]
        count = math.prod(shape)
        t = torch.arange(float(count * 2)).reshape(*shape, 2)[..., 0] if self.noncontiguous else torch.arange(float(count)).reshape(shape)
        # the same values at the first two calls (Dynamo's first compile), then others
        ints = [low if call < 1 else self.rng.randint(low, high) for low, high in self.ranges]
        return t, ints

    def describe(self) -> str:
        return f"rank {self.rank} low {self.low} grow {self.grow} nc {self.noncontiguous} steps {self.steps} keep {self.keep} base {self.return_base}"


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("seed", range(24))
def test_random_view_chains_with_changing_ints_match_eager(seed, dynamic):
    rng = random.Random(seed)
    program = Program(rng)
    fn = program.function()
    compiled = torch.compile(fn, backend=ortlite.Backend(), dynamic=dynamic)
    for call in range(4):
        t, ints = program.arguments(call)
        expected = fn(t, *ints)
        assert_like_eager(compiled(t, *ints), expected, [t], f"{program.describe()} call {call} ints {ints} shape {list(t.shape)}")
    torch._dynamo.reset()


# --- the sizes function: every sympy function ShapeEnv builds, evaluated in Python -----


def _size_functions():
    """Each sympy function of torch's ShapeEnv, applied to symbols, at the first arity that
    builds and evaluates at the test's values."""
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    built = []
    for name in sorted(dir(sympy_functions)):
        fn = getattr(sympy_functions, name)
        if not (isinstance(fn, type) and issubclass(fn, sympy.Function)):
            continue
        for args in ((s0 / 7, 2), (s0 + 3, s1), (s0 + 3,), (s0 + 3, s1, 2), (s0 / 7,)):
            try:
                expr = fn(*args)
                [_value(expr, values) for values in _size_values(expr)]
            except Exception:  # noqa: S112  (another arity, or outside the function's domain)
                continue
            if expr.free_symbols:
                built.append(pytest.param(expr, id=name))
            break
    return built


def _size_values(expr):
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    return [{s0: a, s1: b} for a, b in ((1, 2), (4, 3), (10, 7))]


def _value(expr, values):
    value = expr.subs(values)
    return int(value) if value.is_Integer else float(value)


@pytest.mark.parametrize("expr", _size_functions())
def test_sizes_function_computes_each_sympy_function_or_refuses(expr):
    """A size expression either evaluates to what sympy says, or the graph is refused at
    compile time (it then runs in torch): never a NameError at the first call."""
    from ortlite.lower import LoweredGraph, OutputSpec

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    symbols = {s0: [(0, None)], s1: [(1, None)]}
    lowered = LoweredGraph(None, [], [OutputSpec("sym", value=expr)], [], symbols=symbols)
    try:
        fn = sizes_function("g", lowered, [expr])
    except ValueError as e:
        assert "cannot compute sizes" in str(e)
        return
    for values in _size_values(expr):
        (got,) = fn([values[s0], values[s1]])[1]
        expected = _value(expr, values)
        assert math.isclose(got, expected, rel_tol=1e-12), f"{expr} at {values}: {got} != {expected}"


# --- a lowering that specializes a size is left to torch -------------------------------


def test_a_lowering_that_specializes_a_symbolic_size_is_left_to_torch(monkeypatch):
    """A lowering that turns a symbolic size into a Python int (here: a constant built
    from the size seen at compile time) would be right for that size only; the ShapeEnv
    refuses the guard, and the node runs in torch instead, for every size."""
    from ortlite.lower.ops.common import aten
    from ortlite.lower.registry import LOWERINGS, Lowering

    def neg_then_specialize(g, node, x):
        width = int(x.shape[-1])  # a guard on the symbolic size: refused
        return g.op("Mul", g.op("Neg", x), g.const([1.0] * width, torch.float32))

    monkeypatch.setitem(LOWERINGS, aten.neg.default, Lowering(neg_then_specialize, None))
    backend = ortlite.Backend()
    fn = torch.compile(lambda x: (-(x * 2)) + 1, backend=backend, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(2, n)
        assert torch.equal(fn(x), -(x * 2) + 1)
    assert backend.stats.fallback_ops == {"aten.neg.default": 1}
    assert backend.stats.sessions >= 1  # the rest still runs in ONNX Runtime


# --- ops models use, whole in ONNX Runtime while image sizes change --------------------


def _with_nans(x):
    x = x.clone()
    x.view(-1)[::7] = float("nan")
    x.view(-1)[3::11] = float("-inf")
    return x


WHOLE_WITH_CHANGING_SIZES = {
    "max_pool": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max_pool_nan": lambda x: F.max_pool2d(_with_nans(x), 2),
    "avg_pool": lambda x: F.avg_pool2d(x, 2),
    "avg_pool_padded": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg_pool_ceil": lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True),
    "avg_pool_ceil_kernel_over_input": lambda x: F.avg_pool2d(x, 16, ceil_mode=True),  # EfficientNet's head
    "adaptive_avg_pool_1": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive_avg_pool_uneven": lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
    "adaptive_avg_pool1d": lambda x: F.adaptive_avg_pool1d(x.flatten(2), 5),
    "adaptive_avg_pool3d": lambda x: F.adaptive_avg_pool3d(x.unsqueeze(0), (2, 3, 4)),
    "pad": lambda x: F.pad(x, (1, 2, 0, 1)),
    "pad_reflect": lambda x: F.pad(x, (1, 2, 1, 1), mode="reflect"),
    "repeat": lambda x: x.repeat(1, 2, 1, 1),
    "any": lambda x: (x > 0).any(-1),
    "argmax": lambda x: x.argmax(-1),
    "mean": lambda x: x.mean((-1, -2)),
    "mean_that_may_be_empty": lambda x: x[..., : x.shape[-1] // 8].mean(-1),  # NaN where w < 8
    "std": lambda x: x.std(-1),
    "hardtanh": lambda x: F.hardtanh(x, 0, 6),
    "cumsum": lambda x: x.cumsum(-1),
    "interpolate_bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "interpolate_nearest": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "interpolate_size": lambda x: F.interpolate(x, size=(x.shape[-2] * 2, x.shape[-1] + 1), mode="bilinear"),
    "conv": lambda x: F.conv2d(x, torch.ones(4, 3, 3, 3), stride=2, padding=1),
    "conv_padding_from_the_sizes": lambda x: F.conv2d(x, torch.ones(4, 3, 3, 3), padding=(x.shape[-2] // 4, x.shape[-1] % 3)),
    "conv_transpose": lambda x: F.conv_transpose2d(x, torch.ones(3, 2, 3, 3), stride=2, padding=1),
    "layer_norm_symbolic_shape": lambda x: F.layer_norm(x, x.shape[-1:]),
    "group_norm": lambda x: F.group_norm(x, 3),
    "softmax_topk_sort": lambda x: x.softmax(-1) + x.topk(2, -1).values.sum(-1, keepdim=True) + x.sort(-1).values,
    "unfold": lambda x: F.unfold(x, 2),
    "tril_triu_mask": lambda x: x.tril() * torch.ones(x.shape[-2], x.shape[-1], dtype=torch.bool).triu(1),
    "arange": lambda x: torch.arange(x.shape[-1]) * 2,
    "flip": lambda x: x.flip(-1),
    "embedding": lambda x: F.embedding(torch.arange(x.shape[-1]) % 5, torch.ones(5, 3)),
    "cat_stack": lambda x: torch.stack([torch.cat([x, x * 2], -1)] * 2, 0),
    "masks": lambda x: torch.where(~((x > 0) & (x < 1)), x, 0.0).masked_fill(x > 1, -1.0),
    "sign_ceil_log1p": lambda x: x.sign() + x.ceil() + x.abs().log1p(),
    "pool_island_then_resize": lambda x: F.interpolate(torch.special.airy_ai(F.avg_pool2d(x, 2)), size=x.shape[-2:]),
}


@pytest.mark.parametrize("case", sorted(WHOLE_WITH_CHANGING_SIZES))
def test_ops_stay_whole_while_sizes_change(case):
    fn = WHOLE_WITH_CHANGING_SIZES[case]
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend)  # automatic dynamic: symbolic from the 2nd call
    for h, w in ((6, 7), (9, 11), (8, 8), (13, 5)):
        x = torch.randn(2, 3, h, w)
        got, expected = compiled(x), fn(x)
        assert got.dtype == expected.dtype and got.shape == expected.shape, f"{h}x{w}"
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True, msg=lambda m: f"{h}x{w}: {m}")
    left = {op for op in backend.stats.fallback_ops if "airy_ai" not in op}  # airy_ai: no lowering, on purpose
    assert not left, backend.stats.fallback_ops


CUMULATIVE = {
    "cumprod": lambda t: torch.cumprod(t, 1),
    "logcumsumexp": lambda t: torch.logcumsumexp(t, 1),
    "cummax": lambda t: torch.cummax(t, 1),
    "cummin": lambda t: torch.cummin(t, -1),
}


@pytest.mark.parametrize(
    "case, dtype",
    [
        (case, dtype)
        for case in sorted(CUMULATIVE)
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bool)
        if not (case == "logcumsumexp" and not dtype.is_floating_point or case == "cumprod" and dtype == torch.bool)
    ],
)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_cumulative_ops_at_every_length(case, dtype, dynamic):
    """Short static lengths take the triangular spread; long and symbolic ones the doubling
    scan in a Loop. Ties, NaN and -inf are where the index rule shows."""
    fn = CUMULATIVE[case]
    torch.manual_seed(0)  # the same values in any test order (two workers share the suite)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for n in (2, 3, 7, 300, 1025) if dynamic else (5, 300):
        x = torch.randint(-2, 3, (3, n)).to(dtype) if not dtype.is_floating_point else torch.randn(3, n, dtype=dtype) * 1.01
        if dtype.is_floating_point:
            x[0, n // 2] = float("nan")
            x[1, n - 1] = float("-inf")
            x[2, ::3] = 0.5  # ties
        got, expected = compiled(x), fn(x)
        for g, e in zip(got if isinstance(got, tuple) else [got], expected if isinstance(expected, tuple) else [expected]):
            assert g.dtype == e.dtype and g.shape == e.shape, f"n={n}"
            torch.testing.assert_close(g, e, rtol=2e-6, atol=1e-5, equal_nan=True, msg=lambda m: f"n={n}: {m}")
    assert backend.stats.fallback_ops == {}


DIAGONALS = {
    "diagonal": lambda t, o: torch.diagonal(t, o, 0, 2) + 1,
    "diagonal_negative_dims": lambda t, o: torch.diagonal(t, -o, -1, 1) * 1,
    "diagonal_scatter": lambda t, o: torch.diagonal_scatter(t, torch.diagonal(t, o, 0, 2) * 2, o, 0, 2),
}


# Index ranges built from a symbolic size: ONNX Runtime's GatherToSliceFusion once made a
# Slice of a Range feeding a Gather, wrong wherever the range holds negative indices.
RANGES = {
    "forward": lambda s: torch.arange(s),
    "negative": lambda s: torch.arange(-s, 0),
    "reversed": lambda s: torch.arange(s - 1, -1, -1),
    "reversed_negative": lambda s: torch.arange(-1, -s - 1, -1),
    "across_zero": lambda s: torch.arange(-(s // 2), s // 2),
    "odd_positions": lambda s: torch.arange(1, s, 2),
    "negative_step_2": lambda s: torch.arange(-s, 0, 2),
}
RANGE_READERS = {
    "columns": lambda x, i: x[:, i],
    "rows": lambda x, i: x[i],
    "index_select": lambda x, i: x.index_select(1, i % x.shape[1]),  # which takes no negative index
}


@pytest.mark.parametrize("size_constants", [False, True], ids=["inline", "prelude"])
@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("reader", sorted(RANGE_READERS))
@pytest.mark.parametrize("indices", sorted(RANGES))
def test_gathers_by_ranges_built_from_sizes(indices, reader, dynamic, size_constants):
    def fn(x):
        return RANGE_READERS[reader](x, RANGES[indices](x.shape[1]))

    compiled = torch.compile(fn, backend=ortlite.Backend(ortlite.Options(size_constants=size_constants, fallback="error")), dynamic=dynamic)
    for s in [4, 6, 9, 5]:
        x = torch.arange(float(s * s)).reshape(s, s)
        assert_like_eager(compiled(x), fn(x), [x], f"size {s}")


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("case", sorted(DIAGONALS))
def test_diagonals_with_changing_sizes_and_offsets(case, dynamic):
    fn = DIAGONALS[case]
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    calls = [(3, 4, 5, 1), (4, 2, 6, 2), (5, 3, 2, 3), (6, 1, 9, 4), (2, 3, 2, 5), (7, 2, 4, 2)]
    for a, b, c, offset in calls:
        x = torch.randn(a, b, c)
        got, expected = compiled(x, offset), fn(x, offset)
        assert got.shape == expected.shape and torch.equal(got, expected), (a, b, c, offset)
    assert backend.stats.runs == len(calls) and backend.stats.fallback_ops == {}


PADS = [(1, 2, 0, 1), (2, 0, 1, 1), (-1, 2, 1, -2), (0, -2, 3, 0), (3, 1, 2, 2)]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_reflection_and_replication_pads_that_change_with_the_sizes(mode, dynamic):
    """Pads of either sign (a negative one crops) and input sizes, all changing per call."""
    torch._dynamo.reset()
    fn = lambda x, a, b, c, d: F.pad(x, (a, b, c, d), mode=mode) * 1  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for k, pads in enumerate(PADS):
        x = torch.randn(2, 3, 5 + k, 4 + 2 * k)
        torch.testing.assert_close(compiled(x, *pads), fn(x, *pads), rtol=0, atol=0, msg=lambda m: f"{pads}: {m}")
    assert backend.stats.fallback_ops == {} and backend.stats.runs == len(PADS)


SEARCHES = {
    "searchsorted": lambda s, v: torch.searchsorted(s, v) + 0,
    "searchsorted_right": lambda s, v: torch.searchsorted(s, v, right=True) + 0,
    "bucketize": lambda s, v: torch.bucketize(v, s) + 0,
    "batched": lambda s, v: torch.searchsorted(s.expand(3, -1).contiguous(), v.expand(3, -1)) + 0,
}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("case", sorted(SEARCHES))
def test_binary_searches_over_a_sequence_whose_length_changes(case, dynamic):
    """A symbolic length: the halvings run in a Loop until no search is open."""
    torch._dynamo.reset()
    fn = SEARCHES[case]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for n, m in [(5, 4), (20, 7), (3, 9), (64, 2), (100, 30)]:
        seq = torch.randint(0, 10, (n,)).sort().values.float()  # ties
        if n > 10:
            seq[n // 2] = float("nan")  # unsorted: aten's answer is still defined by its loop
        values = torch.randint(-1, 12, (m,)).float()
        got, expected = compiled(seq, values), fn(seq, values)
        assert torch.equal(got, expected), (n, m)
    assert backend.stats.fallback_ops == {}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_adaptive_average_pooling_gradients_with_changing_sizes(dynamic):
    torch._dynamo.reset()
    fn = lambda x: F.adaptive_avg_pool2d(x, (3, 5)) * 2  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for h, w in [(6, 7), (9, 11), (13, 5), (3, 4)]:
        x = torch.randn(2, 3, h, w, requires_grad=True)
        cotangent = torch.randn(2, 3, 3, 5)
        got = torch.autograd.grad(compiled(x), x, cotangent)[0]
        expected = torch.autograd.grad(fn(x), x, cotangent)[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=lambda m: f"{h}x{w}: {m}")
    assert backend.stats.fallback_ops == {}


INT_ARGUMENT_OPS = {
    "unfold": lambda x, a, b: x.unfold(1, a, b) * 1,
    "nonzero_static": lambda x, a, b: torch.nonzero_static(x > 0.5, size=a + b) + 0,
    "conv_padding": lambda x, a, b: F.conv1d(x.unsqueeze(0), torch.ones(2, 3, 3), padding=a) * 1,
    "conv_padding_2d": lambda x, a, b: F.conv2d(x.view(1, 1, 3, -1), torch.ones(2, 1, 2, 3), padding=(b, a), stride=2),
    "repeat_interleave": lambda x, a, b: torch.repeat_interleave(torch.arange(a) % 3 + 1, output_size=b) * 1,
}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("case", sorted(INT_ARGUMENT_OPS))
def test_window_and_size_arguments_that_change_between_calls(case, dynamic):
    torch._dynamo.reset()
    fn = INT_ARGUMENT_OPS[case]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for n, a, b in [(10, 3, 2), (13, 4, 3), (9, 2, 5), (20, 6, 4)]:
        x = torch.randn(3, n)
        if case == "repeat_interleave":  # output_size must be the sum of the repeats
            b = int((torch.arange(a) % 3 + 1).sum())
        assert torch.equal(compiled(x, a, b), fn(x, a, b)), (n, a, b)
    assert backend.stats.fallback_ops == {}
    if case != "unfold":  # unfold's window size must be a number: a graph per value
        # the static first call, then Dynamo's recompiles as sizes and ints turn symbolic; a
        # graph per value of the ints would make 4 or more
        assert backend.stats.graphs <= 3, backend.stats


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_a_view_whose_size_is_divided_by_an_int_argument(dynamic):
    torch._dynamo.reset()  # x.view(-1, a): the size 3n // a, with a of unknown sign to ShapeEnv
    fn = lambda x, a: x.view(-1, a) * 2  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for n, a in [(12, 4), (10, 5), (9, 3), (20, 6), (7, 21)]:
        x = torch.randn(3, n)
        got, expected = compiled(x, a), fn(x, a)
        assert got.shape == expected.shape and torch.equal(got, expected), (n, a)
    assert backend.stats.fallback_ops == {}


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 1.5, float("inf")])
@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_pdist_with_changing_row_and_column_counts(p, dynamic):
    torch._dynamo.reset()
    fn = lambda x: F.pdist(x, p)  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for n, d in [(5, 3), (8, 4), (2, 7), (11, 2), (6, 6)]:
        x = torch.randn(n, d)
        x[1, 0] = float("nan") if n == 8 else x[1, 0]
        got, expected = compiled(x), fn(x)
        assert got.shape == expected.shape, (n, d)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True, msg=lambda m: f"{n}x{d}: {m}")
    assert backend.stats.fallback_ops == {}


def test_det_with_a_symbolic_size_past_what_onnx_runtime_matches_goes_to_torch(caplog):
    torch._dynamo.reset()
    torch.manual_seed(0)  # (float32 determinants of 16 x 16: some draws differ from torch's by 5e-5 relative)
    backend = ortlite.Backend()
    compiled = torch.compile(torch.linalg.det, backend=backend, dynamic=True)
    for n in (3, 5, 16, 17, 24, 4):
        x = torch.randn(2, n, n) + 2 * torch.eye(n)
        torch.testing.assert_close(compiled(x), torch.linalg.det(x), rtol=2e-5, atol=1e-6, msg=lambda m: f"n={n}: {m}")
        if n == 16:
            assert backend.stats.fallback_ops == {}, "det is lowered while the matrices are small"
    assert list(backend.stats.fallback_ops) == ["aten._linalg_det.default"], backend.stats.fallback_ops
    assert sum("larger than 16 x 16" in r.getMessage() for r in caplog.records) == 1


def _pool_input(kind, h, w):
    if kind == "ties":
        return torch.randint(0, 2, (2, 3, h, w)).float()
    if kind == "all_minus_inf":  # windows that meet the padding: aten's max is -inf
        return torch.full((2, 3, h, w), -float("inf"))
    x = torch.randn(2, 3, h, w)
    if kind == "nan":
        x[0, 0, 1, 1] = float("nan")
        x[1, 1, 2:4, 2:4] = -float("inf")
    return x


@pytest.mark.parametrize("indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("kernel, stride, pad, dilation, ceil", [(3, 2, 1, 1, False), (3, 2, 1, 2, True), (2, 1, 1, 2, False), (2, 3, 0, 1, True)])
def test_max_pooling_with_symbolic_sizes_matches_eager_on_odd_inputs(kernel, stride, pad, dilation, ceil, indices):
    """ONNX MaxPool with symbolic sizes: dilation, ceil mode, indices (its flat index mod the
    plane; a NaN sends the op to torch), windows of -inf meeting the padding, NaN."""
    torch._dynamo.reset()
    fn = lambda x: F.max_pool2d(x, kernel, stride, pad, dilation, ceil_mode=ceil, return_indices=indices)  # noqa: E731
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for kind in ("randn", "ties", "all_minus_inf", "nan"):
        for h, w in ((7, 8), (9, 11)):
            x = _pool_input(kind, h, w)
            for got, expected in zip(*(r if isinstance(r, tuple) else (r,) for r in (compiled(x), fn(x)))):
                assert got.dtype == expected.dtype and got.shape == expected.shape
                assert ((got == expected) | (got.isnan() & expected.isnan())).all(), f"{kind} {h}x{w}"
        if kind == "all_minus_inf":
            assert backend.stats.fallback_ops == {}  # until a NaN meets the indices


@pytest.mark.parametrize(
    "kernel, stride, pad, ceil, count_pad, divisor",
    [(3, 2, 1, True, True, None), (3, 2, 1, False, False, None), (2, 2, 1, True, False, None), (3, 3, 1, True, True, 5), (3, 2, 0, True, False, 2)],
)
def test_average_pooling_in_every_mode_with_symbolic_sizes(kernel, stride, pad, ceil, count_pad, divisor):
    """ceil mode with pads, pads not counted, divisor_override: aten's divisor per window
    computed in the graph from the sizes."""
    torch._dynamo.reset()
    fn = lambda x: F.avg_pool2d(x, kernel, stride, pad, ceil_mode=ceil, count_include_pad=count_pad, divisor_override=divisor)  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for h, w in ((7, 8), (9, 11), (6, 6), (5, 13)):
        x = torch.randn(2, 3, h, w)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-6, msg=lambda m: f"{h}x{w}: {m}")


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_max_pooling_gradients_with_changing_sizes(dynamic):
    """The backward scatters each gradient to its window's max: ties (first max) too."""
    torch._dynamo.reset()
    fn = lambda x: F.max_pool2d(x, 3, 2, 1).sum()  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for h, w in ((7, 8), (9, 11), (6, 6)):
        for x in (torch.randn(2, 3, h, w), torch.randint(0, 2, (2, 3, h, w)).float()):
            x.requires_grad_()
            assert torch.equal(torch.autograd.grad(compiled(x), x)[0], torch.autograd.grad(fn(x), x)[0]), f"{h}x{w}"


@pytest.mark.parametrize("kernel, pad, count_pad", [(1280, 0, True), (7, 3, False), (5, 2, True)])
def test_symbolic_average_pooling_pads_inside_the_kernel(tmp_path, kernel, pad, count_pad):
    """With symbolic sizes the end padding of ceil-mode windows is symbolic too: a Pad node
    of it made ONNX Runtime write the padded input out (EfficientNet's head, a 1280 kernel
    over 2x2 planes, 150 ms a call). The pads are AveragePool's own, under the kernel."""
    torch._dynamo.reset()
    fn = lambda x: F.avg_pool2d(x, kernel, kernel, pad, ceil_mode=True, count_include_pad=count_pad)  # noqa: E731
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for h, w in ((2, 2), (3, 1), (9, 4), (kernel + 1, 2)):
        x = torch.randn(2, 3, h, w)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-6, msg=lambda m: f"{h}x{w}: {m}")
    ops = [n.op_type for p in tmp_path.glob("*.onnx") for n in onnx.load(p).graph.node]
    assert "AveragePool" in ops and "Pad" not in ops


@pytest.mark.parametrize("kernel, stride", [(1, 2), (2, 3), (3, 1), (3, 2), (4, 3), (5, None), (7, 2)])
def test_ceil_mode_average_pooling_matches_eager_at_every_size(kernel, stride):
    """The last window may overhang the input (or start in it only just): aten and ONNX
    must agree on the output size and on each overhanging window's divisor."""
    fn = lambda x: F.avg_pool2d(x, kernel, stride, 0, ceil_mode=True)  # noqa: E731
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for h in range(kernel, kernel + 9):
        x = torch.randn(2, 3, h, 2 * h + 1)
        got, expected = compiled(x), fn(x)
        assert got.shape == expected.shape, h
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=lambda m: f"{h}: {m}")
    assert backend.stats.fallback_ops == {}


@pytest.mark.parametrize("kernel, stride, pad", [(1, 2, 0), (2, 3, 1), (3, 2, 1), (4, 3, 2), (5, 2, 2), (3, 1, 0)])
def test_ceil_mode_max_pooling_matches_eager_at_every_size(kernel, stride, pad):
    """A last window that would start in the end padding is dropped by aten: ONNX Runtime's
    ceil_mode must agree at every size (NaN windows included)."""
    fn = lambda x: F.max_pool2d(x, kernel, stride, pad, ceil_mode=True)  # noqa: E731
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for h in range(max(1, kernel - 2 * pad), kernel + 8):
        x = _with_nans(torch.randn(2, 3, h, h + 3))
        got, expected = compiled(x), fn(x)
        assert got.shape == expected.shape, h
        assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0)), h
    assert backend.stats.fallback_ops == {}


def test_pads_that_change_sign_between_calls():
    fn = lambda x, a, b: F.pad(x, (a, b), value=2.5)  # noqa: E731
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend)
    for a, b in ((1, 2), (3, 0), (2, 5), (-2, 3), (-1, -2), (4, -3), (0, -7)):
        x = torch.randn(2, 7)
        assert torch.equal(compiled(x, a, b), fn(x, a, b)), (a, b)
    assert backend.stats.fallback_ops == {}


def test_size_expressions_are_simplified_and_divide_by_known_positive_sizes():
    fn = lambda x: x.view(x.shape[0] * x.shape[1] // x.shape[0], -1) * 2 + x.shape[1] // x.shape[0]  # noqa: E731
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n, m in ((3, 4), (5, 5), (4, 9)):
        x = torch.randn(n, m)
        assert torch.equal(compiled(x), fn(x))
    assert backend.stats.fallback_ops == {}


def test_in_place_writes_through_views_with_changing_bounds():
    """t[:, i:j] *= 2 and t.select(1, i) += 5: a slice or select scatter at a symbolic
    position (spliced: an empty or negative slice replaces what Python's would), whole."""

    def scale_slice(t, i, j):
        t[:, i:j].mul_(2)
        return t * 1

    def add_to_column(t, i):
        t.select(1, i).add_(5)
        return t * 1

    backend = ortlite.Backend()
    compiled = torch.compile(scale_slice, backend=backend)
    for i, j in ((0, 3), (2, 7), (-5, -1), (3, 100), (-100, 4), (6, 2), (-3, 19), (5, 5)):
        a, b = torch.arange(60.0).reshape(3, 20), torch.arange(60.0).reshape(3, 20)
        assert torch.equal(compiled(a, i, j), scale_slice(b, i, j)) and torch.equal(a, b), (i, j)
    assert backend.stats.fallback_ops == {}
    compiled = torch.compile(add_to_column, backend=ortlite.Backend())
    for i in (0, 3, 7, 19):
        a, b = torch.arange(60.0).reshape(3, 20), torch.arange(60.0).reshape(3, 20)
        assert torch.equal(compiled(a, i), add_to_column(b, i)) and torch.equal(a, b), i


@pytest.mark.parametrize(
    "fn",
    [
        lambda b, x, y, alpha, beta: torch.addmm(b, x, y, alpha=alpha, beta=beta),
        lambda b, x, y, alpha, beta: torch.addmv(b[:, 0], x, y[:, 0], alpha=alpha, beta=beta),
        lambda b, x, y, alpha, beta: torch.addbmm(b, x.expand(2, -1, -1), y.expand(2, -1, -1), alpha=alpha, beta=beta),
    ],
    ids=["addmm", "addmv", "addbmm"],
)
def test_symbolic_alpha_and_beta(fn):
    """alpha and beta as changing ints: beta == 0 ignores the bias (NaN in it too) per call."""
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for alpha, beta in ((2, 3), (3, 0), (1, 1), (0, 2), (5, 0)):
        b, x, y = torch.randn(3, 4), torch.randn(3, 5), torch.randn(5, 4)
        b[0, 0] = float("nan")
        torch.testing.assert_close(compiled(b, x, y, alpha, beta), fn(b, x, y, alpha, beta), equal_nan=True, msg=lambda m: f"{alpha}, {beta}: {m}")
    assert backend.stats.fallback_ops == {}


def _windows(x):
    """Swin's window partition after a patch merge: the padded size is a multiple of 4 and
    the merged size a square's root: (Y + (4 - Y % 4) % 4) // ((Y + (4 - Y % 4) % 4) // 4)."""
    b, h, w, c = x.shape
    x = F.avg_pool2d(x.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1).reshape(b, -1, c)
    side = x.shape[1] // (w // 2)  # ((h//2) * (w//2)) // (w//2)
    x = x.view(b, side, w // 2, c)
    pad_b, pad_r = (4 - side % 4) % 4, (4 - (w // 2) % 4) % 4
    x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    hp, wp = x.shape[1], x.shape[2]
    windows = x.view(b, hp // 4, 4, wp // 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, c)
    return (windows * 2).view(b, hp // (hp // 4), hp // 4, wp // 4, 4, c).sum(1)


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_window_padding_sizes_stay_whole(dynamic):
    backend = ortlite.Backend()
    compiled = torch.compile(_windows, backend=backend, dynamic=dynamic)
    for h in (10, 14, 22, 9, 16, 30):
        x = torch.randn(2, h, h + 2, 3)
        torch.testing.assert_close(compiled(x), _windows(x), msg=lambda m: f"{h}: {m}")
    assert backend.stats.fallback_ops == {}


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_as_strided_of_a_transposed_result_with_changing_sizes(dynamic):
    """The storage as_strided reads is laid out as eager's (transposed): with symbolic
    strides ortlite cannot rebuild that layout, and the graph runs in torch, never wrong."""
    fn = lambda x: torch.as_strided(x.t() * 2, (x.shape[1], 2), (1, x.shape[1])) + 1  # noqa: E731
    compiled = torch.compile(fn, backend=ortlite.Backend(), dynamic=dynamic)
    for n in (3, 5, 4, 7):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), fn(x), msg=lambda m: f"{n}: {m}")


def test_an_attribute_known_only_at_run_time_is_a_lowering_error_not_an_invalid_model():
    """ONNX attributes are numbers: a lowering that passes a run-time value (a symbolic int
    argument's graph input) must fail at lowering, so that only its node goes to torch
    (it used to build a model with string attributes that failed the whole graph)."""
    from ortlite.lower.builder import GraphBuilder, SymbolicShapeError, Value

    g = GraphBuilder("g", 20)
    x, pad = Value("x", torch.float32, (1, 1, 4, 4)), Value("pad", torch.int64, ())
    with pytest.raises(SymbolicShapeError, match="Conv needs its pads as a number"):
        g.op("Conv", x, x, pads=[pad, 0, pad, 0])
    assert g.op("Conv", x, x, pads=[1, 0, 1, 0])  # numbers are fine


# --- graphs compiled for the values of int and float arguments --------------------------


def _conv_norm_linspace(x, w, stride, pad, order):
    return F.conv2d(x, w, stride=stride, padding=pad), torch.linalg.vector_norm(x, order), torch.linspace(0, order, stride)


def test_int_and_float_arguments_that_must_be_numbers_get_a_graph_per_value():
    """dynamic=True makes a conv's padding, a norm's order, linspace's bounds symbolic;
    ONNX needs them as numbers: one variant per set of values, checked every call."""
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(_conv_norm_linspace, backend=backend, dynamic=True)
    calls = [(2, 1, 1.5), (2, 2, 1.5), (3, 0, 2.0), (2, 1, 1.5), (3, 2, 3.5), (2, 2, 1.5)]
    for stride, pad, order in calls:
        args = (torch.randn(1, 3, 9, 8), torch.randn(4, 3, 3, 3), stride, pad, order)
        for got, expected in zip(compiled(*args), _conv_norm_linspace(*args)):
            torch.testing.assert_close(got, expected, msg=lambda m: f"{stride, pad, order}: {m}")
    assert backend.stats.fallback_ops == {}
    assert backend.stats.runs == len(calls)
    # a variant per distinct stride and order; the padding stays symbolic (an explicit Pad)
    assert backend.stats.graphs == len({(stride, order) for stride, _, order in calls})


def test_past_the_variant_limit_new_values_run_in_torch_still_right(monkeypatch, caplog):
    from ortlite import specialize

    monkeypatch.setattr(specialize, "MAX_VARIANTS", 2)
    torch._dynamo.reset()
    backend = ortlite.Backend()
    fn = lambda x, w, stride: F.conv1d(x, w, stride=stride)  # noqa: E731
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    with caplog.at_level("WARNING", logger="ortlite"):
        for stride in (4, 5, 6, 8, 5, 9):  # (not 0 or 1, which Dynamo specializes, nor a size: duck sizing)
            x, w = torch.randn(1, 2, 17), torch.randn(3, 2, 3)
            torch.testing.assert_close(compiled(x, w, stride), fn(x, w, stride))
    assert backend.stats.graphs == 2  # the two variants; strides 6, 8, 9 ran the conv in torch
    assert backend.stats.fallback_ops == {"aten.convolution.default": 1}
    assert sum("compiled for 2 sets of values" in r.getMessage() for r in caplog.records) == 1


def test_a_variant_key_tells_minus_zero_and_bools_apart():
    from ortlite.specialize import _key

    assert _key(0.0) != _key(-0.0) and _key(1) != _key(True) and _key(1) != _key(1.0)
    assert _key(float("nan")) == _key(float("nan"))  # the same bits: the same graph serves
    f64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731  (a float Dynamo passes as a tensor)
    assert _key(f64(0.0)) != _key(f64(-0.0)) and _key(f64(0.5)) == _key(0.5)


def test_a_variant_is_chosen_by_value_whatever_the_objects():
    """Specializing skips the key when a call's numbers are the last call's objects: objects
    that are not the same still choose by value (-0.0 is not 0.0; an equal float is)."""
    from ortlite.specialize import Specializing

    compiled = []

    def compile_variant(values):
        (value,) = values.values()
        compiled.append(value)
        return (lambda *args: (value, args[1])), True

    spec = Specializing({"p": 1}, compile_variant, lambda: None, "g")
    zero, minus_zero, half = 0.0, -0.0, 0.5
    seen = [spec("x", v) for v in (zero, zero, minus_zero, minus_zero, zero, half, float("0.5"), minus_zero)]
    assert [math.copysign(1, v) for v, _ in seen] == [math.copysign(1, v) for _, v in seen]  # each ran its own value's variant
    assert [v for v, _ in seen] == [0.0, 0.0, -0.0, -0.0, 0.0, 0.5, 0.5, -0.0]
    assert len(compiled) == 3  # 0.0, -0.0, 0.5


class _ScaledRMSNorm(torch.nn.Module):
    """An RMSNorm with its eps and an output scale as float attributes (as transformers'
    LlamaRMSNorm keeps variance_epsilon), and gelu_new's math.pi."""

    def __init__(self, width=8):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)
        self.eps, self.scale = 1e-6, 0.5

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return torch.tanh(math.sqrt(2.0 / math.pi) * y) * self.scale


def _compiled_over_values(tmp_path, values, sizes=(3, 5, 4, 7, 2, 6)):
    """The module compiled with dynamic=True, called under no_grad with each (eps, scale)
    and a new size each call; each result compared with eager's. Returns the backend."""
    torch._dynamo.reset()
    model = _ScaledRMSNorm()
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for (eps, scale), n in zip(values, sizes):
            model.eps, model.scale = eps, scale
            x = torch.randn(n, n + 1, 8) * 1e-2
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-7, msg=lambda m: f"{eps, scale, n}: {m}")
    return backend


def test_float_attributes_are_constants_checked_every_call(tmp_path):
    """dynamic=True passes a module's float attributes (and math.pi) as float64 0-d tensor
    arguments: in inference graphs they become constants, a graph per set of their values,
    each call compared; a changed attribute gives eager's result at once."""
    import onnx

    values = [(1e-6, 0.5), (1e-6, 0.5), (1e-3, 0.5), (1e-1, 2.0), (1e-6, 0.5), (1e-3, 0.5)]
    backend = _compiled_over_values(tmp_path, values)
    assert backend.stats.graphs == 3 and backend.stats.runs == len(values)  # one graph per (eps, scale) seen
    for path in tmp_path.glob("*.onnx"):
        model = onnx.load(str(path))
        # the floats are constants of the model, converted to float32: the inputs are x and
        # the weight (frozen into an initializer after the dump), no float64, no cast (and the
        # runner's memory-pattern key, a uint8 input of its own)
        inputs = [i.type.tensor_type.elem_type for i in model.graph.input if not i.name.startswith("ortlite_pattern_key")]
        assert inputs == [onnx.TensorProto.FLOAT] * 2, path.name
        assert not [n for n in model.graph.node if n.op_type == "Cast"], path.name
    assert sorted(p.name.split("_")[-1] for p in tmp_path.glob("*.onnx")) == ["f0.onnx", "f1.onnx", "f2.onnx"]


def test_float_attributes_past_the_variant_limit_are_inputs(tmp_path, monkeypatch, caplog):
    from ortlite import dynamo_backend

    monkeypatch.setattr(dynamo_backend, "MAX_FLOAT_VARIANTS", 2)
    values = [(1e-6, 0.5), (1e-6, 0.25), (1e-6, 0.125), (1e-6, 0.5), (1e-6, 4.0), (1e-6, 0.25)]
    with caplog.at_level("WARNING", logger="ortlite"):
        backend = _compiled_over_values(tmp_path, values)
    assert backend.stats.graphs == 3  # two variants, then the graph with the floats as inputs
    assert sum("compiled for 2 sets of values" in r.getMessage() and "graph inputs" in r.getMessage() for r in caplog.records) == 1
    generic = [p for p in tmp_path.glob("*.onnx") if "_f" not in p.name]
    assert len(generic) == 1


def test_float_attributes_are_passed_as_numbers(tmp_path, monkeypatch):
    """Dynamo built a float64 tensor per attribute float per call before calling the graph
    (torch._as_tensor_fullprec, ~8 us each: on a small T5 under dynamic=True more than its
    graph saved); ortlite has it pass the Python floats its constants are checked against.
    Past the variant limit the generic graph takes them as tensors again: eager's values."""
    from ortlite import dynamo_backend

    monkeypatch.setattr(dynamo_backend, "MAX_FLOAT_VARIANTS", 1)
    built = []
    as_tensor = torch._as_tensor_fullprec
    monkeypatch.setattr(torch, "_as_tensor_fullprec", lambda v: built.append(v) or as_tensor(v))
    backend = _compiled_over_values(tmp_path, [(1e-6, 0.5)] * 3)
    assert backend.stats.graphs == 1 and built == []  # eps, scale, math.pi: none built
    backend = _compiled_over_values(tmp_path, [(1e-6, 0.5), (1e-3, 2.0), (1e-2, 0.5)])  # past the limit of 1
    assert backend.stats.graphs == 2 and len(built) > 0


def test_float_arguments_stay_inputs():
    """A float the function takes as an argument is the caller's to vary: one graph."""
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    fn = lambda x, alpha: torch.tanh(x * alpha)  # noqa: E731
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    with torch.no_grad():
        for n, alpha in ((3, 0.5), (4, 1.5), (5, 2.5), (6, -1.0)):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x, alpha), fn(x, alpha))
    assert backend.stats.graphs == 1


def test_sizes_are_not_specialized():
    """A node left to torch that takes a tensor's size does not make a graph per size."""
    torch._dynamo.reset()
    backend = ortlite.Backend()
    fn = lambda x: torch.special.airy_ai(x) + x.new_zeros(x.shape[0]).sum()  # noqa: E731
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n in (3, 4, 5, 6):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), fn(x))
    assert backend.stats.graphs <= 2  # one symbolic graph (and its split around airy_ai)


def test_conv_gradients_with_a_symbolic_padding():
    torch._dynamo.reset()
    backend = ortlite.Backend()
    fn = lambda x, w, pad: F.conv2d(x, w, padding=pad).tanh()  # noqa: E731
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for pad, h in ((1, 6), (2, 7), (0, 9)):
        x, w = torch.randn(2, 3, h, 5, requires_grad=True), torch.randn(4, 3, 3, 3, requires_grad=True)
        got = torch.autograd.grad(compiled(x, w, pad).sum(), (x, w))
        expected = torch.autograd.grad(fn(x, w, pad).sum(), (x, w))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    # the forward conv runs in ONNX Runtime, a variant per padding; the backward's sizes
    # depend on the padding's symbol (its check cannot rule out empty gradients): torch
    assert set(backend.stats.fallback_ops) <= {"aten.convolution_backward.default"}
