"""Convolution and pooling as gathered windows: every window of the input taken with one
Gather (index tables built at compile time), then reduced. For integers, which ONNX
Runtime's Conv, MaxPool and AveragePool do not take (aten runs int64, and narrower integers
for pooling), the reduction is int64 arithmetic, wrapping modulo 2**64 as aten's does: sums
of products are exact whatever their order, narrower dtypes exact after the final cast. For
adaptive max pooling with indices (ONNX has no adaptive pool), the window's argmax as aten
scans it."""

from __future__ import annotations

import math

import torch

from ..builder import TORCH_TO_ONNX, GraphBuilder, Value
from .common import any_true

I64 = torch.int64
MAX_GATHERED = 2**24  # elements of the gathered windows; larger inputs stay in torch


def direct_source(out: int, size: int, kernel: int, stride: int, pad: int, dilation: int) -> list[list[int]]:
    """Per output position and kernel tap: the input position a window reads, or -1 (padding)."""
    rows = []
    for o in range(out):
        taps = [o * stride - pad + k * dilation for k in range(kernel)]
        rows.append([i if 0 <= i < size else -1 for i in taps])
    return rows


def transposed_source(out: int, size: int, kernel: int, stride: int, pad: int, dilation: int) -> list[list[int]]:
    """The same for a transposed convolution: output o takes input i through tap k where
    o = i * stride - pad + k * dilation."""
    rows = []
    for o in range(out):
        row = []
        for k in range(kernel):
            t = o + pad - k * dilation
            row.append(t // stride if t % stride == 0 and 0 <= t // stride < size else -1)
        rows.append(row)
    return rows


def adaptive_source(out: int, size: int) -> list[list[int]]:
    """aten's adaptive windows [floor(o * size / out), ceil((o + 1) * size / out)), padded with -1."""
    rows = [list(range((o * size) // out, -((-(o + 1) * size) // out))) for o in range(out)]
    width = max(len(r) for r in rows)
    return [r + [-1] * (width - len(r)) for r in rows]


def window_table(sources: list[list[list[int]]], sizes: list[int]) -> torch.Tensor:
    """(outputs, taps) flat positions in the input plane (-1: padding) from per-axis tables."""
    table = torch.zeros((1, 1), dtype=I64)
    for axis, source in enumerate(sources):
        per_axis = torch.tensor(source, dtype=I64)  # (out, kernel)
        inner = math.prod(sizes[axis + 1 :])
        combined = table[:, None, :, None] + per_axis[None, :, None, :] * inner  # (L, out, K, kernel)
        valid = (table[:, None, :, None] >= 0) & (per_axis[None, :, None, :] >= 0)
        table = torch.where(valid, combined, -1).reshape(table.shape[0] * per_axis.shape[0], -1)
    return table


def gather_windows(g: GraphBuilder, x: Value, table: torch.Tensor, fill, dtype=I64) -> Value:
    """x (N, C, *spatial) as windows (N, C, L, K) in dtype; padding reads `fill`."""
    n, c = x.shape[:2]
    plane = math.prod(x.shape[2:])
    flat = g.op("Reshape", g.cast(x, dtype), g.ints([n, c, plane]))
    windows = g.op("Gather", flat, g.const(table.clamp(min=0)), axis=2)
    if bool((table < 0).any()):
        windows = g.op("Where", g.const(table >= 0), windows, g.const(fill, dtype))
    return Value(windows, dtype, (n, c, *table.shape))


def fits(n: int, c: int, table_shape) -> bool:
    return n * c * math.prod(table_shape) <= MAX_GATHERED


def int_convolution(g: GraphBuilder, x: Value, weight: Value, bias, out_shape, table: torch.Tensor, groups: int, transposed: bool, dtype) -> str:
    """sum over channels of the group and kernel taps of window * weight, as one MatMul."""
    n, c = x.shape[:2]
    c_group, taps, outputs = c // groups, table.shape[1], table.shape[0]
    o_group = out_shape[1] // groups
    windows = gather_windows(g, x, table, 0)
    # (N, G, Cg, L, K) -> (N, G, L, Cg * K)
    windows = g.op("Reshape", windows, g.ints([n, groups, c_group, outputs, taps]))
    windows = g.op("Reshape", g.op("Transpose", windows, perm=[0, 1, 3, 2, 4]), g.ints([n, groups, outputs, c_group * taps]))
    w = g.cast(weight, I64)
    if transposed:  # (C, Og, *k) -> (G, Cg, K, Og)
        w = g.op("Transpose", g.op("Reshape", w, g.ints([groups, c_group, o_group, taps])), perm=[0, 1, 3, 2])
    else:  # (O, Cg, *k) -> (G, Cg, K, Og)
        w = g.op("Transpose", g.op("Reshape", w, g.ints([groups, o_group, c_group, taps])), perm=[0, 2, 3, 1])
    w = g.op("Reshape", w, g.ints([groups, c_group * taps, o_group]))
    result = g.op("MatMul", windows, w)  # (N, G, L, Og)
    result = g.op("Reshape", g.op("Transpose", result, perm=[0, 1, 3, 2]), g.ints(list(out_shape)))
    if bias is not None:
        result = g.op("Add", result, g.op("Reshape", g.cast(bias, I64), g.ints([-1] + [1] * (len(out_shape) - 2))))
    return g.op("Cast", result, to=TORCH_TO_ONNX[dtype])


def int_avg_pool(g: GraphBuilder, x: Value, table: torch.Tensor, divisor: torch.Tensor, nonempty: torch.Tensor, out_shape, dtype) -> str:
    """aten's integer average: the window sum (int64) divided by the divisor, truncating."""
    from .reduction import int_sum  # (ONNX Runtime's int64 ReduceSum goes through double)

    sums = int_sum(g, gather_windows(g, x, table, 0), [3], False, x.dtype)
    divisor = torch.where(nonempty, divisor, torch.ones(())).to(I64).reshape(-1)  # empty windows give 0
    result = g.op("Div", sums, g.const(divisor))
    if not bool(nonempty.all()):
        result = g.op("Where", g.const(nonempty.reshape(-1)), result, g.const(0, I64))
    return g.op("Cast", g.op("Reshape", result, g.ints(list(out_shape))), to=TORCH_TO_ONNX[dtype])


def max_pool(g: GraphBuilder, x: Value, table: torch.Tensor, out_shape, with_indices: bool):
    """aten's window max, scanning each window in order: the value moves on a strictly
    greater value or a NaN, so the index is the first tap holding the max, or the last NaN.
    Indices are numbered within the input plane. Integers are reduced in int64."""
    dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else I64
    lowest = -math.inf if dtype != I64 else torch.iinfo(I64).min
    windows = gather_windows(g, x, table, lowest, dtype)
    real = g.const(table >= 0)
    taps = table.shape[1]
    shaped = lambda v: g.op("Reshape", v, g.ints(list(out_shape)))  # noqa: E731
    is_nan = None
    if dtype != I64:
        is_nan = g.op("IsNaN", windows)
        windows = Value(g.op("Where", is_nan, g.const(lowest, dtype), windows), dtype, windows.shape)
    if x.dtype == I64:  # ONNX Runtime's int64 ReduceMax is wrong for values in [2**31, 2**32)
        from .reduction import int64_extreme

        values = int64_extreme(g, windows, [3], True, largest=True)
    else:
        values = g.op("ReduceMax", windows, g.ints([3]), keepdims=1)
    if is_nan is not None:
        has_nan = any_true(g, is_nan, [3], keepdims=True)
        values = g.op("Where", has_nan, g.const(math.nan, dtype), values)
    result = g.op("Cast", shaped(values), to=TORCH_TO_ONNX[x.dtype])
    if not with_indices:
        return result, None
    tap_numbers = g.const(torch.arange(taps))
    hit = g.op("And", g.op("Equal", windows, values), real)
    tap = g.op("ReduceMin", g.op("Where", hit, tap_numbers, g.const(taps, I64)), g.ints([3]), keepdims=1)
    if is_nan is not None:
        last_nan = g.op("ReduceMax", g.op("Where", g.op("And", is_nan, real), tap_numbers, g.const(-1, I64)), g.ints([3]), keepdims=1)
        tap = g.op("Where", has_nan, last_nan, tap)
    n, c = x.shape[:2]
    positions = g.op("Expand", g.const(table[None, None]), g.ints([n, c, *table.shape]))
    return result, shaped(g.op("GatherElements", positions, tap, axis=3))
