"""Scaled dot-product attention (the CPU flash kernels' forward and backward): on CPU in
float32, inference graphs get ONNX's fused Attention (opset 23); the rest, and rows that
kernel treats otherwise than aten, are written out in ONNX ops: MatMul, Softmax, masks.
Kept whole: the core decomposition of the forward gives training gradients that differ
from eager (see decomp.py). The heads' views, copies and rotary embedding around the fused
kernel are rewritten on the lowered graph (fusions.attention_fusions)."""

from __future__ import annotations

import math

import onnxruntime
import torch

from ...options import DEFAULT_OPSET
from ..builder import TORCH_TO_ONNX, Value
from ..registry import lower
from .shape import reshape_to
from .common import any_true, any_zero, aten, arg_val, computed_now, indices_used, is_float, may_be_zero

FUSED_OPSET = 23  # ONNX Attention


def _ort_version() -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in onnxruntime.__version__.split(".")[:2])
    except ValueError:
        return (0,)


# ONNX Runtime's CPU Attention as measured against aten (tests/test_fusions.py): 1.31
FUSED_ATTENTION_ORT = _ort_version() >= (1, 31)


def _shapes_check(q, k, dropout_p) -> str | None:
    if dropout_p:
        return "dropout in attention (random)"
    if q.dim() != 4 or k.dim() != 4:
        return "attention input ranks"
    if not all(isinstance(d, int) for d in (q.shape[1], k.shape[1], q.shape[3])):
        return "symbolic head count or head size"
    if q.shape[1] % k.shape[1]:
        return "query heads not a multiple of key heads"
    return None


def _sdpa_check(node):
    q = arg_val(node, 0)
    dropout_p = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    reason = _shapes_check(q, arg_val(node, 1), dropout_p)
    return reason or (None if is_float(q.dtype) else "non-float input")


def _repeat_heads(g, x, heads: int):
    """Grouped-query attention: kv head j serves query heads j*r .. j*r + r - 1."""
    b, h, s, e = x.shape
    if h == heads:
        return x
    grown = g.expand(Value(g.op("Unsqueeze", x, g.ints([2])), x.dtype, (b, h, 1, s, e)), [b, h, heads // h, s, e])
    return reshape_to(g, Value(grown, x.dtype, (b, h, heads // h, s, e)), [b, heads, s, e])


def _sum_head_groups(g, grad, kv):
    """The gradient of _repeat_heads: sum each group of query heads back onto its kv head."""
    b, h, s, e = kv.shape
    grouped = g.op("Reshape", grad, g.shape([b, h, -1, s, e]))
    return g.op("ReduceSum", grouped, g.ints([2]), keepdims=0)


def _causal_allowed(g, length, source):
    """(length, source) bool: query i sees keys 0..i (top-left aligned)."""
    if isinstance(length, int) and isinstance(source, int):
        return g.const(torch.ones(length, source, dtype=torch.bool).tril())
    rows = g.op("Unsqueeze", g.arange(length), g.ints([1]))
    cols = g.arange(source)
    return g.op("LessOrEqual", cols, rows)


def _scores(g, q, k, scale, is_causal, attn_mask):
    """Scaled, masked attention scores (masked entries -inf) and k with q's head count."""
    heads, length, dim = q.shape[1], q.shape[2], q.shape[3]
    source = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    k = _repeat_heads(g, k, heads)
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.const(scale, q.dtype))
    minus_inf = g.const(float("-inf"), q.dtype)
    if is_causal:
        scores = g.op("Where", _causal_allowed(g, length, source), scores, minus_inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = g.op("Where", attn_mask, scores, minus_inf)
        else:
            scores = g.op("Add", scores, g.cast(attn_mask, q.dtype))
    return scores, k, scale


def _fused_ok(g, node, q, k, attn_mask, lse_used: bool) -> bool:
    """ONNX's Attention computes what aten does for these arguments (float32 on CPU; no
    logsumexp wanted: inference graphs; no empty size; a float mask of rank <= 4), and this
    graph may be opset 23 (the default opset is raised to it; an opset chosen below 23 keeps
    the ops written out)."""
    if not FUSED_ATTENTION_ORT or not (g.opset >= FUSED_OPSET or g.opset == DEFAULT_OPSET):
        return False
    if q.dtype != torch.float32 or arg_val(node, 0).device.type != "cpu" or k.dtype != torch.float32:
        return False
    if lse_used:
        return False
    if any(isinstance(d, int) and d == 0 for d in (*q.shape, *k.shape)):  # (one that may be 0 is checked at run time: _fused)
        return False
    return attn_mask is None or (attn_mask.dtype == torch.float32 and 1 <= attn_mask.rank <= 4)


def _same(a, b) -> bool:
    """Sizes known equal without a guard (ints, or the same symbolic size)."""
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _fused(g, q, k, v, is_causal, attn_mask, scale, mask_now=None):
    """ONNX Attention (4-d q, k, v as aten's: grouped heads and a top-left causal mask as
    aten's). Its CPU kernel gives zeros for a row whose masked scores all are the lowest
    float (aten: their softmax, uniform weights); rows whose mask (where the causal mask
    allows) is nowhere above -1e30 or NaN take the written-out ops instead, in an If, or,
    for a mask computed from constants alone (mask_now: its value; a static causal mask),
    as that check decides now."""
    g.opset = max(g.opset, FUSED_OPSET)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    attrs = dict(scale=float(scale), is_causal=int(bool(is_causal)))
    like = [Value("", q.dtype, ())]
    # a symbolic size that may be 0 (Swin's window count: interval bounds of floor divisions
    # reach 0) is checked at run time: the kernel is not for empty inputs
    empty = any_zero(g, [d for d in (*q.shape, *k.shape) if may_be_zero(d)], (q, k))
    if attn_mask is None:
        if empty is None:
            return g.op("Attention", q, k, v, **attrs)
        (out,) = g.if_(
            empty,
            lambda b: [_written_out(b, q, k, v, is_causal, attn_mask, scale, False)[0]],
            lambda b: [b.op("Attention", q, k, v, **attrs)],
            like,
        )  # fmt: skip
        return out
    length, source = q.shape[2], k.shape[2]
    # the kernel takes masks whose last two sizes are the query and key lengths
    mask = attn_mask
    if attn_mask.rank != 4 or not _same(attn_mask.shape[2], length) or not _same(attn_mask.shape[3], source):
        mask = g.expand(attn_mask, [1, 1, length, source])
    if mask_now is not None and empty is None:
        if _odd_rows_now(mask_now, is_causal, length, source):
            return _written_out(g, q, k, v, is_causal, attn_mask, scale, False)[0]
        if not torch.count_nonzero(mask_now):  # adds 0.0 or -0.0 everywhere (BERT's mask without padding): no mask to read
            return g.op("Attention", q, k, v, **attrs)
        if isinstance(length, int) and isinstance(source, int):  # mask's value, for the blocks of queries (fusions)
            g.values_now[mask] = mask_now.float().expand(torch.broadcast_shapes(mask_now.shape, (1, 1, length, source))).numpy()
        return g.op("Attention", q, k, v, mask, **attrs)
    allowed = mask
    if is_causal:
        allowed = g.op("Where", _causal_allowed(g, length, source), mask, g.const(float("-inf"), q.dtype))
    row_max = g.op("ReduceMax", allowed, g.ints([-1]), keepdims=0)
    odd_rows = any_true(g, g.op("Not", g.op("GreaterOrEqual", row_max, g.const(-1e30, q.dtype))))
    if empty is not None:
        odd_rows = g.op("Or", odd_rows, empty)
    (out,) = g.if_(
        odd_rows,
        lambda b: [_written_out(b, q, k, v, is_causal, attn_mask, scale, False)[0]],
        lambda b: [b.op("Attention", q, k, v, mask, **attrs)],
        like,
    )  # fmt: skip
    return out


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default, check=_sdpa_check)
def sdpa_flash_cpu(g, node, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    lse_used = indices_used(node)
    if _fused_ok(g, node, q, k, attn_mask, lse_used):
        return _fused(g, q, k, v, is_causal, attn_mask, scale, computed_now(node.kwargs.get("attn_mask"))), None
    out, lse = _written_out(g, q, k, v, is_causal, attn_mask, scale, lse_used)
    return out, (None if lse is None else g.op("Cast", lse, to=TORCH_TO_ONNX[node.meta["val"][1].dtype]))


def _odd_rows_now(mask: torch.Tensor, is_causal: bool, length: int, source: int) -> bool:
    """_fused's run-time check, for a mask known now: a row the causal mask and this one
    leave nowhere above -1e30, or NaN."""
    allowed = mask.float().expand(*mask.shape[:-2], length, source)
    if is_causal:
        allowed = allowed.masked_fill(~torch.ones(length, source, dtype=torch.bool).tril(), float("-inf"))
    return bool((~(allowed.amax(-1) >= -1e30)).any())


def _written_out(g, q, k, v, is_causal, attn_mask, scale, lse_used):
    scores, _, _ = _scores(g, q, k, scale, is_causal, attn_mask)
    v = _repeat_heads(g, v, q.shape[1])
    minus_inf = g.const(float("-inf"), q.dtype)
    # a row with every key masked gives zeros (and logsumexp 0), not NaN
    row_max = g.op("ReduceMax", scores, g.ints([-1]), keepdims=1)
    masked_row = g.op("Equal", row_max, minus_inf)
    probs = g.op("Where", masked_row, g.const(0.0, q.dtype), g.op("Softmax", scores, axis=-1))
    out = g.op("MatMul", probs, v)
    if not lse_used:
        return out, None
    lse = g.op("ReduceLogSumExp", scores, g.ints([-1]), keepdims=1)
    lse = g.op("Where", masked_row, g.const(0.0, q.dtype), lse)
    return out, g.op("Squeeze", lse, g.ints([-1]))


def _sdpa_backward_check(node):
    q = arg_val(node, 1)
    reason = _shapes_check(q, arg_val(node, 2), node.args[6])
    # aten's half-precision backward accumulates in float32 in its own order
    return reason or (None if q.dtype in (torch.float32, torch.float64) else f"attention backward in {q.dtype}")


@lower(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, check=_sdpa_backward_check)
def sdpa_flash_cpu_backward(g, node, grad_out, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    scores, k_heads, scale = _scores(g, q, k, scale, is_causal, attn_mask)
    v_heads = _repeat_heads(g, v, q.shape[1])
    # the forward's probabilities, from its logsumexp (0 where a row was fully masked)
    probs = g.op("Exp", g.op("Sub", scores, g.op("Unsqueeze", g.cast(lse, q.dtype), g.ints([-1]))))
    transpose = lambda x: g.op("Transpose", x, perm=[0, 1, 3, 2])  # noqa: E731
    grad_v = g.op("MatMul", transpose(probs), grad_out)
    grad_probs = g.op("MatMul", grad_out, transpose(v_heads))
    delta = g.op("ReduceSum", g.op("Mul", grad_out, out), g.ints([-1]), keepdims=1)
    grad_scores = g.op("Mul", probs, g.op("Sub", grad_probs, delta))
    scale_value = g.const(scale, q.dtype)
    grad_q = g.op("Mul", g.op("MatMul", grad_scores, k_heads), scale_value)
    grad_k = g.op("Mul", g.op("MatMul", transpose(grad_scores), q), scale_value)
    if k.shape[1] != q.shape[1]:
        grad_k, grad_v = _sum_head_groups(g, grad_k, k), _sum_head_groups(g, grad_v, v)
    return grad_q, grad_k, grad_v
