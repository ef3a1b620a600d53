"""Ops that kept whole architectures of transformers partly in torch (issue 50, "the other
eight"): the triangular solve of gated delta-net layers (qwen3_5_text, olmo_hybrid)."""

import pytest
import torch

import ortlite

from conftest import Wrap, assert_same, check_fallback, check_lowered

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


# -- complex arithmetic as real (llama4's and deepseek_v2's rotary embeddings) --------------


def as_complex(x):
    return torch.view_as_complex(x.float().reshape(*x.shape[:-1], x.shape[-1] // 2, 2))


def rope(xq, freqs):
    """llama4's rotary embedding: polar, a product by a number, a complex product."""
    cis = torch.polar(torch.ones_like(freqs), freqs) * 0.7
    return torch.view_as_real(as_complex(xq) * cis[:, :, None, :]).flatten(3)


@pytest.mark.parametrize("dynamic", [False, True])
def test_complex_rotary(dynamic):
    xq, freqs = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 4) * 20
    check_lowered(rope, xq, freqs, dynamic=dynamic)
    check_lowered(rope, xq[:, :, :, :4], freqs[..., :2], dynamic=dynamic)  # non-contiguous
    check_lowered(rope, torch.zeros(0, 5, 3, 8), torch.zeros(0, 5, 4), dynamic=dynamic)  # empty


COMPLEX_OPS = {
    "product": lambda a, b: as_complex(a) * as_complex(b),
    "by real": lambda a, b: as_complex(a) * b[..., ::2],
    "by number": lambda a, b: as_complex(a) * 2.5,
    "by complex number": lambda a, b: as_complex(a) * (0.5 - 2j),
    "sum": lambda a, b: as_complex(a) + as_complex(b),
    "difference, alpha": lambda a, b: torch.sub(as_complex(a), as_complex(b), alpha=3),
    "real plus": lambda a, b: b[..., 1::2] + as_complex(a),
    "negation": lambda a, b: -as_complex(a),
    "complex": lambda a, b: torch.complex(a[..., ::2], b[..., 1::2]) * as_complex(b),
    "cat": lambda a, b: torch.cat([as_complex(a), as_complex(b)], dim=-2),
    "views": lambda a, b: as_complex(a).permute(1, 0, 2).select(0, 1)[:, None].expand(-1, 3, -1).squeeze(-1) * as_complex(b)[0],
    "reshape": lambda a, b: as_complex(a).reshape(-1) * as_complex(b).flatten(),
}


@pytest.mark.parametrize("op", COMPLEX_OPS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_complex_ops_as_real(op, dynamic):
    fn = COMPLEX_OPS[op]
    a, b = torch.randn(4, 3, 6), torch.randn(4, 3, 6)
    check_lowered(lambda a, b: torch.view_as_real(fn(a, b)), a, b, dynamic=dynamic)


def test_complex_non_finite_as_eager():
    # eager promotes a real operand to (x, 0): an infinite imaginary part times 0 is NaN
    a = torch.tensor([[1.0, float("inf")], [float("nan"), 2.0], [float("inf"), -0.0], [3.0, 4.0]])
    b = torch.tensor([2.0, float("inf"), 0.0, float("-inf")])
    for fn in (lambda a, b: as_complex(a) * b, lambda a, b: as_complex(a) * as_complex(a), lambda a, b: as_complex(a) * 0.0):
        check_lowered(lambda a, b: torch.view_as_real(fn(a, b)), a, b)
    check_lowered(lambda m, t: torch.view_as_real(torch.polar(m, t)), b.abs(), torch.tensor([0.0, 1e4, float("inf"), -3.0]))


def test_empty_outputs_have_eager_strides():
    # (they were all 0: torch's view_as_complex of ONNX Runtime's empty pairs refused them)
    x = torch.zeros(0, 10, 3, 2)
    assert check_lowered(lambda x: x * 2 + 1, x) and torch.compile(lambda x: x * 2 + 1, backend=ortlite.Backend())(x).stride() == (60, 6, 2, 1)
    check_fallback(lambda a, b: as_complex(a) * as_complex(b), torch.zeros(0, 1, 6), torch.zeros(0, 10, 6), op="aten.view_as_complex.default")


def test_complex_0d():
    check_lowered(lambda x: torch.view_as_real(torch.view_as_complex(x) * (1 + 2j)), torch.tensor([3.0, -1.0]))


def test_complex_values_leaving_the_graph_stay_in_torch():
    a = torch.randn(4, 6)
    # a complex result: its last view_as_complex is torch's; the product's arithmetic is not
    check_fallback(lambda a: as_complex(a) * as_complex(a), a, op="aten.view_as_complex.default")
    # an op of complex values not decomposed (abs): torch's, and so is the value it reads
    check_fallback(lambda a: (as_complex(a) * 2).abs(), a, op="aten.view_as_complex.default")
    # a complex argument: torch makes its pairs
    backend = check_fallback(lambda c: torch.view_as_real(c * c), torch.randn(3, dtype=torch.complex64), op="aten.view_as_real.default")
    assert backend.stats.graphs == 1


def test_complex_rotary_gradients():
    xq0, freqs = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 4)

    def loss(xq):
        out = rope(xq, freqs)
        return (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()

    xq = xq0.clone().requires_grad_()
    loss(xq).backward()
    fast = xq0.clone().requires_grad_()
    backend = ortlite.Backend()
    torch.compile(loss, backend=backend)(fast).backward()
    assert_same(fast.grad, xq.grad)


def test_llama4_rotary_of_transformers():
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding, apply_rotary_emb

    config = Llama4TextConfig(hidden_size=64, num_attention_heads=4, head_dim=16, num_hidden_layers=1, intermediate_size=64)
    rotary = Llama4TextRotaryEmbedding(config)

    def attention_inputs(q, k, positions):
        return apply_rotary_emb(q, k, rotary(q, positions))

    q, k = torch.randn(1, 7, 4, 16), torch.randn(1, 7, 2, 16)
    positions = torch.arange(7)[None] + 3
    check_lowered(attention_inputs, q, k, positions)
    check_lowered(attention_inputs, q, k, positions, dynamic=True)
    with torch.no_grad():
        compiled = ortlite.compile(Wrap(attention_inputs), (q, k, positions))
        assert_same(compiled(q * 2, k, positions + 5), attention_inputs(q * 2, k, positions + 5))
