"""Which sorts' tie order can reach a graph's outputs: a proof from the graph's structure.

A sort (or topk) of keys with equal values may order the equal ones any way: aten promises
no order, and ONNX Runtime's TopK puts the lower index first. Where the order could reach an
output, the lowering checks every call that the keys are distinct (ops/sort.py). This pass
proves, for each sort of a 1-D key, that its tie order cannot reach any output, in which
case the check is left out. Mixture-of-experts routing is the case it is for: transformers
sorts expert ids (all ties), runs each expert's rows, and puts the rows back in order.

The proof follows how a change of tie order, a permutation pi of positions with equal keys,
moves through the graph. Every value gets a state relative to the sort:
  - clean (absent from the map): unchanged by pi;
  - Rows(axis): permuted along axis by pi (the sort's indices themselves; rows gathered with
    them; row-wise work on those), `constant` where it is clean too (equal along the tie
    groups: integer sorted keys, weights gathered by them);
  - Inverse: positions in the sorted order, which pi maps through its inverse (argsort of the
    indices, or the indices scattered over an arange: what puts rows back);
  - TAINT: anything else.
Each op has a small rule (`@rule(...)`); an op without one taints what it reads. Rows read
back through an Inverse, rows summed over or scattered with their own indices, are clean
again. The sort's tie order is unobservable when no output, no mutated input and no assert
reads a value that is not clean. Each verdict lands in the sort node's meta (TIE_ORDER), which
torch.fx copies into the graphs cut from this one: a joint forward-backward graph is analysed
whole before aot_autograd partitions it.

Two equal floats may differ (-0.0 and 0.0, NaNs): a float key's sorted values are rows of
the key gathered by the indices, not constant. Floating-point sums taken in another order
differ in their last bits, as they already do between ONNX Runtime's kernels and aten's.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .registry import module_path

aten = torch.ops.aten

TIE_ORDER = "ortlite_tie_order"  # node.meta key: a TieOrder

UNCHECKED_KINDS = ("indices unused", "stable", "distinct keys", "every position, scattered", "tie order unobservable")


@dataclasses.dataclass(frozen=True)
class TieOrder:
    """A sort's verdict. kind: one of UNCHECKED_KINDS (no check needed), or "checked"
    (equal keys make the call run in torch); why: the reason, in words."""

    kind: str
    why: str

    @property
    def checked(self) -> bool:
        return self.kind not in UNCHECKED_KINDS


@dataclasses.dataclass(frozen=True)
class Rows:
    axis: int
    constant: bool = False  # also clean: equal along each tie group
    permutation: bool = False  # the sort's indices themselves: each of range(n) once


@dataclasses.dataclass(frozen=True)
class Inverse:
    permutation: bool = False  # each position once


TAINT = "taint"

SORTS = (aten.sort.default, aten.sort.stable, aten.topk.default)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
_SAME = (aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, aten.contiguous.default, aten._to_copy.default)
_FILLS = (aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default, aten.full.default, aten.new_full.default, aten.full_like.default)
_SHAPE_ONLY = (aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.new_zeros.default, aten.new_empty.default, aten.new_full.default, aten.new_ones.default)
_ORDER_FREE_REDUCTIONS = (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default, aten.any.dims, aten.all.dims, aten.any.dim, aten.all.dim, aten.prod.dim_int, aten.logsumexp.default)
_ALL_REDUCTIONS = (aten.sum.default, aten.mean.default, aten.amax.default, aten.any.default, aten.all.default, aten.prod.default, aten.max.default, aten.min.default)
_COUNTS = (aten.histc.default, aten.bincount.default)
_GROUPED_MM = ("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default")
_GROUPED_MM_BACKWARD = ("transformers.grouped_mm_fallback_backward.default",)
_NONNEGATIVE_INDICES = (aten.topk.default, aten.sort.default, aten.sort.stable, aten.max.dim, aten.min.dim)

_RULES: dict = {}


def rule(*targets):
    def register(fn):
        for t in targets:
            _RULES[t] = fn
        return fn

    return register


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def _rank(x) -> int:
    v = _val(x)
    return v.dim() if isinstance(v, torch.Tensor) else 0


def _shape(x) -> tuple:
    v = _val(x)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def _same_size(a, b) -> bool:
    return statically_known_true(a == b) if not (isinstance(a, int) and isinstance(b, int)) else a == b


def _product(sizes):
    p = 1
    for s in sizes:
        p = p * s
    return p


def _arg(node, i, name, default=None):
    if i < len(node.args):
        return node.args[i]
    return node.kwargs.get(name, default)


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _through(node, ops=_VIEWS + _SAME):
    """node through views and copies back to where its values are made."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in ops:
        node = node.args[0]
    return node


def _getitem_of(node, index: int, targets) -> torch.fx.Node | None:
    """The multi-output node whose output `index` node is (through views and copies), if its
    op is one of targets."""
    node = _through(node)
    if isinstance(node, torch.fx.Node) and node.target is operator.getitem and node.args[1] == index:
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and source.target in targets:
            return source
    return None


class _Analysis:
    """The states of the values downstream of one sort."""

    def __init__(self, sort: torch.fx.Node, positions: dict):
        self.sort = sort
        self.positions = positions  # node -> its place in the graph's order
        self.visited = 0  # nodes a rule ran on (the pass's work: tests/test_tie_order.py)
        self.n = _shape(sort.args[0])[0]
        self.states: dict = {}
        self.origins: dict = {}  # a tainted node -> the first node on its path with no rule that keeps track

    def state(self, x):
        if isinstance(x, (list, tuple)):
            states = [self.state(e) for e in x]
            return TAINT if TAINT in states else next((s for s in states if s is not None), None)
        return self.states.get(x) if isinstance(x, torch.fx.Node) else None

    def run(self) -> str | None:
        """None when the tie order reaches nothing observable; else what it reaches. Only
        the users of values with a state are visited, in graph order (a heap of positions):
        the work is the region where the order travels, not the rest of the graph."""
        self.states[self.sort] = self._sorted(self.sort)
        waiting, queued = [], set()
        self._queue_users(self.sort, waiting, queued)
        while waiting:
            node = heapq.heappop(waiting)[1]
            self.visited += 1
            read = [a for a in _flat(node.args, node.kwargs) if isinstance(a, torch.fx.Node) and self.states.get(a) is not None]
            if node.op == "output":
                for a in read:
                    if not _clean(self.states[a]):
                        return f"graph output {a.name}{self._origin(a)}"
                continue
            fn = _RULES.get(node.target, _RULES.get(str(node.target)))
            state = fn(self, node) if fn is not None else TAINT
            if state == TAINT:
                self.origins[node] = next((self.origins[r] for r in read if r in self.origins), node)
                if _side_effect(node):
                    return f"{node.name} ({node.target}){self._origin(node)}"
            if state is not None:
                self.states[node] = state
                self._queue_users(node, waiting, queued)
        return None

    def _queue_users(self, node, waiting: list, queued: set) -> None:
        for user in node.users:
            if user not in queued:
                queued.add(user)
                heapq.heappush(waiting, (self.positions[user], user))

    def _origin(self, node) -> str:
        origin = self.origins.get(node)
        return f", through {origin.name} ({origin.target})" if origin is not None else ""

    def _sorted(self, node):
        """The sort's (values, indices)."""
        key = _val(node.args[0])
        exact = not (key.is_floating_point() or key.is_complex())
        return (Rows(0, constant=exact), Rows(0, permutation=True))


def _flat(args, kwargs) -> list:
    out = []
    stack = [args, tuple(kwargs.values())]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        else:
            out.append(x)
    return out


def _clean(state) -> bool:
    if isinstance(state, tuple):
        return all(_clean(s) for s in state)
    return state is None or (isinstance(state, Rows) and state.constant)


def _side_effect(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable) or "assert" in str(node.target)


# --- rules: each returns the node's state (None: clean) ---------------------------------


@rule(operator.getitem)
def _getitem(a: _Analysis, node):
    state = a.states[node.args[0]]
    return state[node.args[1]] if isinstance(state, tuple) else state


@rule(aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten._assert_tensor_metadata.default, *_SHAPE_ONLY)
def _shape_only(a: _Analysis, node):
    """Reads only the shape (or fills one): no tie order in it."""
    if node.target in _SHAPE_ONLY and len(node.args) > 1 and a.state(node.args[1:]) is not None:
        return TAINT  # (a fill value from the sorted rows)
    return None


def _holds_positions(dtype: torch.dtype, n) -> bool:
    """Does dtype hold every position 0..n-1 exactly?"""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return False
    return statically_known_true(n <= torch.iinfo(dtype).max)


@rule(*_SAME)
def _same(a: _Analysis, node):
    """Copies and casts: elementwise, so rows stay rows; positions (Inverse, a permutation's
    values) survive only a cast to an integer type that holds them."""
    state = a.states[node.args[0]]
    dtype = node.kwargs.get("dtype") if node.target is aten._to_copy.default else None
    if dtype is None or dtype == _val(node.args[0]).dtype or _holds_positions(dtype, a.n):
        return state
    if isinstance(state, Inverse):
        return TAINT
    return dataclasses.replace(state, permutation=False) if isinstance(state, Rows) else state


def _view_axis(before: tuple, after: tuple, axis: int) -> int | None:
    """The axis of `after` (a row-major reshape of `before`) holding `before`'s axis whole."""
    head = _product(before[:axis])
    for j in range(len(after)):
        if _same_size(after[j], before[axis]) and _same_size(_product(after[:j]), head):
            return j
    return None


@rule(*_VIEWS)
def _view(a: _Analysis, node):
    state = a.states[node.args[0]]
    if not isinstance(state, Rows):
        return state  # Inverse: a view keeps the values
    axis = _view_axis(_shape(node.args[0]), _shape(node), state.axis)
    if axis is None:
        return TAINT
    keeps_all = len(_shape(node)) == 1 and len(_shape(node.args[0])) == 1
    return dataclasses.replace(state, axis=axis, permutation=state.permutation and keeps_all)


@rule(aten.expand.default)
def _expand(a: _Analysis, node):
    state = a.states[node.args[0]]
    if isinstance(state, Inverse):
        return Inverse()  # (repeated: no longer each position once)
    if not isinstance(state, Rows):
        return state
    return dataclasses.replace(state, axis=state.axis + _rank(node) - _rank(node.args[0]), permutation=False)


@rule(aten.permute.default, aten.transpose.int, aten.t.default)
def _permute(a: _Analysis, node):
    state = a.states[node.args[0]]
    if not isinstance(state, Rows):
        return state
    rank = _rank(node.args[0])
    if node.target is aten.permute.default:
        order = [_norm(d, rank) for d in node.args[1]]
    else:
        order = list(range(rank))
        d0, d1 = (0, 1) if node.target is aten.t.default else (_norm(node.args[1], rank), _norm(node.args[2], rank))
        if rank >= 2 or node.target is not aten.t.default:
            order[d0], order[d1] = order[d1], order[d0]
    return dataclasses.replace(state, axis=order.index(state.axis), permutation=state.permutation and rank == 1)


@rule(aten.slice.Tensor, aten.select.int, aten.narrow.default)
def _slice(a: _Analysis, node):
    state = a.states[node.args[0]]
    rank = _rank(node.args[0])
    dim = _norm(_arg(node, 1, "dim", 0), rank)
    if not isinstance(state, Rows):
        return Inverse() if isinstance(state, Inverse) else state
    if dim == state.axis:
        if node.target is aten.slice.Tensor and _same_size(_shape(node)[dim], _shape(node.args[0])[dim]):
            return state  # the whole axis
        return TAINT
    axis = state.axis - (1 if node.target is aten.select.int and dim < state.axis else 0)
    return dataclasses.replace(state, axis=axis, permutation=False)


@rule(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int)
def _split(a: _Analysis, node):
    state = a.states[node.args[0]]
    rank = _rank(node.args[0])
    dim = _norm(_arg(node, 1 if node.target is aten.unbind.int else 2, "dim", 0), rank)
    pieces = len(_val(node))
    if isinstance(state, Inverse):
        return tuple(Inverse() for _ in range(pieces))
    if not isinstance(state, Rows) or dim == state.axis:
        return TAINT
    axis = state.axis - (1 if node.target is aten.unbind.int and dim < state.axis else 0)
    return tuple(dataclasses.replace(state, axis=axis, permutation=False) for _ in range(pieces))


@rule(aten.slice_scatter.default, aten.select_scatter.default)
def _slice_scatter(a: _Analysis, node):
    """Rows written into a slice (or an index) of base, along another dim than the rows':
    base filled with one value, or rows along the same axis."""
    base, src = node.args[:2]
    dim = _norm(_arg(node, 2, "dim", 0), _rank(base))
    bs, ss = a.state(base), a.state(src)
    if not isinstance(ss, Rows) or not (bs is None or isinstance(bs, Rows)):
        return TAINT
    axis = ss.axis + (1 if node.target is aten.select_scatter.default and ss.axis >= dim else 0)
    if axis == dim or (bs is None and not _uniform(base)) or (bs is not None and bs.axis != axis):
        return TAINT
    return Rows(axis, constant=ss.constant and (bs is None or bs.constant))


@rule(aten.cat.default)
def _cat(a: _Analysis, node):
    tensors = node.args[0]
    rank = _rank(node)
    dim = _norm(_arg(node, 1, "dim", 0), rank)
    states = [a.state(t) for t in tensors]
    axes = {s.axis for s in states if isinstance(s, Rows)}
    if len(axes) != 1 or not all(isinstance(s, Rows) for s in states) or dim in axes:
        return TAINT
    return Rows(axes.pop(), constant=all(s.constant for s in states))


def _broadcast_rows(a: _Analysis, node, operands, result=None) -> object:
    """The state of an elementwise result of operands (nodes or numbers), and of `result` (a
    state already at the result's rank, or None): rows when every operand is rows along the
    same axis of the result, or broadcast along it."""
    rank = _rank(node)
    if result == TAINT:
        return TAINT
    axis, constant = (result.axis, result.constant) if isinstance(result, Rows) else (None, True)
    if result is not None and not isinstance(result, Rows):
        return TAINT
    for x in operands:
        state = a.state(x)
        if state is None:
            continue
        if not isinstance(state, Rows):
            return TAINT
        at = state.axis + rank - _rank(x)
        if axis not in (None, at):
            return TAINT
        axis, constant = at, constant and state.constant
    if axis is None:
        return None
    for x in operands:  # the clean ones: broadcast along the axis, or none of them
        if a.state(x) is None and isinstance(x, torch.fx.Node):
            at = axis - (rank - _rank(x))
            if at >= 0 and not _same_size(_shape(x)[at], 1):
                return TAINT
    return Rows(axis, constant=constant)


@rule(aten.floor_divide.default)  # (elementwise, though not tagged so)
def _pointwise(a: _Analysis, node):
    return _broadcast_rows(a, node, _flat(node.args, node.kwargs))


def _reduced_dims(node, rank: int) -> list[int]:
    dims = _arg(node, 1, "dim")
    if node.target in _ALL_REDUCTIONS or dims is None or dims == []:
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return sorted(_norm(d, rank) for d in dims)


@rule(*_ORDER_FREE_REDUCTIONS, *_ALL_REDUCTIONS)
def _reduction(a: _Analysis, node):
    """Sums, means, maxima and minima over the permuted axis do not see the order."""
    state = a.states[node.args[0]]
    if not isinstance(state, Rows):
        return TAINT
    rank = _rank(node.args[0])
    dims = _reduced_dims(node, rank)
    if state.axis in dims:
        return None
    keepdim = _rank(node) == rank
    return Rows(state.axis - (0 if keepdim else sum(d < state.axis for d in dims)), constant=state.constant)


@rule(*_COUNTS)
def _counts(a: _Analysis, node):
    return None if isinstance(a.states[node.args[0]], Rows) and a.state(node.args[1:]) is None else TAINT


@rule(aten.cumsum.default, aten._softmax.default, aten._log_softmax.default)
def _along_other_axis(a: _Analysis, node):
    """Works along one dim: rows stay rows when that dim is another."""
    state = a.states[node.args[0]]
    dim = _norm(node.args[1], _rank(node.args[0]))
    if not isinstance(state, Rows) or dim == state.axis:
        return TAINT
    return Rows(state.axis)


@rule(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_backward(a: _Analysis, node):
    grad, output, dim = node.args[:3]
    state = _broadcast_rows(a, node, [grad, output])
    if isinstance(state, Rows) and state.axis == _norm(dim, _rank(node)):
        return TAINT
    return state


def _matmul_rows(a: _Analysis, node, left, right) -> object:
    """mm and bmm as index letters: left (b, m, k), right (b, k, n), out (b, m, n)."""
    batched = _rank(left) == 3
    letters_l = ["b", "m", "k"] if batched else ["m", "k"]
    letters_r = ["b", "k", "n"] if batched else ["k", "n"]
    letters_o = ["b", "m", "n"] if batched else ["m", "n"]
    found = []  # (operand position, letter, constant)
    for position, (x, letters) in enumerate(((left, letters_l), (right, letters_r))):
        state = a.state(x)
        if state is None:
            continue
        if not isinstance(state, Rows):
            return TAINT
        found.append((position, letters[state.axis], state.constant))
    if not found:
        return None
    if len({letter for _, letter, _ in found}) != 1:
        return TAINT
    letter = found[0][1]
    if letter == "k":  # summed over: clean if both operands are permuted alike
        return None if len(found) == 2 else TAINT
    if letter == "b" and len(found) == 1:  # the other operand must be broadcast over the batch
        other = (right, left)[found[0][0]]
        if not _same_size(_shape(other)[0], 1):
            return TAINT
    return Rows(letters_o.index(letter), constant=all(c for _, _, c in found))


@rule(aten.mm.default, aten.bmm.default)
def _mm(a: _Analysis, node):
    return _matmul_rows(a, node, node.args[0], node.args[1])


@rule(aten.addmm.default, aten.baddbmm.default)
def _addmm(a: _Analysis, node):
    """bias + a product, broadcast together."""
    product = _matmul_rows(a, node, node.args[1], node.args[2])
    return TAINT if product == TAINT else _broadcast_rows(a, node, [node.args[0]], product)


def _index_rows(a: _Analysis, node, x, index, dim: int) -> object:
    """x indexed along dim by one index tensor (its dims replacing dim)."""
    xs, idx = a.state(x), a.state(index)
    if xs is None and idx is None:
        return None
    if xs is None and isinstance(idx, Rows):
        return Rows(dim + idx.axis, constant=idx.constant)
    if isinstance(xs, Rows) and xs.axis == dim and isinstance(idx, Inverse):
        return None  # rows put back where they came from
    if isinstance(xs, Rows) and xs.axis != dim and idx is None:
        shift = (_rank(index) - 1) if xs.axis > dim else 0
        return Rows(xs.axis + shift, constant=xs.constant)
    return TAINT


@rule(aten.index.Tensor)
def _index(a: _Analysis, node):
    x, indices = node.args[0], node.args[1]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        return None if a.state(x) is None and a.state(list(indices)) is None else TAINT
    dim, index = given[0]
    return _index_rows(a, node, x, index, dim)


@rule(aten.index_select.default)
def _index_select(a: _Analysis, node):
    x, dim, index = node.args[:3]
    return _index_rows(a, node, x, index, _norm(dim, _rank(x)))


@rule(aten.embedding.default)
def _embedding(a: _Analysis, node):
    return _index_rows(a, node, node.args[0], node.args[1], 0)


@rule(aten.gather.default)
def _gather(a: _Analysis, node):
    x, dim, index = node.args[:3]
    dim = _norm(dim, _rank(x))
    state = _broadcast_rows(a, node, [x, index])
    if isinstance(state, Rows) and state.axis != dim and isinstance(a.state(x), Rows) and isinstance(a.state(index), Rows):
        return state
    return None if a.state(x) is None and a.state(index) is None else TAINT


def _uniform(node) -> bool:
    """Is node a tensor filled with one value (zeros, full)?"""
    return isinstance(node, torch.fx.Node) and _through(node).target in _FILLS


def _is_arange(node, n) -> bool:
    """Is node arange(n) (0, 1, ..., n - 1)?"""
    node = _through(node)
    if not isinstance(node, torch.fx.Node):
        return False
    args = [_val(x) for x in node.args]  # (sizes: SymInts, from their nodes)
    if node.target is aten.arange.default:
        return _same_size(args[0], n)
    if node.target in (aten.arange.start, aten.arange.start_step):
        step = args[2] if len(args) > 2 else 1
        return _same_size(args[0], 0) and _same_size(step, 1) and _same_size(args[1], n)
    return False


def _scatter_rows(a: _Analysis, base, index, values, accumulate: bool, dim: int) -> object:
    """base with values written (or added, accumulate) at index along dim; index is 1-D
    along dim (index_put, index_add) or shaped like values (scatter)."""
    bs, idx, vs = a.state(base), a.state(index), a.state(values)
    if bs is not None:
        return TAINT
    if isinstance(idx, Rows) and idx.permutation and _is_arange(values, a.n) and (not accumulate or _uniform(base)):
        return Inverse(permutation=True)  # out[indices[i]] = i: the inverse permutation
    if isinstance(idx, Rows) and isinstance(vs, Rows) and idx.axis == 0 and vs.axis == dim and (accumulate or idx.permutation):
        return None  # each (index, value) pair still written: only their order changed
    if isinstance(idx, Inverse) and vs is None and (accumulate or idx.permutation) and _uniform(base):
        return Rows(dim)  # values written at positions pi maps: the result's rows permuted
    return TAINT


@rule(aten.index_put.default)
def _index_put(a: _Analysis, node):
    base, indices, values = node.args[:3]
    accumulate = _arg(node, 3, "accumulate", False)
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or given[0][0] != 0 or _rank(given[0][1]) != 1:
        return None if a.state(node.args[:3]) is None else TAINT
    return _scatter_rows(a, base, given[0][1], values, accumulate, 0)


@rule(aten.index_add.default)
def _index_add(a: _Analysis, node):
    base, dim, index, source = node.args[:4]
    return _scatter_rows(a, base, index, source, True, _norm(dim, _rank(base)))


@rule(aten.scatter_add.default)
def _scatter_add(a: _Analysis, node):
    base, dim, index, source = node.args[:4]
    dim = _norm(dim, _rank(base))
    idx, vs = a.state(index), a.state(source)
    if a.state(base) is None and isinstance(idx, Rows) and isinstance(vs, Rows) and idx.axis == vs.axis == dim:
        return None
    return TAINT


def _descending(sort) -> bool:
    """A sort's descending argument (positional in sort.default, a keyword in sort.stable)."""
    if sort.target is aten.sort.default and len(sort.args) > 2:
        return bool(sort.args[2])
    return bool(sort.kwargs.get("descending", False))


def _offsets_follow_keys(a: _Analysis, offsets) -> bool:
    """Are grouped-mm offsets the cumulative counts of the sort's keys, so that each group
    boundary falls between two different keys (ascending sort, keys ≥ the histogram's low
    edge: a nonnegative index, e.g. topk's)? Then a tie group lies inside one group."""
    sort = a.sort
    if sort.target is aten.topk.default or _descending(sort):
        return False
    cumsum = _through(offsets)
    if not (isinstance(cumsum, torch.fx.Node) and cumsum.target is aten.cumsum.default and _norm(cumsum.args[1], 1) == 0):
        return False
    counts = _through(cumsum.args[0])
    if not isinstance(counts, torch.fx.Node) or counts.target not in _COUNTS:
        return False
    if counts.target is aten.histc.default and not _arg(counts, 2, "min", 0) <= 0:
        return False
    if counts.target is aten.bincount.default and _arg(counts, 1, "weights") is not None:
        return False
    counted = _through(counts.args[0])
    sorted_keys = _getitem_of(counted, 0, SORTS)
    if counted is not _through(sort.args[0]) and sorted_keys is not sort:
        return False
    return _nonnegative(sort.args[0])


def _nonnegative(node, depth: int = 8) -> bool:
    """Are node's values never negative by construction (indices of a sort, topk, max or
    argmax, and what views, copies and concatenations make of them)?"""
    node = _through(node)
    if not isinstance(node, torch.fx.Node) or depth == 0:
        return False
    if node.target in (aten.argmax.default, aten.argmin.default) or _getitem_of(node, 1, _NONNEGATIVE_INDICES) is not None:
        return True
    if node.target is aten.cat.default:
        return all(_nonnegative(t, depth - 1) for t in node.args[0])
    return False


@rule(*_GROUPED_MM)
def _grouped_mm(a: _Analysis, node):
    x, weight, offsets = node.args[0], node.args[1], _arg(node, 2, "offs")
    xs = a.state(x)
    if a.state(weight) is None and a.state(offsets) is None and isinstance(xs, Rows) and xs.axis == 0 and _offsets_follow_keys(a, offsets):
        return Rows(0)
    return TAINT


@rule(*_GROUPED_MM_BACKWARD)
def _grouped_mm_backward(a: _Analysis, node):
    x, weight, offsets, grad = node.args[:4]
    xs, gs = a.state(x), a.state(grad)
    rows = all(isinstance(s, Rows) and s.axis == 0 for s in (xs, gs))
    if rows and a.state(weight) is None and a.state(offsets) is None and _offsets_follow_keys(a, offsets):
        return (Rows(0), None)  # the input's gradient row by row; the weights' summed over rows
    return TAINT


def _sort_of_rows(a: _Analysis, node):
    """A sort of the first sort's indices (argsort(perm)): distinct keys, and its indices are
    the inverse permutation."""
    state = a.states[node.args[0]]
    if isinstance(state, Rows) and state.permutation and _rank(node.args[0]) == 1 and node.target is not aten.topk.default and not _descending(node):
        return (None, Inverse(permutation=True))
    return TAINT


for _t in SORTS:
    _RULES[_t] = _sort_of_rows


class _PointwiseRules(dict):
    """The rule table, with torch's pointwise ops (Tag.pointwise) ruled by _pointwise."""

    def get(self, target, default=None):
        found = super().get(target)
        if found is not None:
            return found
        tags = getattr(target, "tags", ())
        if torch.Tag.pointwise in tags:
            return _pointwise
        return default


_RULES = _PointwiseRules(_RULES)


def _distinct_keys(sort: torch.fx.Node) -> bool:
    """1-D keys that cannot tie: another sort's 1-D indices (a permutation), or an arange."""
    key = sort.args[0]
    if _rank(key) != 1:
        return False
    source = _getitem_of(key, 1, SORTS)
    return (source is not None and _rank(source.args[0]) == 1) or _is_arange(key, _shape(key)[0])


def _indices_used(node) -> bool:
    return any(user.target is not operator.getitem or user.args[1] == 1 for user in node.users)


_SCATTERS_OF_A_VALUE = (aten.scatter.value, aten.scatter_.value)


def _scattered_whole(sort: torch.fx.Node) -> bool:
    """Does a sort (or a topk of k = all) of keys of any rank give all the positions of its axis
    in each row, read only by scatters of one value along that axis (through integer copies)?
    Each row's positions are then the same set in any order, and the scatter's result depends on
    the set alone: e.g. DeepSeek's sparse-attention indexer, new_ones(...).scatter(-1, idx, False)."""
    rank = _rank(sort.args[0])
    axis = _norm(_arg(sort, 2, "dim", -1) if sort.target is aten.topk.default else _arg(sort, 1, "dim", -1), max(rank, 1))
    if rank == 0 or (sort.target is aten.topk.default and not _same_size(_arg(sort, 1, "k"), _shape(sort.args[0])[axis])):
        return False
    n = _shape(sort.args[0])[axis]
    pending = [user for user in sort.users]
    if not all(u.target is operator.getitem and u.args[1] == 1 for u in pending):
        return False  # the sorted values are read too
    seen = 0
    while pending:
        node = pending.pop()
        seen += 1
        if seen > 64:
            return False
        for user in node.users:
            if user.target in _SAME and user.args[0] is node and _holds_positions(_val(user).dtype, n) and _shape(user) == _shape(node):
                pending.append(user)
            elif user.target in _SHAPE_ONLY and user.args[0] is node and node not in _flat(user.args[1:], user.kwargs):
                continue
            elif user.target in (aten.sym_size.int, aten.sym_numel.default, aten._assert_tensor_metadata.default):
                continue
            elif user.target in _SCATTERS_OF_A_VALUE and user.args[2] is node and user.args[0] is not node and not isinstance(user.args[3], torch.fx.Node):
                if _rank(user.args[0]) != rank or _norm(user.args[1], rank) != axis:
                    return False
            else:
                return False
    return True


def tie_order(sort: torch.fx.Node, positions: dict | None = None) -> TieOrder:
    """The verdict for one sort or topk node (positions: each node's place in the graph's
    order, computed once for all the sorts of a graph)."""
    if not _indices_used(sort):
        return TieOrder("indices unused", "only the sorted values are read")
    if sort.target is aten.sort.stable and sort.kwargs.get("stable"):
        return TieOrder("stable", "stable=True: ties in index order, as ONNX Runtime's TopK gives them")
    if _distinct_keys(sort):
        return TieOrder("distinct keys", "its keys are another sort's indices (a permutation) or an arange")
    if _scattered_whole(sort):
        return TieOrder("every position, scattered", "all positions of its axis, read only by scatters of one value along it: the same set in any order")
    if _rank(sort.args[0]) != 1:
        return TieOrder("checked", "keys of more than one dim: no proof tried")
    if sort.target is aten.topk.default and not _same_size(_arg(sort, 1, "k"), _shape(sort.args[0])[0]):
        return TieOrder("checked", "topk of fewer than all keys: ties decide which are chosen")
    if positions is None:
        positions = {n: i for i, n in enumerate(sort.graph.nodes)}
    reached = _Analysis(sort, positions).run()
    if reached is None:
        return TieOrder("tie order unobservable", "the rows it orders are put back in order, summed over, or scattered by the same indices before any output")
    return TieOrder("checked", f"the tie order reaches {reached}")


def mark_tie_orders(graph: torch.fx.Graph) -> None:
    """Give every sort and topk of graph without a verdict its verdict (node.meta[TIE_ORDER]).
    A verdict from a larger graph (the joint graph of a training step) is kept."""
    positions = None
    for node in graph.nodes:
        if node.op == "call_function" and node.target in SORTS and TIE_ORDER not in node.meta:
            positions = positions if positions is not None else {n: i for i, n in enumerate(graph.nodes)}
            try:
                node.meta[TIE_ORDER] = tie_order(node, positions)
            except Exception as e:  # a proof that cannot be made is a check kept, never a failed compile
                node.meta[TIE_ORDER] = TieOrder("checked", f"no proof ({type(e).__name__}: {e})")


def sort_verdicts(graph: torch.fx.Graph) -> list:
    """(node name, module path or "", TieOrder) for each sort and topk of graph with a verdict."""
    found = []
    for node in graph.nodes:
        verdict = node.meta.get(TIE_ORDER) if node.op == "call_function" else None
        if verdict is not None:
            found.append((node.name, module_path(node), verdict))
    return found
