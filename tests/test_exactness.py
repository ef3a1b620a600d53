"""The exactness rules of the op table, one test each: where ONNX's semantics differ from
aten's, the lowering must match eager, or the node must fall back to torch."""

import math

import pytest
import torch
import torch.nn.functional as F

import ortlite

from conftest import check_fallback, check_lowered

torch.manual_seed(0)

SPECIAL = torch.tensor([0.0, -0.0, 1.5, -2.5, float("inf"), -float("inf"), float("nan"), 7.0, -7.0, 1e-3, 3.0, -3.0])


def ints(*shape, lo=-20, hi=20, dtype=torch.int64):
    return torch.randint(lo, hi, shape, dtype=dtype)


def grid(values):
    """All pairs of values: (a, b) flattened."""
    return values.repeat(len(values)), values.repeat_interleave(len(values))


# -- integer division and remainder ----------------------------------------------------


@pytest.mark.parametrize("mode", ["trunc", "floor", None])
@pytest.mark.parametrize("divisor", [3, -3, 7, -1])
def test_int_div_rounding_modes_by_constant(mode, divisor):
    check_lowered(lambda a: torch.div(a, divisor, rounding_mode=mode), ints(50), rtol=0, atol=0)


@pytest.mark.parametrize("op", [torch.remainder, torch.fmod])
@pytest.mark.parametrize("divisor", [3, -3, 5, -1])
def test_int_remainder_and_fmod_signs(op, divisor):
    # remainder takes the divisor's sign (Python's %), fmod the dividend's (C's %)
    check_lowered(lambda a: op(a, divisor), ints(50), rtol=0, atol=0)
    check_lowered(lambda a: op(a, divisor), ints(50, dtype=torch.int32), rtol=0, atol=0)


@pytest.mark.parametrize("op", [torch.remainder, torch.fmod])
def test_float_remainder_and_fmod_special_values(op):
    a, b = grid(SPECIAL)
    check_lowered(lambda a, b: op(a, b), a, b, rtol=0, atol=0)
    check_lowered(lambda a: (op(a, 2.5), op(a, -0.75)), torch.cat([SPECIAL, torch.randn(40) * 10]), rtol=0, atol=0)


def test_remainder_scalar_dividend():
    check_lowered(lambda b: torch.remainder(5.5, b), SPECIAL)


INT_DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


@pytest.mark.parametrize("op", INT_DIVISIONS.values(), ids=INT_DIVISIONS.keys())
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_int_division_by_a_tensor_runs_in_ort(op, dtype):
    b = ints(4, 20, dtype=dtype)
    b[b == 0] = 1
    check_lowered(op, ints(4, 20, dtype=dtype), b, rtol=0, atol=0)
    check_lowered(op, ints(3, 1, dtype=dtype), b[0], rtol=0, atol=0)  # broadcast


@pytest.mark.parametrize("op", INT_DIVISIONS.values(), ids=INT_DIVISIONS.keys())
def test_int_division_by_zero_raises_as_aten(op):
    # aten raises RuntimeError("ZeroDivisionError"); ONNX Runtime would kill the process or
    # fail inside a kernel: the graph divides by a safe divisor and the runner raises
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(op, backend=backend)
    a, b = ints(6), torch.tensor([3, -2, 5, 1, 7, 2])
    assert torch.equal(compiled(a, b), op(a, b))
    b[4] = 0
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        op(a, b)
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        compiled(a, b)
    b[4] = 7
    assert torch.equal(compiled(a, b), op(a, b))  # the runner is fine after the error
    assert backend.stats.fallback_ops == {} and backend.stats.sessions == 1
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):  # a constant zero divisor
        torch.compile(lambda a: op(a, 0), backend=backend)(ints(20))


def test_int_division_and_remainders_are_exact_past_2_53():
    # ONNX Runtime's integer Mod with fmod=1 goes through double: fmod(2**63 - 1, 2**63 - 2) gave 0
    a = torch.tensor([2**63 - 1, -(2**62 + 1), 2**53 + 1, 10**18 + 7, -(2**63) + 1])
    b = torch.tensor([2**63 - 2, 3, 2, 10**9, 7])
    for op in INT_DIVISIONS.values():
        check_lowered(op, a, b, rtol=0, atol=0)
        check_lowered(lambda a: op(a, 3), a, rtol=0, atol=0)


def test_int_division_by_zero_meeting_no_element_does_not_raise():
    # a zero divisor broadcast against an empty dividend divides nothing: aten does not raise
    check_lowered(lambda a, b: (a // b, a % b), torch.empty(0, 3, dtype=torch.int64), torch.tensor([0, 1, 2]))
    check_lowered(lambda a: a // 0, torch.empty(0, dtype=torch.int64))


def test_int_division_by_zero_raises_with_dynamic_shapes():
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(lambda a, b: torch.remainder(a, b) + 1, backend=backend, dynamic=True)
    for n in (3, 5):
        assert torch.equal(compiled(torch.arange(n), torch.arange(1, n + 1)), torch.arange(n) % torch.arange(1, n + 1) + 1)
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        compiled(torch.arange(4), torch.arange(4))
    assert backend.stats.sessions == 1


def test_int_pow_is_exact_past_2_53_and_wraps_as_aten():
    # ONNX Runtime's integer Pow goes through double: 3 ** 39 came out 4052555153018976256
    x = torch.tensor([3, 7, -5, 2**20, 0, 1, -1, -2, 12345])
    check_lowered(lambda x: (x**39, x**3, x**0, 2 ** x.abs().clamp(max=70)), x, rtol=0, atol=0)
    e = torch.tensor([0, 1, 2, 63, -1, -2, -3, 40, 5])
    check_lowered(lambda x, e: (x**e, x.T ** e), x[None], e, rtol=0, atol=0)  # negative exponents, broadcast
    for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):  # products wrap in the narrow dtype
        check_lowered(lambda x, e: x**e, x.to(dtype), e.abs().to(dtype), rtol=0, atol=0)
    check_lowered(lambda x, e: x**e, torch.empty(0, 9, dtype=torch.int64), e)
    check_lowered(lambda x, e: x**e, torch.tensor(3), torch.tensor(4))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_shifts_past_the_width_and_by_negative_amounts(dtype):
    # aten: 0 for a left shift out of range, a >> (width - 1) for a signed right shift
    # (sign fill), and an unsigned amount read as signed (uint8 200 is -56)
    info = torch.iinfo(dtype)
    a = torch.tensor([0, 1, -1, 5, -5, 100, -100, info.max, info.min, 37, -37, 3]).to(dtype)
    b = torch.tensor([0, 1, 3, info.bits - 1, info.bits, info.bits + 1, -1, 2, 5, 200, 127, 64]).to(dtype)
    check_lowered(lambda a, b: (a << b, a >> b, a << 3, a >> 2), a, b, rtol=0, atol=0)
    check_lowered(lambda b: (torch.bitwise_left_shift(5, b), torch.bitwise_right_shift(-9, b)), b, rtol=0, atol=0)
    check_lowered(lambda a, b: a[:, None] >> b[::2], a, b, rtol=0, atol=0)  # broadcast, non-contiguous


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_and_lcm_wrap_as_aten(dtype):
    # |INT_MIN| stays negative; lcm's product wraps in int (narrower types are promoted) or its own width
    info = torch.iinfo(dtype)
    edges = torch.tensor([[0, 0], [0, 5], [6, 4], [-4, 6], [info.min, 2], [12, -18], [7, 0], [-9, info.min], [info.max, info.max - 1], [info.min, info.min]])
    a, b = edges.clamp(info.min, info.max).to(dtype).unbind(1)
    check_lowered(lambda a, b: (torch.gcd(a, b), torch.lcm(a, b)), a, b, rtol=0, atol=0)
    r = torch.randint(info.min, info.max, (2, 40), dtype=torch.int64).to(dtype)
    check_lowered(lambda a, b: (torch.gcd(a, b), torch.lcm(a, b), torch.gcd(a[:, None], b[::4])), r[0], r[1], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nextafter_is_bit_exact(dtype):
    fi = torch.finfo(dtype)
    edges = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, fi.max, -fi.max, fi.tiny, fi.tiny / 2, -fi.tiny, fi.smallest_normal * 1.5]
    edges = torch.tensor(edges + [math.inf, -math.inf, math.nan, 1e-40, 123.456, 2**-20, 1024.0], dtype=dtype)
    x = torch.cat([edges.repeat(len(edges)), torch.randn(300, dtype=dtype) * 10.0 ** torch.randint(-30, 30, (300,))])
    y = torch.cat([edges.repeat_interleave(len(edges)), torch.randn(300, dtype=dtype)])
    backend = check_lowered(torch.nextafter, x, y, rtol=0, atol=0)
    got, expected = torch.compile(torch.nextafter, backend=backend)(x, y), torch.nextafter(x, y)
    assert torch.equal(got.signbit(), expected.signbit())  # nextafter(0, -0) is -0


# -- casts -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8])
def test_float_to_int_truncates_toward_zero(dtype):
    x = torch.tensor([0.5, -0.5, 1.9, -1.9, 2.5, -2.5, 100.7, -100.7, 0.0, -0.0])
    check_lowered(lambda x: x.to(dtype), x, rtol=0, atol=0)


def test_float_to_bool_and_back():
    check_lowered(lambda x: (x.to(torch.bool), x.to(torch.bool).to(torch.float32)), SPECIAL)


def test_int_to_float_and_narrowing_int_casts_wrap():
    x = torch.tensor([0, 1, -1, 127, 128, 255, 256, -129, 2**31, -(2**31) - 1, 2**40 + 3])
    check_lowered(lambda x: (x.to(torch.int8), x.to(torch.int32), x.to(torch.uint8), x.to(torch.float32)), x, rtol=0, atol=0)


# -- bool arithmetic -------------------------------------------------------------------


def test_bool_arithmetic_and_reductions():
    a, b = torch.rand(4, 5) > 0.5, torch.rand(4, 5) > 0.5
    check_lowered(lambda a, b: (a + b, a * b, a & b, a | b, a ^ b, ~a, torch.maximum(a, b), torch.minimum(a, b)), a, b)
    check_lowered(lambda a: (a.sum(), a.sum(1), a.prod(0), a.cumsum(1), a.any(1), a.all(0)), a)
    check_lowered(lambda a: (a + 1, a * 2.5, 1 - a.int()), a)  # bool with numbers promotes


# -- reductions on empty tensors -------------------------------------------------------


def test_empty_reductions():
    x = torch.randn(0, 3)
    check_lowered(lambda x: (x.sum(0), x.sum(), x.prod(0), x.prod(), x.cumsum(0), x.any(0), x.all(0), x.any()), x)
    check_lowered(lambda x: (x.var(0), torch.var_mean(x, 0), x.norm(dim=0), x.mean(0)), x)  # NaN where aten gives NaN
    check_lowered(lambda x: (x.sum(1), x.amax(1), x.argmax(1), torch.max(x, 1)), x)  # nothing to reduce over
    check_lowered(lambda x: x.sum(0, keepdim=True), torch.randn(0))


@pytest.mark.parametrize(
    "fn,op",
    [
        (lambda x: x.amax(0), "aten.amax.default"),
        (lambda x: x.argmax(0), "aten.argmax.default"),
        (lambda x: x.max(), "aten.max.default"),
    ],
)
def test_empty_reductions_aten_refuses_or_ort_differs_fall_back(fn, op):
    # aten raises for these (or ORT's answer would differ): torch keeps them; a raise is
    # the right answer, so compare against eager's exception
    x = torch.randn(0, 3)
    try:
        fn(x)
    except (RuntimeError, IndexError):
        backend = ortlite.Backend()
        with pytest.raises((RuntimeError, IndexError)):
            torch.compile(fn, backend=backend)(x)
        return
    check_fallback(fn, x, op=op)


# -- NaN in max/min --------------------------------------------------------------------


def nan_rows():
    x = torch.randn(4, 6)
    x[1, 2] = float("nan")
    x[2, :] = float("nan")
    x[3, 5] = float("inf")
    return x


def test_nan_propagates_in_max_min_family():
    x = nan_rows()
    check_lowered(lambda x: (x.amax(1), x.amin(0), x.max(), x.min(), torch.max(x, 1), torch.min(x, 0)), x)
    check_lowered(lambda x: (x.argmax(1), x.argmin(1), x.argmax(), x.argmin(0)), x)  # NaN wins
    check_lowered(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y)), x, nan_rows().flip(1))
    check_lowered(lambda x, y: (torch.fmax(x, y), torch.fmin(x, y)), x, nan_rows().flip(1))  # NaN loses
    check_lowered(lambda x: (torch.clamp(x, -0.5, 0.5), F.hardtanh(x)), x)
    check_lowered(lambda x: x.norm(float("inf"), dim=1), x)


def test_nan_sorts_above_inf():
    x = nan_rows()
    check_lowered(lambda x: (torch.sort(x, dim=1, stable=True), torch.sort(x, dim=0, descending=True, stable=True)), x)
    check_lowered(lambda x: (torch.sort(x, 1).values, torch.topk(x, 3, 1).values, torch.topk(x, 2, 0, largest=False).values), x)


def test_sort_and_topk_indices_of_ties():
    # a stable sort fixes the order of equal values; otherwise aten's order is unspecified
    # (std::sort, std::partial_sort): the graph checks for equal values among those that
    # decide the result and runs the op in torch when there are some
    x = torch.randint(0, 3, (8000,))
    check_lowered(lambda x: torch.sort(x, stable=True, descending=True), x)
    check_lowered(lambda x: torch.sort(x > 0, stable=True), x)
    check_fallback(lambda x: torch.sort(x), x, op="aten.sort.default")
    check_fallback(lambda x: torch.topk(x, 5), x, op="aten.topk.default")
    check_lowered(lambda x: torch.topk(x, 5).values, x)


SORTS_WITH_INDICES = {
    "sort": lambda x: torch.sort(x, -1),
    "sort_descending": lambda x: torch.sort(x, 0, descending=True),
    "argsort": lambda x: torch.argsort(x, -1),
    "topk": lambda x: torch.topk(x, 3, -1),
    "topk_smallest": lambda x: torch.topk(x, 2, 0, largest=False),
    "topk_all": lambda x: torch.topk(x, x.shape[-1], -1),
}


def _outputs(result):
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("case", sorted(SORTS_WITH_INDICES))
def test_unstable_sort_and_topk_indices_run_in_ort_until_values_tie(case):
    """Distinct values: one order, ONNX Runtime's is aten's. Equal ones (ties, several
    NaN, 0.0 and -0.0) in a later call: that call and the next run the op in torch."""
    fn = SORTS_WITH_INDICES[case]
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    for _ in range(3):
        x = torch.randn(6, 40)
        x[0, 5] = float("nan")  # one NaN: the largest, no tie
        for got, expected in zip(_outputs(compiled(x)), _outputs(fn(x))):
            assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert backend.stats.fallback_ops == {} and backend.stats.runs == 3
    for odd in (torch.randint(0, 3, (6, 40)).float(), torch.full((6, 40), float("nan")), torch.zeros(6, 40)):
        odd[1, 1:5] = -0.0
        for got, expected in zip(_outputs(compiled(odd)), _outputs(fn(odd))):
            assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert len(backend.stats.fallback_ops) == 1


@pytest.mark.parametrize("case", sorted(SORTS_WITH_INDICES))
def test_sort_ties_stable_orders_ties_by_index_in_ort(case):
    """Options(sort_ties="stable"): ties stay in ONNX Runtime, ordered as a stable sort
    orders them (aten's own stable sort is the reference); the values are eager's."""
    fn = SORTS_WITH_INDICES[case]
    backend = ortlite.Backend(ortlite.Options(sort_ties="stable"))
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    stable = {"sort": lambda x: torch.sort(x, dim=-1, stable=True), "sort_descending": lambda x: torch.sort(x, dim=0, descending=True, stable=True),
              "argsort": lambda x: torch.argsort(x, dim=-1, stable=True)}
    for odd in (torch.randint(0, 3, (6, 40)).float(), torch.full((6, 40), float("nan")), torch.zeros(6, 40)):
        odd[1, 1:5] = -0.0
        got, expected = _outputs(compiled(odd)), _outputs(fn(odd))
        assert torch.equal(got[0].nan_to_num(), expected[0].nan_to_num()) or case == "argsort"
        if case in stable:
            for g_, s_ in zip(got, _outputs(stable[case](odd))):
                assert torch.equal(g_.nan_to_num(), s_.nan_to_num())
        else:  # topk: the indices pick the values, ties included
            values, indices = got
            dim = -1 if case != "topk_smallest" else 0
            assert torch.equal(odd.gather(dim, indices).nan_to_num(), values.nan_to_num())
    assert backend.stats.fallback_ops == {}


def test_max_pool_nan_values_and_indices():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 1, 0] = float("nan")
    x[0, 1, 4, 4] = float("inf")
    check_lowered(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)


# -- type promotion with 0-d tensors and Python scalars --------------------------------


@pytest.mark.parametrize("op", [torch.maximum, torch.remainder, torch.fmod, torch.atan2, torch.bitwise_and])
def test_promotion_with_0d_tensors(op):
    i, f = ints(3, 4, lo=1), torch.randn(3, 4)
    if op is torch.bitwise_and:
        check_lowered(lambda a, b: op(a, b), i, torch.tensor(6, dtype=torch.int32))  # 0-d int does not widen
        check_lowered(lambda a: op(a, 6), i.to(torch.int16))
        return
    if op in (torch.remainder, torch.fmod):
        check_lowered(lambda a, b: op(b, a), f, torch.tensor(2.5, dtype=torch.float64))  # 0-d f64 does not widen f32
        check_lowered(lambda a: op(a, 2.5), i)  # int tensor, float scalar: float result
        return
    check_lowered(lambda a, b: op(a, b), i, torch.tensor(0.5))
    check_lowered(lambda a, b: op(a, b), f, torch.tensor(2.5, dtype=torch.float64))


def test_python_scalars_keep_tensor_dtype():
    h = torch.randn(3, 4).half()
    check_lowered(lambda h: (torch.remainder(h, 0.3), h.clamp(-0.1, 0.1), torch.where(h > 0, h, 0.1)), h, atol=1e-3)
    check_lowered(lambda i: (i + 2**40, i * -3, torch.where(i > 0, i, 7)), ints(3, 4, dtype=torch.int32))


def test_linspace_matches_aten_not_its_decomposition():
    # the core decomposition rounds integer linspace differently from aten's kernel
    check_lowered(lambda x: x + torch.linspace(4.3, 0, 50, dtype=torch.int64), ints(50), rtol=0, atol=0)
    check_lowered(lambda x: x * torch.logspace(-2, 2, 7, base=3), torch.randn(7))
    s, e = torch.tensor(-1.5), torch.tensor(7.25)
    check_lowered(lambda s, e: (torch.linspace(s, e, 9), torch.linspace(s, 3.0, 4), torch.linspace(2.0, e, 1)), s, e)
    check_fallback(lambda s, e: torch.linspace(s, e, 50, dtype=torch.int64), torch.tensor(4.3), torch.tensor(0), op="aten.linspace.Tensor_Tensor")


# -- window ops in matrix form: a NaN or infinity stays in its own windows ---------------


WINDOW_MATRIX_OPS = {
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
    "adaptive_avg_pool1d": lambda x: F.adaptive_avg_pool1d(x.flatten(2), 4),
}


@pytest.mark.parametrize("case", sorted(WINDOW_MATRIX_OPS))
def test_non_finite_inputs_of_matrix_form_window_ops_run_in_torch(case, caplog):
    """As a matrix product a NaN or inf would reach every output of its row (0 * inf is
    NaN); aten's kernel keeps it in its windows. The graph checks its input each call: one
    with a NaN or inf runs that op in torch from then on, that call included."""
    fn = WINDOW_MATRIX_OPS[case]
    backend = ortlite.Backend()
    compiled = torch.compile(fn, backend=backend)
    x = torch.randn(2, 3, 6, 7)
    torch.testing.assert_close(compiled(x), fn(x))
    assert backend.stats.fallback_ops == {}  # finite: in ONNX Runtime
    odd = x.clone()
    odd[0, 0, 1, 1], odd[1, 2, 4, 4], odd[1, 1, 0, 6] = float("nan"), float("inf"), -float("inf")
    with caplog.at_level("WARNING", logger="ortlite"):
        torch.testing.assert_close(compiled(odd), fn(odd), equal_nan=True)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(backend.stats.fallback_ops) == 1
    assert any("NaN or infinity" in r.getMessage() for r in caplog.records)


def test_a_non_finite_input_of_a_matrix_form_window_op_is_a_run_error_ahead_of_time():
    compiled = ortlite.compile(torch.nn.AdaptiveAvgPool2d((3, 5)), (torch.randn(2, 3, 6, 7),))
    x = torch.randn(2, 3, 6, 7)
    torch.testing.assert_close(compiled(x), F.adaptive_avg_pool2d(x, (3, 5)))
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ortlite.RunError, match="NaN or infinity"):
        compiled(x)
