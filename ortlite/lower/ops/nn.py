"""Neural-network ops: softmax, normalization, convolution, pooling, embedding."""

from __future__ import annotations

import operator

import torch

from ..builder import TORCH_TO_ONNX
from ..registry import lower
from .common import aten, is_float, norm_dim, out_dtype


def _float_check(node):
    return None if is_float(out_dtype(node)) else "non-float input"


def _softmax_check(node):
    x = node.args[0].meta["val"]
    if x.dim() == 0:
        return "0-d softmax"
    return _float_check(node)


@lower(aten._softmax.default, check=_softmax_check, symbolic=True)
def softmax(g, node, x, dim, half_to_float):
    return g.op("Softmax", g.cast(x, out_dtype(node)), axis=norm_dim(dim, x.rank))


@lower(aten._log_softmax.default, check=_softmax_check, symbolic=True)
def log_softmax(g, node, x, dim, half_to_float):
    return g.op("LogSoftmax", g.cast(x, out_dtype(node)), axis=norm_dim(dim, x.rank))


def _layer_norm_check(node):
    x = node.args[0].meta["val"]
    if len(node.args[1]) == 0 or len(node.args[1]) > x.dim():
        return "normalized_shape rank"
    if not all(isinstance(d, int) for d in node.args[1]):
        return "symbolic normalized_shape"
    return _float_check(node)


@lower(aten.native_layer_norm.default, check=_layer_norm_check, symbolic=True)
def native_layer_norm(g, node, x, normalized_shape, weight, bias, eps):
    if weight is None:
        weight = g.const(torch.ones(tuple(normalized_shape), dtype=x.dtype))
    y, mean, rstd = g.op(
        "LayerNormalization", x, weight, bias, axis=-len(normalized_shape), epsilon=float(eps), stash_type=1, outputs=3
    )
    _, mean_val, rstd_val = node.meta["val"]
    # ONNX keeps the statistics in float32 (stash_type); aten's dtype is in the meta.
    return y, g.op("Cast", mean, to=TORCH_TO_ONNX[mean_val.dtype]), g.op("Cast", rstd, to=TORCH_TO_ONNX[rstd_val.dtype])


def _batch_norm_check(node):
    x = node.args[0].meta["val"]
    if x.dim() < 2 or not isinstance(x.shape[1], int):
        return "batch norm needs a static channel dim"
    return _float_check(node)


@lower(aten._native_batch_norm_legit_no_training.default, check=_batch_norm_check, symbolic=True)
def batch_norm_inference(g, node, x, weight, bias, running_mean, running_var, momentum, eps):
    channels = x.shape[1]
    dtype = x.dtype
    if weight is None:
        weight = g.const(torch.ones(channels, dtype=dtype))
    if bias is None:
        bias = g.const(torch.zeros(channels, dtype=dtype))
    y = g.op("BatchNormalization", x, weight, bias, running_mean, running_var, epsilon=float(eps))
    _, save_mean, save_rstd = node.meta["val"]
    return y, g.const(torch.empty(tuple(save_mean.shape), dtype=save_mean.dtype)), g.const(
        torch.empty(tuple(save_rstd.shape), dtype=save_rstd.dtype)
    )


def _conv_check(node):
    x = node.args[0].meta["val"]
    transposed = node.args[6]
    if transposed:
        return "transposed convolution"
    if x.dim() not in (3, 4, 5):
        return "unbatched convolution input"
    return _float_check(node)


@lower(aten.convolution.default, check=_conv_check, symbolic=True)
def convolution(g, node, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    spatial = x.rank - 2
    expand = lambda v: list(v) * spatial if len(v) == 1 else list(v)  # noqa: E731
    return g.op(
        "Conv",
        x,
        weight,
        bias,
        strides=expand(stride),
        pads=expand(padding) * 2,
        dilations=expand(dilation),
        group=int(groups),
    )


def _max_pool_check(node):
    x = node.args[0].meta["val"]
    if x.dim() != 4:
        return "unbatched max_pool2d input"
    ceil_mode = node.args[5] if len(node.args) > 5 else node.kwargs.get("ceil_mode", False)
    if ceil_mode:
        return "ceil_mode"
    if any(user.target is not operator.getitem or user.args[1] != 0 for user in node.users):
        return "max_pool2d indices are used (ONNX numbers them differently)"
    return _float_check(node)


@lower(aten.max_pool2d_with_indices.default, check=_max_pool_check, symbolic=True)
def max_pool2d_with_indices(g, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    pair = lambda v: [v, v] if isinstance(v, int) else (list(v) * 2 if len(v) == 1 else list(v))  # noqa: E731
    kernel = pair(kernel_size)
    strides = pair(stride) if stride else kernel
    pads = pair(padding)
    values = g.op("MaxPool", x, kernel_shape=kernel, strides=strides, pads=pads * 2, dilations=pair(dilation))
    return values, None


@lower(aten.embedding.default, symbolic=True)
def embedding(g, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return g.op("Gather", weight, indices, axis=0)

