"""Orthogonal polynomials (torch.special.*_polynomial_*), as aten's Math.h computes them:
the same special cases in the same order, then the three-term recurrence, run as an ONNX
Loop for as many steps as the largest degree needs (an element stops at its own degree,
or once its value is NaN where aten's loop stops there too). Computed in the result dtype,
operation by operation as aten does, so results round as aten's."""

from __future__ import annotations

import math

import torch

from ..builder import TORCH_TO_ONNX, GraphBuilder, Value
from ..registry import lower
from .common import any_true, aten, as_value, out_dtype, out_shape

I64 = torch.int64


class E:
    """An ONNX value with formula arithmetic; numbers become constants of its dtype."""

    def __init__(self, g: GraphBuilder, name: str, dtype: torch.dtype):
        self.g, self.name, self.dtype = g, name, dtype

    def _other(self, other):
        return other.name if isinstance(other, E) else self.g.const(other, self.dtype)

    def _op(self, op_type, other, swap=False, dtype=None):
        a, b = (self._other(other), self.name) if swap else (self.name, self._other(other))
        return E(self.g, self.g.op(op_type, a, b), dtype or self.dtype)

    def __add__(self, o): return self._op("Add", o)  # noqa: E704
    def __radd__(self, o): return self._op("Add", o, swap=True)  # noqa: E704
    def __sub__(self, o): return self._op("Sub", o)  # noqa: E704
    def __rsub__(self, o): return self._op("Sub", o, swap=True)  # noqa: E704
    def __mul__(self, o): return self._op("Mul", o)  # noqa: E704
    def __rmul__(self, o): return self._op("Mul", o, swap=True)  # noqa: E704
    def __truediv__(self, o): return self._op("Div", o)  # noqa: E704
    def __neg__(self): return E(self.g, self.g.op("Neg", self.name), self.dtype)  # noqa: E704
    def __lt__(self, o): return self._op("Less", o, dtype=torch.bool)  # noqa: E704
    def __gt__(self, o): return self._op("Greater", o, dtype=torch.bool)  # noqa: E704
    def __le__(self, o): return self._op("LessOrEqual", o, dtype=torch.bool)  # noqa: E704
    def __and__(self, o): return self._op("And", o)  # noqa: E704
    def __or__(self, o): return self._op("Or", o)  # noqa: E704
    def __invert__(self): return E(self.g, self.g.op("Not", self.name), torch.bool)  # noqa: E704

    def eq(self, o):
        return self._op("Equal", o, dtype=torch.bool)

    def ne(self, o):
        return ~self.eq(o)

    def fn(self, op_type):  # a unary ONNX op: Cos, Acos, Abs, IsNaN, ...
        dtype = torch.bool if op_type in ("IsNaN", "IsInf") else self.dtype
        return E(self.g, self.g.op(op_type, self.name), dtype)

    def to(self, dtype):
        return E(self.g, self.g.op("Cast", self.name, to=TORCH_TO_ONNX[dtype]), dtype) if dtype != self.dtype else self

    def even(self):  # for int64: n % 2 == 0
        return E(self.g, self.g.op("Mod", self.name, self.g.const(2, I64)), I64).eq(0)


def where(cond: E, a, b) -> E:
    """cond ? a : b, numbers taking the other branch's dtype."""
    ref = a if isinstance(a, E) else b
    a, b = (v.to(ref.dtype) if isinstance(v, E) else v for v in (a, b))
    return E(cond.g, cond.g.op("Where", cond.name, ref._other(a), ref._other(b)), ref.dtype)


def cases(branches, default) -> E:
    """aten's if-chain: the first branch whose condition holds, else default."""
    result = default
    for cond, value in reversed(branches):
        result = where(cond, value, result)
    return result


def _inputs(g, node, x, n):
    """x in the result dtype, and the degree as aten has it: n in the result dtype (aten's
    type promotion), then static_cast<int64_t> (non-finite degrees count as negative)."""
    dtype = out_dtype(node)
    shape = g.shape(out_shape(node))
    x = E(g, g.op("Expand", as_value(g, x, dtype), shape), dtype)
    n_t = E(g, g.op("Expand", as_value(g, n, dtype), shape), dtype)
    n = where(n_t.fn("IsNaN") | n_t.fn("IsInf"), -1, n_t.to(I64))
    return x, n


def _recurrence(g, x: E, count: E, p: E, q: E, step, k_first: int, k_step: int = 1, stop_at_nan: bool = True) -> E:
    """aten's loop `for (k = k_first; <count steps>; k += k_step) { r = step(k, p, q); p = q; q = r; }`,
    per element (count <= 0: no step), ending early where q is NaN if stop_at_nan. Returns q."""
    dtype = x.dtype

    def running(b, i, count, q):
        active = E(b, b.op("Less", i, count.name), torch.bool)
        if stop_at_nan:
            active = active & ~E(b, b.op("IsNaN", q.name), torch.bool)
        return active

    def body(b, i, p_in, q_in):
        p, q = E(b, p_in, dtype), E(b, q_in, dtype)
        x_b, count_b = E(b, x.name, dtype), E(b, count.name, I64)
        k = E(b, b.op("Add", b.op("Mul", i, b.const(k_step, I64)), b.const(k_first, I64)), I64)
        active = running(b, i, count_b, q)
        r = step(x_b, k, p, q)
        p, q = where(active, q, p), where(active, r, q)
        following = E(b, b.op("Add", i, b.const(1, I64)), I64).name
        return any_true(b, running(b, following, count_b, q).name), Value(p.name, dtype, ()), Value(q.name, dtype, ())

    start = running(g, g.const(0, I64), count, q)
    _, q_out = g.loop(None, any_true(g, start.name), [Value(p.name, dtype, ()), Value(q.name, dtype, ())], body)
    return E(g, q_out, dtype)


def _ones(g, node, dtype) -> E:
    return E(g, g.op("Expand", g.const(1.0, dtype), g.shape(out_shape(node))), dtype)


def _evaluate(g, node, x: E, n: E, branches, first: E, step, k_first: int, k_step: int = 1, stop_at_nan: bool = True) -> E:
    """aten's if-chain: n < 0 gives 0, then `branches` (condition, value) in order, n == 0
    gives 1, n == 1 `first`; elsewhere the recurrence from p = 1, q = first for n - 1 steps
    (the loop runs only for elements no branch takes)."""
    branches = [(n < 0, 0.0), *branches, (n.eq(0), 1.0), (n.eq(1), first)]
    in_loop = ~(n < 2)
    for condition, _ in branches[1:-2]:
        in_loop = in_loop & ~condition
    count = where(in_loop, n - 1, 0)
    q = _recurrence(g, x, count, _ones(g, node, x.dtype), first, step, k_first, k_step, stop_at_nan)
    return cases(branches, q)


def _chebyshev(g, node, x, n, kind: str, shifted: bool) -> E:
    x, n = _inputs(g, node, x, n)
    ones = _ones(g, node, x.dtype)
    nf = lambda e: e.to(x.dtype)  # noqa: E731  (an int64 expression in the result dtype)
    odd_sign = lambda value: where(n.even(), value, -value)  # noqa: E731  (value, or -value for odd n)
    y = x + x - 1.0 if shifted else x  # aten's shifted forms use x + x - 1 throughout
    first = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    two_n_1 = nf(n + n + 1)
    angle = y.fn("Acos")
    half_sin, half_cos = (angle / 2.0).fn("Sin"), (angle / 2.0).fn("Cos")
    if kind == "t":
        trig = (nf(n) * angle).fn("Cos")
    elif kind == "u":
        trig = cases([(angle.fn("Sin").ne(0.0), (nf(n + 1) * angle).fn("Sin") / angle.fn("Sin"))], nf(n + 1) * (nf(n + 1) * angle).fn("Cos") / y)
    elif kind == "v":
        trig = cases([(half_sin.ne(1.0), ((nf(n) + 0.5) * angle).fn("Cos") / half_cos)], odd_sign(two_n_1))
    else:
        degenerate = odd_sign(ones) if shifted else where(x > 0.0, two_n_1, odd_sign(ones))
        trig = cases([(half_cos.ne(1.0), ((nf(n) + 0.5) * angle).fn("Sin") / half_sin)], degenerate)
    threshold = {"t": 6, "u": 6 if shifted else 8, "v": 6 if shifted else 8, "w": 4 if shifted else 8}[kind]
    at_one = {"t": ones, "u": nf(n + 1), "v": ones, "w": two_n_1}[kind]
    if shifted:  # at x == 1 and x == 0 (y == +-1)
        at_zero = odd_sign({"t": ones, "u": nf(n + 1), "v": two_n_1, "w": ones}[kind])
        edges = [(x.eq(1.0), at_one), (x.eq(0.0), at_zero)]
    else:  # at |x| == 1: the x = 1 value, or the x = -1 one
        at_minus_one = odd_sign({"t": ones, "u": nf(n + 1), "v": two_n_1, "w": ones}[kind])
        edges = [(x.fn("Abs").eq(1.0), where(x > 0.0, at_one, at_minus_one))]
    in_trig = (n > threshold) & (y.fn("Abs") < 1.0)
    step = lambda x, k, p, q: ((x + x - 1.0) + (x + x - 1.0) if shifted else x + x) * q - p  # noqa: E731
    return _evaluate(g, node, x, n, edges + [(in_trig, trig)], first, step, 2)


POLYNOMIALS = {}
for _kind in "tuvw":
    for _shifted in (False, True):
        _name = f"special_{'shifted_' if _shifted else ''}chebyshev_polynomial_{_kind}"
        POLYNOMIALS[_name] = (lambda kind, shifted: lambda g, node, x, n: _chebyshev(g, node, x, n, kind, shifted))(_kind, _shifted)


def _hermite_limit(dtype) -> int:
    return 128 if dtype == torch.float32 else 512


def _hermite_h(g, node, x, n) -> E:
    x, n = _inputs(g, node, x, n)
    too_high = (n > _hermite_limit(x.dtype), math.nan)
    return _evaluate(g, node, x, n, [too_high], x + x, lambda x, k, p, q: (x + x) * q - k.to(x.dtype) * p, 2, 2, stop_at_nan=False)


def _hermite_he(g, node, x, n) -> E:
    x, n = _inputs(g, node, x, n)
    too_high = (n > _hermite_limit(x.dtype), math.nan)
    return _evaluate(g, node, x, n, [too_high], x, lambda x, k, p, q: x * q - k.to(x.dtype) * p, 1, stop_at_nan=False)


def _laguerre(g, node, x, n) -> E:
    x, n = _inputs(g, node, x, n)

    def step(x, k, p, q):
        return (((k + k).to(x.dtype) + (1.0 - x)) * q - k.to(x.dtype) * p) / (k + 1).to(x.dtype)

    return _evaluate(g, node, x, n, [(x.fn("Abs").eq(0.0), 1.0)], 1.0 - x, step, 1)


def _legendre(g, node, x, n) -> E:
    x, n = _inputs(g, node, x, n)
    ones = _ones(g, node, x.dtype)

    def step(x, k, p, q):
        return ((k + k + 1).to(x.dtype) * x * q - k.to(x.dtype) * p) / (k + 1).to(x.dtype)

    edge = (x.fn("Abs").eq(1.0), where((x > 0.0) | n.even(), ones, -ones))
    return _evaluate(g, node, x, n, [edge], x, step, 1)


POLYNOMIALS.update(
    special_hermite_polynomial_h=_hermite_h,
    special_hermite_polynomial_he=_hermite_he,
    special_laguerre_polynomial_l=_laguerre,
    special_legendre_polynomial_p=_legendre,
)


def _check(node):
    return None if out_dtype(node) in (torch.float32, torch.float64) else f"{out_dtype(node)} result"


def _register(name, build):
    packet = getattr(aten, name)

    @lower(packet.default, packet.x_scalar, packet.n_scalar, check=_check)
    def polynomial(g, node, x, n):
        return g.op("Identity", build(g, node, x, n).name)

    polynomial.__name__ = name


for _name, _build in POLYNOMIALS.items():
    _register(_name, _build)
