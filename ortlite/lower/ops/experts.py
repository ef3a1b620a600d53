"""Mixture-of-experts products: transformers' grouped matmul and its backward (custom ops,
lowered by name). Rows offs[e-1]:offs[e] of x belong to expert e; rows past offs[-1] to none.

Both run an ONNX Loop over the experts that have rows (NonZero of the counts), not over all
of them: a decoding step's few tokens then read only their experts' weights, as eager's loop
of mm does (it skips experts without rows)."""

from __future__ import annotations

import torch

from ..builder import Value
from ..registry import lower
from .common import any_true, arg_val, may_be_zero


def _grouped_mm_check(node):
    x, weight = arg_val(node, 0), arg_val(node, 1)
    if x.dtype not in (torch.float32, torch.float64) or weight.dtype != x.dtype:
        return f"grouped mm of {x.dtype} and {weight.dtype}"
    return "an inner dim that may be 0" if may_be_zero(x.shape[-1]) else None


def _grouped_mm_backward_check(node):
    x, weight, grad = arg_val(node, 0), arg_val(node, 1), arg_val(node, 3)
    if x.dtype not in (torch.float32, torch.float64) or weight.dtype != x.dtype or grad.dtype != x.dtype:
        return f"grouped mm backward of {x.dtype}, {weight.dtype} and {grad.dtype}"
    return "an inner dim that may be 0" if may_be_zero(x.shape[-1]) or may_be_zero(weight.shape[-1]) else None


def _groups(g, offs):
    """(starts, ends, active): each expert's first row and end (int64), and the experts with
    rows, ascending. Offsets that decrease (eager: empty slices, rows left unwritten) or are
    negative run the node in torch."""
    ends = g.cast(offs, torch.int64)
    starts = g.op("Concat", g.ints([0]), g.op("Slice", ends, g.ints([0]), g.ints([-1])), axis=0)
    g.fallback_if(any_true(g, g.op("Less", ends, starts)), "grouped mm offsets that decrease or are negative")
    active = g.op("Reshape", g.op("NonZero", g.op("Less", starts, ends)), g.ints([-1]))
    return starts, ends, active


def _rows(b, starts, ends, active, i, *tensors):
    """Expert active[i]'s index (0-d) and its rows of each tensor (aten's slices stop at the
    last row)."""
    e = b.op("Gather", active, i)
    start, end = b.op("Unsqueeze", b.op("Gather", starts, e), b.ints([0])), b.op("Unsqueeze", b.op("Gather", ends, e), b.ints([0]))
    return e, [b.op("Slice", t, start, end, b.ints([0])) for t in tensors]


def _pad_rows(g, done, rows):
    """done with zero rows appended up to `rows` (the rows past offs[-1])."""
    missing = g.op("Sub", g.sym(rows), g.op("Gather", g.op("Shape", done), g.const(0, torch.int64)))
    return g.op("Pad", done, g.op("Concat", g.ints([0, 0]), g.op("Unsqueeze", missing, g.ints([0])), g.ints([0]), axis=0))


def _trips(g, active):
    return g.op("Gather", g.op("Shape", active), g.const(0, torch.int64))


@lower("transformers.grouped_mm_fallback.default", check=_grouped_mm_check)
def grouped_mm(g, node, x, weight, offs):
    """Each active expert's rows times its weight, concatenated in expert order (the rows'
    order), zeros past offs[-1]."""
    starts, ends, active = _groups(g, offs)
    columns = weight.shape[-1]

    def body(b, i, done):
        e, (rows,) = _rows(b, starts, ends, active, i, x)
        piece = b.op("MatMul", rows, b.op("Gather", weight, e, axis=0))
        return [b.const(True), Value(b.op("Concat", done, piece, axis=0), x.dtype, (None, columns))]

    none_yet = Value(g.op("Expand", g.const(0, x.dtype), g.shape([0, columns])), x.dtype, (0, columns))
    (done,) = g.loop(_trips(g, active), None, [none_yet], body)
    return _pad_rows(g, done, x.shape[0])


@lower("transformers.grouped_mm_fallback_backward.default", check=_grouped_mm_backward_check)
def grouped_mm_backward(g, node, x, weight, offs, grad):
    """The gradients: grad rows times weight[e]^T for x (zeros past offs[-1]); x rows^T times
    grad rows for weight[e], zero for an expert with no rows."""
    starts, ends, active = _groups(g, offs)
    inner, columns = weight.shape[-2], weight.shape[-1]

    def body(b, i, done_x, done_w):
        e, (rows_x, rows_grad) = _rows(b, starts, ends, active, i, x, grad)
        piece_x = b.op("MatMul", rows_grad, b.op("Transpose", b.op("Gather", weight, e, axis=0), perm=[1, 0]))
        # (rows cut to none by the end of x: ONNX Runtime's MatMul over no rows need not write zeros)
        has_rows = b.op("Less", b.const(0, torch.int64), b.op("Gather", b.op("Shape", rows_x), b.const(0, torch.int64)))
        piece_w = b.op("Where", has_rows, b.op("MatMul", b.op("Transpose", rows_x, perm=[1, 0]), rows_grad), b.const(0, x.dtype))
        stacked = b.op("Concat", done_w, b.op("Unsqueeze", piece_w, b.ints([0])), axis=0)
        return [
            b.const(True),
            Value(b.op("Concat", done_x, piece_x, axis=0), x.dtype, (None, inner)),
            Value(stacked, x.dtype, (None, inner, columns)),
        ]

    no_rows = Value(g.op("Expand", g.const(0, x.dtype), g.shape([0, inner])), x.dtype, (0, inner))
    no_experts = Value(g.op("Expand", g.const(0, x.dtype), g.shape([0, inner, columns])), x.dtype, (0, inner, columns))
    done_x, done_w = g.loop(_trips(g, active), None, [no_rows, no_experts], body)
    zeros = g.op("Expand", g.const(0, x.dtype), g.op("Shape", weight))
    grad_weight = g.op("ScatterND", zeros, g.op("Unsqueeze", active, g.ints([1])), done_w)
    return _pad_rows(g, done_x, x.shape[0]), grad_weight
