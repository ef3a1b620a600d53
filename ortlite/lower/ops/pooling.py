"""Pooling (max with indices, average, adaptive average, their backward forms), upsampling
and the padding modes. Where ONNX's conventions differ from aten's (ceil_mode windows,
average divisors, index numbering, NaN), the lowering spells aten's out."""

from __future__ import annotations

import math
import operator

import torch

from ..builder import TORCH_TO_ONNX, Value, sym_expr
from ..registry import lower, meta
from . import windows
from .common import any_true, aten, indices_used, arg_val, is_float, is_static, known_empty, may_be_zero, out_dtype, out_shape


def _tuple(v, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def _pool_args(x_shape, spatial: int, out_spatial, kernel_size, stride, padding, dilation=1):
    """Kernel, strides, dilations, and ONNX begin/end pads giving aten's output size with
    ONNX's floor rule (ceil_mode windows become extra end padding)."""
    kernel = _tuple(kernel_size, spatial)
    strides = _tuple(stride, spatial) if stride else kernel
    pads = _tuple(padding, spatial)
    dilations = _tuple(dilation, spatial)
    ends = []
    for i in range(spatial):
        size = x_shape[-spatial + i]
        needed = (out_spatial[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
        ends.append(max(pads[i], needed - size - pads[i]))
    return kernel, strides, dilations, pads, ends


def _batched(g, x: Value, spatial: int):
    """aten pools take unbatched (C, *spatial) inputs too; ONNX needs (N, C, *spatial)."""
    if x.rank == spatial + 2:
        return x, False
    return Value(g.op("Unsqueeze", x, g.ints([0])), x.dtype, (1, *x.shape)), True


def _unbatch(g, y, unbatched: bool):
    return g.op("Squeeze", y, g.ints([0])) if unbatched else y


# -- max pooling -----------------------------------------------------------------------


def _max_pool_check(node):
    spatial = 2 if node.target is aten.max_pool2d_with_indices.default else 3
    x = arg_val(node, 0)
    if x.dim() not in (spatial + 1, spatial + 2):
        return "input rank"
    if not is_static(x.shape[-spatial:]) and not _symbolic_max_pool(node):
        return "symbolic spatial sizes with dilation, pads as large as the kernel, or indices"  # they are computed from the sizes
    if any(may_be_zero(d) for d in x.shape):
        return "empty input"
    if not is_float(x.dtype):
        return _int_window_check(x, out_shape(node)[-spatial:], node.args[1], spatial)
    if any(user.target is not operator.getitem for user in node.users):
        return "output used whole"
    if is_static(x.shape[-spatial:]) and math.prod(x.shape[-spatial:]) > 2**24:
        return "planes too large for exact float indices"
    return None


def _symbolic_max_pool(node) -> bool:
    """Max pooling that symbolic spatial sizes do not change the form of: ONNX's MaxPool with
    aten's pads, dilation (and its ceil_mode, which drops a last window that would start in
    the end padding as aten does), pads under the kernel, float values."""
    spatial = 2 if node.target in (aten.max_pool2d_with_indices.default,) else 3
    args = dict(zip(["x", "kernel_size", "stride", "padding", "dilation", "ceil_mode"], node.args))
    kernel = _tuple(args["kernel_size"], spatial)
    pads = _tuple(args.get("padding", 0), spatial)
    return all(p < k for p, k in zip(pads, kernel)) and is_float(arg_val(node, 0).dtype)


def _grow(g, v, shape, lead, tail, fill, dtype):
    """v with blocks of fill before and after its trailing axes. (Concat, not Pad: ONNX
    Runtime fuses a Pad into the MaxPool after it, and then refuses the pads.)"""
    shape = list(shape)
    spatial = len(lead)
    for i, (before, after) in enumerate(zip(lead, tail)):
        axis = len(shape) - spatial + i
        parts = []
        for count in (before, after):
            block = list(shape)
            block[axis] = count
            parts.append(g.op("Expand", g.const(fill, dtype), g.ints(block)) if count else None)
        v = g.op("Concat", *[p for p in (parts[0], v, parts[1]) if p is not None], axis=axis)
        shape[axis] += before + after
    return v


def _int_window_check(x, out_spatial, kernel_size, spatial: int):
    if not is_static(x.shape):
        return "integer pooling with symbolic sizes"
    batch = x.shape[0] if x.dim() == spatial + 2 else 1
    if not windows.fits(batch, x.shape[-spatial - 1], (math.prod(out_spatial), math.prod(_tuple(kernel_size, spatial)))):
        return "integer pooling too large to gather"
    return None


def _int_pool_table(x_shape, spatial, out_spatial, kernel, strides, pads, dilations=None):
    dilations = dilations or [1] * spatial
    sizes = list(x_shape[-spatial:])
    sources = [windows.direct_source(out_spatial[i], sizes[i], kernel[i], strides[i], pads[i], dilations[i]) for i in range(spatial)]
    return windows.window_table(sources, sizes)


def _fixed_where_needed(g, node, x: Value, values: str, fixed) -> str:
    """fixed(b) (the max pool's NaN and -inf fixes, built with b) for the values of MaxPool
    on x. On CPU only inside an If on whether x may hold a NaN or a -inf (its sum is NaN or
    -inf then; a false alarm, an overflow to -inf, only takes the exact branch): the MaxPool
    stays where ONNX Runtime's NCHWc transform puts it, beside the convolutions around it.
    Elsewhere always (an If's condition is read on the host: a device sync)."""
    if arg_val(node, 0).device.type != "cpu":
        return fixed(g)
    maybe = g.op("Not", g.op("Greater", g.op("ReduceSum", x, keepdims=0), g.const(float("-inf"), x.dtype)))
    (out,) = g.if_(maybe, lambda b: [fixed(b)], lambda b: [values], [Value(values, x.dtype, ())])
    return out


@lower(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default, check=_max_pool_check)
def max_pool_with_indices(g, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    spatial = 2 if node.target is aten.max_pool2d_with_indices.default else 3
    x, unbatched = _batched(g, x, spatial)
    if not is_static(x.shape[-spatial:]):  # see _symbolic_max_pool
        kernel, pads = _tuple(kernel_size, spatial), _tuple(padding, spatial)
        attrs = dict(
            kernel_shape=kernel, strides=_tuple(stride, spatial) if stride else kernel, pads=pads + pads,
            dilations=_tuple(dilation, spatial), ceil_mode=int(bool(ceil_mode)),
        )  # fmt: skip
        if indices_used(node):
            # ONNX Runtime's index is the first largest in the window, as aten's, over the
            # whole tensor (mod the plane: aten's); a NaN it skips where aten takes the last
            g.fallback_if(any_true(g, g.op("IsNaN", x)), "a NaN in the input of max pooling with indices and symbolic sizes")
            values, flat = g.op("MaxPool", x, outputs=2, **attrs)
            plane = g.sym(math.prod(x.shape[2:]))
            return _unbatch(g, values, unbatched), _unbatch(g, g.op("Mod", flat, plane, fmod=0), unbatched)
        values = g.op("MaxPool", x, **attrs)

        def fixed(b):
            # aten's window max is NaN when any element is (ONNX Runtime's only when it comes
            # first), and -inf when all are (ONNX Runtime's the lowest float where the window
            # meets the padding): a max of 2 per NaN, 1 per element above -inf, tells each
            kind = b.op("Add", b.op("Mul", b.op("Cast", b.op("IsNaN", x), to=TORCH_TO_ONNX[x.dtype]), b.const(2.0, x.dtype)),
                        b.op("Cast", b.op("Greater", x, b.const(float("-inf"), x.dtype)), to=TORCH_TO_ONNX[x.dtype]))  # fmt: skip
            window_kind = b.op("MaxPool", kind, **attrs)
            v = b.op("Where", b.op("Equal", window_kind, b.const(0.0, x.dtype)), b.const(float("-inf"), x.dtype), values)
            return b.op("Where", b.op("Greater", window_kind, b.const(1.0, x.dtype)), b.const(float("nan"), x.dtype), v)

        return _unbatch(g, _fixed_where_needed(g, node, x, values, fixed), unbatched), None
    kernel, strides, dilations, begins, ends = _pool_args(x.shape, spatial, out_shape(node)[-spatial:], kernel_size, stride, padding, dilation)
    if not is_float(x.dtype):
        out_spatial = out_shape(node)[-spatial:]
        table = _int_pool_table(x.shape, spatial, out_spatial, kernel, strides, begins, dilations)
        values, indices = windows.max_pool(g, x, table, (*x.shape[:2], *out_spatial), indices_used(node))
        return _unbatch(g, values, unbatched), indices if indices is None else _unbatch(g, indices, unbatched)
    sizes = list(x.shape[-spatial:])
    plane = math.prod(sizes)
    positions = torch.arange(1, plane + 1, dtype=torch.float32).view(sizes)
    original = x
    # ONNX Runtime takes pads smaller than the kernel only: longer ones (dilated kernels, a
    # ceil_mode tail) are padded onto the input first (-inf, never a window's max)
    lead = [b if b >= k else 0 for b, k in zip(begins, kernel)]
    tail = [e if e >= k else 0 for e, k in zip(ends, kernel)]
    if any(lead + tail):
        begins = [b - p for b, p in zip(begins, lead)]
        ends = [e - t for e, t in zip(ends, tail)]
        x = Value(_grow(g, x, x.shape, lead, tail, float("-inf"), x.dtype), x.dtype, ())
    attrs = dict(kernel_shape=kernel, strides=strides, dilations=dilations, pads=begins + ends)
    values = g.op("MaxPool", x, **attrs)

    def last_nan_of(b):
        # ONNX Runtime's MaxPool keeps NaN only when a window starts with it; aten's window
        # max is NaN when any element is, and its index is the window's last NaN. A max-pool
        # of (position + 1) where x is NaN finds both.
        nan_at = b.op("Where", b.op("IsNaN", original), b.const(positions), b.const(0.0, torch.float32))
        if any(lead + tail):
            nan_at = _grow(b, nan_at, original.shape, lead, tail, 0.0, torch.float32)
        last_nan = b.op("MaxPool", nan_at, **attrs)
        return last_nan, b.op("Greater", last_nan, b.const(0.0, torch.float32))

    def fixed(b, has_nan):
        # a window of -inf only (beside the padding) is -inf in aten, the lowest float in
        # ONNX Runtime's float32 MaxPool; NaN where a window holds one
        above = b.op("Cast", b.op("Greater", x, b.const(float("-inf"), x.dtype)), to=TORCH_TO_ONNX[x.dtype])
        all_neg_inf = b.op("Equal", b.op("MaxPool", above, **attrs), b.const(0.0, x.dtype))
        v = b.op("Where", all_neg_inf, b.const(float("-inf"), x.dtype), values)
        return b.op("Where", has_nan, b.const(float("nan"), x.dtype), v)

    if not indices_used(node):
        return _unbatch(g, _fixed_where_needed(g, node, original, values, lambda b: fixed(b, last_nan_of(b)[1])), unbatched), None
    last_nan, has_nan = last_nan_of(g)
    values = fixed(g, has_nan)
    # ONNX numbers indices over the whole (padded) tensor, aten within each plane
    _, onnx_indices = g.op("MaxPool", x, outputs=2, **attrs)
    padded = [n + p + t for n, p, t in zip(sizes, lead, tail)]
    indices = flat = g.op("Mod", onnx_indices, g.const(math.prod(padded), torch.int64))
    if any(lead + tail):  # per-axis coordinates in the padded plane, renumbered in x's
        indices = g.const(0, torch.int64)
        for i in range(spatial):
            inner = math.prod(padded[i + 1 :])
            coordinate = g.op("Mod", g.op("Div", flat, g.const(inner, torch.int64)), g.const(padded[i], torch.int64))
            coordinate = g.op("Sub", coordinate, g.const(lead[i], torch.int64))
            indices = g.op("Add", indices, g.op("Mul", coordinate, g.const(math.prod(sizes[i + 1 :]), torch.int64)))
    nan_index = g.op("Sub", g.op("Cast", last_nan, to=TORCH_TO_ONNX[torch.int64]), g.const(1, torch.int64))
    indices = g.op("Where", has_nan, nan_index, indices)
    return _unbatch(g, values, unbatched), _unbatch(g, indices, unbatched)


def _max_pool_backward_check(node):
    x = arg_val(node, 1)
    return None if is_float(x.dtype) else "non-float input"


@lower(
    aten.max_pool2d_with_indices_backward.default,
    aten.max_pool3d_with_indices_backward.default,
    check=_max_pool_backward_check,
)
def max_pool_backward(g, node, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    # each output's gradient goes to the input element its index names, summed
    spatial = 2 if node.target is aten.max_pool2d_with_indices_backward.default else 3
    lead = list(x.shape[: x.rank - spatial])
    plane = math.prod(x.shape[-spatial:])
    zeros = g.op("Expand", g.const(0, x.dtype), g.shape(lead + [plane]))
    flat_grad = g.op("Reshape", g.cast(grad, x.dtype), g.shape(lead + [-1]))
    flat_indices = g.op("Reshape", indices, g.shape(lead + [-1]))
    summed = g.op("ScatterElements", zeros, flat_indices, flat_grad, axis=len(lead), reduction="add")
    return g.op("Reshape", summed, g.shape(x.shape))


# -- average pooling -------------------------------------------------------------------


def _avg_spatial(node) -> int:
    return {aten.avg_pool2d.default: 2, aten.avg_pool3d.default: 3,
            aten.avg_pool2d_backward.default: 2, aten.avg_pool3d_backward.default: 3}[node.target]  # fmt: skip


def _avg_divisors(in_spatial, out_spatial, kernel, strides, pads, count_include_pad, divisor_override):
    """aten's divisor for each output of an average pool (AvgPoolKernel.cpp), and whether
    its window has any input element (outputs of empty windows are 0)."""
    axes = []
    for size, out, k, s, p in zip(in_spatial, out_spatial, kernel, strides, pads):
        full, valid = [], []
        for o in range(out):
            start = o * s - p
            end = min(start + k, size + p)
            full.append(end - start)
            valid.append(min(end, size) - max(start, 0))
        axes.append((torch.tensor(full, dtype=torch.float64), torch.tensor(valid, dtype=torch.float64)))
    full = torch.ones(())
    valid = torch.ones(())
    for i, (f, v) in enumerate(axes):
        shape = [1] * len(axes)
        shape[i] = -1
        full = full * f.view(shape)
        valid = valid * v.clamp(min=0).view(shape)
    if divisor_override:
        divisor = torch.full_like(valid, float(divisor_override))
    else:
        divisor = full if count_include_pad else valid
    return divisor, valid > 0


def _avg_pool_check(node):
    spatial = _avg_spatial(node)
    x = arg_val(node, 0)
    if x.dim() not in (spatial + 1, spatial + 2):
        return "input rank"
    if not is_float(x.dtype):
        if x.dtype != torch.int64 or x.device.type != "cpu":  # aten's kernels take no other integers
            return f"avg_pool of {x.dtype} on {x.device.type} (aten raises)"
        return _int_window_check(x, out_shape(node)[-spatial:], node.args[1], spatial)
    if not is_static(x.shape[-spatial:]):
        args = dict(zip(["x", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"], node.args), **node.kwargs)
        if any(p >= k for p, k in zip(_tuple(args.get("padding", 0), spatial), _tuple(args["kernel_size"], spatial))):
            return "pads as large as the kernel"
    return None


def _avg_args(node, x_shape, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    out_spatial = out_shape(node)[-spatial:] if node.target not in (aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default) else arg_val(node, 0).shape[-spatial:]
    kernel, strides, _, begins, ends = _pool_args(x_shape, spatial, out_spatial, kernel_size, stride, padding)
    divisor, nonempty = _avg_divisors(x_shape[-spatial:], out_spatial, kernel, strides, begins, count_include_pad, divisor_override)
    # scale: turns a mean over the kernel's full window (zeros padded) into aten's value
    scale = torch.where(nonempty, math.prod(kernel) / divisor, torch.zeros(()))
    return kernel, strides, begins, ends, scale


@lower(aten.avg_pool2d.default, aten.avg_pool3d.default, check=_avg_pool_check)
def avg_pool(g, node, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    spatial = _avg_spatial(node)
    x, unbatched = _batched(g, x, spatial)
    if not is_float(x.dtype):
        out_spatial = out_shape(node)[-spatial:]
        kernel, strides, _, begins, _ = _pool_args(x.shape, spatial, out_spatial, kernel_size, stride, padding)
        divisor, nonempty = _avg_divisors(x.shape[-spatial:], out_spatial, kernel, strides, begins, count_include_pad, divisor_override)
        table = _int_pool_table(x.shape, spatial, out_spatial, kernel, strides, begins)
        result = windows.int_avg_pool(g, x, table, divisor, nonempty, (*x.shape[:2], *out_spatial), x.dtype)
        return _unbatch(g, result, unbatched)
    if not is_static(x.shape[-spatial:]):
        kernel, pads = _tuple(kernel_size, spatial), _tuple(padding, spatial)
        strides = _tuple(stride, spatial) if stride else kernel
        if not ceil_mode and not divisor_override and (count_include_pad or not any(pads)):
            # every window lies within the padded input: aten divides by the kernel's size,
            # as ONNX does with the pads counted
            mean = g.op("AveragePool", x, kernel_shape=kernel, strides=strides, pads=pads + pads, count_include_pad=1)
            return _unbatch(g, mean, unbatched)
        return _unbatch(g, _symbolic_avg_pool(g, node, x, spatial, kernel, strides, pads, count_include_pad, divisor_override), unbatched)
    kernel, strides, begins, ends, scale = _avg_args(node, x.shape, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    if bool((scale == 1).all()) and not any(begins + ends):
        return _unbatch(g, g.op("AveragePool", x, kernel_shape=kernel, strides=strides), unbatched)
    padded = g.op("Pad", x, g.ints([0, 0] + begins + [0, 0] + ends), g.const(0, x.dtype), mode="constant")
    mean = g.op("AveragePool", padded, kernel_shape=kernel, strides=strides)
    return _unbatch(g, g.op("Mul", mean, g.const(scale, x.dtype)), unbatched)


def _symbolic_avg_pool(g, node, x: Value, spatial: int, kernel, strides, pads, count_include_pad, divisor_override) -> str:
    """aten's average pool for symbolic sizes in any mode: the window sums of x padded with
    zeros (at the end as far as the last window reaches), over aten's divisor per output,
    computed in the graph as _avg_divisors does; 0 for windows with no input element."""
    out_spatial = out_shape(node)[-spatial:]
    i64 = lambda v: g.const(v, torch.int64)  # noqa: E731
    divisor, nonempty = None, None
    for i, (size, out, k, st, p) in enumerate(zip(x.shape[-spatial:], out_spatial, kernel, strides, pads)):
        start = g.op("Sub", g.op("Mul", g.op("Range", i64(0), g.sym(out), i64(1)), i64(st)), i64(p))
        end = g.op("Min", g.op("Add", start, i64(k)), g.sym(sym_expr(size) + p))
        full = g.op("Sub", end, start)
        valid = g.op("Max", g.op("Sub", g.op("Min", end, g.sym(size)), g.op("Max", start, i64(0))), i64(0))
        axis = full if count_include_pad else valid
        shape = [1] * spatial
        shape[i] = -1
        axis, valid = (g.op("Reshape", g.op("Cast", v, to=TORCH_TO_ONNX[torch.float64]), g.ints(shape)) for v in (axis, valid))
        divisor = axis if divisor is None else g.op("Mul", divisor, axis)
        nonempty = valid if nonempty is None else g.op("Mul", nonempty, valid)
    if divisor_override:
        divisor = g.const(float(divisor_override), torch.float64)
    # aten's last window starts inside the input, so it reaches at most k - 1 past its end:
    # end pads of k - 1 (and the begin pads, both under the kernel) hold every window of aten's
    # whole, none cut short, so ONNX's count_include_pad mean is the sum over the kernel's size;
    # the windows ONNX has beyond aten's last are sliced off. (Padding x with a Pad of the
    # symbolic exact size instead made ONNX Runtime write it out: an EfficientNet's pooler,
    # kernel 1280 over 2x2 planes, took 150 ms a call.)
    mean = g.op("AveragePool", x, kernel_shape=kernel, strides=strides, pads=list(pads) + [k - 1 for k in kernel], count_include_pad=1)
    axes = list(range(2, 2 + spatial))
    mean = g.op("Slice", mean, g.ints([0] * spatial), g.shape(list(out_spatial)), g.ints(axes))
    sums = g.op("Mul", mean, g.const(float(math.prod(kernel)), x.dtype))
    scale = g.op("Where", g.op("Greater", nonempty, g.const(0.0, torch.float64)), g.op("Div", g.const(1.0, torch.float64), divisor), g.const(0.0, torch.float64))
    return g.op("Mul", sums, g.op("Cast", scale, to=TORCH_TO_ONNX[x.dtype]))


def _avg_pool_backward_check(node):
    x = arg_val(node, 1)
    spatial = _avg_spatial(node)
    if x.dim() != spatial + 2:
        return "unbatched input"
    return None if is_float(x.dtype) else "non-float input"


@lower(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default, check=_avg_pool_backward_check)
def avg_pool_backward(g, node, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    # each output's gradient / its divisor spreads over its window: a transposed
    # convolution with a kernel of ones per channel, cropped to the input
    spatial = _avg_spatial(node)
    kernel, strides, begins, ends, scale = _avg_args(node, x.shape, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    weighted = g.op("Mul", grad, g.const(scale / math.prod(kernel), x.dtype))
    channels = x.shape[1]
    ones = g.const(torch.ones([channels, 1] + kernel, dtype=x.dtype))
    spread = g.op("ConvTranspose", weighted, ones, kernel_shape=kernel, strides=strides, group=channels)
    full = [(grad.shape[2 + i] - 1) * strides[i] + kernel[i] for i in range(spatial)]
    axes = list(range(2, 2 + spatial))
    stops = [begins[i] + x.shape[2 + i] for i in range(spatial)]
    short = [max(0, stops[i] - full[i]) for i in range(spatial)]
    if any(short):  # trailing inputs that no window reads get no gradient
        spread = g.op("Pad", spread, g.ints([0] * (2 + spatial) + [0, 0] + short), mode="constant")
    if begins == [0] * spatial and stops == [f + s for f, s in zip(full, short)]:
        return spread
    return g.op("Slice", spread, g.ints(begins), g.ints(stops), g.ints(axes))


# -- adaptive average pooling ----------------------------------------------------------


def _adaptive_matrix(size: int, out: int) -> torch.Tensor:
    """(out, size): row i averages aten's adaptive window i."""
    m = torch.zeros(out, size, dtype=torch.float64)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def _adaptive_windows(g, size, out) -> Value:
    """(out, size) bool: aten's adaptive window of each output, [floor(i * size / out),
    ceil((i + 1) * size / out)); computed in the graph where a size is symbolic."""
    if isinstance(size, int) and isinstance(out, int):
        return g.const(_windows(size, out))
    i64 = lambda v: g.const(v, torch.int64)  # noqa: E731
    size_, out_ = g.sym(size), g.sym(out)
    rows = g.op("Unsqueeze", g.arange(out_), g.ints([1]))  # (out, 1)
    cols = g.arange(size_)  # (size,)
    start = g.op("Div", g.op("Mul", rows, size_), out_)
    end = g.op("Div", g.op("Add", g.op("Mul", g.op("Add", rows, i64(1)), size_), g.op("Sub", out_, i64(1))), out_)
    inside = g.op("And", g.op("GreaterOrEqual", cols, start), g.op("Less", cols, end))
    return Value(inside, torch.bool, (out, size))


def _adaptive_weights(g, size, out, dtype: torch.dtype, transposed: bool = False) -> Value:
    """_adaptive_matrix as a Value of dtype, computed in the graph where a size is symbolic."""
    if isinstance(size, int) and isinstance(out, int):
        m = _adaptive_matrix(size, out)
        return g.const(m.t() if transposed else m, dtype)
    inside = _adaptive_windows(g, size, out)
    count = g.op("ReduceSum", g.op("Cast", inside, to=TORCH_TO_ONNX[torch.float64]), g.ints([1]), keepdims=1)
    m = g.op("Cast", g.op("Where", inside, g.op("Div", g.const(1.0, torch.float64), count), g.const(0.0, torch.float64)), to=TORCH_TO_ONNX[dtype])
    return Value(g.op("Transpose", m, perm=[1, 0]) if transposed else m, dtype, (size, out) if transposed else (out, size))


def _adaptive_check(node):
    x = arg_val(node, 0)
    spatial = 2 if node.target in (aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default, aten.adaptive_max_pool2d.default) else 3
    if node.target is aten._adaptive_avg_pool2d_backward.default:
        x = arg_val(node, 1)
    if x.dim() not in (spatial + 1, spatial + 2) or any(may_be_zero(d) for d in x.shape[-spatial:]):
        return "input rank or empty planes"
    if not is_float(x.dtype):
        return "non-float input"
    if node.target in (aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default) and indices_used(node):
        if x.dtype not in (torch.float32, torch.float64):
            return "adaptive max-pool indices of half precision"
        if not is_static(list(x.shape) + list(out_shape(node))):
            return "adaptive max-pool indices with symbolic sizes"
        return _int_window_check(x, out_shape(node)[-spatial:], [-(-s // o) + 1 for s, o in zip(x.shape[-spatial:], out_shape(node)[-spatial:])], spatial)
    return None



def _along_axes(g, x: Value, matrices: list) -> str:
    """x with its last len(matrices) axes each multiplied by a matrix (out_i, in_i): a torch
    tensor, or a Value already transposed to (in_i, out_i). A NaN or infinity would reach
    every output of its row through the zeros (0 * inf is NaN), where aten's windowed kernels
    touch only their own window: inputs holding one run in torch."""
    nonfinite = g.op("Or", g.op("IsNaN", x), g.op("IsInf", x))
    g.fallback_if(any_true(g, nonfinite), "a NaN or infinity in the input of a matrix-form window op")
    result, rank = x, x.rank
    spatial = len(matrices)
    for i, m in enumerate(matrices):
        axis = rank - spatial + i
        perm = [d for d in range(rank) if d != axis] + [axis]
        moved = g.op("Transpose", result, perm=perm) if axis != rank - 1 else result
        weights = m if isinstance(m, Value) else g.const(m.t().contiguous(), x.dtype)
        multiplied = g.op("MatMul", moved, weights)
        result = g.op("Transpose", multiplied, perm=[perm.index(d) for d in range(rank)]) if axis != rank - 1 else multiplied
    return result


@lower(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, check=_adaptive_check)
def adaptive_avg_pool(g, node, x, output_size):
    output_size = [meta(o) for o in node.args[1]]  # SymInts where symbolic
    spatial = len(output_size)
    sizes = x.shape[-spatial:]
    if known_empty(out_shape(node)):
        return g.op("Expand", g.const(0, x.dtype), g.shape(out_shape(node)))
    if is_static(list(sizes) + output_size) and all(s % o == 0 for s, o in zip(sizes, output_size)):
        x4, unbatched = _batched(g, x, spatial)
        kernel = [s // o for s, o in zip(sizes, output_size)]
        return _unbatch(g, g.op("AveragePool", x4, kernel_shape=kernel, strides=kernel), unbatched)
    return _along_axes(g, x, [_adaptive_weights(g, s, o, x.dtype, transposed=True) for s, o in zip(sizes, output_size)])


@lower(aten._adaptive_avg_pool2d_backward.default, check=_adaptive_check)
def adaptive_avg_pool2d_backward(g, node, grad, x):
    sizes = x.shape[-2:]
    return _along_axes(g, grad, [_adaptive_weights(g, s, o, grad.dtype) for s, o in zip(sizes, grad.shape[-2:])])


def _windows(size: int, out: int) -> torch.Tensor:
    """(out, size) bool: aten's adaptive window of each output."""
    m = torch.zeros(out, size, dtype=torch.bool)
    for i in range(out):
        m[i, (i * size) // out : -((-(i + 1) * size) // out)] = True
    return m


@lower(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default, check=_adaptive_check)
def adaptive_max_pool(g, node, x, output_size):
    output_size = [meta(o) for o in node.args[1]]  # SymInts where symbolic
    spatial = len(output_size)
    if known_empty(out_shape(node)):
        empty = g.op("Expand", g.const(0, x.dtype), g.shape(out_shape(node)))
        return empty, g.op("Expand", g.const(0, torch.int64), g.shape(out_shape(node)))
    if indices_used(node):
        x, unbatched = _batched(g, x, spatial)
        sizes = list(x.shape[-spatial:])
        table = windows.window_table([windows.adaptive_source(o, s) for o, s in zip(output_size, sizes)], sizes)
        values, indices = windows.max_pool(g, x, table, (*x.shape[:2], *output_size), True)
        return _unbatch(g, values, unbatched), _unbatch(g, indices, unbatched)
    # a window max is a max over each axis in turn; NaN anywhere in the window wins
    nan = Value(g.op("Cast", g.op("IsNaN", x), to=TORCH_TO_ONNX[x.dtype]), x.dtype, x.shape)
    result, has_nan = x, nan
    for i, (size, out) in enumerate(zip(x.shape[-spatial:], output_size)):
        axis = x.rank - spatial + i
        window = g.op("Reshape", _adaptive_windows(g, size, out), g.ints([0, 0] + [1] * (x.rank - axis - 1)))
        lowest = g.const(float("-inf"), x.dtype)
        result = g.op("ReduceMax", g.op("Where", window, g.op("Unsqueeze", result, g.ints([axis])), lowest), g.ints([axis + 1]), keepdims=0)
        has_nan = g.op("ReduceMax", g.op("Where", window, g.op("Unsqueeze", has_nan, g.ints([axis])), g.const(0, x.dtype)), g.ints([axis + 1]), keepdims=0)
    values = g.op("Where", g.op("Greater", has_nan, g.const(0, x.dtype)), g.const(float("nan"), x.dtype), result)
    return values, None


# -- upsampling ------------------------------------------------------------------------


def _upsample_check(node):
    x = arg_val(node, 0)
    if x.numel() == 0 or math.prod(x.shape[2:]) > 2**24:
        return "empty or very large input"
    return None if is_float(x.dtype) or node.target is aten.upsample_nearest2d.vec else "non-float input"


@lower(aten.upsample_nearest2d.vec, check=_upsample_check)
def upsample_nearest2d(g, node, x, output_size, scale_factors):
    # aten's own kernel on the flat positions gives the exact source of every output
    h, w = x.shape[-2:]
    positions = torch.arange(h * w, dtype=torch.float64).view(1, 1, h, w)
    source = aten.upsample_nearest2d.vec(positions, output_size, scale_factors).view(out_shape(node)[-2:]).long()
    flat = g.op("Reshape", x, g.ints(list(x.shape[:-2]) + [h * w]))
    return g.op("Gather", flat, g.const(source), axis=x.rank - 2)


def _linear_weights(target, x_shape, axis_count: int, axis: int, args) -> torch.Tensor:
    """(out, in) weights of a separable interpolation along one spatial axis, taken from
    aten's kernel applied to the identity: exactly aten's coefficients. The other axes get
    size 2 kept at 2 (an identity; aten's antialiased kernels mishandle size 1)."""
    size = x_shape[-axis_count + axis]
    eye_shape = [size, 1] + [2] * axis_count
    eye_shape[2 + axis] = size
    basis = torch.eye(size, dtype=torch.float64).view([size, 1] + [size if i == axis else 1 for i in range(axis_count)]).expand(eye_shape)
    output_size, align_corners, scale_factors = args
    sizes = [2] * axis_count
    if target in (aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default):
        sizes[axis] = output_size[axis]
        scales = [None, None]
        scales[axis] = scale_factors[axis] if scale_factors else None
        result = target(basis.contiguous(), sizes, align_corners, *scales)
    elif output_size is not None:
        sizes[axis] = output_size[axis]
        result = target(basis.contiguous(), sizes, align_corners, None)
    else:
        scales = [1.0] * axis_count
        scales[axis] = scale_factors[axis]
        result = target(basis.contiguous(), None, align_corners, scales)
    index = [slice(None), 0] + [slice(None) if i == axis else 0 for i in range(axis_count)]
    return result[tuple(index)].t().contiguous()  # (out, in)


def _interp_check(node):
    reason = _upsample_check(node)
    if reason:
        return reason
    x = arg_val(node, 0)
    if x.dim() != 4 and node.target is not aten.upsample_trilinear3d.vec:
        return "input rank"
    return None


@lower(aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default, check=_interp_check)
def upsample_antialiased(g, node, x, output_size, align_corners, scales_h=None, scales_w=None):
    scales = (scales_h, scales_w) if scales_h is not None or scales_w is not None else None
    return upsample_interpolate(g, node, x, output_size, align_corners, scales)


@lower(aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.vec, aten.upsample_trilinear3d.vec, check=_interp_check)
def upsample_interpolate(g, node, x, output_size, align_corners, scale_factors):
    spatial = x.rank - 2
    vec = node.target
    matrices = [_linear_weights(vec, x.shape, spatial, i, (output_size, align_corners, scale_factors)) for i in range(spatial)]
    return _along_axes(g, x, matrices)


# -- padding modes ---------------------------------------------------------------------


@lower(
    aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
    aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default,
)  # fmt: skip
def pad_mode(g, node, x, pad):
    pad = [meta(p) for p in node.args[1]]  # symbolic pads as SymInts
    mode = "reflect" if "reflection" in str(node.target) else "edge"
    begins, ends = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        begins[x.rank - 1 - i], ends[x.rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if not is_static(list(pad) + list(x.shape)):
        return _pad_by_gather(g, x, begins, ends, mode)
    if 0 in out_shape(node):
        return g.op("Expand", g.const(0, x.dtype), g.ints(out_shape(node)))
    if mode == "reflect" and any(p < 0 for p in pad):
        # aten reflects about the uncropped input: output j reads reflect(j - begin)
        result = x
        for d in range(x.rank):
            if begins[d] or ends[d]:
                n = x.shape[d]
                source = [abs(t) if t < n else 2 * (n - 1) - t for t in range(-begins[d], n + ends[d])]
                result = g.op("Gather", result, g.ints(source), axis=d)
        return result
    result = g.op("Pad", x, g.ints([max(p, 0) for p in begins + ends]), mode=mode)
    # negative (replication) padding crops, after padding: aten clamps source positions
    crops = [d for d in range(x.rank) if begins[d] < 0 or ends[d] < 0]
    if crops:
        starts = [max(-begins[d], 0) for d in crops]
        stops = [ends[d] if ends[d] < 0 else 2**63 - 1 for d in crops]
        result = g.op("Slice", result, g.ints(starts), g.ints(stops), g.ints(crops))
    return result


def _pad_by_gather(g, x: Value, begins: list, ends: list, mode: str) -> str:
    """Reflection or replication padding with pads or sizes that may be symbolic (of either
    sign: a negative pad crops): output j along a dim reads source t = j - begin, reflected
    (|t|, or 2(n - 1) - t past the end) or clamped to [0, n - 1]."""
    result = x
    for d in range(x.rank):
        if isinstance(begins[d], int) and isinstance(ends[d], int) and begins[d] == ends[d] == 0:
            continue
        n = sym_expr(x.shape[d])
        t = g.op("Range", g.sym(-sym_expr(begins[d])), g.sym(n + sym_expr(ends[d])), g.const(1, torch.int64))
        last = g.sym(n - 1)
        if mode == "reflect":
            source = g.op("Where", g.op("Less", t, g.sym(n)), g.op("Abs", t), g.op("Sub", g.op("Add", last, last), t))
        else:
            source = g.op("Min", g.op("Max", t, g.const(0, torch.int64)), last)
        result = g.op("Gather", result, source, axis=d)
    return result


# -- grid sampling ---------------------------------------------------------------------

GRID_MODES = {0: "linear", 1: "nearest", 2: "cubic"}
GRID_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _grid_check(node):
    x = arg_val(node, 0)
    # known_empty compares static sizes only: numel() == 0 would add a guard on symbolic ones,
    # which fails under backed_size_oblivious (input sizes from 0); those may-be-empty sizes
    # are checked at run time instead (grid_sampler)
    if not is_float(x.dtype) or known_empty(x.shape) or known_empty(arg_val(node, 1).shape):
        return "non-float or empty input"
    if node.args[2] not in GRID_MODES or node.args[3] not in GRID_PADDING:
        return "interpolation or padding mode"
    return None


@lower(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default, check=_grid_check)
def grid_sampler(g, node, x, grid, interpolation_mode, padding_mode, align_corners):
    xv, gridv = arg_val(node, 0), arg_val(node, 1)
    if may_be_zero(xv.shape[1]) or any(may_be_zero(d) for d in gridv.shape[:-1]):
        # a symbolic size whose bounds reach 0 (RAFT's pooled correlation levels under
        # backed_size_oblivious): an empty output where the grid or the channels are empty, as
        # torch gives (ONNX Runtime's GridSample and this lowering's NaN handling fail on those)
        zero = g.const(0, torch.int64)
        channels = g.op("Gather", g.op("Shape", x), g.const(1, torch.int64), axis=0)
        empty = g.op("Or", g.op("Equal", g.op("Size", grid), zero), g.op("Equal", channels, zero))
        dtype = out_dtype(node)
        (out,) = g.if_(
            empty,
            lambda br: [br.op("Expand", br.const(0, dtype), br.ints(out_shape(node)))],
            lambda br: [_grid_sample(br, x, grid, interpolation_mode, padding_mode, align_corners)],
            [Value("", dtype, ())],
        )
        return out
    return _grid_sample(g, x, grid, interpolation_mode, padding_mode, align_corners)


def _grid_sample(g, x, grid, interpolation_mode, padding_mode, align_corners):
    grid = g.cast(grid, x.dtype)
    mode, padding = GRID_MODES[interpolation_mode], GRID_PADDING[padding_mode]
    nan = g.op("IsNaN", grid)
    if padding != "zeros" and mode != "cubic":
        # aten clips a NaN coordinate to the first pixel: the grid value that names it
        sizes = list(reversed(x.shape[2:]))  # grid holds (x, y[, z]): W, H[, D]
        first = [-1.0 if align_corners else -1.0 + 1.0 / n for n in sizes]
        grid = g.op("Where", nan, g.const(torch.tensor(first, dtype=x.dtype)), grid)
    y = g.op("GridSample", x, grid, mode=mode, padding_mode=padding, align_corners=int(align_corners))
    if padding == "zeros" or mode == "cubic":
        # a point with a NaN coordinate: NaN, or 0 for nearest with zero padding
        point_nan = any_true(g, nan, [-1])
        fill = 0.0 if (mode == "nearest" and padding == "zeros") else float("nan")
        y = g.op("Where", g.op("Unsqueeze", point_nan, g.ints([1])), g.const(fill, x.dtype), y)
    return y
