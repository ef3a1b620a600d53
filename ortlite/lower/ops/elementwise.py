"""Elementwise ops: arithmetic, unary math, activations, comparisons, logic, where, clamp."""

from __future__ import annotations

import torch

from ..builder import TORCH_TO_ONNX, GraphBuilder, Value
from ..registry import lower
from .common import aten, arg_val, as_value, is_float, out_dtype, promoted_dtype


def _compute_dtype(node, *operands) -> torch.dtype:
    """The dtype to compute in: the result dtype, or float32 for a half-precision result
    with Python-number operands (aten computes those in float32 without rounding the
    number to half first)."""
    dtype = out_dtype(node)
    if dtype in (torch.float16, torch.bfloat16) and any(not isinstance(o, Value) for o in operands):
        return torch.float32
    return dtype


def _finish(g: GraphBuilder, node, result: str, dtype: torch.dtype) -> str:
    target = out_dtype(node)
    return result if dtype == target else g.op("Cast", result, to=TORCH_TO_ONNX[target])


# -- arithmetic ------------------------------------------------------------------------


def _bool_alpha_check(node):
    if out_dtype(node) == torch.bool and node.kwargs.get("alpha", 1) != 1:
        return "bool arithmetic with alpha"
    return None


@lower(aten.add.Tensor, aten.add.Scalar, check=_bool_alpha_check, symbolic=True)
def add(g, node, a, b, *, alpha=1):
    return _add_sub(g, node, "Add", a, b, alpha)


@lower(aten.sub.Tensor, aten.sub.Scalar, symbolic=True)
def sub(g, node, a, b, *, alpha=1):
    return _add_sub(g, node, "Sub", a, b, alpha)


def _add_sub(g, node, op_type, a, b, alpha):
    if out_dtype(node) == torch.bool:  # bool + bool is logical or (bool - bool is an error in aten)
        return g.op("Or", as_value(g, a, torch.bool), as_value(g, b, torch.bool))
    dtype = _compute_dtype(node, a, b, *([alpha] if alpha != 1 else []))
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if alpha != 1:
        b = g.op("Mul", b, g.const(alpha, dtype))
    return _finish(g, node, g.op(op_type, a, b), dtype)


@lower(aten.mul.Tensor, aten.mul.Scalar, symbolic=True)
def mul(g, node, a, b):
    if out_dtype(node) == torch.bool:
        return g.op("And", as_value(g, a, torch.bool), as_value(g, b, torch.bool))
    dtype = _compute_dtype(node, a, b)
    return _finish(g, node, g.op("Mul", as_value(g, a, dtype), as_value(g, b, dtype)), dtype)


def _div_check(node):
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if mode is not None and mode not in ("trunc", "floor"):
        return f"rounding_mode {mode!r}"
    divisor = node.args[1]
    if not is_float(out_dtype(node)):
        # Integer division by zero raises in aten but kills the process in ONNX Runtime:
        # only a nonzero constant divisor is safe to lower.
        if isinstance(divisor, torch.fx.Node) or divisor == 0:
            return "integer division by a tensor (or by zero)"
        if not isinstance(divisor, int):
            return "integer division by a non-integer scalar"
    return None


@lower(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode, check=_div_check, symbolic=True)
def div(g, node, a, b, *, rounding_mode=None):
    dtype = _compute_dtype(node, a, b)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if rounding_mode is None or not is_float(dtype):
        quotient = g.op("Div", a, b)  # integer Div truncates toward zero
        if rounding_mode == "floor" and not is_float(dtype):
            # floor(a / b) == (a - python_mod(a, b)) / b exactly for integers
            quotient = g.op("Div", g.op("Sub", a, g.op("Mod", a, b, fmod=0)), b)
    elif rounding_mode == "trunc":
        q = g.op("Div", a, b)
        quotient = g.op("Where", g.op("Less", q, g.const(0, dtype)), g.op("Ceil", q), g.op("Floor", q))
    else:
        quotient = _float_floor_divide(g, a, b, dtype)
    return _finish(g, node, quotient, dtype)


def _float_floor_divide(g, a, b, dtype):
    # aten's div_floor_floating: floor of (a - fmod(a, b)) / b with its sign corrections,
    # so that results agree with eager to the last bit.
    zero, one, half = g.const(0, dtype), g.const(1, dtype), g.const(0.5, dtype)
    true_div = g.op("Div", a, b)
    mod = g.op("Mod", a, b, fmod=1)
    div = g.op("Div", g.op("Sub", a, mod), b)
    signs_differ = g.op("Xor", g.op("Less", b, zero), g.op("Less", mod, zero))
    adjust = g.op("And", g.op("Not", g.op("Equal", mod, zero)), signs_differ)
    div = g.op("Sub", div, g.op("Cast", adjust, to=TORCH_TO_ONNX[dtype]))
    floor = g.op("Floor", div)
    floor = g.op("Add", floor, g.op("Cast", g.op("Greater", g.op("Sub", div, floor), half), to=TORCH_TO_ONNX[dtype]))
    signed_zero = g.op("Mul", true_div, zero)
    result = g.op("Where", g.op("Equal", div, zero), signed_zero, floor)
    return g.op("Where", g.op("Equal", b, zero), true_div, result)


def _pow_check(node):
    if not is_float(out_dtype(node)):
        exponent = node.args[1]
        if isinstance(exponent, torch.fx.Node) or not isinstance(exponent, int) or exponent < 0:
            return "integer pow needs a constant non-negative integer exponent"
    return None


@lower(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar, check=_pow_check, symbolic=True)
def pow_(g, node, base, exponent):
    dtype = _compute_dtype(node, base, exponent)
    if not isinstance(exponent, Value) and exponent == 2:
        x = as_value(g, base, dtype)
        return _finish(g, node, g.op("Mul", x, x), dtype)
    if not isinstance(exponent, Value) and exponent == 0.5 and is_float(dtype):
        return _finish(g, node, g.op("Sqrt", as_value(g, base, dtype)), dtype)
    return _finish(g, node, g.op("Pow", as_value(g, base, dtype), as_value(g, exponent, dtype)), dtype)


# -- unary -----------------------------------------------------------------------------


def _unary(target, op_type):
    @lower(target, symbolic=True)
    def fn(g, node, x):
        return g.op(op_type, g.cast(x, out_dtype(node)))

    fn.__name__ = op_type.lower()
    return fn


for _target, _op_type in [
    (aten.neg.default, "Neg"),
    (aten.abs.default, "Abs"),
    (aten.exp.default, "Exp"),
    (aten.log.default, "Log"),
    (aten.sqrt.default, "Sqrt"),
    (aten.sigmoid.default, "Sigmoid"),
    (aten.tanh.default, "Tanh"),
    (aten.erf.default, "Erf"),
    (aten.sin.default, "Sin"),
    (aten.cos.default, "Cos"),
]:
    _unary(_target, _op_type)


def _not_bool(node):
    return "bool input" if out_dtype(node) == torch.bool else None


@lower(aten.rsqrt.default, symbolic=True)
def rsqrt(g, node, x):
    return g.op("Reciprocal", g.op("Sqrt", g.cast(x, out_dtype(node))))


@lower(aten.relu.default, check=_not_bool, symbolic=True)
def relu(g, node, x):
    if is_float(x.dtype):
        return g.op("Relu", x)
    return g.op("Max", x, g.const(0, x.dtype))


def _gelu_check(node):
    if node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    # ORT's Gelu expands to a function whose nodes errors cannot name: refuse the dtypes
    # its CPU kernels lack up front.
    return None if out_dtype(node) in (torch.float32, torch.float16) else f"gelu in {out_dtype(node)}"


@lower(aten.gelu.default, check=_gelu_check, symbolic=True)
def gelu(g, node, x, approximate="none"):
    return g.op("Gelu", x, approximate=approximate)


@lower(aten.silu.default, symbolic=True)
def silu(g, node, x):
    return g.op("Mul", x, g.op("Sigmoid", x))


@lower(aten.threshold_backward.default, symbolic=True)
def threshold_backward(g, node, grad, x, threshold):
    dtype = out_dtype(node)
    below = g.op("LessOrEqual", x, g.const(threshold, x.dtype))
    return g.op("Where", below, g.const(0, dtype), g.cast(grad, dtype))


# -- where, comparisons, logic ---------------------------------------------------------


@lower(aten.where.self, symbolic=True)
def where(g, node, cond, a, b):
    dtype = out_dtype(node)
    return g.op("Where", g.cast(cond, torch.bool), as_value(g, a, dtype), as_value(g, b, dtype))


def _compare(target, op_type, negate=False):
    @lower(target, symbolic=True)
    def fn(g, node, a, b):
        dtype = promoted_dtype(arg_val(node, 0), arg_val(node, 1))
        if dtype == torch.bool and op_type != "Equal":
            dtype = torch.int32  # ONNX orders numbers, not bools
        result = g.op(op_type, as_value(g, a, dtype), as_value(g, b, dtype))
        return g.op("Not", result) if negate else result

    return fn


for _name, _op_type, _negate in [
    ("eq", "Equal", False),
    ("ne", "Equal", True),
    ("lt", "Less", False),
    ("le", "LessOrEqual", False),
    ("gt", "Greater", False),
    ("ge", "GreaterOrEqual", False),
]:
    _compare(getattr(aten, _name).Tensor, _op_type, _negate)
    _compare(getattr(aten, _name).Scalar, _op_type, _negate)


def _logical(target, op_type):
    @lower(target, symbolic=True)
    def fn(g, node, *xs):
        result = g.op(op_type, *(g.cast(x, torch.bool) for x in xs))
        return g.cast(Value(result, torch.bool, ()), out_dtype(node))

    return fn


_logical(aten.logical_and.default, "And")
_logical(aten.logical_or.default, "Or")
_logical(aten.logical_xor.default, "Xor")
_logical(aten.logical_not.default, "Not")


# -- clamp -----------------------------------------------------------------------------


@lower(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default, aten.clamp_min.Tensor, aten.clamp_max.Tensor, symbolic=True)
def clamp(g, node, x, min=None, max=None):
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        min, max = None, min
    dtype = out_dtype(node)
    result = g.cast(x, dtype)
    # Max/Min (not Clip): they propagate NaN as aten does, and take tensor bounds.
    if min is not None:
        result = g.op("Max", result, as_value(g, min, dtype))
    if max is not None:
        result = g.op("Min", result, as_value(g, max, dtype))
    return result if (min is not None or max is not None) else g.op("Identity", result)
