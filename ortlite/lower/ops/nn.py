"""Neural-network ops: softmax, normalization, convolution, pooling, embedding."""

from __future__ import annotations

import math

import torch

from ..builder import TORCH_TO_ONNX, Value
from ..registry import lower, meta
from . import windows
from .common import arg_val, aten, is_float, is_static, may_be_empty, norm_dim, out_dtype, out_shape


def _float_check(node):
    return None if is_float(out_dtype(node)) else "non-float input"


def _softmax(g, node, op_type, x):
    dim = node.args[1]
    x = g.cast(x, out_dtype(node))
    if x.rank == 0:  # one element: a softmax over [x]
        return g.op("Squeeze", g.op(op_type, g.op("Unsqueeze", x, g.ints([0])), axis=0), g.ints([0]))
    return g.op(op_type, x, axis=norm_dim(dim, x.rank))


@lower(aten._softmax.default, check=_float_check)
def softmax(g, node, x, dim, half_to_float):
    return _softmax(g, node, "Softmax", x)


@lower(aten._log_softmax.default, check=_float_check)
def log_softmax(g, node, x, dim, half_to_float):
    return _softmax(g, node, "LogSoftmax", x)


def _layer_norm_check(node):
    x = node.args[0].meta["val"]
    if len(node.args[1]) == 0 or len(node.args[1]) > x.dim():
        return "normalized_shape rank"
    return _float_check(node)


@lower(aten.native_layer_norm.default, check=_layer_norm_check)
def native_layer_norm(g, node, x, normalized_shape, weight, bias, eps):
    if weight is None:
        weight = g.op("Expand", g.const(1.0, x.dtype), g.ints(normalized_shape))
    y, mean, rstd = g.op(
        "LayerNormalization", x, weight, bias, axis=-len(normalized_shape), epsilon=float(eps), stash_type=1, outputs=3
    )
    _, mean_val, rstd_val = node.meta["val"]
    # ONNX keeps the statistics in float32 (stash_type); aten's dtype is in the meta.
    return y, g.op("Cast", mean, to=TORCH_TO_ONNX[mean_val.dtype]), g.op("Cast", rstd, to=TORCH_TO_ONNX[rstd_val.dtype])


def _batch_norm_check(node):
    x = node.args[0].meta["val"]
    if x.dim() < 2:
        return "batch norm of a rank under 2"
    return _float_check(node)


@lower(aten._native_batch_norm_legit_no_training.default, check=_batch_norm_check)
def batch_norm_inference(g, node, x, weight, bias, running_mean, running_var, momentum, eps):
    per_channel = g.shape([x.shape[1]])
    if weight is None:
        weight = g.op("Expand", g.const(1, x.dtype), per_channel)
    if bias is None:
        bias = g.op("Expand", g.const(0, x.dtype), per_channel)
    y = g.op("BatchNormalization", x, weight, bias, running_mean, running_var, epsilon=float(eps))
    _, save_mean, save_rstd = node.meta["val"]
    return y, g.const(torch.empty(tuple(save_mean.shape), dtype=save_mean.dtype)), g.const(
        torch.empty(tuple(save_rstd.shape), dtype=save_rstd.dtype)
    )


def _conv_check(node):
    x = node.args[0].meta["val"]
    if x.dim() not in (3, 4, 5):
        return "unbatched convolution input"
    if isinstance(node.args[8], torch.fx.Node):
        return "a group count known only at run time (ONNX wants it as a number)"
    if is_float(x.dtype):
        return None
    weight, out = arg_val(node, 1), out_shape(node)
    if not (is_static(x.shape) and is_static(weight.shape) and is_static(out)):
        return "integer convolution with symbolic sizes"
    if not windows.fits(x.shape[0], x.shape[1], (math.prod(out[2:]), math.prod(weight.shape[2:]))):
        return "integer convolution too large to gather"
    return None


@lower(aten.convolution.default, check=_conv_check)
def convolution(g, node, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    spatial = x.rank - 2
    stride, padding, dilation, output_padding = (_spatial_list(v, spatial) for v in (stride, padding, dilation, output_padding))
    if not is_float(x.dtype):
        source = windows.transposed_source if transposed else windows.direct_source
        out, kernel = out_shape(node)[2:], weight.shape[2:]
        sources = [source(out[i], x.shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(spatial)]
        table = windows.window_table(sources, list(x.shape[2:]))
        return windows.int_convolution(g, x, weight, bias, out_shape(node), table, int(groups), transposed, out_dtype(node))
    if not transposed and not is_static(padding):
        # padding known only at run time: zeros added by Pad, as Conv's own pads would
        padding = [meta(p) for p in node.args[4]] * (spatial if len(node.args[4]) == 1 else 1)
        x = g.op("Pad", x, g.shape([0, 0, *padding, 0, 0, *padding]))
        padding = [0] * spatial
    if transposed and any(o >= s for o, s in zip(output_padding, stride)):
        return _wide_output_padding(g, node, x, weight, bias, stride, padding, dilation, groups)
    return g.op(
        "ConvTranspose" if transposed else "Conv", x, weight, bias, strides=stride, pads=padding * 2,
        dilations=dilation, group=int(groups), output_padding=output_padding if transposed and any(output_padding) else None,
    )  # fmt: skip


def _wide_output_padding(g, node, x, weight, bias, stride, padding, dilation, groups):
    """A transposed convolution whose output_padding reaches a stride (aten allows up to the
    dilation; ONNX Runtime does not): the full result, cropped or zero-extended to aten's
    window, then the bias."""
    spatial = x.rank - 2
    full = g.op("ConvTranspose", x, weight, strides=stride, dilations=dilation, group=int(groups))
    kernel = weight.shape[2:]
    lengths = [stride[i] * (x.shape[2 + i] - 1) + dilation[i] * (kernel[i] - 1) + 1 for i in range(spatial)]
    out = out_shape(node)[2:]
    short = [max(0, padding[i] + out[i] - lengths[i]) for i in range(spatial)]
    if any(short):
        full = g.op("Pad", full, g.ints([0] * (2 + spatial) + [0, 0] + short), mode="constant")
    result = g.op("Slice", full, g.ints(padding), g.ints([p + o for p, o in zip(padding, out)]), g.ints(range(2, 2 + spatial)))
    if bias is not None:
        result = g.op("Add", result, g.op("Reshape", bias, g.ints([-1] + [1] * spatial)))
    return result


@lower(aten.embedding.default)
def embedding(g, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    from .index import OUT_OF_RANGE, checked_index

    return g.op("Gather", weight, checked_index(g, node, indices, weight.shape[0], negative=False, message=OUT_OF_RANGE), axis=0)



# -- convolution -----------------------------------------------------------------------


def _spatial_list(v, spatial: int) -> list[int]:
    return list(v) * spatial if len(v) == 1 else list(v)


def _conv_backward_check(node):
    if node.args[7]:
        return "transposed convolution backward"
    x = arg_val(node, 1)
    if x.dim() not in (3, 4, 5) or may_be_empty(x) or may_be_empty(arg_val(node, 0)):
        return "input rank or empty input"
    if not all(isinstance(d, int) for d in x.shape[1:]) or not all(isinstance(d, int) for d in arg_val(node, 0).shape[1:]):
        return "symbolic channel or spatial sizes"  # they set ConvTranspose's output padding
    return None if is_float(x.dtype) else "non-float input"


@lower(aten.convolution_backward.default, check=_conv_backward_check)
def convolution_backward(g, node, grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask):
    spatial = x.rank - 2
    stride, padding, dilation = (_spatial_list(v, spatial) for v in (stride, padding, dilation))
    kernel = list(weight.shape[2:])
    out_sp, in_sp = list(grad.shape[2:]), list(x.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        extra = [in_sp[i] - ((out_sp[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + 1) for i in range(spatial)]
        grad_input = g.op(
            "ConvTranspose", grad, weight, strides=stride, pads=padding * 2, dilations=dilation,
            group=int(groups), output_padding=extra,
        )  # fmt: skip
    if output_mask[1]:
        # dW[o, i, k] = sum over n, p of grad[n, o, p] * x_padded[n, i, p * stride + k * dilation]:
        # a convolution of x (channels as batch) with grad (batch as channels) as the kernel
        n, c_in = x.shape[:2]
        c_out = grad.shape[1]
        cig, cog = c_in // groups, c_out // groups
        xs = g.op("Reshape", x, g.ints([n, groups, cig] + in_sp))
        xs = g.op("Reshape", g.op("Transpose", xs, perm=[2, 1, 0] + list(range(3, 3 + spatial))), g.ints([cig, groups * n] + in_sp))
        gs = g.op("Reshape", grad, g.ints([n, groups, cog] + out_sp))
        gs = g.op("Reshape", g.op("Transpose", gs, perm=[1, 2, 0] + list(range(3, 3 + spatial))), g.ints([groups * cog, n] + out_sp))
        full = g.op("Conv", xs, gs, strides=dilation, dilations=stride, pads=padding * 2, group=int(groups))
        cropped = g.op("Slice", full, g.ints([0] * spatial), g.ints(kernel), g.ints(range(2, 2 + spatial)))
        grad_weight = g.op("Transpose", cropped, perm=[1, 0] + list(range(2, 2 + spatial)))
    if output_mask[2]:
        grad_bias = g.op("ReduceSum", grad, g.ints([0] + list(range(2, 2 + spatial))), keepdims=0)
    return grad_input, grad_weight, grad_bias


# -- batch and group norm --------------------------------------------------------------


def _bn_training_check(node):
    x = arg_val(node, 0)
    if x.dim() < 2 or may_be_empty(x):
        return "input rank or empty input"
    return _float_check(node)


def _batch_stats(g, x, eps):
    axes = g.ints([0] + list(range(2, x.rank)))
    mean = g.op("ReduceMean", x, axes, keepdims=1)
    centered = g.op("Sub", x, mean)
    var = g.op("ReduceMean", g.op("Mul", centered, centered), axes, keepdims=1)
    rstd = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.const(eps, x.dtype))))
    return mean, var, centered, rstd


def _per_channel(g, x) -> Value:
    """The Reshape target that lines a (C,) vector up with x's channel dim."""
    return g.ints([-1] + [1] * (x.rank - 2))


def _affine(g, x, y, weight, bias):
    if weight is not None:
        y = g.op("Mul", y, g.op("Reshape", weight, _per_channel(g, x)))
    if bias is not None:
        y = g.op("Add", y, g.op("Reshape", bias, _per_channel(g, x)))
    return y


def _batch_norm_functional(g, node, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """aten's batch norm, training or not, with the updated running statistics."""
    flat = g.ints([-1])
    if not training:  # normalize with the running statistics, which stay as they are
        shape = _per_channel(g, x)
        rstd = g.op("Reciprocal", g.op("Sqrt", g.op("Add", g.op("Reshape", g.cast(running_var, x.dtype), shape), g.const(float(eps), x.dtype))))
        y = _affine(g, x, g.op("Mul", g.op("Sub", x, g.op("Reshape", g.cast(running_mean, x.dtype), shape)), rstd), weight, bias)
        empty = [g.op("Expand", g.const(0, v.dtype), g.ints(tuple(v.shape))) for v in node.meta["val"][1:3]]
        return y, empty[0], empty[1], g.op("Identity", running_mean), g.op("Identity", running_var)
    mean, var, centered, rstd = _batch_stats(g, x, float(eps))
    y = _affine(g, x, g.op("Mul", centered, rstd), weight, bias)
    mean_c, var_c, rstd_c = g.op("Reshape", mean, flat), g.op("Reshape", var, flat), g.op("Reshape", rstd, flat)
    n = x.shape[0] * math.prod(x.shape[2:])
    m = g.const(float(momentum), running_mean.dtype)
    keep = g.const(1.0 - float(momentum), running_mean.dtype)
    new_mean = g.op("Add", g.op("Mul", keep, running_mean), g.op("Mul", m, g.cast(Value(mean_c, x.dtype, ()), running_mean.dtype)))
    # the running variance takes the unbiased variance: n / (n - 1), inf for one element
    if isinstance(n, int):
        correction = g.const(n / (n - 1) if n > 1 else float("inf"), x.dtype)
    else:
        count = g.cast(g.sym(n), x.dtype)
        correction = g.op("Div", count, g.op("Sub", count, g.const(1, x.dtype)))
    unbiased = g.op("Mul", var_c, correction)
    new_var = g.op("Add", g.op("Mul", keep, running_var), g.op("Mul", m, g.cast(Value(unbiased, x.dtype, ()), running_var.dtype)))
    return y, mean_c, rstd_c, new_mean, new_var


@lower(aten._native_batch_norm_legit_functional.default, check=_bn_training_check)
def batch_norm_legit_functional(g, node, x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm_functional(g, node, x, weight, bias, running_mean, running_var, training, momentum, eps)


@lower(aten._batch_norm_with_update_functional.default, check=_bn_training_check)
def batch_norm_with_update_functional(g, node, x, weight, bias, running_mean, running_var, momentum, eps):
    y, mean, rstd, new_mean, new_var = _batch_norm_functional(g, node, x, weight, bias, running_mean, running_var, True, momentum, eps)
    reserve = node.meta["val"][3]
    return y, mean, rstd, g.op("Expand", g.const(0, reserve.dtype), g.ints(tuple(reserve.shape))), new_mean, new_var


@lower(aten._native_batch_norm_legit.no_stats, check=_bn_training_check)
def batch_norm_no_stats(g, node, x, weight, bias, training, momentum, eps):
    mean, var, centered, rstd = _batch_stats(g, x, float(eps))
    y = _affine(g, x, g.op("Mul", centered, rstd), weight, bias)
    return y, g.op("Reshape", mean, g.ints([-1])), g.op("Reshape", rstd, g.ints([-1]))


def _group_norm_check(node):
    x = arg_val(node, 0)
    if x.dim() < 2 or (x.numel() == 0 and x.shape[0] != 0):
        return "empty groups"
    return _float_check(node)


@lower(aten.native_group_norm.default, check=_group_norm_check)
def native_group_norm(g, node, x, weight, bias, n, c, hxw, group, eps):
    if math.prod(x.shape) == 0:  # an empty batch
        return tuple(g.op("Expand", g.const(0, v.dtype), g.ints(tuple(v.shape))) for v in node.meta["val"])
    grouped = g.op("Reshape", x, g.ints([n, group, -1]))
    mean = g.op("ReduceMean", grouped, g.ints([2]), keepdims=1)
    centered = g.op("Sub", grouped, mean)
    var = g.op("ReduceMean", g.op("Mul", centered, centered), g.ints([2]), keepdims=1)
    rstd = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.const(float(eps), x.dtype))))
    y = g.op("Reshape", g.op("Mul", centered, rstd), g.ints(x.shape))
    y = _affine(g, x, y, weight, bias)
    return y, g.op("Reshape", mean, g.ints([n, group])), g.op("Reshape", rstd, g.ints([n, group]))
