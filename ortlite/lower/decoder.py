"""Rewrites for decoder steps: attention over a static KV cache (fixed-size buffers the step
writes at positions arange(S) + p, as transformers' StaticCache does) as ONNX Runtime's
GroupQueryAttention, and the norms around it. Passes on the lowered ONNX graph, in the style of
fusions.py: each rewrites only what it proves equal on the graph, and leaves the rest."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from .builder import TORCH_TO_ONNX, onnx_dim
from .fusions import HEADS_PERM, _new_values, _passes, _perm, _reads, _token_rows, drop_unread_initializers, live_nodes
from .ops.common import same_shape

MS_DOMAIN = "com.microsoft"
_CONSTANT_OPS = ("Identity", "Add", "Sub", "Mul", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Range", "Concat")


def _has(graph: onnx.GraphProto, op_type: str, domain: str = "") -> bool:
    """Whether graph has a node of op_type (the decoder passes run only where theirs are)."""
    return any(n.op_type == op_type and n.domain in ((domain, "ai.onnx") if domain == "" else (domain,)) for n in graph.node)


class _Graph:
    """What the passes read of a graph: each value's producer and readers, small constants."""

    def __init__(self, graph: onnx.GraphProto, known: dict[str, tuple]):
        self.graph, self.known = graph, known
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list] = {}
        for n in graph.node:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name: i for i in graph.input}
        self.initializers = {t.name: t for t in graph.initializer}
        self._values: dict[str, np.ndarray | None] = {}
        self._keys: StructuralIds | None = None

    def made_by(self, value: str, *op_types: str):
        """The node making value through Identities, if its op type is one of op_types."""
        node = self.producer.get(value)
        while node is not None and node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            node = self.producer.get(node.input[0])
        if node is None or node.domain not in ("", "ai.onnx") or node.op_type not in op_types:
            return None
        return node

    def root(self, value: str) -> str:
        """value through Identities back to where it is made."""
        node = self.producer.get(value)
        while node is not None and node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            value = node.input[0]
            node = self.producer.get(value)
        return value

    def constant(self, value: str, depth: int = 0):
        """value's array where it is computed from initializers alone by a few shape and
        arithmetic ops (evaluated here with numpy, as ONNX defines them), else None."""
        if value in self._values:
            return self._values[value]
        result = None
        if value in self.initializers:
            t = self.initializers[value]
            result = numpy_helper.to_array(t) if int(np.prod(t.dims)) <= 1 << 16 else None
        elif depth < 32:
            node = self.producer.get(value)
            if node is not None and node.domain in ("", "ai.onnx") and node.op_type in _CONSTANT_OPS and len(node.output) == 1:
                args = [self.constant(i, depth + 1) if i else None for i in node.input]
                if all(a is not None for a, i in zip(args, node.input) if i):
                    result = _evaluate(node, args)
        self._values[value] = result
        return result

    def shape(self, value: str):
        return self.known[value][1] if value in self.known else None


def _evaluate(node, args):
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        op = node.op_type
        if op == "Identity":
            return args[0]
        if op in ("Add", "Sub", "Mul"):
            return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](args[0], args[1]).astype(args[0].dtype)
        if op == "Unsqueeze":
            out = args[0]
            for axis in sorted(int(a) % (out.ndim + len(args[1])) for a in args[1]):
                out = np.expand_dims(out, axis)
            return out
        if op == "Squeeze":
            return np.squeeze(args[0], tuple(int(a) for a in args[1])) if len(args) > 1 and args[1] is not None else np.squeeze(args[0])
        if op == "Reshape":
            shape = [d if d != 0 else args[0].shape[i] for i, d in enumerate(args[1].tolist())]
            return args[0].reshape(shape)
        if op == "Expand":
            return np.broadcast_to(args[0], np.broadcast_shapes(args[0].shape, tuple(args[1].tolist()))).copy()
        if op == "Cast":
            return args[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
        if op == "Range":
            return np.arange(args[0], args[1], args[2]).astype(args[0].dtype)
        if op == "Concat":
            return np.concatenate(args, attrs["axis"])
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return None


def _positions(g: _Graph, value: str):
    """(S, p) for a value that is arange(S) + p, an int64 vector: S the name of the Range's
    limit (or the int, where arange(S) is a constant), p the name of a 0-d int64 (through
    Identities and a rank-keeping Expand); else None."""
    add = g.made_by(value, "Add")
    if add is None or g.shape(value) is None or len(g.shape(value)) != 1 or g.known[value][0] != torch.int64:
        return None
    for ranged, offset in (add.input, add.input[::-1]):
        size = None
        r = g.made_by(ranged, "Range")
        if r is not None:
            start, delta = g.constant(r.input[0]), g.constant(r.input[2])
            if start is None or delta is None or start.shape != () or delta.shape != () or int(start) != 0 or int(delta) != 1:
                continue
            if not same_shape(g.shape(ranged) or (None,), g.shape(value)):
                continue
            size = g.root(r.input[1])
        else:
            steps = g.constant(ranged)
            if steps is None or steps.ndim != 1 or steps.dtype != np.int64 or not np.array_equal(steps, np.arange(steps.size)):
                continue
            if tuple(g.shape(value)) != (steps.size,):
                continue
            size = int(steps.size)
        p = g.root(offset)
        expand = g.made_by(p, "Expand")
        if expand is not None and g.shape(p) == () and g.shape(expand.input[0]) == ():
            p = g.root(expand.input[0])
        if g.shape(p) != () or g.known[p][0] != torch.int64:
            continue
        return size, p
    return None


class StructuralIds:
    """An int per value, equal for values computed alike: the same ops, attributes and
    constants from the same graph inputs, through Identities (transformers computes
    cache_position[0] and the sequence length anew in every layer). Hash-consed: a value's
    id is interned from its node's op, attributes and its inputs' ids, each computed once, so
    a graph with reconvergent paths (residual adds, SE gates) costs time linear in its size."""

    def __init__(self, producer: dict, initializers: dict):
        self.producer, self.initializers = producer, initializers  # producer: value -> node
        self.ids: dict[str, int] = {}
        self.interned: dict[tuple, int] = {}

    def __call__(self, value: str) -> int:
        ids, stack, expanded = self.ids, [value], set()
        while stack:  # (iterative: a deep graph's paths would pass Python's recursion limit)
            v = stack[-1]
            if v in ids:
                stack.pop()
                continue
            node = self.producer.get(v)
            if v in self.initializers:
                t = self.initializers[v]
                small = int(np.prod(t.dims)) <= 64
                structure = ("const", t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes() if small else v)
            elif node is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                structure = ("value", v)
            else:
                missing = [i for i in node.input if i and i not in ids]
                if missing and v in expanded:  # its inputs came back without ids: a cycle (graphs have none)
                    structure = ("value", v)
                elif missing:
                    expanded.add(v)
                    stack.extend(missing)
                    continue
                elif node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
                    ids[v] = ids[node.input[0]]
                    stack.pop()
                    continue
                else:
                    attrs = tuple(sorted(a.SerializeToString() for a in node.attribute))
                    inputs = tuple(ids[i] if i else -1 for i in node.input)
                    structure = (node.op_type, node.domain, attrs, inputs, list(node.output).index(v))
            ids[v] = self.interned.setdefault(structure, len(self.interned))
            stack.pop()
        return ids[value]


def _key(g: _Graph, value: str) -> int:
    """value's StructuralIds id in g."""
    if g._keys is None:
        g._keys = StructuralIds(g.producer, g.initializers)
    return g._keys(value)


def _same_positions(g: _Graph, a, b) -> bool:
    """Two (S, p) of _positions are the same sizes and offsets."""
    def key(x):
        if isinstance(x, str):
            c = g.constant(x)
            if c is None or c.ndim != 0 or c.dtype.kind != "i":
                return ("value", _key(g, x))
            x = int(c)
        return ("int", x)

    return a is not None and b is not None and all(key(x) == key(y) for x, y in zip(a, b))


def _int_list(g: _Graph, value: str):
    """A small int64 vector (a shape) as a list of ints and names of 0-d values (sizes computed
    per call, by their root), where Concat, Reshape/Unsqueeze of a 0-d value and constants
    make it; else None."""
    c = g.constant(value)
    if c is not None:
        return [int(x) for x in c.reshape(-1)] if c.ndim <= 1 and c.dtype.kind == "i" else None
    node = g.producer.get(value)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Identity":
        return _int_list(g, node.input[0])
    if node.op_type == "Concat":
        parts = [_int_list(g, i) for i in node.input]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]
    one = node.op_type == "Reshape" and (g.constant(node.input[1]) is not None and g.constant(node.input[1]).reshape(-1).tolist() in ([1], [-1]))
    if one or (node.op_type == "Unsqueeze" and g.shape(node.input[0]) == ()):
        inner = _int_list(g, node.input[0]) if g.shape(node.input[0]) != () else None
        return inner if inner is not None and len(inner) == 1 else [g.root(node.input[0])]
    return None


def _to_root(g: _Graph, value: str):
    """(root, chain): value made from root by Identities, Unsqueezes, Reshapes and additions
    of an integer 0 of at most one dim (chain, the last one first)."""
    chain = []
    node = g.producer.get(value)
    while node is not None and node.domain in ("", "ai.onnx") and node.op_type in ("Identity", "Unsqueeze", "Reshape", "Add"):
        if node.op_type == "Add":
            zero = [i for i, v in enumerate(node.input) if _is_int_zero(g.constant(v))]
            if not zero or _positions(g, value) is not None:  # (arange(1) + p is [0] + p: positions)
                break
            node = helper.make_node("Identity", [node.input[1 - zero[0]]], list(node.output))
        chain.append(node)
        value = node.input[0]
        node = g.producer.get(value)
    return value, chain


def _is_int_zero(a) -> bool:
    return a is not None and a.dtype.kind == "i" and a.size == 1 and a.ndim <= 1 and int(a.flat[0]) == 0


def _layout(g: _Graph, chain: list, size, axis_wanted: int, rank_wanted: int) -> bool:
    """Whether a vector of `size` elements (the name of a 0-d value, or an int) lies along
    axis_wanted of rank_wanted dims after chain (as _to_root gives it), every other size 1.
    (One element lies along any axis.)"""
    found = _vector_axis(g, chain, size)
    if found is None:
        return False
    return found[1] == rank_wanted and (found[0] == axis_wanted or size == 1)


def _vector_axis(g: _Graph, chain: list, size):
    """(axis, rank) of the vector after chain (see _layout); None where a step's result
    cannot be told so."""
    axis, rank = 0, 1
    for node in reversed(chain):
        if node.op_type == "Unsqueeze":
            axes = g.constant(node.input[1]) if len(node.input) > 1 else None
            if axes is None:
                return None
            rank += axes.size
            for a in sorted(int(a) % rank for a in axes.reshape(-1)):
                if a <= axis:
                    axis += 1
        elif node.op_type == "Reshape":
            target = _int_list(g, node.input[1])
            if target is None:
                return None
            if size == 1:  # one element: any target of ones (or -1)
                if any(d not in (1, -1) for d in target):
                    return None
                axis, rank = 0, len(target)
                continue
            same = (lambda d: d == size) if isinstance(size, int) else (lambda d: isinstance(d, str) and _key(g, d) == _key(g, size))
            sized = [i for i, d in enumerate(target) if d == -1 or same(d)]
            if len(sized) != 1 or any(d != 1 for i, d in enumerate(target) if i != sized[0]):
                return None
            axis, rank = sized[0], len(target)
    return axis, rank


def _causal_offset_mask(g: _Graph, mask: str):
    """((S, p), L) where mask, a float32 additive mask (.., S, L), is 0 where key j <= p + i for
    query i and -inf elsewhere: Expand(Where(LessOrEqual(arange(L), arange(S) + p), 0, -inf)),
    as transformers' static-cache masks are spelled (the keys a constant arange(L) on the
    last axis, the queries' positions on the one before); else None."""
    where = g.made_by(mask, "Where", "Expand")
    while where is not None and where.op_type == "Expand":
        where = g.made_by(where.input[0], "Where", "Expand")
    if where is None or g.known.get(mask, (None,))[0] not in (None, torch.float32):
        return None
    zero, minus_inf = g.constant(where.input[1]), g.constant(where.input[2])
    if zero is None or minus_inf is None or zero.size != 1 or minus_inf.size != 1 or zero.dtype != np.float32:
        return None
    if float(zero.flat[0]) != 0.0 or float(minus_inf.flat[0]) != -np.inf:
        return None
    condition = g.made_by(where.input[0], "LessOrEqual", "Expand")
    while condition is not None and condition.op_type == "Expand":
        condition = g.made_by(condition.input[0], "LessOrEqual", "Expand")
    if condition is None:
        return None
    keys, queries = condition.input
    key_values = g.constant(keys)
    if key_values is None or key_values.ndim < 2 or any(d != 1 for d in key_values.shape[:-1]):
        return None
    length = key_values.shape[-1]
    if not np.array_equal(key_values.reshape(-1), np.arange(length)):
        return None
    root, chain = _to_root(g, queries)
    found = _positions(g, root)
    if found is None or not _layout(g, chain, found[0], key_values.ndim - 2, key_values.ndim):
        return None
    return found, length


def _checked_positions(g: _Graph, indices: str, failures: set, length: int, value: bool = False):
    """(S, p) where indices (B, H, S, D) int64 hold position arange(S) + p along axis 2 for
    every b, h, d, as ortlite's checked index lowers index_copy's (Where(outside, 0, P), with
    `outside` read by a failure output: the call raises when a position is outside
    [0, length)); else None."""
    expand = g.made_by(indices, "Expand")
    if expand is None:
        return None
    root, chain = _to_root(g, expand.input[0])
    where = g.made_by(root, "Where")
    if where is None:
        return None
    zero = g.constant(where.input[1])
    if zero is None or zero.size != 1 or int(zero.flat[0]) != 0:
        return None
    outside = g.made_by(where.input[0], "GreaterOrEqual")
    raising = [g.producer.get(f) for f in failures]
    if outside is None or not any(r is not None and r.op_type == "ReduceMax" and _key(g, r.input[0]) == _key(g, outside.output[0]) for r in raising):
        return None
    position, bound = (g.made_by(v, "Cast") for v in outside.input)
    if position is None or bound is None or g.root(position.input[0]) != g.root(where.input[2]):
        return None
    if any(a.name == "to" and a.i != TensorProto.UINT64 for n in (position, bound) for a in n.attribute):
        return None
    limit = g.constant(bound.input[0])
    if limit is None or limit.size != 1 or int(limit.flat[0]) != length:
        return None
    found = _positions(g, g.root(where.input[2]))  # (the Where has P's shape: the check's, and a scalar 0)
    found = found if found is not None and _layout(g, chain, found[0], 2, 4) else None
    return (found, g.root(where.input[2])) if value and found else found


def shared_cache_offsets(graph: onnx.GraphProto, known: dict[str, tuple], failures: set, checks: list) -> int:
    """Caches written at checked positions arange(S) + p (see _checked_positions) whose offsets
    p are 0-d int64 graph inputs (transformers' StaticCache keeps a length counter per layer,
    all equal as generate runs; under torch.compile they are arguments), and the positions
    rotary embeddings are computed from given as graph inputs P (1, S) or (S,) (position_ids,
    which generate makes arange(S) + p): every read of every offset reads one value instead,
    and every read of P reads arange(S) + that value, through
        Gather([p0], Cast(Not(p1 == p0 And p2 == p0 ...)))          (the offsets: a cache write's origin)
        Gather([that], Cast(Not(all(P == arange(S) + p0) ...)))    (P: a Cos or Sin's origin)
    p0 where all hold; where one fails, an index out of bounds, for which ONNX Runtime fails the
    run at that node, before any node reading an offset or P (the cache writes, in place) has
    run: the run fails to torch (Backend._after_run_failure: that Gather's origin runs in torch
    from then on, the cache writes or the rotary tables (the graph compiled again then reads the
    offsets as one still); ortlite.compile raises). Where it runs, every value is the one
    the graph computed before; each layer's positions, their range check, its attention's
    lengths and mask check are then computed alike, once (ONNX Runtime's common subexpression
    elimination; ortlite's repeated_checks for the failure outputs), and rotary_inside_attention
    sees the rotary's positions as the attention's. P: graph inputs a Cos or Sin is computed from
    (see _rotary_position_inputs). Offsets and P read inside a subgraph are
    left; P only where S is a number. failures: names of the conditions that make the call
    raise. checks (a list): (each Gather's node name, the ONNX node whose origin it takes) is
    appended. Returns the number of offsets and P read so."""
    if not _has(graph, "ScatterElements"):  # (no cache writes: nothing to read once)
        return 0
    g = _Graph(graph, known)
    offsets: dict[str, tuple] = {}  # offset -> (the first ScatterElements writing at arange(S) + it, S)
    for node in graph.node:
        if node.op_type != "ScatterElements" or node.domain not in ("", "ai.onnx") or node.input[0] not in g.inputs:
            continue
        shape = g.shape(node.input[0])
        if not shape or len(shape) != 4 or not isinstance(shape[2], int):
            continue
        found = _checked_positions(g, node.input[1], failures, shape[2])
        p = found[1] if found else None
        if p in g.inputs and g.known.get(p) == (torch.int64, ()):
            offsets.setdefault(p, (node.name, found[0]))
    branch_reads = set()
    for n in graph.node:
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                branch_reads |= set().union(*(_reads(m) for m in sub.node))
    shared = [p for p in offsets if p not in branch_reads]
    sizes = {offsets[p][1] for p in shared}
    size = sizes.pop() if len(sizes) == 1 and isinstance(next(iter(sizes)), int) else None
    given, cos = _rotary_position_inputs(g, size) if size is not None else ([], None)
    given = [x for x in given if x not in branch_reads]
    if not shared or len(shared) + len(given) < 2:
        return 0
    fresh, constant = _new_values(graph, "ortlite_offsets")
    first, one = shared[0], fresh("ortlite_cache_offset")
    made = {x: fresh(f"{x}_positions") for x in given}  # P -> arange(S) + one, in P's shape
    for n in graph.node:
        for k, x in enumerate(n.input):
            if x in shared:
                n.input[k] = one
            elif x in made:
                n.input[k] = made[x]
    nodes = []

    def op(op_type, *inputs, out=None, **attrs):
        out = out or fresh(f"ortlite_offsets_{op_type.lower()}")
        nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def positions(p, x, out=None):
        """arange(S) + p in x's shape."""
        vector = op("Add", constant(np.arange(size, dtype=np.int64)), p)
        known[vector] = (torch.int64, (size,))
        return op("Identity", vector, out=out) if len(known[x][1]) == 1 else op("Unsqueeze", vector, constant([0]), out=out)

    gates = []  # (conditions, the ONNX node whose origin runs in torch where one is false, tag)
    if len(shared) > 1:
        gates.append(([op("Equal", p, first) for p in shared[1:]], offsets[shared[-1]][0], "offsets_equal"))
    if given:
        equal = [op("Cast", op("Equal", x, positions(first, x)), to=TensorProto.INT32) for x in given]
        gates.append(([op("Cast", op("ReduceMin", e, keepdims=0), to=TensorProto.BOOL) for e in equal], cos, "positions_equal"))
    value = first
    for k, (conditions, origin, tag) in enumerate(gates):
        same = conditions[0]
        for c in conditions[1:]:
            same = op("And", same, c)
        index = op("Cast", op("Not", same), to=TensorProto.INT64)
        name = fresh(f"{origin}_{tag}")
        out = one if k == len(gates) - 1 else fresh(f"ortlite_cache_offset_{tag}")
        nodes.append(helper.make_node("Gather", [op("Reshape", value, constant([1])), index], [out], name=name, axis=0))  # (index 1 of 1 element: the run fails here)
        checks.append((name, origin))
        value = out
    known[one] = (torch.int64, ())
    for x in given:
        positions(one, x, made[x])
        known[made[x]] = known[x]
    nodes += list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(shared) + len(given)


def _rotary_position_inputs(g: _Graph, size: int):
    """(the int64 graph inputs (1, size) or (size,) that a Cos or Sin (a rotary embedding's
    tables, as ortlite lowers aten) is computed from, the ONNX name of one such Cos or Sin)."""
    found, seen, reached = [], set(), None
    for n in g.graph.node:
        if n.op_type not in ("Cos", "Sin") or n.domain not in ("", "ai.onnx"):
            continue
        stack, before = [n.input[0]], len(found)
        while stack:
            v = stack.pop()
            if v in seen or not v:
                continue
            seen.add(v)
            if v in g.inputs:
                if g.known.get(v, (None,))[0] == torch.int64 and tuple(g.known[v][1]) in ((1, size), (size,)):
                    found.append(v)
                continue
            node = g.producer.get(v)
            if node is not None:
                stack.extend(node.input)
        if len(found) > before and reached is None:
            reached = n.name
    return sorted(found), reached


def proven_attention_masks(
    graph: onnx.GraphProto, known: dict[str, tuple], failures: set, runtime_checks: list | None = None, checked_masks: dict | None = None
) -> int:
    """ortlite lowers attention under a mask it cannot see into as If(a row is fully masked,
    the written-out ops, ONNX Attention). Where the mask is a static cache's causal mask from
    positions arange(S) + p (see _causal_offset_mask) and the same positions are checked
    where the cache is written (ScatterElements whose indices are _checked_positions), a
    fully masked row needs p < 0, for which the call raises: the If becomes its Attention,
    in the main graph, where the other attention rewrites see it. failures: names of the
    graph outputs that make the call raise.

    runtime_checks (a list): where the mask is Where(B, 0, -inf) of a bool graph input B
    (the causal mask HF generate makes outside the graph for a static cache), the If goes
    too, with a check per call that B is exactly that causal mask (key j <= P[i] for the
    checked positions P): (condition, reason, ONNX node name) is appended, for the graph to
    fail the run (to torch) where the condition is true; checked_masks[mask] = ((S, p), L),
    for static_cache_attention. Returns the count."""
    if not (_has(graph, "ScatterElements") and _has(graph, "If")):  # (the masks of a static cache's attention)
        return 0
    g = _Graph(graph, known)
    fresh, constant = _new_values(graph, "ortlite_mask_check")
    checked = []  # ((S, p), L, the positions' value, the ScatterElements)
    for node in graph.node:
        if node.op_type == "ScatterElements" and node.domain in ("", "ai.onnx") and (node.input[0] in g.inputs or node.input[0] in g.initializers):
            shape = g.shape(node.input[0])
            if shape and len(shape) == 4 and isinstance(shape[2], int):
                found = _checked_positions(g, node.input[1], failures, shape[2], value=True)
                if found:
                    checked.append((found[0], shape[2], found[1], node.output[0]))
    if not checked:
        return 0
    count, added = 0, {}
    for i, node in enumerate(graph.node):
        if node.op_type != "If" or len(node.output) != 1:
            continue
        branch = next((a.g for a in node.attribute if a.name == "else_branch"), None)
        if branch is None or len(branch.node) != 1 or len(branch.output) != 1:
            continue
        attention = branch.node[0]
        if attention.op_type != "Attention" or attention.domain not in ("", "ai.onnx") or attention.output[0] != branch.output[0].name:
            continue
        if len(attention.input) != 4 or any(a.name == "is_causal" and a.i for a in attention.attribute):
            continue
        mask = attention.input[3]
        found = _causal_offset_mask(g, mask)
        if found is not None and not any(_same_positions(g, found[0], c[0]) and found[1] == c[1] for c in checked):
            continue
        if found is None:
            if runtime_checks is None or checked_masks is None:
                continue
            own = _written_by(g, attention.input[1])  # the cache this attention reads, and its write's positions
            mine = [c for c in checked if own is not None and c[3] == own]
            check = _mask_check(g, mask, attention.input[0], mine, constant, fresh)
            if check is None:
                continue
            nodes, condition, found = check
            added[i] = nodes
            runtime_checks.append((condition, "the attention mask is not the causal mask of the cache positions", node.name))
            checked_masks[mask] = found
        rewritten = helper.make_node("Attention", list(attention.input), [node.output[0]], name=node.name)
        rewritten.attribute.extend(attention.attribute)
        graph.node[i].CopyFrom(rewritten)
        count += 1
    if count:
        nodes = [m for i, n in enumerate(graph.node) for m in added.get(i, []) + [n]]
        nodes = live_nodes(nodes, g.outputs | {c for c, _, _ in runtime_checks or ()})
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _written_by(g: _Graph, value: str):
    """The ScatterElements output value is read from, through Identities, Reshapes, Expands
    and Unsqueezes (transformers' repeat_kv), else None."""
    node = g.producer.get(value)
    while node is not None and node.domain in ("", "ai.onnx") and node.op_type in ("Identity", "Reshape", "Expand", "Unsqueeze"):
        value = node.input[0]
        node = g.producer.get(value)
    return value if node is not None and node.op_type == "ScatterElements" else None


def _mask_check(g: _Graph, mask: str, q: str, checked: list, constant, fresh):
    """(nodes, condition, ((S, p), L)) checking per call that mask, Where(B, 0, -inf) of a bool
    graph input B (1, 1, S, L), is the causal mask of one of the checked cache positions
    (P, of L keys): condition is true where B differs from key j <= P[i]. None where mask is
    not so or no cache of L positions is written at positions of q's length."""
    where = g.made_by(mask, "Where")
    if where is None or g.known.get(mask, (None,))[0] not in (None, torch.float32):
        return None
    zero, minus_inf = g.constant(where.input[1]), g.constant(where.input[2])
    if zero is None or minus_inf is None or zero.size != 1 or minus_inf.size != 1 or float(zero.flat[0]) != 0.0 or float(minus_inf.flat[0]) != -np.inf:
        return None
    bools = g.root(where.input[0])
    shape = g.shape(bools)
    if bools not in g.inputs or shape is None or len(shape) != 4 or g.known[bools][0] != torch.bool or q not in g.known:
        return None
    length = shape[3]
    if not isinstance(length, int) or any(not (isinstance(d, int) and d == 1) for d in shape[:2]) or not same_shape(shape[2:3], g.known[q][1][2:3]):
        return None
    match = next(((found, positions) for found, cache_length, positions, _ in checked if cache_length == length and same_shape(g.shape(positions) or (None,), shape[2:3])), None)
    if match is None:
        return None
    found, positions = match
    causal, rows, differ, count, condition = (fresh(f"{mask}_{x}") for x in ("causal", "rows", "differ", "count", "not_causal"))
    nodes = [
        helper.make_node("Unsqueeze", [positions, constant([0, 1, 3])], [rows]),
        helper.make_node("LessOrEqual", [constant(np.arange(length, dtype=np.int64).reshape(1, 1, 1, length)), rows], [causal]),
        helper.make_node("Xor", [bools, causal], [differ]),
        helper.make_node("ReduceMax", [fresh(f"{mask}_differ_int")], [count], keepdims=0),
        helper.make_node("Cast", [count], [condition], to=TensorProto.BOOL),
    ]
    nodes.insert(3, helper.make_node("Cast", [differ], [nodes[3].input[0]], to=TensorProto.INT32))
    return nodes, condition, (found, length)


def static_cache_attention(
    graph: onnx.GraphProto, known: dict[str, tuple], failures: set, inplace: list | None = None, mutations: dict | None = None,
    checked_masks: dict | None = None,
) -> int:
    """Attention over a static KV cache as transformers' StaticCache spells it, lowered:
        Kc = ScatterElements(K, positions, k_new, axis=2)   (K a graph input (1, Hkv, L, D); positions
        Vc = ScatterElements(V, positions, v_new, axis=2)    arange(S) + p, checked)
        Attention(q, Kc, Vc, causal mask from arange(S) + p)   (see _causal_offset_mask)
    becomes ONNX Runtime's GroupQueryAttention(q, k_new, v_new, K, V, seqlens_k = p + S - 1,
    total_sequence_length = p + S, clamped to [S, L]) on token rows: it writes k_new and v_new at rows p..p+S-1
    of its present key and value (rows below p from K and V) and attends each query i to keys
    0..p+i, the same keys the mask leaves, with the same arithmetic per row (the mask's other
    keys weigh exp(-inf) = 0). inplace (a list): where Kc and Vc are the new values of K and
    V (mutations: output -> the input it is the new value of) and nothing else reads K and
    V, the present key and value are Kc and Vc, written into K's and V's memory (the kernel's
    shared past/present buffer: it writes rows p..p+S-1 alone, and the others stay K's and
    V's, as eager leaves them); the pairs (Kc, K), (Vc, V) are appended, for the runner to
    bind so (LoweredGraph.inplace). Else (inplace None) the present rows from p + S on are not
    K's: a Where takes them from K, so Kc and Vc are eager's values all the same.
    Only where the cache positions and the mask's are the same arange(S) + p, the call
    raises for positions outside [0, L) (p is clamped for the kernel, which then stays in
    its buffers), batch 1 (the kernel's condition for S > 1 with a past), float32, head
    size a multiple of 8, Attention in its 4-D form reading the cache's Hkv heads (after
    fusions.attention_takes_grouped_heads). Returns the count."""
    if not (_has(graph, "ScatterElements") and _has(graph, "Attention")):
        return 0
    g = _Graph(graph, known)
    fresh, constant = _new_values(graph, "ortlite_gqa_const")
    rewritten, removed = {}, set()

    def scatter(value):
        node = g.made_by(value, "ScatterElements")
        if node is None or (node.input[0] not in g.inputs and node.input[0] not in g.initializers):
            return None
        if any(a.name == "axis" and a.i not in (2, -2) for a in node.attribute) or any(a.name == "reduction" and a.s not in (b"none", "none") for a in node.attribute):
            return None
        if not any(a.name == "axis" for a in node.attribute):
            return None
        shape, new = g.shape(node.input[0]), g.shape(node.input[2])
        if not shape or len(shape) != 4 or not all(isinstance(d, int) for d in shape) or not new or len(new) != 4:
            return None
        if g.known[node.input[0]][0] != torch.float32 or not same_shape((new[0], new[1], new[3]), (shape[0], shape[1], shape[3])):
            return None
        found = _checked_positions(g, node.input[1], failures, shape[2])
        return (node, found) if found else None

    def rows_of(heads, n, d):
        """(token rows (B, S, N*D) of heads (B, N, S, D), nodes making them)."""
        rows = _token_rows(g.producer, known, heads)
        if rows is not None:
            return rows, []
        swapped, out = fresh(heads + "_bsnd"), fresh(heads + "_rows")
        b, _, s, _ = known[heads][1]
        known[swapped], known[out] = (torch.float32, (b, s, n, d)), (torch.float32, (b, s, n * d))
        return out, [
            helper.make_node("Transpose", [heads], [swapped], perm=HEADS_PERM),
            helper.make_node("Reshape", [swapped, constant([0, 0, n * d])], [out]),
        ]

    for node in graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.input) != 4 or len(node.output) != 1:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if set(attrs) - {"scale", "is_causal"} or attrs.get("is_causal", 0):
            continue
        q, k, v, mask = node.input
        ks, vs = scatter(k), scatter(v)
        masked = _causal_offset_mask(g, mask) or (checked_masks or {}).get(mask)
        if ks is None or vs is None or masked is None or q not in known or known[q][0] != torch.float32:
            continue
        (k_node, k_pos), (v_node, v_pos) = ks, vs
        cache = g.shape(k_node.input[0])
        batch, kv_heads, length, head = cache
        if g.shape(v_node.input[0]) != cache or masked[1] != length or batch != 1 or head % 8:
            continue
        if not _same_positions(g, masked[0], k_pos) or not _same_positions(g, v_pos, k_pos):
            continue
        qb, heads, s, qd = known[q][1]
        if not isinstance(heads, int) or heads % kv_heads or qd != head or not same_shape((qb,), (batch,)):
            continue
        if not same_shape(known[k_node.input[2]][1], (batch, kv_heads, s, head)) or not same_shape(known[v_node.input[2]][1], (batch, kv_heads, s, head)):
            continue
        size, p = k_pos
        if isinstance(size, int):
            size = constant(np.array(size, np.int64))
        nodes = []
        q_rows, made = rows_of(q, heads, head)
        nodes += made
        k_rows, made = rows_of(k_node.input[2], kv_heads, head)
        nodes += made
        v_rows, made = rows_of(v_node.input[2], kv_heads, head)
        nodes += made

        def op(op_type, *inputs, **kw):
            out = fresh(f"{node.name}_{op_type.lower()}")
            nodes.append(helper.make_node(op_type, list(inputs), [out], **kw))
            return out

        # p + S clamped to [S, L] in int32 (the call raises outside: positions are checked; the
        # kernel then stays in its buffers, also where a p past 2**31 wraps in the cast)
        size32 = op("Cast", size, to=TensorProto.INT32)
        total32 = op("Clip", op("Cast", op("Add", p, size), to=TensorProto.INT32), size32, constant(np.array(length, np.int32)))
        seqlens = op("Reshape", op("Sub", total32, constant(np.array(1, np.int32))), constant([1]))
        shared = inplace is not None and all(
            g.readers.get(n.input[0]) == [n] and (mutations or {}).get(n.output[0]) == n.input[0] for n in (k_node, v_node)
        )
        out_rows = fresh(node.output[0] + "_rows")
        if shared:
            present_k, present_v = k_node.output[0], v_node.output[0]
            inplace += [(present_k, k_node.input[0]), (present_v, v_node.input[0])]
        else:
            present_k, present_v = fresh(k_node.output[0] + "_present"), fresh(v_node.output[0] + "_present")
        scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / float(np.sqrt(head))
        nodes.append(
            helper.make_node(
                "GroupQueryAttention", [q_rows, k_rows, v_rows, k_node.input[0], v_node.input[0], seqlens, total32],
                [out_rows, present_k, present_v], name=node.name, domain=MS_DOMAIN, num_heads=heads, kv_num_heads=kv_heads, scale=scale,
            )
        )  # fmt: skip
        if not shared:  # rows from p + S on: the buffers' own (in a buffer of its own, the kernel leaves them unset)
            stale = op("GreaterOrEqual", constant(np.arange(length, dtype=np.int32).reshape(1, 1, length, 1)), total32)
            nodes.append(helper.make_node("Where", [stale, k_node.input[0], present_k], [k_node.output[0]]))
            nodes.append(helper.make_node("Where", [stale, v_node.input[0], present_v], [v_node.output[0]]))
        # the heads the Attention gave, from the rows (a Transpose pair the next pass cancels)
        heads_out = fresh(node.output[0] + "_bsnd")
        nodes.append(helper.make_node("Reshape", [out_rows, constant([0, 0, heads, head])], [heads_out]))
        nodes.append(helper.make_node("Transpose", [heads_out], [node.output[0]], perm=HEADS_PERM))
        known[out_rows] = (torch.float32, (batch, s, heads * head))
        known[heads_out] = (torch.float32, (batch, s, heads, head))
        for x in (q_rows, k_rows, v_rows, out_rows):
            graph.value_info.append(helper.make_tensor_value_info(x, TORCH_TO_ONNX[known[x][0]], [onnx_dim(d) for d in known[x][1]]))
        rewritten[id(node)] = nodes
        removed.update((id(k_node), id(v_node)))
    if not rewritten:
        return 0
    nodes = [m for n in graph.node if id(n) not in removed for m in rewritten.get(id(n), [n])]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, g.outputs))
    _cancel_head_transposes(graph, known)
    return len(rewritten)


def _cancel_head_transposes(graph: onnx.GraphProto, known: dict[str, tuple]) -> None:
    """rows -> Reshape (B, S, N, D) -> Transpose(0, 2, 1, 3) -> [passes] -> Transpose(0, 2, 1, 3)
    -> Reshape (B, S, N*D): the second Reshape's result is the rows (an Identity)."""
    producer = {o: n for n in graph.node for o in n.output}
    for i, node in enumerate(graph.node):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or node.output[0] not in known:
            continue
        back = producer.get(node.input[0])
        while back is not None and _passes(back, known):
            back = producer.get(back.input[0])
        if back is None or back.op_type != "Transpose" or _perm(back) != HEADS_PERM:
            continue
        rows = _token_rows(producer, known, back.input[0])
        if rows is not None and same_shape(known[rows][1], known[node.output[0]][1]):
            graph.node[i].CopyFrom(helper.make_node("Identity", [rows], [node.output[0]], name=node.name))


def skip_simplified_norms(graph: onnx.GraphProto, known: dict[str, tuple]) -> int:
    """A residual sum read by an RMSNorm, as decoder blocks spell it:
        h = Add(x, y); SimplifiedLayerNormalization(h, w)   (h also read elsewhere, or not)
    becomes ONNX Runtime's SkipSimplifiedLayerNormalization(x, y, w) where the Add was, whose
    fourth output is the sum (x + y, computed as the Add did) for h's other readers: one
    kernel instead of two passes. Only float32 x and y of the same shape (the kernel does not
    broadcast), the norm over the last axis with a 1-D weight that is an initializer or a
    graph input (what fusions.fuse_rms_norm makes). Returns the count."""
    if not _has(graph, "SimplifiedLayerNormalization"):
        return 0
    g = _Graph(graph, known)
    replaced, removed = {}, set()
    for norm in graph.node:
        if norm.op_type != "SimplifiedLayerNormalization" or norm.domain not in ("", "ai.onnx") or len(norm.input) != 2 or len(norm.output) != 1:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
        weight = norm.input[1]
        if attrs.get("axis", -1) != -1 or (weight not in g.initializers and weight not in g.inputs):
            continue
        add = g.producer.get(norm.input[0])
        if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or id(add) in replaced:
            continue
        x, y = add.input
        if x not in known or y not in known or known[x][0] != torch.float32 or known[y][0] != torch.float32:
            continue
        if not same_shape(known[x][1], known[y][1]) or len(known[x][1]) < 2:
            continue
        replaced[id(add)] = helper.make_node(
            "SkipSimplifiedLayerNormalization", [x, y, weight], [norm.output[0], "", "", add.output[0]],
            name=norm.name, domain=MS_DOMAIN, epsilon=float(attrs.get("epsilon", 1e-5)),
        )  # fmt: skip
        removed.add(id(norm))
    if not replaced:
        return 0
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def repeated_checks(nodes: list, initializers: list, checks: list) -> list[bool]:
    """Per check (condition value name, message, kind: GraphBuilder.failures), whether an
    earlier one has the same message and kind and a condition computed alike: the same ops,
    attributes and constants from the same graph inputs (a decoder checks its cache
    positions, the same arange(S) + cache_position[0], once per cache it writes)."""
    key = StructuralIds({o: n for n in nodes for o in n.output}, {t.name: t for t in initializers})
    seen, repeated = set(), []
    for condition, message, kind in checks:
        k = (key(condition), message, kind)
        repeated.append(k in seen)
        seen.add(k)
    return repeated


PACK_MOST = 4  # products packed into one at most


def packed_products(graph: onnx.GraphProto, known: dict[str, tuple], into: tuple | None = None, frozen: frozenset = frozenset()) -> int:
    """Products of one input by constant weights, as a decoder's q, k and v projections (and
    its MLP's gate and up) read the normed hidden states:
        MatMul(x, W1), MatMul(x, W2), ...   (each W an initializer (K, Ni), or one's Transpose)
    become one MatMul(x, [W1 W2 ...]) and a Split of its columns: one kernel call reading x
    once instead of several, the same dot products (each column is x times that column).
    Only float32 x and weights, 2-D weights of the same K, at most PACK_MOST together, in
    the order the graph has them; into: only products whose results reach an op of these
    types (through RotaryEmbedding), None: all. The packed weight is an initializer of its own (the
    separate ones go where nothing else reads them). frozen: names of graph inputs that become
    initializers at session build (ortlite.frozen, torch.compile): weights that are those (or
    their Transposes) are packed by a Concat of the products' weight operands, which ONNX
    Runtime folds into one initializer when it builds the session (the separate ones then go,
    read by nothing else: the memory of the weights once, as before); other graph inputs
    (bound weights) are left. Returns the number of products packed."""
    initializers = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    fresh, _ = _new_values(graph, "ortlite_packed")

    def weight(b):
        """(initializer name, transposed) of a constant 2-D float32 weight, else None."""
        if b in initializers:
            t = initializers[b]
            return (b, False) if len(t.dims) == 2 and t.data_type == TensorProto.FLOAT else None
        if b in frozen:
            return (b, False) if known.get(b, (None, ()))[0] == torch.float32 and len(known[b][1]) == 2 else None
        node = producer.get(b)
        if node is not None and node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and _perm(node) in ([1, 0], None):
            found = weight(node.input[0])
            return (found[0], True) if found is not None and not found[1] else None
        return None

    readers: dict = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def feeds(value, depth=0):
        """The op types value reaches through RotaryEmbedding (a q or k on its way)."""
        found = set()
        for r in readers.get(value, []):
            found.add(r.op_type)
            if r.op_type == "RotaryEmbedding" and depth < 2:
                found |= feeds(r.output[0], depth + 1)
        return found

    groups: dict = {}
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        if into is not None and not feeds(node.output[0]) & set(into):
            continue
        x = node.input[0]
        if x not in known or known[x][0] != torch.float32 or len(known[x][1]) < 2:
            continue
        found = weight(node.input[1])
        if found is not None:
            groups.setdefault(x, []).append((node, found))
    replaced, removed, count = {}, set(), 0
    for x, members in groups.items():
        for start in range(0, len(members), PACK_MOST):
            chunk = members[start : start + PACK_MOST]
            shapes = []  # (K, N) of each product's weight operand
            for _, (name, transposed) in chunk:
                shape = tuple(initializers[name].dims) if name in initializers else known[name][1]
                shapes.append(shape[::-1] if transposed else shape)
            if len(chunk) < 2 or len({k for k, _ in shapes}) != 1 or not all(isinstance(d, int) for shape in shapes for d in shape):
                continue
            packed = fresh(chunk[0][0].name + "_packed_weight")
            nodes = []
            if all(name in initializers for _, (name, _) in chunk):
                arrays = [numpy_helper.to_array(initializers[name]) for _, (name, _) in chunk]
                arrays = [a.T if transposed else a for a, (_, (_, transposed)) in zip(arrays, chunk)]
                graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(np.concatenate(arrays, axis=1)), packed))
            else:  # (weights frozen at session build: ONNX Runtime folds the Transposes and the Concat then)
                operands = []
                for _, (name, transposed) in chunk:
                    if transposed:
                        operands.append(fresh(name + "_t"))
                        nodes.append(helper.make_node("Transpose", [name], [operands[-1]], perm=[1, 0]))
                    else:
                        operands.append(name)
                nodes.append(helper.make_node("Concat", operands, [packed], name=packed, axis=1))
            product = fresh(chunk[0][0].name + "_packed")
            sizes = fresh(packed + "_sizes")
            graph.initializer.append(numpy_helper.from_array(np.array([n for _, n in shapes], np.int64), sizes))
            nodes += [
                helper.make_node("MatMul", [x, packed], [product], name=chunk[0][0].name + "_packed"),
                helper.make_node("Split", [product, sizes], [n.output[0] for n, _ in chunk], name=chunk[0][0].name + "_split", axis=-1),
            ]
            x_shape = known[x][1]
            known[product] = (torch.float32, (*x_shape[:-1], sum(n for _, n in shapes)))
            replaced[id(chunk[0][0])] = nodes
            removed.update(id(n) for n, _ in chunk[1:])
            count += len(chunk)
    if not replaced:
        return 0
    nodes = [m for n in graph.node if id(n) not in removed for m in replaced.get(id(n), [n])]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, outputs))
    drop_unread_initializers(graph)
    return count


def scatters_in_place(graph: onnx.GraphProto, inplace: list, mutations: dict) -> int:
    """ScatterElements writing rows of an input the graph mutates (a static cache's
    index_copy_ that static_cache_attention left, as under torch.compile, where the mask is
    an argument): its output, that input's new value, is written into the input's memory
    (ONNX Runtime's CPU kernel copies data to its output only where they differ: in place,
    it writes the updates alone). Only where nothing else reads the input (it would see the
    new rows) and the output is that input's mutation (mutations: output -> input). Appends
    the pairs to inplace (LoweredGraph.inplace); returns their count."""
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in _reads(n):
            readers.setdefault(i, []).append(n)
    taken = {o for o, _ in inplace}
    count = 0
    for node in graph.node:
        if node.op_type != "ScatterElements" or node.domain not in ("", "ai.onnx") or node.output[0] in taken:
            continue
        if any(a.name == "reduction" and a.s not in (b"none", "none") for a in node.attribute):
            continue
        data, out = node.input[0], node.output[0]
        if mutations.get(out) == data and readers.get(data) == [node]:
            inplace.append((out, data))
            count += 1
    return count


_POSITIONWISE = ("Identity", "Cast", "Cos", "Sin")


def _position_slice(g: _Graph, value: str, positions: str):
    """The nodes computing value from the vector `positions` position by position (each
    element of value depends on one position alone: Unsqueezes, Casts, Cos/Sin, arithmetic
    with constants that broadcast along the positions' axis, Concat along another axis),
    in graph order, and value's (axis of the positions, rank); None where it is not so."""
    frozen = getattr(g, "frozen", frozenset())
    nodes, seen, stack = [], set(), [value]
    while stack:  # the nodes between positions and value
        v = stack.pop()
        if v == positions or v in seen or v in frozen or g.constant(v) is not None:
            continue
        seen.add(v)
        node = g.producer.get(v)
        if node is None or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            return None
        nodes.append(node)
        stack.extend(i for i in node.input if i)
    order = {id(n): i for i, n in enumerate(g.graph.node)}
    nodes.sort(key=lambda n: order[id(n)])
    layout = {positions: (0, 1)}
    for node in nodes:
        ins = [layout.get(i) for i in node.input]
        placed = [x for x in ins if x is not None]
        if not placed:
            return None
        axis, rank = placed[0]
        op = node.op_type
        if op in _POSITIONWISE or op == "Unsqueeze" and ins[0] is not None:
            if op == "Unsqueeze":
                axes = g.constant(node.input[1]) if len(node.input) > 1 else None
                if axes is None:
                    return None
                rank += axes.size
                for a in sorted(int(a) % rank for a in axes.reshape(-1)):
                    if a <= axis:
                        axis += 1
        elif op in ("Mul", "Add", "Sub", "Div") and len(placed) == 1:
            other = node.input[1] if ins[0] is not None else node.input[0]
            c = g.constant(other)
            c_shape = c.shape if c is not None else tuple(g.shape(other) or (None,))  # (a frozen weight: its shape)
            if not all(isinstance(d, int) for d in c_shape):
                return None
            out_rank = max(rank, len(c_shape))
            axis += out_rank - rank
            lead = out_rank - len(c_shape)  # c's dims align with the last ones
            if axis >= lead and c_shape[axis - lead] != 1:
                return None
            rank = out_rank
        elif op == "Concat" and len(placed) == len(ins) and all(x == placed[0] for x in placed):
            a = next(x.i for x in node.attribute if x.name == "axis")
            if a % rank == axis:
                return None
        else:
            return None
        layout[node.output[0]] = (axis, rank)
    return (nodes, layout[value]) if value in layout else None


def _position_table(g: _Graph, value: str, positions: str, length: int):
    """value (.., S, .., D) for positions 0..length-1, computed by ONNX Runtime as the graph
    would, as a (length, D) float32 array; None where value is not computed position by
    position from positions (see _position_slice) or is not of that form."""
    import onnxruntime

    found = _position_slice(g, value, positions)
    if found is None:
        return None
    nodes, (axis, rank) = found
    if axis != rank - 2:
        return None
    constants = {i for n in nodes for i in n.input if i and i != positions and i not in {m.output[0] for m in nodes}}
    initializers = [numpy_helper.from_array(np.asarray(g.constant(c)), c) for c in constants]
    graph = helper.make_graph(
        [helper.make_node(n.op_type, list(n.input), list(n.output), domain=n.domain, **{a.name: helper.get_attribute_value(a) for a in n.attribute}) for n in nodes],
        "ortlite_positions", [helper.make_tensor_value_info(positions, TensorProto.INT64, [length])],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, None)], initializers,
    )  # fmt: skip
    opset = next((o.version for o in g.opset if o.domain in ("", "ai.onnx")), 18)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (table,) = session.run(None, {positions: np.arange(length, dtype=np.int64)})
    except Exception:  # (a form the checks above let through that ONNX Runtime refuses: not rewritten)
        return None
    if table.dtype != np.float32 or table.ndim != rank or any(d != 1 for d in table.shape[:-2]) or table.shape[-2] != length:
        return None
    return table.reshape(length, table.shape[-1])


def _position_table_nodes(g: _Graph, value: str, positions: str, length: int, head: int, fresh, constant):
    """(nodes, name): value (1.., S, D) for positions 0..length-1 computed in the graph by a copy
    of the nodes computing it position by position from positions (see _position_slice), from
    constants and frozen weights alone (ONNX Runtime folds them when it builds the session,
    from the weights' values then), as a (length, head // 2) table: its first half; else None."""
    found = _position_slice(g, value, positions)
    shape = g.shape(value)
    if found is None or shape is None or found[1][0] != found[1][1] - 2 or shape[-1] != head or any(d != 1 for d in shape[:-2]):
        return None
    renamed = {positions: constant(np.arange(length, dtype=np.int64))}
    nodes = []
    for node in found[0]:
        out = renamed[node.output[0]] = fresh(node.output[0] + "_table")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes.append(helper.make_node(node.op_type, [renamed.get(i, i) for i in node.input], [out], domain=node.domain, **attrs))
    rows, half = fresh(value + "_table_rows"), fresh(value + "_table_half")
    nodes.append(helper.make_node("Reshape", [renamed[value], constant([length, head])], [rows]))
    nodes.append(helper.make_node("Slice", [rows, constant([0]), constant([head // 2]), constant([1])], [half]))
    return nodes, half


def rotary_inside_attention(graph: onnx.GraphProto, known: dict[str, tuple], opset, frozen: frozenset = frozenset()) -> int:
    """GroupQueryAttention (static_cache_attention's) on q, k and v that one packed product
    makes (packed_products: MatMul -> Split into q, k, v), q and k through RotaryEmbedding
    (fusions.rotary_before_attention: non-interleaved, on token rows) with caches cut from
    cos and sin computed position by position from the attention's positions arange(S) + p:
    the kernel takes the packed rows and rotates q and k itself (do_rotary) at positions
    p..p+S-1, from cos and sin tables of the L cache positions, computed now by ONNX
    Runtime from the graph's own nodes (the values the graph gives at those positions).
    Three nodes fewer per attention. Returns the count."""
    if not _has(graph, "GroupQueryAttention", MS_DOMAIN):
        return 0
    g = _Graph(graph, known)
    g.opset, g.frozen = opset, frozen
    fresh, constant = _new_values(graph, "ortlite_rotary_table")
    table_nodes = []  # (tables computed in the graph from frozen weights: first)
    tables: dict = {}
    count = 0
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or node.domain != MS_DOMAIN or len(node.input) != 7:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("do_rotary", 0):
            continue
        heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
        q_rot, k_rot, v = (g.producer.get(x) for x in node.input[:3])
        split = g.producer.get(node.input[2])
        if q_rot is None or k_rot is None or split is None or any(n.op_type != "RotaryEmbedding" for n in (q_rot, k_rot)):
            continue
        if split.op_type != "Split" or list(split.output) != [q_rot.input[0], k_rot.input[0], node.input[2]]:
            continue
        if any(len(n.input) != 3 or {a.name: helper.get_attribute_value(a) for a in n.attribute}.get("interleaved", 0) for n in (q_rot, k_rot)):
            continue
        if any({a.name: helper.get_attribute_value(a) for a in n.attribute}.get("rotary_embedding_dim", 0) for n in (q_rot, k_rot)):
            continue
        cache = g.shape(node.input[3])
        if cache is None or q_rot.input[1:] != k_rot.input[1:]:
            continue
        length, head = cache[2], cache[3]
        sizes = g.constant(split.input[1]) if len(split.input) > 1 else None
        if sizes is None or sizes.tolist() != [heads * head, kv_heads * head, kv_heads * head]:
            continue
        halves = []
        for half in q_rot.input[1:]:  # Slice(cos or sin, 0, D/2, last axis): the first half
            cut = g.made_by(half, "Slice")
            bounds = [g.constant(i) for i in cut.input[1:4]] if cut is not None and len(cut.input) == 4 else [None]
            if any(b is None for b in bounds) or [b.tolist() for b in bounds] != [[0], [head // 2], [-1]]:
                break
            halves.append(cut.input[0])
        if len(halves) != 2:
            continue
        positions = _attention_positions(g, node, halves[0])
        if positions is None or _attention_positions(g, node, halves[1]) != positions:
            continue
        made = []
        for x in halves:
            key = (x, positions, length)
            if key not in tables:
                in_graph = _position_table_nodes(g, x, positions, length, head, fresh, constant) if frozen else None
                if in_graph is not None and any(i in frozen for n in in_graph[0] for i in n.input):
                    table_nodes += in_graph[0]
                    tables[key] = in_graph[1]
                else:
                    table = _position_table(g, x, positions, length)
                    tables[key] = None if table is None or table.shape[1] != head else constant(np.ascontiguousarray(table[:, : head // 2]))
            made.append(tables[key])
        if None in made:
            continue
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        node.input.extend(made)
        node.attribute.append(helper.make_attribute("do_rotary", 1))
        count += 1
    if count:
        nodes = live_nodes(table_nodes + list(graph.node), g.outputs)
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _attention_positions(g: _Graph, node, cos: str):
    """The positions vector cos is computed from (the one leaf of its position slice that is
    arange(S) + p), where that is the S and p GroupQueryAttention node (static_cache_attention's)
    writes and attends at: read back from its total_sequence_length, Clip(Cast(Add(p, S))).
    Else None."""
    clip = g.producer.get(node.input[6])
    cast = clip if clip is None or clip.op_type != "Clip" else g.producer.get(clip.input[0])
    total = cast and cast.op_type == "Cast" and g.made_by(cast.input[0], "Add")
    if not total:
        return None
    attended = (total.input[1], total.input[0])
    leaves, seen, stack = set(), set(), [cos]
    while stack:
        v = stack.pop()
        if v in seen or g.constant(v) is not None or v in getattr(g, "frozen", ()):
            continue
        seen.add(v)
        if _positions(g, v) is not None:
            leaves.add(v)
            continue
        n = g.producer.get(v)
        if n is None:
            return None
        stack.extend(i for i in n.input if i)
    if len(leaves) != 1:
        return None
    (leaf,) = leaves
    return leaf if _same_positions(g, _positions(g, leaf), attended) else None


def unread_inputs_in_place(graph: onnx.GraphProto, inplace: list, mutations: dict) -> int:
    """The new value of a mutated input that no node reads (transformers' StaticCache sets
    its length counters from cache_position: copy_ over the old value) is written into that
    input's memory: nothing can see the old value go. mutations: output -> input. Appends
    to inplace; returns the count."""
    read = set().union(*(_reads(n) for n in graph.node)) if graph.node else set()
    produced = {o for n in graph.node for o in n.output}
    taken = {o for o, _ in inplace}
    count = 0
    for output, argument in mutations.items():
        if output not in taken and output in produced and argument not in read:
            inplace.append((output, argument))
            count += 1
    return count
