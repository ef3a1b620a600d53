"""Mixture-of-experts products: the backward of transformers' grouped matmul (its forward is
in linalg.py)."""

from __future__ import annotations

import torch

from ..builder import Value
from ..registry import lower
from .common import any_true, arg_val, may_be_zero


def _grouped_mm_backward_check(node):
    x, weight, grad = arg_val(node, 0), arg_val(node, 1), arg_val(node, 3)
    if x.dtype not in (torch.float32, torch.float64) or weight.dtype != x.dtype or grad.dtype != x.dtype:
        return f"grouped mm backward of {x.dtype}, {weight.dtype} and {grad.dtype}"
    return "an inner dim that may be 0" if may_be_zero(x.shape[-1]) or may_be_zero(weight.shape[-1]) else None


@lower("transformers.grouped_mm_fallback_backward.default", check=_grouped_mm_backward_check)
def grouped_mm_backward(g, node, x, weight, offs, grad):
    """The gradients of rows offs[e-1]:offs[e] of x times weight[e]: grad rows times
    weight[e]^T for x (rows past offs[-1] zero), x rows^T times grad rows for weight[e] (zero
    for an expert with no rows). A Loop over the experts, as eager's loop of mm."""
    offs = g.cast(offs, torch.int64)
    earlier = g.op("Concat", g.ints([0]), g.op("Slice", offs, g.ints([0]), g.ints([-1])), axis=0)
    g.fallback_if(any_true(g, g.op("Less", offs, earlier)), "grouped mm offsets that decrease or are negative")
    inner, columns = weight.shape[-2], weight.shape[-1]

    def body(b, e, done_x, done_w):
        start, end = b.op("Unsqueeze", b.op("Gather", earlier, e), b.ints([0])), b.op("Unsqueeze", b.op("Gather", offs, e), b.ints([0]))
        rows_x = b.op("Slice", x, start, end, b.ints([0]))
        rows_grad = b.op("Slice", grad, start, end, b.ints([0]))
        expert = b.op("Gather", weight, e, axis=0)
        piece_x = b.op("MatMul", rows_grad, b.op("Transpose", expert, perm=[1, 0]))
        # (a product over no rows: ONNX Runtime's MatMul need not write zeros)
        product = b.op("MatMul", b.op("Transpose", rows_x, perm=[1, 0]), rows_grad)
        has_rows = b.op("Less", b.ints([0]), b.op("Slice", b.op("Shape", rows_x), b.ints([0]), b.ints([1])))
        piece_w = b.op("Where", b.op("Squeeze", has_rows, b.ints([0])), product, b.const(0, x.dtype))
        stacked = b.op("Concat", done_w, b.op("Unsqueeze", piece_w, b.ints([0])), axis=0)
        return [
            b.const(True),
            Value(b.op("Concat", done_x, piece_x, axis=0), x.dtype, (None, inner)),
            Value(stacked, x.dtype, (None, inner, columns)),
        ]

    experts = g.op("Gather", g.op("Shape", offs), g.const(0, torch.int64))
    no_rows = Value(g.op("Expand", g.const(0, x.dtype), g.shape([0, inner])), x.dtype, (0, inner))
    no_experts = Value(g.op("Expand", g.const(0, x.dtype), g.shape([0, inner, columns])), x.dtype, (0, inner, columns))
    done_x, done_w = g.loop(experts, None, [no_rows, no_experts], body)
    missing = g.op("Sub", g.sym(x.shape[0]), g.op("Gather", g.op("Shape", done_x), g.const(0, torch.int64)))  # rows past offs[-1]
    pads = g.op("Concat", g.ints([0, 0]), g.op("Unsqueeze", missing, g.ints([0])), g.ints([0]), axis=0)
    return g.op("Pad", done_x, pads), done_w
