"""Special functions ONNX lacks, spelled out from ONNX arithmetic. Each follows aten's own
algorithm (aten/src/ATen/native/Math.h) in float64, then rounds to the result dtype: as
close to aten's float32 results as aten's own float32 rounding.

The Chebyshev and asymptotic coefficients are those of aten's Math.h, derived from the
Cephes Math Library (Copyright (c) 2018, Steven Moshier; 3-clause BSD license)."""

from __future__ import annotations

import math

import torch

from ..builder import Value
from ..registry import lower
from . import cephes
from .common import aten, is_float, out_dtype

F64 = torch.float64

I0E_A = [
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16, 1.71539128555513303061e-15,
    -1.16853328779934516808e-14, 7.67618549860493561688e-14, -4.85644678311192946090e-13, 2.95505266312963983461e-12,
    -1.72682629144155570723e-11, 9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-9,
    -1.30002500998624804212e-8, 6.04699502254191894932e-8, -2.67079385394061173391e-7, 1.11738753912010371815e-6,
    -4.41673835845875056359e-6, 1.64484480707288970893e-5, -5.75419501008210370398e-5, 1.88502885095841655729e-4,
    -5.76375574538582365885e-4, 1.63947561694133579842e-3, -4.32430999505057594430e-3, 1.05464603945949983183e-2,
    -2.37374148058994688156e-2, 4.93052842396707084878e-2, -9.49010970480476444210e-2, 1.71620901522208775349e-1,
    -3.04682672343198398683e-1, 6.76795274409476084995e-1,
]  # fmt: skip
I0E_B = [
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17, 3.46122286769746109310e-17,
    -2.82762398051658348494e-16, -3.42548561967721913462e-16, 1.77256013305652638360e-15, 3.81168066935262242075e-15,
    -9.55484669882830764870e-15, -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11, -3.14991652796324136454e-11,
    1.18891471078464383424e-11, 4.94060238822496958910e-10, 3.39623202570838634515e-9, 2.26666899049817806459e-8,
    2.04891858946906374183e-7, 2.89137052083475648297e-6, 6.88975834691682398426e-5, 3.36911647825569408990e-3,
    8.04490411014108831608e-1,
]  # fmt: skip
I1E_A = [
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16, -1.10559694773538630805e-15,
    7.60068429473540693410e-15, -5.04218550472791168711e-14, 3.22379336594557470981e-13, -1.98397439776494371520e-12,
    1.17361862988909016308e-11, -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-9,
    9.38153738649577178388e-9, -4.44505912879632808065e-8, 2.00329475355213526229e-7, -8.56872026469545474066e-7,
    3.47025130813767847674e-6, -1.32731636560394358279e-5, 4.78156510755005422638e-5, -1.61760815825896745588e-4,
    5.12285956168575772895e-4, -1.51357245063125314899e-3, 4.15642294431288815669e-3, -1.05640848946261981558e-2,
    2.47264490306265168283e-2, -5.29459812080949914269e-2, 1.02643658689847095384e-1, -1.76416518357834055153e-1,
    2.52587186443633654823e-1,
]  # fmt: skip
I1E_B = [
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17, -3.20952592199342395980e-17,
    2.96262899764595013876e-16, 3.30820231092092828324e-16, -1.88035477551078244854e-15, -3.81440307243700780478e-15,
    1.04202769841288027642e-14, 4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11, 3.25260358301548823856e-11,
    -1.89749581235054123450e-11, -5.58974346219658380687e-10, -3.83538038596423702205e-9, -2.63146884688951950684e-8,
    -2.51223623787020892529e-7, -3.88256480887769039346e-6, -1.10588938762623716291e-4, -9.76109749136146840777e-3,
    7.78576235018280120474e-1,
]  # fmt: skip
DIGAMMA_A = [
    8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3, -4.16666666666666666667e-3,
    3.96825396825396825397e-3, -8.33333333333333333333e-3, 8.33333333333333333333e-2,
]  # fmt: skip
ZETA_A = [
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
    -7.1661652561756670113e18,
]  # fmt: skip
LANCZOS_G = 7.0
LANCZOS = [
    0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
    12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7,
]  # fmt: skip


class Math:
    """Float64 arithmetic on ONNX values, written like formulas."""

    def __init__(self, g):
        self.g = g

    def c(self, v):
        return self.g.const(float(v), F64)

    def add(self, a, b):
        return self.g.op("Add", a, b)

    def sub(self, a, b):
        return self.g.op("Sub", a, b)

    def mul(self, a, b):
        return self.g.op("Mul", a, b)

    def div(self, a, b):
        return self.g.op("Div", a, b)

    def op(self, op_type, *args, **attrs):
        return self.g.op(op_type, *args, **attrs)

    def where(self, cond, a, b):
        return self.g.op("Where", cond, a, b)

    def chbevl(self, x, coefficients):
        """aten's chbevl: a Chebyshev series at x (Clenshaw's recurrence)."""
        b0, b1, b2 = self.c(coefficients[0]), self.c(0), self.c(0)
        for a in coefficients[1:]:
            b2, b1 = b1, b0
            b0 = self.add(self.sub(self.mul(x, b1), b2), self.c(a))
        return self.mul(self.c(0.5), self.sub(b0, b2))

    def polevl(self, x, coefficients):
        result = self.c(0)
        for a in coefficients:
            result = self.add(self.mul(result, x), self.c(a))
        return result

    def is_integer(self, x):
        return self.op("Equal", x, self.op("Floor", x))


def _float_check(node):
    return None if is_float(out_dtype(node)) else "non-float result"


def _input(g, x):
    """The argument as a float64 value (aten computes integer inputs in the default float)."""
    return g.cast(x, F64) if isinstance(x, Value) else g.const(float(x), F64)


def _finish(g, node, result):
    return g.cast(Value(result, F64, ()), out_dtype(node))


# -- modified Bessel functions of the first kind ---------------------------------------


def _bessel(g, x, small, large, times_x: bool, scaled: bool):
    m = Math(g)
    ax = m.op("Abs", x)
    near = m.chbevl(m.sub(m.div(ax, m.c(2)), m.c(2)), small)
    if times_x:
        near = m.mul(near, ax)
    far = m.div(m.chbevl(m.sub(m.div(m.c(32), ax), m.c(2)), large), m.op("Sqrt", ax))
    result = m.where(m.op("LessOrEqual", ax, m.c(8)), near, far)
    if not scaled:
        result = m.mul(m.op("Exp", ax), result)
    if times_x:  # odd functions
        result = m.where(m.op("Less", x, m.c(0)), m.op("Neg", result), result)
    return result


# aten's special_modified_bessel_i0/i1 are the same functions by another Cephes series
@lower(aten.i0.default, aten.special_modified_bessel_i0.default, check=_float_check)
def i0(g, node, x):
    return _finish(g, node, _bessel(g, _input(g, x), I0E_A, I0E_B, False, False))


@lower(aten.special_i0e.default, check=_float_check)
def i0e(g, node, x):
    return _finish(g, node, _bessel(g, _input(g, x), I0E_A, I0E_B, False, True))


@lower(aten.special_i1.default, aten.special_modified_bessel_i1.default, check=_float_check)
def i1(g, node, x):
    return _finish(g, node, _bessel(g, _input(g, x), I1E_A, I1E_B, True, False))


@lower(aten.special_i1e.default, check=_float_check)
def i1e(g, node, x):
    return _finish(g, node, _bessel(g, _input(g, x), I1E_A, I1E_B, True, True))


@lower(aten.special_spherical_bessel_j0.default, check=_float_check)
def spherical_bessel_j0(g, node, x):
    # sin(x) / x, 1 at 0, 0 at +-inf
    m = Math(g)
    x = _input(g, x)
    result = m.where(m.op("Equal", x, m.c(0)), m.c(1), m.div(m.op("Sin", x), x))
    return _finish(g, node, m.where(m.op("IsInf", x), m.c(0), result))


# -- gamma and its derivatives ---------------------------------------------------------


def _lgamma(g, x):
    """Lanczos (g=7, 9 terms) for x >= 0.5, reflection below; +inf at poles and +-inf."""
    m = Math(g)
    reflect = m.op("Less", x, m.c(0.5))
    y = m.where(reflect, m.sub(m.c(1), x), x)  # lgamma(y) with y >= 0.5
    ym1 = m.sub(y, m.c(1))
    series = m.c(LANCZOS[0])
    for i, p in enumerate(LANCZOS[1:], start=1):
        series = m.add(series, m.div(m.c(p), m.add(ym1, m.c(i))))
    t = m.add(ym1, m.c(LANCZOS_G + 0.5))
    big = m.add(m.mul(m.add(ym1, m.c(0.5)), m.op("Log", t)), m.sub(m.c(0.5 * math.log(2 * math.pi)), t))
    lg = m.add(big, m.op("Log", series))
    # lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x): x less its nearest integer keeps digits
    fraction = m.sub(x, m.op("Round", x))
    sin = m.op("Abs", m.op("Sin", m.mul(m.c(math.pi), fraction)))
    reflected = m.sub(m.sub(m.c(math.log(math.pi)), m.op("Log", sin)), lg)
    result = m.where(reflect, reflected, lg)
    return m.where(m.op("IsInf", x), m.c(float("inf")), result)


@lower(aten.lgamma.default, check=_float_check)
def lgamma(g, node, x):
    return _finish(g, node, _lgamma(g, _input(g, x)))


def _digamma(g, x):
    m = Math(g)
    zero = m.c(0)
    negative = m.op("Less", x, zero)
    y = m.where(negative, m.sub(m.c(1), x), x)
    # psi(y) = psi(y + 10) - sum 1/(y + k): then y + 10 >= 10, where the series is exact
    shift = zero
    for k in range(10):
        shift = m.sub(shift, m.div(m.c(1), m.add(y, m.c(k))))
    z = m.add(y, m.c(10))
    zz = m.div(m.c(1), m.mul(z, z))
    result = m.sub(m.sub(m.add(shift, m.op("Log", z)), m.div(m.c(0.5), z)), m.mul(zz, m.polevl(zz, DIGAMMA_A)))
    # x < 0: psi(1 - x) - pi / tan(pi r), r the fraction of x (with x's sign)
    r = m.sub(x, m.where(negative, m.op("Ceil", x), m.op("Floor", x)))
    angle = m.mul(m.c(math.pi), r)
    result = m.where(negative, m.sub(result, m.div(m.mul(m.c(math.pi), m.op("Cos", angle)), m.op("Sin", angle))), result)
    result = m.where(m.op("And", negative, m.is_integer(x)), m.c(float("nan")), result)
    # psi(+-0) = -+inf
    minus_zero = m.op("Less", m.op("Reciprocal", x), zero)
    at_zero = m.where(minus_zero, m.c(float("inf")), m.c(float("-inf")))
    return m.where(m.op("Equal", x, zero), at_zero, result)


@lower(aten.digamma.default, check=_float_check)
def digamma(g, node, x):
    return _finish(g, node, _digamma(g, _input(g, x)))


def _trigamma(g, x, dtype):
    m = Math(g)
    reflect = m.op("Less", x, m.c(0.5))
    # aten takes sin(pi * x) in the input's precision (float32 for half ones, its opmath
    # type): its value near the poles
    dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    narrow = g.cast(Value(x, F64, ()), dtype)
    sin = g.cast(Value(g.op("Sin", g.op("Mul", narrow, g.const(math.pi, dtype))), dtype, ()), F64)
    result = m.where(reflect, m.op("Neg", m.div(m.c(math.pi * math.pi), m.mul(sin, sin))), m.c(0))
    y = m.where(reflect, m.sub(m.c(1), x), x)
    for _ in range(6):
        result = m.add(result, m.div(m.c(1), m.mul(y, y)))
        y = m.add(y, m.c(1))
    ixx = m.div(m.c(1), m.mul(y, y))
    tail = m.sub(m.c(1.0 / 30), m.mul(ixx, m.c(1.0 / 42)))
    tail = m.sub(m.c(1.0 / 6), m.mul(ixx, tail))
    tail = m.add(m.add(m.c(1), m.div(m.c(1), m.mul(m.c(2), y))), m.mul(ixx, tail))
    result = m.add(result, m.div(tail, y))
    return m.where(reflect, m.op("Neg", result), result)


ZETA_TERMS = 40  # direct terms before the Euler-Maclaurin tail; right for q > 9 - ZETA_TERMS


def _zeta(g, x, q):
    """Hurwitz zeta as aten's Cephes code, with a fixed count of direct terms (aten stops
    once they no longer change the sum: the same value)."""
    m = Math(g)
    one, zero = m.c(1), m.c(0)
    minus_x = m.op("Neg", x)
    s = zero
    for i in range(ZETA_TERMS + 1):
        s = m.add(s, m.op("Pow", m.add(q, m.c(i)), minus_x))
    w = m.add(q, m.c(ZETA_TERMS))
    b = m.op("Pow", w, minus_x)
    s = m.add(s, m.div(m.mul(b, w), m.sub(x, one)))
    s = m.sub(s, m.mul(m.c(0.5), b))
    a, k = one, zero
    for coefficient in ZETA_A:
        a = m.mul(a, m.add(x, k))
        b = m.div(b, w)
        s = m.add(s, m.div(m.mul(a, b), m.c(coefficient)))
        k = m.add(k, one)
        a = m.mul(a, m.add(x, k))
        b = m.div(b, w)
        k = m.add(k, one)
    nan, inf = m.c(float("nan")), m.c(float("inf"))
    q_pole = m.op("And", m.op("LessOrEqual", q, zero), m.is_integer(q))
    q_bad = m.op("And", m.op("LessOrEqual", q, zero), m.op("Not", m.is_integer(x)))
    s = m.where(q_bad, nan, s)
    s = m.where(q_pole, inf, s)
    s = m.where(m.op("Less", x, one), nan, s)
    return m.where(m.op("Equal", x, one), inf, s)


@lower(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar, check=_float_check)
def zeta(g, node, x, q):
    return _finish(g, node, _zeta(g, _input(g, x), _input(g, q)))


@lower(aten.polygamma.default, check=_float_check)
def polygamma(g, node, n, x):
    x = _input(g, x)
    if n == 0:
        return _finish(g, node, _digamma(g, x))
    if n == 1:
        return _finish(g, node, _trigamma(g, x, out_dtype(node)))
    m = Math(g)
    scale = (1.0 if n % 2 else -1.0) * math.factorial(n)
    return _finish(g, node, m.mul(m.c(scale), _zeta(g, m.c(n + 1), x)))


# -- complementary error function -----------------------------------------------------


def _erfc_parts(m, x):
    """Pieces of erfc in float64, each to ~1e-13 relative: (series, fraction, z) where
    series = 1 - erf(x) by erf's Taylor series, used for |x| < 2, and, with z = |x| >= 2,
    fraction = erfcx(z) = exp(z^2) erfc(z) by Laplace's continued fraction, 60 terms
    evaluated from the tail (no cancellation: erfc(26) = 5.7e-296 keeps its digits)."""
    small = m.op("Clip", x, m.c(-2), m.c(2))
    square = m.mul(small, small)
    total, term = m.c(0), small
    for n in range(40):
        total = m.add(total, m.div(term, m.c(2 * n + 1)))
        term = m.mul(term, m.div(m.op("Neg", square), m.c(n + 1)))
    series = m.sub(m.c(1), m.mul(m.c(2 / math.sqrt(math.pi)), total))
    z = m.op("Max", m.op("Abs", x), m.c(2))
    tail = m.c(0)
    for n in range(60, 0, -1):
        tail = m.div(m.c(n / 2), m.add(z, tail))
    fraction = m.div(m.c(1 / math.sqrt(math.pi)), m.add(z, tail))
    return series, fraction, z


def _erfc(g, x):
    """erfc: the series for |x| < 2, exp(-z^2) erfcx(z) beyond, reflected as 2 - erfc(-x)."""
    m = Math(g)
    series, fraction, z = _erfc_parts(m, x)
    tail = m.mul(m.op("Exp", m.op("Neg", m.mul(z, z))), fraction)
    tail = m.where(m.op("Less", x, m.c(0)), m.sub(m.c(2), tail), tail)
    result = m.where(m.op("Less", m.op("Abs", x), m.c(2)), series, tail)
    return m.where(m.op("IsNaN", x), x, result)


def _erfcx(g, x):
    """erfcx = exp(x^2) erfc(x): the continued fraction for x >= 2, exp(x^2) times the
    series for |x| < 2, 2 exp(x^2) - erfcx(-x) for x <= -2 (inf past -26.7, as aten)."""
    m = Math(g)
    series, fraction, z = _erfc_parts(m, x)
    grow = m.op("Exp", m.mul(x, x))
    result = m.where(m.op("Less", x, m.c(0)), m.sub(m.mul(m.c(2), grow), fraction), fraction)
    result = m.where(m.op("Less", m.op("Abs", x), m.c(2)), m.mul(grow, series), result)
    return m.where(m.op("IsNaN", x), x, result)


def _log1p(m, u):
    """log(1 + u) without losing u's digits when |u| is small (Kahan's trick)."""
    w = m.add(m.c(1), u)
    exact = m.mul(m.op("Log", w), m.div(u, m.sub(w, m.c(1))))
    return m.where(m.op("Equal", w, m.c(1)), u, exact)


@lower(aten.erfc.default, check=_float_check)
def erfc(g, node, x):
    return _finish(g, node, _erfc(g, _input(g, x)))


@lower(aten.special_erfcx.default, check=_float_check)
def erfcx(g, node, x):
    return _finish(g, node, _erfcx(g, _input(g, x)))


@lower(aten.special_log_ndtr.default, check=_float_check)
def log_ndtr(g, node, x):
    # aten's calc_log_ndtr: log(erfcx(-t) / 2) - t^2 below x = -1, else log1p(-erfc(t) / 2)
    m = Math(g)
    x = _input(g, x)
    t = m.mul(x, m.c(math.sqrt(0.5)))
    low = m.sub(m.op("Log", m.div(_erfcx(g, m.op("Neg", t)), m.c(2))), m.mul(t, t))
    high = _log1p(m, m.div(m.op("Neg", _erfc(g, t)), m.c(2)))
    return _finish(g, node, m.where(m.op("Less", x, m.c(-1)), low, high))


@lower(aten.special_ndtri.default, check=_float_check)
def ndtri(g, node, y0):
    """aten's calc_ndtri (Cephes): a rational function of y - 1/2 in the middle, of
    1 / sqrt(-2 log y) in the tails."""
    m = Math(g)
    y0 = _input(g, y0)
    t = cephes.NDTRI
    edge = 0.13533528323661269189  # exp(-2)
    upper = m.op("Greater", y0, m.c(1 - edge))
    y = m.where(upper, m.sub(m.c(1), y0), y0)
    middle = m.sub(y, m.c(0.5))
    y2 = m.mul(middle, middle)
    central = m.mul(m.add(middle, m.mul(middle, m.div(m.mul(y2, m.polevl(y2, t["P0"])), m.polevl(y2, t["Q0"])))), m.c(2.50662827463100050242))
    safe_y = m.op("Max", m.op("Min", y, m.c(edge)), m.c(1e-300))
    x = m.op("Sqrt", m.mul(m.c(-2), m.op("Log", safe_y)))
    x0 = m.sub(x, m.div(m.op("Log", x), x))
    z = m.div(m.c(1), x)
    near = m.div(m.mul(z, m.polevl(z, t["P1"])), m.polevl(z, t["Q1"]))
    far = m.div(m.mul(z, m.polevl(z, t["P2"])), m.polevl(z, t["Q2"]))
    tails = m.sub(x0, m.where(m.op("Less", x, m.c(8)), near, far))
    tails = m.where(upper, tails, m.op("Neg", tails))
    result = m.where(m.op("Greater", y, m.c(edge)), central, tails)
    result = m.where(m.op("Equal", y0, m.c(0)), m.c(-math.inf), m.where(m.op("Equal", y0, m.c(1)), m.c(math.inf), result))
    outside = m.op("Or", m.op("Less", y0, m.c(0)), m.op("Greater", y0, m.c(1)))
    return _finish(g, node, m.where(m.op("Or", outside, m.op("IsNaN", y0)), m.c(math.nan), result))


# -- inverse error function ------------------------------------------------------------


def _erfinv_check(node):
    # ONNX Runtime's Erf is float32-only on the CPU; aten computes in the input's dtype
    return None if out_dtype(node) == torch.float32 else f"erfinv in {out_dtype(node)}"


@lower(aten.erfinv.default, check=_erfinv_check)
def erfinv(g, node, y):
    # aten's calc_erfinv: a rational first guess, then two Newton steps, in float32
    dtype = torch.float32
    y = g.cast(y, dtype)
    c = lambda v: g.const(float(v), dtype)  # noqa: E731
    a = [0.886226899, -1.645349621, 0.914624893, -0.140543331]
    b = [-2.118377725, 1.442710462, -0.329097515, 0.012229801]
    cc = [-1.970840454, -1.624906493, 3.429567803, 1.641345311]
    d = [3.543889200, 1.637067800]
    op = g.op
    y_abs = op("Abs", y)
    z = op("Mul", y, y)
    num = op("Add", op("Mul", op("Add", op("Mul", op("Add", op("Mul", c(a[3]), z), c(a[2])), z), c(a[1])), z), c(a[0]))
    dem = op("Add", op("Mul", c(b[3]), z), c(b[2]))
    dem = op("Add", op("Mul", op("Add", op("Mul", op("Add", op("Mul", dem, z), c(b[1])), z), c(b[0])), z), c(1))
    central = op("Div", op("Mul", y, num), dem)
    zt = op("Sqrt", op("Neg", op("Log", op("Div", op("Sub", c(1), y_abs), c(2)))))
    num_t = op("Add", op("Mul", op("Add", op("Mul", op("Add", op("Mul", c(cc[3]), zt), c(cc[2])), zt), c(cc[1])), zt), c(cc[0]))
    dem_t = op("Add", op("Mul", op("Add", op("Mul", c(d[1]), zt), c(d[0])), zt), c(1))
    signed = op("Where", op("Less", y, c(0)), op("Neg", num_t), num_t)
    tail = op("Div", signed, dem_t)
    x = op("Where", op("LessOrEqual", y_abs, c(0.7)), central, tail)
    two_over_sqrt_pi = c(2.0 / math.sqrt(math.pi))
    for _ in range(2):
        step = op("Div", op("Sub", op("Erf", x), y), op("Mul", two_over_sqrt_pi, op("Exp", op("Neg", op("Mul", x, x)))))
        x = op("Sub", x, step)
    x = op("Where", op("Equal", y_abs, c(1)), op("Where", op("Less", y, c(0)), c(float("-inf")), c(float("inf"))), x)
    x = op("Where", op("Greater", y_abs, c(1)), c(float("nan")), x)
    return g.cast(Value(x, dtype, ()), out_dtype(node))


# -- Bessel functions of the first and second kind, modified of the second kind --------


QUARTER_PI, THREE_QUARTER_PI = 0.785398163397448309615660845819875721, 2.356194490192344928846982537459627163
SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
TWO_OVER_PI = 0.636619772367581343075535053490057448


def _asymptotic(m, x, table, shift, first_kind: bool, dtype):
    """aten's large-x form: (P cos + / - 5/x Q sin)(x - shift) * sqrt(2/pi) / sqrt(x).
    x - shift is taken in the input's precision, as aten does: for large x its rounding
    decides the phase."""
    g = m.g
    z = m.div(m.c(25), m.mul(x, x))
    p = m.div(m.polevl(z, table["PP"]), m.polevl(z, table["PQ"]))
    q = m.div(m.polevl(z, table["QP"]), m.polevl(z, table["QQ"]))
    narrow = g.cast(Value(x, F64, ()), dtype)
    angle = g.cast(Value(g.op("Sub", narrow, g.const(shift, dtype)), dtype, ()), F64)
    five_q = m.mul(m.div(m.c(5), x), q)
    if first_kind:
        wave = m.sub(m.mul(p, m.op("Cos", angle)), m.mul(five_q, m.op("Sin", angle)))
    else:
        wave = m.add(m.mul(p, m.op("Sin", angle)), m.mul(five_q, m.op("Cos", angle)))
    return m.div(m.mul(wave, m.c(SQRT_2_OVER_PI)), m.op("Sqrt", x))


def _j0(g, x, dtype):
    m, t = Math(g), cephes.BESSEL_J0
    x = m.op("Abs", x)
    xx = m.mul(x, x)
    near = m.div(m.mul(m.mul(m.sub(xx, m.c(5.78318596294678452118e00)), m.sub(xx, m.c(3.04712623436620863991e01))), m.polevl(xx, t["RP"])), m.polevl(xx, t["RQ"]))
    near = m.where(m.op("Less", x, m.c(1e-5)), m.sub(m.c(1), m.div(xx, m.c(4))), near)
    return m.where(m.op("LessOrEqual", x, m.c(5)), near, _asymptotic(m, x, t, QUARTER_PI, True, dtype))


def _j1(g, x, dtype):
    m, t = Math(g), cephes.BESSEL_J1
    ax = m.op("Abs", x)
    xx = m.mul(ax, ax)
    near = m.mul(m.mul(m.mul(m.div(m.polevl(xx, t["RP"]), m.polevl(xx, t["RQ"])), ax), m.sub(xx, m.c(1.46819706421238932572e01))), m.sub(xx, m.c(4.92184563216946036703e01)))
    result = m.where(m.op("LessOrEqual", ax, m.c(5)), near, _asymptotic(m, ax, t, THREE_QUARTER_PI, True, dtype))
    return m.where(m.op("Less", x, m.c(0)), m.op("Neg", result), result)  # odd


def _y(g, x, order: int, dtype):
    m = Math(g)
    t = cephes.BESSEL_Y0 if order == 0 else cephes.BESSEL_Y1
    xx = m.mul(x, x)
    ratio = m.div(m.polevl(xx, t["YP"]), m.polevl(xx, t["YQ"]))
    if order == 0:
        near = m.add(ratio, m.mul(m.mul(m.c(TWO_OVER_PI), m.op("Log", x)), _j0(g, x, dtype)))
    else:
        near = m.add(m.mul(x, ratio), m.mul(m.c(TWO_OVER_PI), m.sub(m.mul(_j1(g, x, dtype), m.op("Log", x)), m.div(m.c(1), x))))
    near = m.where(m.op("Less", x, m.c(0)), m.c(float("nan")), near)
    near = m.where(m.op("Equal", x, m.c(0)), m.c(float("-inf")), near)
    far = _asymptotic(m, x, t, QUARTER_PI if order == 0 else THREE_QUARTER_PI, False, dtype)
    return m.where(m.op("LessOrEqual", x, m.c(5)), near, far)


def _k(g, x, order: int, scaled: bool):
    m = Math(g)
    t = cephes.MODIFIED_BESSEL_K0 if order == 0 else cephes.MODIFIED_BESSEL_K1
    half_log = m.op("Log", m.mul(m.c(0.5), x))
    series = m.chbevl(m.sub(m.mul(x, x), m.c(2)), t["A"])
    if order == 0:
        near = m.sub(series, m.mul(half_log, _bessel(g, x, I0E_A, I0E_B, False, False)))
    else:
        near = m.add(m.mul(half_log, _bessel(g, x, I1E_A, I1E_B, True, False)), m.div(series, x))
    far = m.div(m.chbevl(m.sub(m.div(m.c(8), x), m.c(2)), t["B"]), m.op("Sqrt", x))
    if scaled:
        near = m.mul(near, m.op("Exp", x))
    else:
        far = m.mul(m.op("Exp", m.op("Neg", x)), far)
    result = m.where(m.op("LessOrEqual", x, m.c(2)), near, far)
    result = m.where(m.op("Less", x, m.c(0)), m.c(float("nan")), result)
    return m.where(m.op("Equal", x, m.c(0)), m.c(float("inf")), result)


for _target, _fn in [
    (aten.special_bessel_j0.default, lambda g, x, dtype: _j0(g, x, dtype)),
    (aten.special_bessel_j1.default, lambda g, x, dtype: _j1(g, x, dtype)),
    (aten.special_bessel_y0.default, lambda g, x, dtype: _y(g, x, 0, dtype)),
    (aten.special_bessel_y1.default, lambda g, x, dtype: _y(g, x, 1, dtype)),
    (aten.special_modified_bessel_k0.default, lambda g, x, dtype: _k(g, x, 0, False)),
    (aten.special_modified_bessel_k1.default, lambda g, x, dtype: _k(g, x, 1, False)),
    (aten.special_scaled_modified_bessel_k0.default, lambda g, x, dtype: _k(g, x, 0, True)),
    (aten.special_scaled_modified_bessel_k1.default, lambda g, x, dtype: _k(g, x, 1, True)),
]:

    def _make(fn):
        def lowering(g, node, x):
            return _finish(g, node, fn(g, _input(g, x), out_dtype(node)))

        return lowering

    lower(_target, check=_float_check)(_make(_fn))
