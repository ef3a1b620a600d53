"""Helpers shared by the op table: type promotion, scalars, dims."""

from __future__ import annotations

import contextlib
import contextvars
import math
import operator

import torch
import torch.fx
from onnx import TensorProto
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from ..builder import GraphBuilder, SymbolicShapeError, Value, sym_expr
from ..registry import meta

aten = torch.ops.aten

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def out_val(node) -> torch.Tensor:
    """The node's output meta tensor (the first one for multi-output ops)."""
    val = meta(node)
    return val[0] if isinstance(val, (tuple, list)) else val


def out_dtype(node) -> torch.dtype:
    return out_val(node).dtype


def out_shape(node) -> tuple:
    return tuple(out_val(node).shape)


def arg_val(node, index: int, name: str | None = None, default=None):
    """The meta value of one of node's arguments (by position, or by keyword name)."""
    if index < len(node.args):
        return meta(node.args[index])
    if name is not None and name in node.kwargs:
        return meta(node.kwargs[name])
    return default


def promoted_dtype(*operands, kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT) -> torch.dtype:
    """aten's result dtype for operands that are meta tensors or Python numbers."""
    operands = [o for o in operands if o is not None]
    return elementwise_dtypes(*operands, type_promotion_kind=kind)[1]


def as_value(g: GraphBuilder, x, dtype: torch.dtype) -> Value:
    """A tensor Value cast to dtype, or a Python number made a 0-d constant of dtype."""
    if isinstance(x, Value):
        return g.cast(x, dtype)
    if dtype in INT_DTYPES and isinstance(x, int) and not isinstance(x, bool):
        x = wrap_int(x, dtype)
    return g.const(x, dtype)


def wrap_int(value: int, dtype: torch.dtype) -> int:
    """A Python int as aten casts it to an integer dtype: modulo 2**bits."""
    info = torch.iinfo(dtype)
    span = 2**info.bits
    return (value - info.min) % span + info.min


def c_remainder(g: GraphBuilder, a: str, b: str) -> str:
    """C's a % b for integers (the dividend's sign): a - trunc(a / b) * b. (ONNX Runtime's
    integer Mod with fmod=1 goes through double: wrong past 2**53.)"""
    return g.op("Sub", a, g.op("Mul", g.op("Div", a, b), b))


def norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def norm_dims(dims, rank: int) -> list[int]:
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [norm_dim(d, max(rank, 1)) for d in dims]


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES


# torch.export traces with sizes of at least 2 (its shape environment says so) while the
# exported program takes its Dims' whole ranges: ortlite.compile declares the ranges it
# runs (lower_graph's symbol_ranges), and what may be 0 is judged by those
_declared_ranges: contextvars.ContextVar[dict] = contextvars.ContextVar("ortlite_declared_ranges", default={})


@contextlib.contextmanager
def declared_ranges(ranges: dict | None):
    """symbol -> (min, max or None): the sizes the graph will run with, where they are wider
    than the shape environment's, for may_be_zero while lowering."""
    bound = lambda v, infinity: infinity if v is None else v  # noqa: E731
    token = _declared_ranges.set({s: ValueRanges(bound(lo, -int_oo), bound(hi, int_oo)) for s, (lo, hi) in (ranges or {}).items()})
    try:
        yield
    finally:
        _declared_ranges.reset(token)


def may_be_zero(size) -> bool:
    """Can this size be 0 at run time? Asks without adding a guard. Dynamo's symbolic sizes
    are >= 2, and what its guards establish counts (every call that reaches the graph passed
    them): Swin's window count, a floor division of a padded size whose interval bounds
    reach 0, is known >= 1. Sizes of symbols with declared ranges (torch.export's Dims) are
    bounded by those."""
    if isinstance(size, int):
        return size == 0
    expr = size.node.expr
    declared = _declared_ranges.get()
    if declared and expr.free_symbols & declared.keys():
        ranges = {s: declared[s] if s in declared else size.node.shape_env.var_to_range.get(s, ValueRanges.unknown()) for s in expr.free_symbols}
        return bound_sympy(expr, ranges).lower <= 0
    return not statically_known_true(size >= 1)


def may_be_empty(t) -> bool:
    return any(may_be_zero(d) for d in t.shape)


def any_zero(g, sizes: list, values) -> str | None:
    """A 0-d bool: whether any of these sizes is 0 at run time (None: there are none). From
    their expressions where ONNX can spell them (of argument sizes: the size prelude computes
    the check), else from the values' element counts."""
    if not sizes:
        return None
    zero = g.const(0, torch.int64)
    try:
        flags = [g.op("Equal", g.sym(d), zero) for d in {sym_expr(d): d for d in sizes}.values()]
    except SymbolicShapeError:
        flags = [g.op("Equal", g.op("Size", v), zero) for v in values]
    result = flags[0]
    for flag in flags[1:]:
        result = g.op("Or", result, flag)
    return result


def known_empty(shape) -> bool:
    """Does a static size of this shape make it empty? (Symbolic sizes are not compared:
    that would add a guard; lowerings handle a size that may be 0 at run time.)"""
    return 0 in [d for d in shape if isinstance(d, int)]


def is_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def fills_its_storage(t) -> bool:
    """Are t's elements all its storage holds (offset 0, no gaps), known without a guard?"""
    known = statically_known_true
    return known(t.storage_offset() == 0) and known(t.untyped_storage().nbytes() == t.numel() * t.element_size())


def has_contiguous_strides(sizes, strides) -> bool:
    """Are strides the contiguous ones of sizes (any stride on a size-1 dim), known without
    a guard?"""
    known = statically_known_true
    return all(known(n == 1) or known(s == math.prod(sizes[k + 1 :])) for k, (n, s) in enumerate(zip(sizes, strides)))


def same_shape(a, b) -> bool:
    """Are two shapes the same for every size the graph serves? (Comparing SymInts with
    == would add a guard.)"""
    return len(a) == len(b) and all(sym_expr(x) == sym_expr(y) for x, y in zip(a, b))


def broadcast_shape(*shapes) -> tuple:
    """aten's broadcast of shapes whose sizes may be symbolic: where sizes differ, each
    other one must be a static 1 (torch.broadcast_shapes would guard on symbols)."""
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for k in range(rank, 0, -1):
        sizes = [s[len(s) - k] for s in shapes if len(s) >= k]
        others = [d for d in sizes if not (isinstance(d, int) and d == 1)]
        if not others:
            result.append(1)
        elif all(sym_expr(d) == sym_expr(others[0]) for d in others):
            result.append(others[0])
        else:
            return tuple(torch.broadcast_shapes(*shapes))  # guards: the node is then left to torch
    return tuple(result)


def indices_used(node) -> bool:
    """Is a two-output node's second output (a max's indices, attention's logsumexp) read?"""
    return any(user.target is not operator.getitem or user.args[1] == 1 for user in node.users)


def any_true(g: GraphBuilder, cond: str, axes: list[int] | None = None, keepdims: bool = False) -> str:
    """Whether any element of a bool value is true, over `axes` (None: all). (ONNX Runtime
    reduces no bools: a max over them as uint8.)"""
    flags = g.op("Cast", cond, to=TensorProto.UINT8)
    reduced = g.op("ReduceMax", flags, g.ints(axes) if axes is not None else None, keepdims=int(keepdims))
    return g.op("Cast", reduced, to=TensorProto.BOOL)


def max_min(g: GraphBuilder, a: str, b: str, dtype: torch.dtype, largest: bool) -> str:
    """Elementwise max (largest) or min of a and b, broadcast. ONNX Runtime's int64 Max/Min
    (1.31, CPU) compare values in [2**31, 2**32) and [-2**32, -2**31) wrongly: for int64 a
    Where on Greater/Less, which are exact. (No NaN in integers: the same answer as aten's.)"""
    if dtype == torch.int64:
        return g.op("Where", g.op("Greater" if largest else "Less", a, b), a, b)
    return g.op("Max" if largest else "Min", a, b)


def where(g: GraphBuilder, cond: str, a: str, b: str, dtype: torch.dtype) -> str:
    """ONNX Where, also for bool values (ONNX Runtime has no bool Where kernel)."""
    if dtype != torch.bool:
        return g.op("Where", cond, a, b)
    return g.op("Or", g.op("And", cond, a), g.op("And", g.op("Not", cond), b))


class _NotConstant(Exception):
    pass


def computed_now(node, max_nodes: int = 64, max_elements: int = 1 << 22) -> torch.Tensor | None:
    """The value of an FX node computed from constants alone (no argument, weight, symbolic
    size or random op: a static causal mask built from arange), by torch's own kernels now,
    on the CPU; None where it is not such a value."""
    values: dict = {}

    def evaluate(n):
        if n in values:
            return values[n]
        val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        if (
            n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or len(values) >= max_nodes
            or torch.Tag.nondeterministic_seeded in n.target.tags or not isinstance(val, torch.Tensor)
            or val.device.type != "cpu" or not is_static(val.shape) or val.numel() > max_elements
        ):  # fmt: skip
            raise _NotConstant
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), evaluate)
        if any(isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) for a in torch.utils._pytree.tree_leaves((args, kwargs))):
            raise _NotConstant
        try:
            values[n] = n.target(*args, **kwargs)
        except Exception as e:  # (what torch refuses now is left to run time)
            raise _NotConstant from e
        return values[n]

    try:
        with unset_fake_temporarily():
            return evaluate(node) if isinstance(node, torch.fx.Node) else None
    except _NotConstant:
        return None
