"""Rewrites of a lowered ONNX graph into ops ONNX Runtime runs as one kernel, where its own
graph optimizer does not (its patterns expect another spelling of the same math)."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from .builder import TORCH_TO_ONNX, Names, onnx_dim
from .ops.common import same_shape


def _only_user(graph: onnx.GraphProto):
    """only_user(value, op_type): the node reading value, where it is the only one, of that
    ONNX op type, and value is no graph output (a training graph's saved values are); else None."""
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def only_user(value, op_type):
        users = consumers.get(value, [])
        if value in outputs or len(users) != 1 or users[0].op_type != op_type or users[0].domain not in ("", "ai.onnx"):
            return None
        return users[0]

    return only_user


def fuse_rms_norm(graph: onnx.GraphProto, known: dict[str, tuple]) -> int:
    """RMSNorm as aten spells it (x * rsqrt(mean(x * x, -1, keepdim) + eps) * w, the form of
    LLaMA's, Mistral's, T5's norms), as ortlite lowers it:
        Mul(x, x) -> ReduceMean([-1], keepdims) -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x, .) -> Mul(w, .)
    becomes SimplifiedLayerNormalization(x, w, axis=-1, epsilon=eps) (ONNX Runtime's kernel,
    float32, which computes x / sqrt(mean(x * x) + eps) * w in float32: within an ulp or two
    of aten's). Only where each intermediate feeds the next alone (not a graph output, as
    the saved values of a training graph are), eps is a float32 scalar initializer and w a
    1-D float32 initializer or graph input as long as x's last size (an int: a weight that
    broadcasts is aten's, not the kernel's), x float32 with the mean over its last axis.
    known: value name -> (torch dtype, shape), for the values lowering made (FX nodes').
    Returns the number of norms fused."""

    initializers = {t.name: t for t in graph.initializer}
    input_dims = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim] for i in graph.input if i.type.tensor_type.HasField("shape")}
    input_types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    only_user = _only_user(graph)

    def float32_weight(name, size: int) -> bool:
        if name in initializers:
            t = initializers[name]
            return t.data_type == onnx.TensorProto.FLOAT and list(t.dims) == [size]
        return input_types.get(name) == onnx.TensorProto.FLOAT and input_dims.get(name) == [size]

    fused, removed = [], set()
    for square in graph.node:
        if square.op_type != "Mul" or square.domain not in ("", "ai.onnx") or len(square.input) != 2 or square.input[0] != square.input[1]:
            continue
        x = square.input[0]
        if x not in known or known[x][0] != torch.float32 or not known[x][1] or type(known[x][1][-1]) is not int:
            continue
        rank, size = len(known[x][1]), known[x][1][-1]
        mean = only_user(square.output[0], "ReduceMean")
        if mean is None or len(mean.input) != 2 or mean.input[1] not in initializers:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in mean.attribute}
        if attrs.get("keepdims", 1) != 1 or attrs.get("noop_with_empty_axes", 0) != 0:
            continue
        if numpy_helper.to_array(initializers[mean.input[1]]).tolist() not in ([-1], [rank - 1]):
            continue
        add = only_user(mean.output[0], "Add")
        if add is None:
            continue
        eps_name = add.input[1] if add.input[0] == mean.output[0] else add.input[0]
        eps = initializers.get(eps_name)
        if eps is None or eps.data_type != onnx.TensorProto.FLOAT or len(eps.dims) != 0:
            continue
        sqrt = only_user(add.output[0], "Sqrt")
        reciprocal = sqrt and only_user(sqrt.output[0], "Reciprocal")
        scaled = reciprocal and only_user(reciprocal.output[0], "Mul")
        if scaled is None or sorted(scaled.input) != sorted([x, reciprocal.output[0]]):
            continue
        weighted = only_user(scaled.output[0], "Mul")
        if weighted is None:
            continue
        w = weighted.input[0] if weighted.input[1] == scaled.output[0] else weighted.input[1]
        if w == scaled.output[0] or not float32_weight(w, size):
            continue
        node = helper.make_node(
            "SimplifiedLayerNormalization", [x, w], [weighted.output[0]], name=weighted.name,  # its FX origin, as the Mul had
            axis=-1, epsilon=float(np.float32(numpy_helper.to_array(eps))), stash_type=1,
        )  # fmt: skip
        fused.append((weighted, node))
        removed.update(id(n) for n in (square, mean, add, sqrt, reciprocal, scaled))
    if not fused:
        return 0
    replacement = {id(old): new for old, new in fused}
    nodes = [replacement.get(id(n), n) for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(fused)


def fold_flattening_reshapes(graph: onnx.GraphProto, known: dict[str, tuple], origin: dict[str, str], keep_gemm: bool = False) -> int:
    """aten's linear on an input of rank > 2 is view(x, [rows, k]) -> mm -> view(., [*lead, n])
    (rows the product of x's leading sizes): ortlite lowers it Reshape -> MatMul -> Reshape, and
    with symbolic sizes the second Reshape's target is computed per call (Unsqueeze, Concat).
    ONNX MatMul takes x as it is: a 2-D right operand broadcasts over x's leading dims, the
    same rows times the same matrix, so both Reshapes go (on a small transformer a third of
    the nodes ONNX Runtime runs, and what made symbolic graphs slower than static ones).
    Only where each intermediate feeds the next alone, the right operand is 2-D and the
    final view's leading sizes are x's own (the same expressions). Returns the number folded;
    the size arithmetic left unused is removed. origin: ONNX node name -> FX node name, for
    the nodes made here (a bias's Add is the addmm's).

    keep_gemm (a graph with a size prelude): a linear with a bias is folded only with static
    sizes, where ONNX Runtime makes the MatMul + Add a Gemm again (MatMulAddFusion needs the
    shapes). With symbolic sizes the Add would stay a pass over the whole output (Swin: a
    third slower than static); the Reshapes alias, and the size prelude (lower.hoist)
    computes their targets."""
    outputs = {o.name for o in graph.output}
    only_user = _only_user(graph)

    replaced, removed = {}, set()
    for flatten in graph.node:
        if flatten.op_type != "Reshape" or flatten.domain not in ("", "ai.onnx"):
            continue
        x, flat = flatten.input[0], flatten.output[0]
        if x not in known or flat not in known:
            continue
        x_shape, flat_shape = known[x][1], known[flat][1]
        if len(x_shape) < 3 or len(flat_shape) != 2 or not same_shape(x_shape[-1:], flat_shape[-1:]):
            continue
        matmul = only_user(flat, "MatMul") or only_user(flat, "Gemm")
        if matmul is None or matmul.input[0] != flat or matmul.input[1] not in known or len(known[matmul.input[1]][1]) != 2:
            continue
        bias = None
        if matmul.op_type == "Gemm":  # addmm: C broadcast over the rows, as over x's leading dims
            attrs = {a.name: helper.get_attribute_value(a) for a in matmul.attribute}
            if any(attrs.get(k, 0) for k in ("transA", "transB")) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
                continue
            bias = matmul.input[2] if len(matmul.input) > 2 and matmul.input[2] else None
            if bias is not None and (bias not in known or len(known[bias][1]) != 1):
                continue
            if bias is not None and keep_gemm and not all(isinstance(d, int) for d in x_shape):
                continue  # see the docstring
        unflatten = only_user(matmul.output[0], "Reshape")
        if unflatten is None or unflatten.output[0] not in known or not same_shape(known[unflatten.output[0]][1][:-1], x_shape[:-1]):
            continue
        out = unflatten.output[0]
        if bias is None:
            replaced[id(unflatten)] = [helper.make_node("MatMul", [x, matmul.input[1]], [out], name=matmul.name)]
        else:
            product = out + "_product"
            replaced[id(unflatten)] = [
                helper.make_node("MatMul", [x, matmul.input[1]], [product], name=matmul.name),
                helper.make_node("Add", [product, bias], [out], name=matmul.name + "_bias"),
            ]
            origin[matmul.name + "_bias"] = origin.get(matmul.name, "")
        removed.update((id(flatten), id(matmul)))
    if not replaced:
        return 0
    nodes = [m for n in graph.node if id(n) not in removed for m in replaced.get(id(n), [n])]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, outputs))
    return len(replaced)


HEADS_PERM = [0, 2, 1, 3]  # (B, S, N, D) <-> (B, N, S, D)


def attention_fusions(graph: onnx.GraphProto, known: dict[str, tuple], values_now: dict | None = None) -> None:
    """The rewrites around ONNX's Attention, in this order: each one's result is what the
    next one looks for (whole slices vanish from grouped heads' copies; k read uncopied is
    a rotary embedding's result; rotary on token rows leaves heads the 3-D form takes; the
    blocks of queries split the attention the others made). values_now: value name -> its
    value where lowering knew it (constant masks)."""
    whole_slices_to_identity(graph, known)
    attention_takes_grouped_heads(graph, known)
    rotary_before_attention(graph, known)
    attention_on_token_rows(graph, known)
    attention_in_query_blocks(graph, known, values_now or {})


def whole_slices_to_identity(graph: onnx.GraphProto, known: dict[str, tuple]) -> int:
    """A Slice whose result has its input's shape (the same expressions) in unit steps takes
    all of it: an Identity (the attention patterns look through those). With symbolic sizes
    Dynamo keeps such slices (x[:, :, None]), and ONNX Runtime cannot tell they are whole."""
    units = {name for name, a in _small_constants(graph).items() if a.dtype.kind == "i" and np.all(a == 1)}
    count = 0
    for i, node in enumerate(graph.node):
        if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or (len(node.input) > 4 and node.input[4] and node.input[4] not in units):
            continue
        x, out = node.input[0], node.output[0]
        if x in known and out in known and same_shape(known[x][1], known[out][1]):
            graph.node[i].CopyFrom(helper.make_node("Identity", [x], [out], name=node.name))
            count += 1
    return count


def attention_takes_grouped_heads(graph: onnx.GraphProto, known: dict[str, tuple]) -> int:
    """Grouped-query attention as transformers spell it (repeat_kv): k and v of Hkv heads
        kv (B, Hkv, S, D) -> Unsqueeze(2) -> Expand (B, Hkv, r, S, D) -> Reshape (B, Hkv*r, S, D)
    before ONNX's Attention, which groups heads itself the same way (kv head j serves query
    heads j*r .. j*r + r - 1): Attention reads k and v of Hkv heads, and the copies go.
    Only where k and v both come so (Attention wants as many heads in each). Returns the
    number of attentions rewritten."""
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    constants = _small_constants(graph)

    def kv_heads(value):
        reshape = _made_by(producer, known, value, "Reshape")
        expand = reshape and _made_by(producer, known, reshape.input[0], "Expand")
        unsqueeze = expand and _made_by(producer, known, expand.input[0], "Unsqueeze")
        if not unsqueeze or len(unsqueeze.input) < 2 or constants.get(unsqueeze.input[1], np.array([])).tolist() != [2]:
            return None
        kv = unsqueeze.input[0]
        if kv not in known or len(known[kv][1]) != 4 or expand.output[0] not in known or reshape.output[0] not in known:
            return None
        (b, h, s, d), grown, repeated = known[kv][1], known[expand.output[0]][1], known[reshape.output[0]][1]
        r = grown[2] if len(grown) == 5 else None
        if type(h) is not int or type(r) is not int or not same_shape(grown, (b, h, r, s, d)) or not same_shape(repeated, (b, h * r, s, d)):
            return None
        return kv

    count = 0
    for node in graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.input) < 3 or any(node.input[4:]):
            continue
        k, v = kv_heads(node.input[1]), kv_heads(node.input[2])
        if k is None or v is None or known[k][1][1] != known[v][1][1]:
            continue
        node.input[1], node.input[2] = k, v
        count += 1
    if count:
        nodes = live_nodes(list(graph.node), outputs)
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def rotary_before_attention(graph: onnx.GraphProto, known: dict[str, tuple]) -> int:
    """Rotary position embedding as transformers spell it (LLaMA's apply_rotary_pos_emb and
    rotate_half) on float32 heads t (B, N, S, D), in a graph with ONNX's Attention (so a
    float32 CPU inference graph of opset 23), with cos and sin (B or 1, S, D) unsqueezed at 1:
        t * cos + Concat(-t[..., D/2:], t[..., :D/2]) * sin
    becomes ONNX RotaryEmbedding, whose caches are cos's and sin's first halves (B, S, D/2).
    That is the same arithmetic only where the second halves equal the first: cos and sin
    must each be computed elementwise from Concat(f, f) on the last axis (transformers'
    emb = cat(freqs, freqs)), checked on the graph. Where t is token rows viewed into heads
    (see attention_on_token_rows), the 3-D form on the rows, then viewed into heads again
    (for Attention's 3-D form to take the rows); else the 4-D form on t. Returns the count."""
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    constants = _small_constants(graph)
    made_by = lambda value, op_type: _made_by(producer, known, value, op_type)  # noqa: E731
    fresh, constant = _new_values(graph, "ortlite_rotary_const")
    added: list = []  # the cache nodes made for the rotary embedding being rewritten

    def scalar(name) -> bool:
        return name in constants and constants[name].size == 1

    def same_last(node) -> bool:
        """node keeps each last-axis row whole (a view that keeps the last size)."""
        ends = [known.get(v, (None, ()))[1] for v in (node.input[0], node.output[0])]
        return all(ends) and type(ends[0][-1]) is int and ends[0][-1] == ends[1][-1]

    def doubled(value) -> bool:
        """value is computed elementwise (Cos, Sin, Cast, a scalar's Mul or Div; views that
        keep last-axis rows whole) from Concat(f, f) on its last axis: its halves are equal."""
        node = producer.get(value)
        while node is not None:
            if node.op_type in ("Cos", "Sin", "Cast", "Identity") or (node.op_type in ("Unsqueeze", "Reshape", "Expand") and same_last(node)):
                node = producer.get(node.input[0])
            elif node.op_type in ("Mul", "Div") and scalar(node.input[1]):
                node = producer.get(node.input[0])
            elif node.op_type == "Mul" and scalar(node.input[0]):
                node = producer.get(node.input[1])
            else:
                break
        if node is None or node.op_type != "Concat" or len(node.input) != 2 or node.input[0] != node.input[1]:
            return False
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        rank = len(known[node.output[0]][1]) if node.output[0] in known else None
        return rank is not None and axis in (-1, rank - 1)

    def slice_of(node, t, begin, end, d) -> bool:
        if node is None or node.op_type != "Slice" or node.input[0] != t or len(node.input) < 4 or any(node.input[5:]):
            return False
        if len(node.input) == 5 and node.input[4] and constants.get(node.input[4], np.array([0])).tolist() != [1]:
            return False
        got = [constants.get(i, np.array([None])).tolist() for i in node.input[1:4]]
        return got[0] == [begin] and got[2] in ([3], [-1]) and (got[1] == [end] or (end == d and got[1][0] is not None and got[1][0] >= d))

    def unsqueezed(value):
        """(Bc, S, D) x where value is Unsqueeze(x, [1]), else None."""
        node = made_by(value, "Unsqueeze")
        if node is None or len(node.input) < 2 or constants.get(node.input[1], np.array([])).tolist() != [1]:
            return None
        return node.input[0] if node.input[0] in known and len(known[node.input[0]][1]) == 3 else None

    def match(add):
        """(t, cos, sin) of a rotary embedding ending in add, else None."""
        if len(add.input) != 2:
            return None
        products = [producer.get(i) for i in add.input]
        if any(p is None or p.op_type != "Mul" or p.domain not in ("", "ai.onnx") for p in products):
            return None
        for direct, rotated in (products, products[::-1]):
            for t, cos_u in (direct.input, direct.input[::-1]):
                if t not in known or len(known[t][1]) != 4 or known[t][0] != torch.float32:
                    continue
                b, n, s, d = known[t][1]
                if type(d) is not int or d % 2:
                    continue
                for c, sin_u in (rotated.input, rotated.input[::-1]):
                    concat = producer.get(c)
                    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
                        continue
                    if next((a.i for a in concat.attribute if a.name == "axis"), None) not in (3, -1):
                        continue
                    neg = producer.get(concat.input[0])
                    if neg is None or neg.op_type != "Neg" or not slice_of(producer.get(neg.input[0]), t, d // 2, d, d):
                        continue
                    if not slice_of(producer.get(concat.input[1]), t, 0, d // 2, d):
                        continue
                    cos, sin = unsqueezed(cos_u), unsqueezed(sin_u)
                    if cos is None or sin is None or not (doubled(cos) and doubled(sin)):
                        continue
                    for x in (cos, sin):
                        bc, sc, dc = known[x][1]
                        if known[x][0] != torch.float32 or dc != d or not same_shape((sc,), (s,)):
                            break
                        if not same_shape((bc,), (b,)) and bc != 1:
                            break
                    else:
                        return t, cos, sin
        return None

    halves: dict = {}

    def half(x, batch, rows):
        """x's first half on its last axis, (batch, S, D/2): the kernel's cache."""
        key = (x, str(batch))
        if key not in halves:
            d = known[x][1][2]
            out = fresh(x + "_half")
            added.append(helper.make_node("Slice", [x, constant([0]), constant([d // 2]), constant([-1])], [out]))
            if not same_shape((known[x][1][0],), (batch,)):  # one cos for the batch
                wide = fresh(x + "_half_batch")
                if type(batch) is int:
                    shape = constant([batch, 1, 1])
                else:
                    first = fresh(x + "_batch")
                    added.append(helper.make_node("Shape", [rows], [first], start=0, end=1))
                    shape = fresh(x + "_batch_shape")
                    added.append(helper.make_node("Concat", [first, constant([1, 1])], [shape], axis=0))
                added.append(helper.make_node("Expand", [out, shape], [wide]))
                out = wide
            halves[key] = out
        return halves[key]

    if not any(n.op_type == "Attention" and n.domain in ("", "ai.onnx") for n in graph.node):
        return 0
    replaced = {}
    for add in graph.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
            continue
        found = match(add)
        if found is None:
            continue
        t, cos, sin = found
        b, n, s, d = known[t][1]
        rows = _token_rows(producer, known, t)
        if rows is not None:
            rotated, heads = fresh(add.output[0] + "_rows"), fresh(add.output[0] + "_heads")
            nodes = [
                helper.make_node("RotaryEmbedding", [rows, half(cos, b, rows), half(sin, b, rows)], [rotated], name=add.name, num_heads=n),
                helper.make_node("Reshape", [rotated, constant([0, 0, n, d])], [heads]),
                helper.make_node("Transpose", [heads], [add.output[0]], perm=HEADS_PERM),
            ]  # fmt: skip
            known[rotated], known[heads] = (torch.float32, known[rows][1]), (torch.float32, (b, s, n, d))
        else:
            nodes = [helper.make_node("RotaryEmbedding", [t, half(cos, b, t), half(sin, b, t)], [add.output[0]], name=add.name)]
        replaced[id(add)] = added + nodes  # (the caches first made here: before their first use)
        added = []
    if not replaced:
        return 0
    nodes = [m for n in graph.node for m in replaced.get(id(n), [n])]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, outputs))
    return len(replaced)


def attention_on_token_rows(graph: onnx.GraphProto, known: dict[str, tuple]) -> int:
    """Multi-head attention as models spell it around ONNX's Attention (4-D: heads first):
        x (B, S, N*D) -> Reshape (B, S, N, D) -> Transpose -> q, k or v
        Attention -> Transpose -> Reshape (B, S, N*Dv)
    (Identities, or Reshapes to the same shape, between any two) becomes Attention's 3-D
    form (q_num_heads, kv_num_heads), which reads each head in place from the token rows and
    writes it so: the four Transposes (copies) of every attention go, where nothing else
    reads their values; the same kernel, the same arithmetic. Only in the main graph, where
    q, k and v all come so and the output only goes so (each value on its way read by the
    next alone), no past key or value. known: as for fuse_rms_norm. Returns the count."""
    outputs = {o.name for o in graph.output}
    only_user = _only_user(graph)
    producer = {o: n for n in graph.node for o in n.output}
    read_by = lambda value, op_type: _read_by(only_user, known, value, op_type)[0]  # noqa: E731
    token_rows = lambda value: _token_rows(producer, known, value)  # noqa: E731

    rewritten, removed = {}, set()
    for node in graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.output) != 1 or any(node.input[4:]) or len(node.input) < 3:
            continue
        rows = [token_rows(v) for v in node.input[:3]]
        back = read_by(node.output[0], "Transpose")
        merge = back and _perm(back) == HEADS_PERM and read_by(back.output[0], "Reshape")
        if None in rows or not merge or node.output[0] not in known or merge.output[0] not in known:
            continue
        if not _splits_last(known[merge.output[0]][1], known[node.output[0]][1], HEADS_PERM):
            continue
        heads_of = lambda v: known[v][1][1]  # noqa: E731  (4-D q, k: (B, N, S, D))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rewritten[id(node)] = helper.make_node(
            "Attention", [*rows, *node.input[3:]], [merge.output[0]], name=node.name,
            q_num_heads=heads_of(node.input[0]), kv_num_heads=heads_of(node.input[1]), **attrs,
        )  # fmt: skip
        removed.add(id(merge))  # (the nodes between are left unread)
        # ONNX Runtime's shape inference takes an unknown hidden size for 0, and then
        # rejects the output: the token rows' shapes, declared
        for x in rows:
            dtype, shape = known[x]
            graph.value_info.append(helper.make_tensor_value_info(x, TORCH_TO_ONNX[dtype], [onnx_dim(d) for d in shape]))
    if not rewritten:
        return 0
    nodes = [rewritten.get(id(n), n) for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, outputs))
    return len(rewritten)


# rows of queries a block: measured best from 128 to 2048 query rows; longer sequences get
# blocks of S / QUERY_BLOCKS_MOST rows. Below QUERY_ROWS_LEAST the blocks and their NaN
# carry cost what they save (measured: the issue 12 note).
QUERY_BLOCK = 64
QUERY_BLOCKS_MOST = 32
QUERY_ROWS_LEAST = 256
BLOCK_MASKS_MOST = 1 << 22  # elements of the blocks' masks, all attentions together
BLOCKS_WORTH = 0.85  # blocks are made where they compute at most this share of the scores


def attention_in_query_blocks(graph: onnx.GraphProto, known: dict[str, tuple], values_now: dict) -> int:
    """Causal attention, or attention under a constant mask, with static sequence lengths, as
    blocks of QUERY_BLOCK query rows: each block reads only the keys some row of it may see
    (the causal mask's, or the mask's, columns not -inf for every row of the block), so a
    causal attention computes about half its scores (ONNX Runtime's kernel computes them all
    and masks). Each block is an ONNX Attention on Slices of q, k and v with its part of the
    mask (a constant, shared by the attentions that have the same one); a Concat joins them.
    Rows get the same arithmetic as before: a skipped key's weight was exp(-inf) = 0; where
    a skipped key's k or v holds NaN or inf, which the whole kernel spreads to the row, the
    row is made NaN (_skipped_keys_reach_rows). Only Attention without past key or value in
    the main graph, at least QUERY_ROWS_LEAST query rows; the blocks must save at least
    1 - BLOCKS_WORTH of the scores. values_now: as for attention_fusions (a mask is a
    constant there or an initializer). Returns the number of attentions split."""
    outputs = {o.name for o in graph.output}
    initializers = {t.name: t for t in graph.initializer}
    fresh, constant = _new_values(graph, "ortlite_block_const")
    budget = [BLOCK_MASKS_MOST]

    def blocks_of(node, attrs):
        """(axis, [(rows, keys, mask part or None)]) for node, or None where blocks do not pay."""
        q, k, v = node.input[:3]
        if any(x not in known for x in (q, k, v, node.output[0])) or attrs.get("qk_matmul_output_mode", 0):
            return None
        rank = len(known[q][1])
        axis = 1 if rank == 3 else 2
        if rank not in (3, 4) or any(len(known[x][1]) != rank for x in (k, v)):
            return None
        length, source = known[q][1][axis], known[k][1][axis]
        if type(length) is not int or type(source) is not int or length < QUERY_ROWS_LEAST:
            return None
        allowed = np.tril(np.ones((length, source), dtype=bool)) if attrs.get("is_causal", 0) else np.ones((length, source), dtype=bool)
        mask = None
        if len(node.input) > 3 and node.input[3]:
            name = node.input[3]
            mask = values_now.get(name, numpy_helper.to_array(initializers[name]) if name in initializers else None)
            if mask is None or mask.dtype != np.float32 or not 2 <= mask.ndim <= 4 or list(mask.shape[-2:]) != [length, source]:
                return None
            allowed &= (mask != -np.inf).reshape(-1, length, source).any(0)  # (NaN is kept)
        rows = max(QUERY_BLOCK, -(-length // QUERY_BLOCKS_MOST))
        blocks, scores, mask_size = [], 0, 0
        for lo in range(0, length, rows):
            hi = min(lo + rows, length)
            seen = np.flatnonzero(allowed[lo:hi].any(0))
            if not seen.size:
                return None  # (rows seeing nothing take the written-out ops: not here)
            keys = (int(seen[0]), int(seen[-1]) + 1)
            part = np.zeros(1, np.float32) if mask is None else mask[..., lo:hi, keys[0] : keys[1]]
            if attrs.get("is_causal", 0):
                part = np.where(allowed[lo:hi, keys[0] : keys[1]], part, np.float32(-np.inf)).astype(np.float32)
            part = None if not np.any(part) else np.ascontiguousarray(part, dtype=np.float32)
            blocks.append(((lo, hi), keys, part))
            scores += (hi - lo) * (keys[1] - keys[0])
            mask_size += 0 if part is None else part.size
        if scores > BLOCKS_WORTH * length * source or mask_size > budget[0]:
            return None
        budget[0] -= mask_size
        return axis, blocks

    split = {}  # node index -> its blocks' nodes
    for index, node in enumerate(graph.node):
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or any(node.input[4:]) or len(node.input) < 3:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        found = blocks_of(node, attrs)
        if found is None:
            continue
        axis, blocks = found
        q, k, v = node.input[:3]
        attrs["is_causal"] = 0
        nodes, parts = [], []
        for (lo, hi), (start, end), part in blocks:
            q_rows, keys = fresh(f"{q}_rows{lo}"), [k, v]
            nodes.append(helper.make_node("Slice", [q, constant([lo]), constant([hi]), constant([axis])], [q_rows]))
            if (start, end) != (0, known[k][1][axis]):
                keys = [fresh(f"{x}_keys{start}_{end}") for x in (k, v)]
                for x, out in zip((k, v), keys):
                    nodes.append(helper.make_node("Slice", [x, constant([start]), constant([end]), constant([axis])], [out]))
            out = fresh(f"{node.output[0]}_rows{lo}")
            inputs = [q_rows, *keys] + ([] if part is None else [constant(part)])
            nodes.append(helper.make_node("Attention", inputs, [out], name=f"{node.name}_rows{lo}", **attrs))
            parts.append(out)
        joined = fresh(f"{node.output[0]}_blocks")
        nodes.append(helper.make_node("Concat", parts, [joined], name=f"{node.name}_blocks", axis=axis))
        nodes += _skipped_keys_reach_rows(k, v, joined, node.output[0], axis, blocks, known[k][1][axis], fresh, constant)
        split[index] = nodes
    if not split:
        return 0
    nodes = [m for i, n in enumerate(graph.node) for m in split.get(i, [n])]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, outputs))
    return len(split)


def _skipped_keys_reach_rows(k, v, joined, out, axis, blocks, source, fresh, constant) -> list:
    """Nodes making out = joined + (NaN for the rows of a block that skips a key whose k or v
    holds NaN or inf, else 0): what the whole kernel gives them (a NaN score plus the mask's
    -inf is NaN; 0 times an inf value is NaN). A sum over a key's k and v that overflows
    counts as inf too (NaN where the whole kernel had a number: the safe side)."""
    nodes = []

    def op(op_type, *inputs, **attrs):
        name = fresh(f"{out}_{op_type.lower()}")
        nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    features = constant([2] if axis == 1 else [1, 3])  # all but batch and keys
    total = op("Add", op("ReduceSum", k, features, keepdims=0), op("ReduceSum", v, features, keepdims=0))
    bad = op("Pad", op("Mul", total, constant(np.array(0, np.float32))), constant([0, 1, 0, 1]))  # (B, 1 + keys + 1)
    flags = []
    ends = np.concatenate([np.full(hi - lo, end + 1) for (lo, hi), (_, end), _ in blocks])  # past the keys read
    if np.any(ends <= source):
        flags.append(op("Gather", op("CumSum", bad, constant(1), reverse=1), constant(ends), axis=1))
    starts = np.concatenate([np.full(hi - lo, start) for (lo, hi), (start, _), _ in blocks])  # before them
    if np.any(starts > 0):
        flags.append(op("Gather", op("CumSum", bad, constant(1)), constant(starts), axis=1))
    flag = flags[0] if len(flags) == 1 else op("Add", *flags)
    rows = op("Unsqueeze", flag, constant([2] if axis == 1 else [1, 3]))
    nodes.append(helper.make_node("Add", [joined, rows], [out]))
    return nodes


def _passes(node, known) -> bool:
    """An Identity, or a Reshape to the shape it has."""
    if node.op_type == "Identity":
        return True
    ends = (node.input[0], node.output[0])
    return node.op_type == "Reshape" and all(v in known for v in ends) and same_shape(known[ends[0]][1], known[ends[1]][1])


def _read_by(only_user, known: dict, value: str, op_type: str):
    """(the only node reading value, through nodes that pass it on, if it is of op_type;
    the value it reads)."""
    node = only_user(value, "Identity") or only_user(value, "Reshape")
    while node is not None and _passes(node, known):
        value = node.output[0]
        node = only_user(value, "Identity") or only_user(value, "Reshape")
    return only_user(value, op_type), value


def _made_by(producer: dict, known: dict, value: str, op_type: str):
    """The node making value, through nodes that pass it on (_passes), if it is of op_type."""
    node = producer.get(value)
    while node is not None and node.domain in ("", "ai.onnx") and _passes(node, known):
        node = producer.get(node.input[0])
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _perm(node) -> list | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _token_rows(producer: dict, known: dict, value: str) -> str | None:
    """x where value is x (B, S, N*D) -> Reshape (B, S, N, D) -> Transpose(0, 2, 1, 3)
    (through nodes that pass values on), else None."""
    transpose = _made_by(producer, known, value, "Transpose")
    reshape = transpose and _perm(transpose) == HEADS_PERM and _made_by(producer, known, transpose.input[0], "Reshape")
    if not reshape or reshape.input[0] not in known or reshape.output[0] not in known:
        return None
    return reshape.input[0] if _splits_last(known[reshape.input[0]][1], known[reshape.output[0]][1]) else None


def _small_constants(graph: onnx.GraphProto, most: int = 8) -> dict:
    """name -> array of the initializers of at most `most` elements (attribute-like inputs:
    axes, starts, steps, scalars), without converting the weights."""
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer if np.prod(t.dims) <= most}


def _splits_last(rows: tuple, heads: tuple, perm=(0, 1, 2, 3)) -> bool:
    """rows (B, S, N*D) and heads, permuted by perm, (B, S, N, D), N and D ints."""
    if len(rows) != 3 or len(heads) != 4:
        return False
    b, s, n, d = (heads[p] for p in perm)
    return type(n) is int and type(d) is int and type(rows[2]) is int and rows[2] == n * d and same_shape(rows[:2], (b, s))


def _new_values(graph: onnx.GraphProto, base: str):
    """(fresh(name): name, or name_<k>, that nothing in graph has yet; constant(values): the
    name of an initializer holding values (ints as int64, arrays as they are), one per
    distinct value) for a rewrite adding values to graph."""
    taken = Names({o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | {i.name for i in graph.input})
    made: dict = {}  # (dtype, shape, bytes) -> initializer name
    fresh = taken.fresh

    def constant(values) -> str:
        array = values if isinstance(values, np.ndarray) else np.array(values, dtype=np.int64)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in made:
            made[key] = fresh(base)
            graph.initializer.append(numpy_helper.from_array(array, made[key]))
        return made[key]

    return fresh, constant


def shield_range_gathers(graph: onnx.GraphProto) -> int:
    """A Gather whose indices a Range makes reads them through Where(true, indices, indices)
    (the same values; not Max, whose int64 CPU kernel is wrong in [2**31, 2**32)): ONNX
    Runtime's GatherToSliceFusion would turn the pair into a Slice that is wrong for a range
    with negative indices or a negative step (x[:, arange(-s, 0)] came back empty). ortlite's sessions run without that optimizer; this makes a saved file right in
    plain onnxruntime with default options too."""
    made_by_range = set()  # a Range's output, or an Identity of one (ONNX Runtime removes those first)
    for n in graph.node:
        if n.domain in ("", "ai.onnx") and (n.op_type == "Range" or (n.op_type == "Identity" and n.input[0] in made_by_range)):
            made_by_range.add(n.output[0])
    gathers = [
        n for n in graph.node
        if n.op_type == "Gather" and n.domain in ("", "ai.onnx") and len(n.input) > 1 and n.input[1] in made_by_range
    ]
    if not gathers:
        return 0
    taken = Names({o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | {i.name for i in graph.input})
    shielded_ids = {id(n) for n in gathers}
    true = None
    nodes = []
    for node in graph.node:
        if id(node) in shielded_ids:  # (not `in gathers`: protobuf == compares whole nodes)
            if true is None:
                true = taken.fresh("ortlite_true")
                graph.initializer.append(numpy_helper.from_array(np.array(True), true))
            shielded = taken.fresh(f"{node.input[1]}_shielded")
            nodes.append(helper.make_node("Where", [true, node.input[1], node.input[1]], [shielded]))
            node.input[1] = shielded
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(gathers)


def live_nodes(nodes: list, outputs: set) -> list:
    """nodes without those whose outputs nothing reads (a branch of an If reads outer values)."""
    used = set(outputs)
    live = []
    for n in reversed(nodes):
        if not any(o in used for o in n.output):
            continue
        live.append(n)
        used.update(_reads(n))
    return live[::-1]


def drop_unread_initializers(graph: onnx.GraphProto) -> int:
    """Remove the initializers no node reads (what rewrites left behind: a folded table's
    inputs, a Split's sizes): ONNX Runtime warns on stderr for each one when it loads the
    model, with a user's SessionOptions and in plain onnxruntime. Returns the count."""
    read = set().union(*(_reads(n) for n in graph.node)) | {o.name for o in graph.output} | {i.name for i in graph.input}
    unread = [i for i, t in enumerate(graph.initializer) if t.name not in read]
    for i in reversed(unread):  # in place: copying the kept ones took 0.36 s of BERT-base's compile
        del graph.initializer[i]
    return len(unread)


def _reads(node) -> set:
    names = set(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
            for n in g.node:
                names |= _reads(n)
    return names
