"""Scaled dot-product attention forward and backward, against eager in float64 (tight)."""

import pytest
import torch
import torch.nn.functional as F

import ortlite
from conftest import assert_same

torch.manual_seed(0)


def run_both(fn, shapes, dynamic_dims=(), dtype=torch.float64, **tolerance):
    inputs = [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    for t in inputs:
        for d in dynamic_dims:
            torch._dynamo.mark_dynamic(t, d)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    out = torch.compile(fn, backend=backend)(*inputs)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    expected = fn(*twins)
    (expected * weights).sum().backward()
    assert_same(out.detach(), expected.detach(), **tolerance)
    assert_same([t.grad for t in inputs], [t.grad for t in twins], **tolerance)
    assert backend.stats.graphs == 2 and backend.stats.fallback_ops == {}


TIGHT = dict(rtol=1e-12, atol=1e-12)
QKV = ((2, 4, 6, 8),) * 3


def test_plain():
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), QKV, **TIGHT)


def test_causal_and_scale():
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), QKV, **TIGHT)


def test_grouped_query_heads():
    shapes = ((2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8))
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), shapes, **TIGHT)


def test_float_mask_with_a_fully_masked_row():
    mask = torch.randn(6, 6, dtype=torch.float64)
    mask[2] = float("-inf")
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), QKV, **TIGHT)


def test_bool_mask_and_longer_source():
    mask = torch.rand(6, 7) > 0.3
    mask[1] = False
    shapes = ((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8))
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), shapes, **TIGHT)


def test_float32():
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), QKV, dtype=torch.float32, atol=1e-5)


@pytest.mark.parametrize("length", [5, 9, 13])
def test_symbolic_batch_and_length(length):
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    run_both(fn, ((3, 4, length, 8),) * 3, dynamic_dims=(0, 2), **TIGHT)


def test_dropout_stays_in_torch():
    backend = ortlite.Backend()
    q = torch.randn(2, 4, 6, 8)
    torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), backend=backend)(q)
    assert any("attention" in op or "dropout" in op for op in backend.stats.fallback_ops), backend.stats.fallback_ops
