"""Rewrites of a lowered ONNX graph into ops ONNX Runtime runs as one kernel, where its own
graph optimizer does not (its patterns expect another spelling of the same math)."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper


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
