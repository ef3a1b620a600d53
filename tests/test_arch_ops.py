"""Ops that kept whole architectures of transformers partly in torch (issue 50, "the other
eight"): the triangular solve of gated delta-net layers (qwen3_5_text, olmo_hybrid)."""

import pytest
import torch

import ortlite

from conftest import assert_same, check_fallback, check_lowered

SOLVE = "aten.linalg_solve_triangular.default"


def triangular(n, *batch, upper=False, unit=False, dtype=torch.float32, garbage=True):
    """A well-conditioned triangular matrix (a unit or dominant diagonal), its other triangle
    holding values eager never reads (NaN and inf among them)."""
    a = torch.randn(*batch, n, n, dtype=dtype) * 0.3
    a = a + torch.diag_embed(torch.rand(*batch, n, dtype=dtype) + 1.5) * (0 if unit else 1)
    keep = torch.triu(torch.ones(n, n, dtype=torch.bool)) if upper else torch.tril(torch.ones(n, n, dtype=torch.bool))
    if unit:
        keep &= ~torch.eye(n, dtype=torch.bool)
    other = torch.full_like(a, float("nan")) if garbage else torch.zeros_like(a)
    if garbage and n > 2:
        other[..., 0, -1] = other[..., -1, 0] = float("inf")
    return torch.where(keep, a, other)


def solve(upper, left=True, unit=False):
    return lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
def test_solve_triangular(upper, left, unit, dynamic):
    fn = solve(upper, left, unit)
    a = triangular(6, 2, 3, upper=upper, unit=unit)
    b = torch.randn(2, 3, 6, 4) if left else torch.randn(2, 3, 4, 6)
    check_lowered(fn, a, b, dynamic=dynamic)
    check_lowered(fn, a[0], b[:, :1], dynamic=dynamic)  # batch dims broadcast both ways


@pytest.mark.parametrize("dynamic", [False, True])
def test_solve_triangular_odd_inputs(dynamic):
    fn = solve(upper=False)
    a = triangular(5, 3)
    check_lowered(fn, a.mT.contiguous().mT, torch.randn(3, 4, 5).mT, dynamic=dynamic)  # non-contiguous both
    check_lowered(fn, a[:, ::1, :], torch.randn(3, 5, 2)[..., :1], dynamic=dynamic)  # one column
    check_lowered(fn, triangular(1, 3), torch.randn(3, 1, 7), dynamic=dynamic)  # 1 x 1
    check_lowered(fn, triangular(5), torch.randn(5, 3, dtype=torch.float32), dynamic=dynamic)  # no batch
    check_lowered(solve(upper=True, unit=True), triangular(7, upper=True, unit=True, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64), dynamic=dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
def test_solve_triangular_empty(dynamic):
    fn = solve(upper=False)
    check_lowered(fn, torch.zeros(2, 0, 0), torch.zeros(2, 0, 3), dynamic=dynamic)
    check_lowered(fn, triangular(4, 2), torch.zeros(2, 4, 0), dynamic=dynamic)
    check_lowered(fn, torch.zeros(0, 4, 4), torch.zeros(0, 4, 3), dynamic=dynamic)


def test_solve_triangular_non_finite_runs_in_torch():
    # a NaN in B, a zero pivot: trsm spreads inf and NaN in an order of its own
    fn = solve(upper=False)
    a, b = triangular(4, garbage=False), torch.randn(4, 2)
    b[1, 0] = float("nan")
    check_fallback(fn, a, b, op=SOLVE)
    a[2, 2] = 0.0
    check_fallback(fn, a, torch.randn(4, 2), op=SOLVE)


def test_solve_triangular_of_half_raises_as_eager():
    a, b = triangular(3, garbage=False).half(), torch.randn(3, 2).half()
    with pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        solve(upper=False)(a, b)
    with pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        torch.compile(solve(upper=False), backend=ortlite.Backend())(a, b)


@pytest.mark.parametrize("upper", [False, True])
def test_solve_triangular_gradients(upper):
    a0 = triangular(5, 2, upper=upper, garbage=False)
    b0 = torch.randn(2, 5, 3)

    def step(a, b):
        x = torch.linalg.solve_triangular(a, b, upper=upper)
        return (x * torch.linspace(-1, 1, x.numel()).view(x.shape)).sum()

    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    step(a, b).backward()
    backend = ortlite.Backend()
    a1, b1 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    torch.compile(step, backend=backend)(a1, b1).backward()
    assert_same(a1.grad, a.grad)
    assert_same(b1.grad, b.grad)
    assert SOLVE not in backend.stats.fallback_ops, backend.stats.fallback_ops
    assert backend.stats.graphs == 2  # forward and backward, each in ONNX Runtime


# -- bfloat16 read into float32 graphs (recurrent_gemma's normalizer) ---------------------


class Normalized(torch.nn.Module):
    """recurrent_gemma's embedding scale: a bfloat16 buffer of a float32 model."""

    def __init__(self):
        super().__init__()
        self.normalizer = torch.nn.Buffer(torch.tensor(64**0.5, dtype=torch.bfloat16), persistent=False)
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x * self.normalizer.type(x.dtype))


@pytest.mark.parametrize("dynamic", [False, True])
def test_bfloat16_weight_read_into_float32_graph(dynamic):
    model = Normalized()
    x = torch.randn(3, 5, 4)
    with torch.no_grad():
        check_lowered(model, x, dynamic=dynamic)
        check_lowered(model, x[:, ::2], dynamic=dynamic)  # non-contiguous
        check_lowered(model, torch.zeros(0, 5, 4), dynamic=dynamic)  # empty
        compiled = ortlite.compile(model, (x,))  # torch.export's metadata assert of the buffer too
        assert_same(compiled(x * 2), model(x * 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bfloat16_input_read_as_float(dtype):
    x = (torch.randn(3, 4) * 100).bfloat16()
    check_lowered(lambda x: x.to(dtype) * 3 + 1, x)
    check_lowered(lambda x: x.to(dtype).sum(), x[:, 1])  # non-contiguous
    check_lowered(lambda x: x.to(dtype) * 3, x[0, 0])  # 0-d


def test_bfloat16_arithmetic_and_lone_casts_stay_in_torch():
    x = torch.randn(3, 4).bfloat16()
    # a cast of a value torch computed in bfloat16: the graph's bfloat16 part stays torch's
    check_fallback(lambda x: (x * 2).float() + 1, x, op="aten._to_copy.default")
    # a cast read by nothing that lowers: no session of its own for it
    check_fallback(lambda x: x.float(), x, op="aten._to_copy.default")
    # narrowing is rounding: not a read
    check_fallback(lambda x: (x.float() + 1).bfloat16(), x, op="aten._to_copy.default")


# -- a weight a graph only returns (ctrl's pos_encoding, reassigned in forward) -------------


class Reassigned(torch.nn.Module):
    """ctrl: `self.pos_encoding = self.pos_encoding.to(device, dtype)` in forward. Dynamo
    breaks the graph there (nn.Buffer's `persistent`); the graph before returns the buffer."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Buffer(torch.randn(8, 4), persistent=False)
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        y = x * self.scale
        self.table = self.table.to(device=x.device, dtype=x.dtype)
        return y + self.table[: x.shape[0]]


def test_weight_only_returned_is_not_frozen():
    model = Reassigned()
    x = torch.randn(3, 4)
    backend = ortlite.Backend()
    with torch.no_grad():
        expected = model(x)
        fast = torch.compile(model, backend=backend)
        assert_same(fast(x), expected)
        assert_same(fast(x), expected)
    assert backend.stats.fallback_ops == {}, backend.stats.fallback_ops
    assert backend.stats.frozen >= 1  # the scale, read by the product, still is
