"""Elementwise ops: arithmetic, unary math, activations, comparisons, logic, where, clamp."""

from __future__ import annotations

import math

import torch
from onnx import TensorProto

from ..builder import TORCH_TO_ONNX, GraphBuilder, Value
from ..registry import lower
from . import common
from .common import aten, arg_val, as_value, is_float, out_dtype, out_shape, promoted_dtype
from ..registry import node_tensors


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


@lower(aten.add.Tensor, aten.add.Scalar)
def add(g, node, a, b, *, alpha=1):
    if out_dtype(node) == torch.bool and not alpha:  # a + False * b
        return g.op("Expand", as_value(g, a, torch.bool), g.ints(out_shape(node)))
    return _add_sub(g, node, "Add", a, b, alpha)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(g, node, a, b, *, alpha=1):
    return _add_sub(g, node, "Sub", a, b, alpha)


def _add_sub(g, node, op_type, a, b, alpha):
    if out_dtype(node) == torch.bool:  # bool + bool is logical or (bool - bool is an error in aten)
        return g.op("Or", as_value(g, a, torch.bool), as_value(g, b, torch.bool))  # alpha is True here
    dtype = _compute_dtype(node, a, b, *([alpha] if alpha != 1 else []))
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if alpha != 1:
        b = g.op("Mul", b, g.const(alpha, dtype))
    return _finish(g, node, g.op(op_type, a, b), dtype)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(g, node, a, b):
    if out_dtype(node) == torch.bool:
        return g.op("And", as_value(g, a, torch.bool), as_value(g, b, torch.bool))
    dtype = _compute_dtype(node, a, b)
    return _finish(g, node, g.op("Mul", as_value(g, a, dtype), as_value(g, b, dtype)), dtype)


def _div_check(node):
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if mode is not None and mode not in ("trunc", "floor"):
        return f"rounding_mode {mode!r}"
    return _int_divisor_check(node)


def _int_divisor_check(node):
    """Integer division by zero raises in aten but kills the process in ONNX Runtime: a
    divisor that may be zero is made safe and checked (_safe_int_divisor), on CPU only
    (where aten raises; on CUDA its results are unspecified)."""
    if is_float(out_dtype(node)):
        return None
    divisor = node.args[1]
    if isinstance(divisor, torch.fx.Node):
        if any(t.device.type != "cpu" for t in node_tensors(node)):
            return "integer division by a tensor on CUDA"
    elif isinstance(divisor, bool) or not isinstance(divisor, int):
        return "integer division by a non-integer scalar"
    return None


def _safe_int_divisor(g: GraphBuilder, node, b: Value) -> Value:
    """An integer divisor with its zeros replaced by ones; the call raises aten's
    ZeroDivisionError when a zero divisor meets an element of the result."""
    divisor, out = node.args[1], common.out_val(node)
    if isinstance(divisor, int) and divisor != 0:
        return b
    is_zero = g.op("Equal", b, g.const(0, b.dtype))
    if not (common.is_static(out.shape) and math.prod(out.shape) == 0):  # else nothing is divided
        met = is_zero
        if b.shape != out.shape:  # the divisors the result meets: b broadcast (empty if the result is)
            met = g.op("Expand", is_zero, g.shape(out.shape))
        g.fail_if(common.any_true(g, met), "ZeroDivisionError")
    return Value(g.op("Where", is_zero, g.const(1, b.dtype), b), b.dtype, b.shape)


@lower(
    aten.div.Tensor,
    aten.div.Scalar,
    aten.div.Tensor_mode,
    aten.div.Scalar_mode,
    aten.true_divide.Tensor,
    check=_div_check,
)
def div(g, node, a, b, *, rounding_mode=None):
    dtype = _compute_dtype(node, a, b)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if not is_float(dtype):
        b = _safe_int_divisor(g, node, b)
    if rounding_mode is None or not is_float(dtype):
        quotient = g.op("Div", a, b)  # integer Div truncates toward zero
        if rounding_mode == "floor" and not is_float(dtype):
            # aten's div_floor_integer: one less where the signs differ and there is a remainder
            zero = g.const(0, dtype)
            inexact = g.op("Not", g.op("Equal", common.c_remainder(g, a, b), zero))
            signs_differ = g.op("Xor", g.op("Less", a, zero), g.op("Less", b, zero))
            quotient = g.op("Sub", quotient, g.cast(Value(g.op("And", inexact, signs_differ), torch.bool, ()), dtype))
    elif rounding_mode == "trunc":
        q = g.op("Div", a, b)
        quotient = g.op("Where", g.op("Less", q, g.const(0, dtype)), g.op("Ceil", q), g.op("Floor", q))
    else:
        quotient = _float_floor_divide(g, a, b, dtype)
    return _finish(g, node, quotient, dtype)


@lower(aten.floor_divide.default, check=_int_divisor_check)
def floor_divide(g, node, a, b):
    return div(g, node, a, b, rounding_mode="floor")


def _float_floor_divide(g, a, b, dtype):
    # aten's div_floor_floating: floor of (a - fmod(a, b)) / b with its sign corrections,
    # so that results agree with eager to the last bit.
    zero, half = g.const(0, dtype), g.const(0.5, dtype)
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
    dtype = out_dtype(node)
    if dtype == torch.bool:
        return "bool pow"
    exponent = node.args[1]
    if not is_float(dtype) and not isinstance(exponent, torch.fx.Node) and (not isinstance(exponent, int) or exponent < 0):
        return "integer pow by a negative or non-integer scalar (aten raises)"
    return None


@lower(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar, check=_pow_check)
def pow_(g, node, base, exponent):
    dtype = _compute_dtype(node, base, exponent)
    if not is_float(dtype):
        return _finish(g, node, _int_pow(g, node, base, exponent), torch.int64)
    if not isinstance(exponent, Value) and exponent == 2:
        x = as_value(g, base, dtype)
        return _finish(g, node, g.op("Mul", x, x), dtype)
    if not isinstance(exponent, Value) and exponent == 0.5:
        return _finish(g, node, g.op("Sqrt", as_value(g, base, dtype)), dtype)
    return _finish(g, node, g.op("Pow", as_value(g, base, dtype), as_value(g, exponent, dtype)), dtype)


def _int_pow(g: GraphBuilder, node, base, exponent) -> Value:
    """aten's powi in int64: square-and-multiply (ONNX Runtime's integer Pow goes through
    double, inexact past 2**53). Products wrap modulo 2**64, so narrower dtypes are exact
    after the final cast. A negative exponent gives 1 for a base of 1, +-1 for -1, else 0."""
    i64 = torch.int64
    shape = g.shape(out_shape(node))
    one = g.const(1, i64)
    a = as_value(g, base, i64)
    if not isinstance(exponent, Value):  # a constant exponent >= 0: unrolled
        result, square, e = one, a, exponent
        while e:
            if e & 1:
                result = g.op("Mul", result, square)
            e >>= 1
            if e:
                square = g.op("Mul", square, square)
        return Value(g.op("Expand", result, shape), i64, out_shape(node))
    zero, two = g.const(0, i64), g.const(2, i64)
    e = as_value(g, exponent, i64)
    negative = g.op("Less", e, zero)
    a = Value(g.op("Expand", a, shape), i64, out_shape(node))
    e_pos = Value(g.op("Expand", g.op("Where", negative, zero, e), shape), i64, out_shape(node))

    def any_positive(b, e):
        return common.any_true(b, b.op("Greater", e, zero))

    def step(b, i, result, square, e):
        odd = b.op("Equal", b.op("Mod", e, two), one)
        result = b.op("Where", odd, b.op("Mul", result, square), result)
        e = b.op("Div", e, two)
        return any_positive(b, e), result, b.op("Mul", square, square), e

    ones = Value(g.op("Expand", one, shape), i64, out_shape(node))
    result, _, _ = g.loop(None, any_positive(g, e_pos), [ones, a, e_pos], step)
    # negative exponents: 1 ** e = 1, (-1) ** e = +-1, else 0 (integer truncation of 1 / a ** -e)
    odd = g.op("Equal", common.c_remainder(g, e, two), g.const(-1, i64))
    minus_one = g.op("Where", odd, g.const(-1, i64), one)
    by_negative = g.op("Where", g.op("Equal", a, one), one, g.op("Where", g.op("Equal", a, g.const(-1, i64)), minus_one, zero))
    return Value(g.op("Where", negative, by_negative, result), i64, out_shape(node))


# -- unary -----------------------------------------------------------------------------


def _unary(target, op_type):
    @lower(target)
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


def _float_only(node):
    return None if is_float(out_dtype(node)) else "non-float input"


@lower(aten.rsqrt.default)
def rsqrt(g, node, x):
    return g.op("Reciprocal", g.op("Sqrt", g.cast(x, out_dtype(node))))


@lower(aten.relu.default, check=_not_bool)
def relu(g, node, x):
    if is_float(x.dtype):
        return g.op("Relu", x)
    return common.max_min(g, x, g.const(0, x.dtype), x.dtype, largest=True)


def _gelu_check(node):
    if node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    # ORT's Gelu expands to a function whose nodes errors cannot name: refuse the dtypes
    # its CPU kernels lack up front.
    return None if out_dtype(node) in (torch.float32, torch.float16) else f"gelu in {out_dtype(node)}"


@lower(aten.gelu.default, check=_gelu_check)
def gelu(g, node, x, approximate="none"):
    return g.op("Gelu", x, approximate=approximate)


@lower(aten.silu.default)
def silu(g, node, x):
    return g.op("Mul", x, g.op("Sigmoid", x))


@lower(aten.threshold_backward.default)
def threshold_backward(g, node, grad, x, threshold):
    dtype = out_dtype(node)
    below = g.op("LessOrEqual", x, g.const(threshold, x.dtype))
    return g.op("Where", below, g.const(0, dtype), g.cast(grad, dtype))


# -- where, comparisons, logic ---------------------------------------------------------


@lower(aten.where.self)
def where(g, node, cond, a, b):
    dtype = out_dtype(node)
    return common.where(g, g.cast(cond, torch.bool), as_value(g, a, dtype), as_value(g, b, dtype), dtype)


def _compare(target, op_type, negate=False):
    @lower(target)
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
    @lower(target)
    def fn(g, node, *xs):
        result = g.op(op_type, *(g.cast(x, torch.bool) for x in xs))
        return g.cast(Value(result, torch.bool, ()), out_dtype(node))

    return fn


_logical(aten.logical_and.default, "And")
_logical(aten.logical_or.default, "Or")
_logical(aten.logical_xor.default, "Xor")
_logical(aten.logical_not.default, "Not")


# -- clamp -----------------------------------------------------------------------------


@lower(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default, aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def clamp(g, node, x, min=None, max=None):
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        min, max = None, min
    dtype = out_dtype(node)
    result = g.cast(x, dtype)
    # Max/Min (not Clip): they propagate NaN as aten does, and take tensor bounds.
    if min is not None:
        low = as_value(g, min, dtype)
        result = g.op("Or", result, low) if dtype == torch.bool else common.max_min(g, result, low, dtype, largest=True)
    if max is not None:
        high = as_value(g, max, dtype)
        result = g.op("And", result, high) if dtype == torch.bool else common.max_min(g, result, high, dtype, largest=False)
    return result if (min is not None or max is not None) else g.op("Identity", result)


# -- more unary math -------------------------------------------------------------------


for _target, _op_type in [
    (aten.acos.default, "Acos"),
    (aten.acosh.default, "Acosh"),
    (aten.asin.default, "Asin"),
    (aten.asinh.default, "Asinh"),
    (aten.atan.default, "Atan"),
    (aten.atanh.default, "Atanh"),
    (aten.cosh.default, "Cosh"),
    (aten.sinh.default, "Sinh"),
    (aten.tan.default, "Tan"),
    (aten.reciprocal.default, "Reciprocal"),
]:
    _unary(_target, _op_type)


def _rounding(target, op_type):
    @lower(target)
    def fn(g, node, x):
        if not is_float(x.dtype):
            return g.op("Identity", x)  # aten rounds integers to themselves
        return g.op(op_type, x)  # ONNX Round, like aten, rounds half to even

    return fn


_rounding(aten.ceil.default, "Ceil")
_rounding(aten.floor.default, "Floor")
_rounding(aten.round.default, "Round")


@lower(aten.trunc.default)
def trunc(g, node, x):
    if not is_float(x.dtype):
        return g.op("Identity", x)
    return g.op("Where", g.op("Less", x, g.const(0, x.dtype)), g.op("Ceil", x), g.op("Floor", x))


def _round_decimals_check(node):
    return None if is_float(out_dtype(node)) else "round with decimals on integers"


@lower(aten.round.decimals, check=_round_decimals_check)
def round_decimals(g, node, x, *, decimals=0):
    # aten: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d for negative d
    if decimals == 0:
        return g.op("Round", x)
    scale = g.const(10.0 ** abs(decimals), x.dtype)
    if decimals > 0:
        return g.op("Div", g.op("Round", g.op("Mul", x, scale)), scale)
    return g.op("Mul", g.op("Round", g.op("Div", x, scale)), scale)


def _signbit_check(node):
    # a NaN's sign bit cannot be read in ONNX (no bit cast): only integer and bool inputs
    if is_float(arg_val(node, 0).dtype):
        return "float input (NaN sign bits)"
    return None


@lower(aten.signbit.default, check=_signbit_check)
def signbit(g, node, x):
    if x.dtype == torch.bool or x.dtype == torch.uint8:
        return g.op("Expand", g.const(False), g.ints(out_shape(node)))
    return g.op("Less", x, g.const(0, x.dtype))


@lower(aten.sign.default)
def sign(g, node, x):
    if x.dtype == torch.bool:
        return g.op("Identity", x)
    result = g.op("Sign", x)
    if is_float(x.dtype):  # ONNX Sign of NaN is NaN; aten's is 0
        result = g.op("Where", g.op("IsNaN", x), g.const(0, x.dtype), result)
    return result


def _is_class(target, op_type):
    @lower(target)
    def fn(g, node, x):
        if not is_float(x.dtype):
            return _bool_fill(g, x.shape, False)
        return g.op(op_type, x)

    return fn


def _bool_fill(g, shape, value):
    scalar = g.const(value, torch.bool)
    return g.op("Expand", scalar, g.ints(shape)) if shape else g.op("Identity", scalar)


_is_class(aten.isnan.default, "IsNaN")
_is_class(aten.isinf.default, "IsInf")


@lower(aten.log2.default, aten.log10.default)
def log_base(g, node, x):
    dtype = out_dtype(node)
    base = 2.0 if node.target is aten.log2.default else 10.0
    return g.op("Div", g.op("Log", g.cast(x, dtype)), g.const(math.log(base), dtype))


@lower(aten.exp2.default)
def exp2(g, node, x):
    dtype = out_dtype(node)
    return g.op("Pow", g.const(2.0, dtype), g.cast(x, dtype))


@lower(aten.expm1.default)
def expm1(g, node, x):
    # Kahan's expm1: exact to a few ulps where exp(x) - 1 loses every digit (|x| tiny)
    dtype = out_dtype(node)
    x = g.cast(x, dtype)
    u = g.op("Exp", x)
    um1 = g.op("Sub", u, g.const(1, dtype))
    ratio = g.op("Mul", um1, g.op("Div", x, g.op("Log", u)))  # x / log(u) ~ 1: no overflow
    result = g.op("Where", g.op("Equal", u, g.const(1, dtype)), x, ratio)
    result = g.op("Where", g.op("Equal", um1, g.const(-1, dtype)), g.const(-1, dtype), result)
    return g.op("Where", g.op("IsInf", u, detect_negative=0), u, result)


@lower(aten.log1p.default)
def log1p(g, node, x):
    # Kahan's log1p: log(u) * x / (u - 1) with u = 1 + x
    dtype = out_dtype(node)
    x = g.cast(x, dtype)
    u = g.op("Add", x, g.const(1, dtype))
    log_u = g.op("Log", u)
    ratio = g.op("Mul", log_u, g.op("Div", x, g.op("Sub", u, g.const(1, dtype))))
    result = g.op("Where", g.op("Equal", u, g.const(1, dtype)), x, ratio)
    return g.op("Where", g.op("IsInf", u), log_u, result)


@lower(aten.bitwise_not.default)
def bitwise_not(g, node, x):
    return g.op("Not" if x.dtype == torch.bool else "BitwiseNot", x)


def _bitwise(targets, bool_op, int_op):
    @lower(*targets)
    def fn(g, node, a, b):
        dtype = out_dtype(node)
        return g.op(bool_op if dtype == torch.bool else int_op, as_value(g, a, dtype), as_value(g, b, dtype))

    return fn


_bitwise((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), "And", "BitwiseAnd")
_bitwise((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), "Or", "BitwiseOr")
_bitwise((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), "Xor", "BitwiseXor")


def _shift_check(node):
    return None if out_dtype(node) in common.INT_DTYPES else f"shift of {out_dtype(node)}"


LEFT_SHIFTS = (aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor)
RIGHT_SHIFTS = (aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)


@lower(*LEFT_SHIFTS, aten.__lshift__.Tensor, aten.__lshift__.Scalar, *RIGHT_SHIFTS, aten.__rshift__.Tensor, aten.__rshift__.Scalar, check=_shift_check)
def bitwise_shift(g, node, a, b):
    """aten's shifts: by a negative amount or past the width, a left shift gives 0 and a
    right shift a >> (width - 1) for signed types, 0 for unsigned. ONNX's BitShift is
    unsigned only: values go through int64 and uint64 (the low bits of a left shift are the
    same in every width), a signed right shift as ~(~a >> s) for negative a."""
    dtype = out_dtype(node)
    left = node.target in LEFT_SHIFTS or node.target in (aten.__lshift__.Tensor, aten.__lshift__.Scalar)
    info = torch.iinfo(dtype)
    signed = info.min < 0
    i64, u64 = torch.int64, TensorProto.UINT64
    a = as_value(g, a, i64) if isinstance(a, Value) else as_value(g, common.wrap_int(a, dtype), i64)
    b = as_value(g, b, dtype)
    amount = g.cast(g.cast(b, dtype if signed else torch.int8), i64)  # aten reads it signed: uint8 200 is -56
    max_shift = info.bits - 1 if signed and not left else info.bits
    valid = g.op("And", g.op("GreaterOrEqual", amount, g.const(0, i64)), g.op("Less", amount, g.const(max_shift, i64)))
    direction = "LEFT" if left else "RIGHT"
    if left or not signed:
        shift = g.op("Cast", g.op("Where", valid, amount, g.const(0, i64)), to=u64)
        shifted = g.op("Cast", g.op("BitShift", g.op("Cast", a, to=u64), shift, direction=direction), to=TensorProto.INT64)
        return g.op("Cast", g.op("Where", valid, shifted, g.const(0, i64)), to=TORCH_TO_ONNX[dtype])
    shift = g.op("Cast", g.op("Where", valid, amount, g.const(max_shift, i64)), to=u64)
    negative = g.op("Less", a, g.const(0, i64))
    magnitude = g.op("Where", negative, g.op("BitwiseNot", a), a)  # >= 0
    shifted = g.op("Cast", g.op("BitShift", g.op("Cast", magnitude, to=u64), shift, direction=direction), to=TensorProto.INT64)
    return g.op("Cast", g.op("Where", negative, g.op("BitwiseNot", shifted), shifted), to=TORCH_TO_ONNX[dtype])


def _gcd_check(node):
    return None if out_dtype(node) in common.INT_DTYPES else f"gcd of {out_dtype(node)}"


def _wrapped(g, x: str, dtype: torch.dtype) -> str:
    """An int64 value as aten's `dtype` arithmetic leaves it: wrapped to its width."""
    if dtype == torch.int64:
        return x
    return g.op("Cast", g.op("Cast", x, to=TORCH_TO_ONNX[dtype]), to=TensorProto.INT64)


def _gcd(g, node, a, b) -> str:
    """aten's calc_gcd in int64: a, b = |a|, |b| (wrapped: |-128| is -128 in int8); while
    a != 0: a, b = b % a, a (C's %), as an ONNX Loop while any element runs."""
    dtype, shape = out_dtype(node), g.shape(out_shape(node))
    i64 = torch.int64
    zero = g.const(0, i64)
    a, b = (Value(_wrapped(g, g.op("Expand", g.op("Abs", as_value(g, v, i64)), shape), dtype), i64, out_shape(node)) for v in (a, b))

    def any_running(b_, a):
        return common.any_true(b_, b_.op("Not", b_.op("Equal", a, zero)))

    def step(b_, i, a, b):
        running = b_.op("Not", b_.op("Equal", a, zero))
        remainder = common.c_remainder(b_, b, b_.op("Where", running, a, g.const(1, i64)))
        a_next = b_.op("Where", running, remainder, zero)
        return any_running(b_, a_next), a_next, b_.op("Where", running, a, b)

    _, result = g.loop(None, any_running(g, a), [a, b], step)
    return result


@lower(aten.gcd.default, check=_gcd_check)
def gcd(g, node, a, b):
    return g.op("Cast", _gcd(g, node, a, b), to=TORCH_TO_ONNX[out_dtype(node)])


@lower(aten.lcm.default, check=_gcd_check)
def lcm(g, node, a, b):
    # aten: g == 0 ? 0 : |a / g * b| in C++ arithmetic: int for types narrower than int
    # (promoted), else the type's own width
    dtype, i64 = out_dtype(node), torch.int64
    width = torch.int64 if dtype == torch.int64 else torch.int32
    divisor = _gcd(g, node, a, b)
    is_zero = g.op("Equal", divisor, g.const(0, i64))
    quotient = g.op("Div", as_value(g, a, i64), g.op("Where", is_zero, g.const(1, i64), divisor))
    product = _wrapped(g, g.op("Mul", quotient, as_value(g, b, i64)), width)
    result = g.op("Where", is_zero, g.const(0, i64), g.op("Abs", product))
    return g.op("Cast", result, to=TORCH_TO_ONNX[dtype])


def _nextafter_check(node):
    return None if out_dtype(node) in (torch.float32, torch.float64) else f"nextafter of {out_dtype(node)}"


@lower(aten.nextafter.default, check=_nextafter_check)
def nextafter(g, node, x, y):
    """The neighbour of x toward y, from its binade: |x| in [2**e, 2**(e+1)) moves by
    ulp = 2**(e - mantissa bits), by half that when shrinking from a power of two (float64
    arithmetic, exact for both dtypes: every float32 and its neighbours are doubles)."""
    dtype = out_dtype(node)
    info = torch.finfo(dtype)
    bits = {torch.float32: 23, torch.float64: 52}[dtype]
    min_exp = {torch.float32: -126, torch.float64: -1022}[dtype]
    f64 = torch.float64
    c = lambda v: g.const(float(v), f64)  # noqa: E731
    x64, y64 = g.cast(as_value(g, x, dtype), f64), g.cast(as_value(g, y, dtype), f64)
    size = g.op("Abs", x64)
    e = g.op("Floor", g.op("Div", g.op("Log", g.op("Max", size, c(info.smallest_normal))), c(math.log(2))))
    power = g.op("Pow", c(2), e)  # correct the logarithm's rounding near powers of two
    e = g.op("Sub", e, g.op("Cast", g.op("Greater", power, size), to=TensorProto.DOUBLE))
    e = g.op("Add", e, g.op("Cast", g.op("LessOrEqual", g.op("Mul", g.op("Pow", c(2), e), c(2)), size), to=TensorProto.DOUBLE))
    e = g.op("Max", e, c(min_exp))  # subnormals: the smallest step
    ulp = g.op("Pow", c(2), g.op("Sub", e, c(bits)))
    up = g.op("Greater", y64, x64)
    growing = g.op("Xor", up, g.op("Less", x64, c(0)))
    at_power = g.op("And", g.op("Equal", size, g.op("Pow", c(2), e)), g.op("Greater", e, c(min_exp)))
    shrink = g.op("Where", at_power, g.op("Mul", ulp, c(0.5)), ulp)
    moved = g.op("Where", growing, g.op("Add", size, ulp), g.op("Sub", size, shrink))
    moved = g.op("Where", g.op("IsInf", size), c(info.max), moved)  # from +-inf toward y: the largest finite
    sign = g.op("Where", g.op("Less", x64, c(0)), c(-1), c(1))
    result = g.op("Mul", sign, moved)
    tiny = g.op("Where", up, c(2.0 ** (min_exp - bits)), c(-(2.0 ** (min_exp - bits))))
    result = g.op("Where", g.op("Equal", x64, c(0)), tiny, result)
    # y in Where's Y input: ONNX Runtime's CPU Where drops the sign of a -0.0 taken from X
    # (and x != y is not a Not, which ONNX Runtime would fuse back into a swapped Where)
    result = g.op("Where", g.op("Or", g.op("Less", x64, y64), g.op("Greater", x64, y64)), result, y64)
    nan = g.op("Or", g.op("IsNaN", x64), g.op("IsNaN", y64))
    result = g.op("Where", nan, c(math.nan), result)
    return g.op("Cast", result, to=TORCH_TO_ONNX[dtype])


# -- binary math -----------------------------------------------------------------------


@lower(aten.maximum.default, aten.minimum.default)
def maximum(g, node, a, b):
    dtype = out_dtype(node)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if dtype == torch.bool:
        return g.op("Or" if node.target is aten.maximum.default else "And", a, b)
    return common.max_min(g, a, b, dtype, largest=node.target is aten.maximum.default)


@lower(aten.fmax.default, aten.fmin.default)
def fmax(g, node, a, b):
    dtype = out_dtype(node)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if dtype == torch.bool:
        return g.op("Or" if node.target is aten.fmax.default else "And", a, b)
    result = common.max_min(g, a, b, dtype, largest=node.target is aten.fmax.default)
    if is_float(dtype):  # NaN only where both are NaN
        result = g.op("Where", g.op("IsNaN", a), b, g.op("Where", g.op("IsNaN", b), a, result))
    return result


@lower(aten.fmod.Tensor, aten.fmod.Scalar, check=_int_divisor_check)
def fmod(g, node, a, b):
    dtype = _compute_dtype(node, a, b)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if not is_float(dtype):
        b = _safe_int_divisor(g, node, b)
    mod = g.op("Mod", a, b, fmod=1) if is_float(dtype) else common.c_remainder(g, a, b)
    return _finish(g, node, mod, dtype)


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, check=_int_divisor_check)
def remainder(g, node, a, b):
    dtype = _compute_dtype(node, a, b)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    if not is_float(dtype):
        b = _safe_int_divisor(g, node, b)
        return _finish(g, node, g.op("Mod", a, b, fmod=0), dtype)  # the divisor's sign, as Python's %
    # aten's kernel: m = fmod(a, b); m + b where m != 0 and its sign differs from b's
    zero = g.const(0, dtype)
    mod = g.op("Mod", a, b, fmod=1)
    adjust = g.op("And", g.op("Not", g.op("Equal", mod, zero)), g.op("Xor", g.op("Less", b, zero), g.op("Less", mod, zero)))
    return _finish(g, node, g.op("Where", adjust, g.op("Add", mod, b), mod), dtype)


# -- activations -----------------------------------------------------------------------


@lower(aten.elu.default, check=_float_only)
def elu(g, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    dtype = x.dtype
    if scale == 1 and input_scale == 1:
        return g.op("Elu", x, alpha=float(alpha))
    negative = g.op("Mul", g.const(float(alpha) * float(scale), dtype), expm1(g, node, Value(g.op("Mul", x, g.const(input_scale, dtype)), dtype, x.shape)))
    return g.op("Where", g.op("Greater", x, g.const(0, dtype)), g.op("Mul", x, g.const(scale, dtype)), negative)


@lower(aten.leaky_relu.default, check=_float_only)
def leaky_relu(g, node, x, negative_slope=0.01):
    return g.op("LeakyRelu", x, alpha=float(negative_slope))


def _hardtanh_check(node):
    dtype = out_dtype(node)
    if dtype == torch.bool:
        return "bool input"
    bounds = list(node.args[1:3]) + [node.kwargs[k] for k in ("min_val", "max_val") if k in node.kwargs]
    if not is_float(dtype):
        info = torch.iinfo(dtype)
        if any(not math.isfinite(b) or not info.min <= int(b) <= info.max for b in bounds):
            return "bounds outside the integer dtype"
    return None


@lower(aten.hardtanh.default, check=_hardtanh_check)
def hardtanh(g, node, x, min_val=-1, max_val=1):
    if not is_float(x.dtype):  # aten converts the bounds to the dtype: toward zero
        min_val, max_val = int(min_val), int(max_val)
    # Max/Min propagate NaN as aten does
    low = common.max_min(g, x, g.const(min_val, x.dtype), x.dtype, largest=True)
    return common.max_min(g, low, g.const(max_val, x.dtype), x.dtype, largest=False)


def _signbit(g, x: str, dtype) -> str:
    """x < 0, and true for -0.0 (1 / -0.0 is -inf)."""
    zero = g.const(0, dtype)
    return g.op("Or", g.op("Less", x, zero), g.op("And", g.op("Equal", x, zero), g.op("Less", g.op("Reciprocal", x), zero)))


@lower(aten.atan2.default)
def atan2(g, node, y, x):
    dtype = out_dtype(node)
    y, x = as_value(g, y, dtype), as_value(g, x, dtype)
    pi = g.op("Where", _signbit(g, y, dtype), g.const(-math.pi, dtype), g.const(math.pi, dtype))
    x_negative = _signbit(g, x, dtype)
    base = g.op("Atan", g.op("Div", y, x))
    result = g.op("Where", x_negative, g.op("Add", base, pi), base)
    # the quotient is 0/0 or inf/inf: IEEE atan2's values for signed zeros and infinities
    zero = g.const(0, dtype)
    both_zero = g.op("And", g.op("Equal", y, zero), g.op("Equal", x, zero))
    result = g.op("Where", both_zero, g.op("Where", x_negative, pi, y), result)
    both_inf = g.op("And", g.op("IsInf", y), g.op("IsInf", x))
    quarter = g.op("Mul", pi, g.op("Where", x_negative, g.const(0.75, dtype), g.const(0.25, dtype)))
    return g.op("Where", both_inf, quarter, result)


@lower(aten.ldexp.Tensor)
def ldexp(g, node, x, exponent):
    # aten: x * 2 ** exponent
    dtype = out_dtype(node)
    return g.op("Mul", as_value(g, x, dtype), g.op("Pow", g.const(2.0, dtype), as_value(g, exponent, dtype)))


def _copysign_check(node):
    # the sign bit of a NaN cannot be read in ONNX (x86 makes -NaN from 0/0): only a
    # Python number or an integer tensor gives the sign
    sign = node.args[1]
    if isinstance(sign, torch.fx.Node) and is_float(sign.meta["val"].dtype):
        return "sign from a float tensor (NaN sign bits)"
    return None


@lower(aten.copysign.Tensor, aten.copysign.Scalar, check=_copysign_check)
def copysign(g, node, x, sign):
    dtype = out_dtype(node)
    magnitude = g.op("Expand", g.op("Abs", as_value(g, x, dtype)), g.ints(out_shape(node)))
    if isinstance(sign, Value) and sign.dtype == torch.bool:
        negative = g.const(False)
    elif isinstance(sign, Value):
        negative = g.op("Less", sign, g.const(0, sign.dtype))
    else:
        negative = g.const(math.copysign(1.0, sign) < 0)
    return g.op("Where", negative, g.op("Neg", magnitude), magnitude)


@lower(aten.hypot.default, check=_float_only)
def hypot(g, node, a, b):
    # max * sqrt(1 + (min / max)^2): no overflow where a^2 would; inf wins over NaN
    dtype = out_dtype(node)
    a, b = as_value(g, a, dtype), as_value(g, b, dtype)
    ax, ay = g.op("Abs", a), g.op("Abs", b)
    big, small = g.op("Max", ax, ay), g.op("Min", ax, ay)
    ratio = g.op("Div", small, big)
    result = g.op("Mul", big, g.op("Sqrt", g.op("Add", g.const(1, dtype), g.op("Mul", ratio, ratio))))
    result = g.op("Where", g.op("Equal", big, g.const(0, dtype)), g.const(0, dtype), result)
    return g.op("Where", g.op("Or", g.op("IsInf", a), g.op("IsInf", b)), g.const(float("inf"), dtype), result)


@lower(aten.angle.default)
def angle(g, node, x):
    # of a real number: pi for negatives, 0 otherwise, NaN for NaN
    dtype = out_dtype(node)
    x = g.cast(x, dtype)
    result = g.op("Where", g.op("Less", x, g.const(0, dtype)), g.const(math.pi, dtype), g.const(0, dtype))
    return g.op("Where", g.op("IsNaN", x), x, result)


@lower(aten.frexp.Tensor, check=_float_only)
def frexp(g, node, x):
    # x = mantissa * 2**exponent, |mantissa| in [0.5, 1); 0, inf and NaN keep x with exponent 0.
    # In float64 a guess from log2 is off by at most one: checked against the mantissa.
    f64 = torch.float64
    wide = g.cast(x, f64)
    magnitude = g.op("Abs", wide)
    exponent = g.op("Add", g.op("Floor", g.op("Div", g.op("Log", magnitude), g.const(math.log(2), f64))), g.const(1.0, f64))
    finite = g.op("And", g.op("Not", g.op("IsInf", wide)), g.op("Not", g.op("IsNaN", wide)))
    special = g.op("Or", g.op("Not", finite), g.op("Equal", wide, g.const(0.0, f64)))
    exponent = g.op("Where", special, g.const(0.0, f64), exponent)
    for _ in range(2):
        m = g.op("Div", magnitude, g.op("Pow", g.const(2.0, f64), exponent))
        too_big = g.op("And", g.op("GreaterOrEqual", m, g.const(1.0, f64)), g.op("Not", special))
        exponent = g.op("Add", exponent, g.op("Cast", too_big, to=TORCH_TO_ONNX[f64]))
        m = g.op("Div", magnitude, g.op("Pow", g.const(2.0, f64), exponent))
        too_small = g.op("And", g.op("Less", m, g.const(0.5, f64)), g.op("Not", special))
        exponent = g.op("Sub", exponent, g.op("Cast", too_small, to=TORCH_TO_ONNX[f64]))
    mantissa = g.op("Div", wide, g.op("Pow", g.const(2.0, f64), exponent))
    mantissa_dtype, exponent_dtype = (v.dtype for v in node.meta["val"])
    return g.op("Cast", mantissa, to=TORCH_TO_ONNX[mantissa_dtype]), g.op("Cast", exponent, to=TORCH_TO_ONNX[exponent_dtype])
