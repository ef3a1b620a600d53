"""Options(quantize="int8", calibration=...): convolutions in static int8, as QDQ pairs that
ONNX Runtime fuses into its integer kernels (QLinearConv, QLinearAdd, uint8 MaxPool).

Why QDQ (QuantizeLinear -> DequantizeLinear around each quantized tensor) and not QLinearConv
written out: the file stays a float graph with its quantization stated beside it, the form
ONNX Runtime's own quantizer writes and every execution provider reads; ORT's CPU provider
rewrites DQ -> Conv -> Q into QLinearConv (then NHWC, whole chains in uint8) itself, and
leaves what it cannot fuse as float math between exact Q/DQ pairs (slower, never wrong).

The scheme (ONNX Runtime's and PT2E's x86 defaults): activations uint8, asymmetric, per
tensor, their range calibrated (the least and largest value seen over the samples, widened
to hold 0); weights int8, symmetric, per output channel (max|w| / 127; the codes stored as
uint8 at zero point 128, see _quantize_conv); a bias int32 at the
product of the input's and the weight's scales. Steps, on the lowered float graph:

1. fold_batch_norms: an inference BatchNormalization after a Conv with constant weights is
   folded into them (the quantized weights are the folded ones: a DQ'd weight cannot be
   folded later, and the BN would otherwise sit between the Conv and its Q).
2. plan: which tensors are quantized. Each quantized Conv's input and output (its output
   after a clamp at 0 that reads it alone, a Relu or a ReLU6's Max with 0 and Min with 6: the
   clamp is then dropped, as Q's zero point 0 and its saturation at the calibrated largest
   value, at most the clamp's bound, clamp alike); an Add (a residual) whose two inputs are
   quantized, its output likewise; a MaxPool whose input is quantized, its output at the
   input's scale (ORT then runs it on uint8). A depthwise Conv only where its input is a
   quantized op's output (see _depthwise). Also
   kept in uint8 where their inputs are: Sigmoid, Mul (SiLU, squeeze-excitation), spatial
   means (as GlobalAveragePool); torch's hardswish and hardsigmoid (x + 3 clamped to [0, 6],
   times x, over 6: five float ops) become ONNX HardSwish / HardSigmoid between their pairs
   (equal up to float rounding, far below a quantization step).
3. observer_outputs (calibration): each planned tensor's min and max as extra outputs.
4. quantize_planned: the Q/DQ pairs at the calibrated ranges, the weights and biases
   quantized.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .builder import Names
from .fusions import _reads, drop_unread_initializers, live_nodes
from .quantize import INT8_WEIGHT_ZERO

ONNX_DOMAINS = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class StaticConv:
    """A convolution quantized statically (what ortlite.explain lists)."""

    node: str  # the ONNX node's name
    origin: str  # the FX node it was lowered from
    input_range: tuple  # the calibrated (min, max) of its input
    output_range: tuple  # of its output (after the Relu it absorbed, if any)
    channels: int
    groups: int


@dataclasses.dataclass
class Plan:
    """Nodes are known by their first output (not every node has a name). points: tensor name
    -> the tensor whose calibrated range it takes (itself, or a MaxPool's input); convs: the
    Conv nodes quantized; absorbed: a quantized op's output -> the output of the clamp after it
    that its Q replaces; dropped: those clamp nodes (and a hardswish's first nodes)."""

    points: dict
    convs: list
    absorbed: dict
    dropped: set
    aliases: dict  # the output of a quantized MaxPool's NaN guard (an If) -> the MaxPool's output
    means: set  # ReduceMean nodes over H and W (4-D) written as GlobalAveragePool
    activations: dict  # the last node of torch's hardswish / hardsigmoid -> (ONNX op written instead, its input)


def fold_batch_norms(graph: onnx.GraphProto) -> int:
    """Conv (constant float32 weight and bias) -> BatchNormalization (constant parameters,
    inference mode) as one Conv with the folded weight and bias. Returns the count."""
    initializers = {t.name: t for t in graph.initializer}
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    taken = Names({o for n in graph.node for o in n.output} | {i.name for i in graph.input} | set(initializers))
    folded = set()  # positions of the BatchNormalizations folded
    for position, bn in enumerate(graph.node):
        if bn.op_type != "BatchNormalization" or bn.domain not in ONNX_DOMAINS or len(bn.output) != 1 or _attr(bn, "training_mode", 0):
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or conv.domain not in ONNX_DOMAINS or bn.input[0] in outputs or len(readers[bn.input[0]]) != 1:
            continue
        params = [_float_constant(initializers, name) for name in list(bn.input[1:5]) + list(conv.input[1:3])]
        gamma, beta, mean, var, weight = params[:5]
        bias = params[5] if len(conv.input) > 2 and conv.input[2] else np.zeros(weight.shape[0], np.float32) if weight is not None else None
        if any(p is None for p in (gamma, beta, mean, var, weight, bias)):
            continue
        factor = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + _attr(bn, "epsilon", 1e-5))
        new_weight = (weight * factor.reshape(-1, *[1] * (weight.ndim - 1))).astype(np.float32)
        new_bias = ((bias - mean) * factor + beta).astype(np.float32)
        w_name, b_name = taken.fresh(f"{conv.input[1]}_folded"), taken.fresh(f"{conv.input[1]}_folded_bias")
        graph.initializer.extend([numpy_helper.from_array(new_weight, w_name), numpy_helper.from_array(new_bias, b_name)])
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        folded.add(position)
    if folded:
        kept = [n for i, n in enumerate(graph.node) if i not in folded]
        del graph.node[:]
        graph.node.extend(kept)
        drop_unread_initializers(graph)
    return len(folded)


def plan(graph: onnx.GraphProto) -> Plan:
    """What quantize_planned will quantize (see the module docstring), in the graph's order."""
    initializers = {t.name: t for t in graph.initializer}
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    points: dict = {}
    convs, absorbed, dropped, aliases = [], {}, set(), {}
    made = set()  # the planned outputs of quantized ops (their readers get uint8 at no cost)
    rank: dict = {}  # of made values, where known
    means: set = set()  # ReduceMeans over H and W to write as GlobalAveragePool
    activations: dict = {}  # the last node of a hardswish / hardsigmoid chain -> (ONNX op, its input)
    ints = _int_constants(graph)
    constant = _scalar_constants(graph)

    def only_reader(value, op_type):  # (fusions._only_user, but counting reads inside If branches: the value's name goes away)
        users = readers.get(value, [])
        if value in outputs or len(users) != 1 or users[0].op_type != op_type or users[0].domain not in ONNX_DOMAINS:
            return None
        return users[0]

    def bound(node, value):  # the scalar constant the node (Max, Min) compares value with, or None
        other = [i for i in node.input if i != value]
        return constant.get(other[0]) if len(node.input) == 2 and len(other) == 1 else None

    def hard_activation(add):  # ("HardSwish" | "HardSigmoid", x, the chain's nodes) of x + 3 clamped to [0, 6] / 6 (x made)
        x = next((i for i in add.input if i in made and bound(add, i) == 3.0), None)
        if x is None or add.output[0] in outputs:
            return None
        low = only_reader(add.output[0], "Max")
        high = only_reader(low.output[0], "Min") if low is not None and bound(low, add.output[0]) == 0.0 else None
        if high is None or bound(high, low.output[0]) != 6.0:
            return None
        product = only_reader(high.output[0], "Mul")
        if product is not None and x in product.input:
            divide = only_reader(product.output[0], "Div")
            chain, op_type = [add, low, high, product, divide], "HardSwish"
        else:
            divide = only_reader(high.output[0], "Div")
            chain, op_type = [add, low, high, divide], "HardSigmoid"
        if divide is None or divide.input[0] != chain[-2].output[0] or constant.get(divide.input[1]) != 6.0 or divide.output[0] in outputs:
            return None
        return op_type, x, chain

    def result(node):  # the tensor to quantize for node's output: after a clamp at 0 reading it alone
        out = node.output[0]
        chain = []
        if (relu := only_reader(out, "Relu")) is not None:
            chain = [relu]
        elif (low := only_reader(out, "Max")) is not None and bound(low, out) == 0.0:
            chain = [low]
            high = only_reader(low.output[0], "Min")
            if high is not None and (b := bound(high, low.output[0])) is not None and b > 0:
                chain.append(high)
        if not chain:
            return out
        dropped.update(n.output[0] for n in chain)
        absorbed[out] = chain[-1].output[0]
        return chain[-1].output[0]

    for node in graph.node:
        if node.domain not in ONNX_DOMAINS:
            continue
        inputs = [aliases.get(i, i) for i in node.input]
        if node.op_type == "Conv" and _quantizable_conv(node, initializers) and (inputs[0] in made or not _depthwise(node, initializers)):
            convs.append(node)
            points.setdefault(inputs[0], inputs[0])
            out = result(node)  # (a graph output too: ORT's QLinearConv needs the Q; the output is then its DQ)
            points[out] = out
            made.add(out)
            rank[out] = len(initializers[node.input[1]].dims)
        elif node.op_type in ("Add", "Mul") and len(inputs) == 2 and all(i in points for i in inputs) and len(node.output) == 1 and node.output[0] not in outputs:
            out = result(node)  # (ORT: QLinearAdd, QLinearMul; a SiLU's x * sigmoid(x), a squeeze-excitation's scaling)
            points[out] = out
            made.add(out)
            ranks = [rank.get(i) for i in inputs]
            rank[out] = None if None in ranks else max(ranks)
        elif node.op_type == "Add" and (hard := hard_activation(node)) is not None:
            op_type, x, chain = hard  # (one ONNX op between the Q/DQ pairs, for the 5 or 4 of torch's decomposition)
            out = chain[-1].output[0]
            activations[chain[-1].output[0]] = (op_type, x)
            dropped.update(n.output[0] for n in chain[:-1])
            points[out] = out
            made.add(out)
            rank[out] = rank.get(x)
        elif node.op_type == "Sigmoid" and inputs[0] in made and node.output[0] not in outputs:
            points[node.output[0]] = node.output[0]  # (ORT: QLinearSigmoid)
            made.add(node.output[0])
            rank[node.output[0]] = rank.get(inputs[0])
        elif node.op_type == "ReduceMean" and inputs[0] in made and rank.get(inputs[0]) == 4 and _spatial_mean(node, ints) and node.output[0] not in outputs:
            points[node.output[0]] = node.output[0]  # (as a GlobalAveragePool: ORT's QLinearGlobalAveragePool)
            made.add(node.output[0])
            means.add(node.output[0])
            rank[node.output[0]] = 4
        elif node.op_type == "MaxPool" and inputs[0] in points and len(node.output) == 1 and node.output[0] not in outputs:
            points[node.output[0]] = points[inputs[0]]
            if inputs[0] in made:
                made.add(node.output[0])
                rank[node.output[0]] = rank.get(inputs[0])
        elif node.op_type == "If" and (passed := _nan_guard_of(node, producer)) in points and node.output[0] not in outputs:
            aliases[node.output[0]] = passed
    return Plan(points, convs, absorbed, dropped, aliases, means, activations)


def observer_outputs(graph: onnx.GraphProto, names: list) -> list:
    """Adds each name's least and largest value (0-d float32) as graph outputs; returns the
    output names, min then max per name."""
    taken = Names({o for n in graph.node for o in n.output} | {i.name for i in graph.input} | {t.name for t in graph.initializer})
    added = []
    for name in names:
        for op in ("ReduceMin", "ReduceMax"):
            out = taken.fresh(f"{name}_{op[6:].lower()}")
            graph.node.append(helper.make_node(op, [name], [out], keepdims=0))
            graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, []))
            added.append(out)
    return added


def quantize_planned(graph: onnx.GraphProto, planned: Plan, ranges: dict, origin: dict | None = None) -> list:
    """Rewrites graph in place: a QuantizeLinear -> DequantizeLinear pair on each planned tensor
    at the uint8 parameters of its calibrated range (ranges: name -> (min, max)), the Relus
    the plan absorbed dropped (their producer writes the pair's input), the NaN guards of
    quantized MaxPools dropped, each quantized Conv reading int8 per-channel weights and an
    int32 bias through DequantizeLinear. Returns [StaticConv]."""
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    taken = Names({o for n in graph.node for o in n.output} | graph_inputs | set(initializers))
    params = {name: _uint8_params(*ranges[source]) for name, source in planned.points.items()}
    added = []

    def constant(value: np.ndarray, base: str) -> str:
        name = taken.fresh(base)
        added.append(numpy_helper.from_array(value, name))
        return name

    def pair(name: str, source: str, out: str) -> list:
        scale, zero = params[name]
        s, z = constant(np.array(scale, np.float32), f"{name}_scale"), constant(np.array(zero, np.uint8), f"{name}_zero")
        q = taken.fresh(f"{name}_uint8")
        return [helper.make_node("QuantizeLinear", [source, s, z], [q], name=taken.fresh(f"{name}_quantize")),
                helper.make_node("DequantizeLinear", [q, s, z], [out], name=taken.fresh(f"{name}_dequantize"))]

    renames = dict(planned.aliases)  # value -> what its readers read instead
    nodes = []
    for name in planned.points:  # a graph input: its readers read its pair's output
        if name in graph_inputs:
            renames[name] = taken.fresh(f"{name}_dq")
            nodes += pair(name, name, renames[name])
    absorbed = planned.absorbed
    convs = {n.output[0] for n in planned.convs}
    made = []
    for node in graph.node:
        key = node.output[0]
        if key in planned.dropped or key in planned.aliases:
            continue
        if key in convs:
            x = planned.aliases.get(node.input[0], node.input[0])
            made.append(StaticConv(
                node.name, (origin or {}).get(node.name, ""), _range(ranges, planned, x), _range(ranges, planned, absorbed.get(key, key)),
                initializers[node.input[1]].dims[0], _attr(node, "group", 1),
            ))
            nodes += _quantize_conv(node, params[x][0], initializers, constant, taken)
        for i, x in enumerate(node.input):
            node.input[i] = renames.get(x, x)
        if key in planned.means:
            node = helper.make_node("GlobalAveragePool", [node.input[0]], list(node.output), name=node.name)
        elif key in planned.activations:
            op_type, x = planned.activations[key]
            extra = dict(alpha=1 / 6, beta=0.5) if op_type == "HardSigmoid" else {}
            node = helper.make_node(op_type, [renames.get(x, x)], list(node.output), name=node.name, **extra)
        nodes.append(node)
        for j, out in enumerate(node.output):
            point = absorbed.get(out, out)
            if point in planned.points and point not in graph_inputs:
                node.output[j] = taken.fresh(f"{point}_float")
                nodes += pair(point, node.output[j], point)
    graph.initializer.extend(added)
    kept = live_nodes(nodes, {o.name for o in graph.output})
    del graph.node[:]
    graph.node.extend(kept)
    drop_unread_initializers(graph)
    return made


def _quantize_conv(node, input_scale: float, initializers: dict, constant, taken: Names) -> list:
    """node reading its weight (int8, per output channel) and bias (int32 at input scale x
    weight scale) through DequantizeLinear: the DequantizeLinear nodes, to place before it."""
    weight = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float64)
    channels = weight.shape[0]
    w_scale = np.abs(weight.reshape(channels, -1)).max(axis=1) / 127
    w_scale = np.where(w_scale == 0, 1.0, w_scale).astype(np.float32)
    codes = np.clip(np.rint(weight / w_scale.astype(np.float64).reshape(-1, *[1] * (weight.ndim - 1))), -127, 127)
    # stored as uint8 at zero point 128 (the same codes): ORT's u8 x s8 convolution saturates on
    # CPUs without VNNI (plain AVX2), its u8 x u8 one is exact everywhere (see quantize.py)
    codes = (codes + INT8_WEIGHT_ZERO).astype(np.uint8)
    base = node.input[1]
    w_dq = taken.fresh(f"{base}_dq")
    nodes = [helper.make_node(
        "DequantizeLinear", [constant(codes, f"{base}_uint8"), constant(w_scale, f"{base}_scale"), constant(np.full(channels, INT8_WEIGHT_ZERO, np.uint8), f"{base}_zero")], [w_dq],
        axis=0, name=taken.fresh(f"{base}_dequantize"),
    )]
    inputs = [node.input[0], w_dq]
    if len(node.input) > 2 and node.input[2]:
        bias = numpy_helper.to_array(initializers[node.input[2]]).astype(np.float64)
        b_scale = (np.float64(input_scale) * w_scale.astype(np.float64)).astype(np.float32)
        b_codes = np.clip(np.rint(bias / b_scale.astype(np.float64)), -(2**31), 2**31 - 1).astype(np.int32)
        b_dq = taken.fresh(f"{node.input[2]}_dq")
        nodes.append(helper.make_node(
            "DequantizeLinear", [constant(b_codes, f"{node.input[2]}_int32"), constant(b_scale, f"{node.input[2]}_scale")], [b_dq],
            axis=0, name=taken.fresh(f"{node.input[2]}_dequantize"),
        ))
        inputs.append(b_dq)
    del node.input[:]
    node.input.extend(inputs)
    return nodes


def _range(ranges: dict, planned: Plan, name: str) -> tuple:
    name = planned.aliases.get(name, name)
    return tuple(float(v) for v in ranges[planned.points.get(name, name)])


def _nan_guard_of(node, producer: dict) -> str | None:
    """The MaxPool output an If passes through in its else branch (ortlite's NaN guard of a max
    pool, lower.ops.pooling: its then branch only matters where the input may hold a NaN)."""
    if len(node.output) != 1:
        return None
    else_branch = next((a.g for a in node.attribute if a.name == "else_branch"), None)
    if else_branch is None or len(else_branch.output) != 1:
        return None
    passed = else_branch.output[0].name
    body = list(else_branch.node)  # nothing, or one Identity of the outer value
    if len(body) == 1 and body[0].op_type == "Identity" and body[0].output[0] == passed:
        passed = body[0].input[0]
    elif body:
        return None
    pool = producer.get(passed)
    return passed if pool is not None and pool.op_type == "MaxPool" else None


def _quantizable_conv(node, initializers) -> bool:
    """A Conv whose weight is a constant float32 initializer (2-D convolutions and 1-D/3-D
    alike) and whose bias, if any, is one too."""
    w = initializers.get(node.input[1]) if len(node.input) > 1 else None
    if w is None or w.data_type != onnx.TensorProto.FLOAT or len(w.dims) < 3:
        return False
    if len(node.input) > 2 and node.input[2]:
        b = initializers.get(node.input[2])
        if b is None or b.data_type != onnx.TensorProto.FLOAT:
            return False
    return True


def _depthwise(node, initializers) -> bool:
    """A Conv of one input channel per group (MobileNet's, EfficientNet's 3x3 and 5x5). One
    whose input is a float op's (a SiLU, a Hardswish) stays float: its Q and DQ cost more than
    its integer kernel saves (EfficientNet-B0, 1 thread: 1.06x float32 with them quantized,
    0.91x without); after a quantized op (MobileNetV2's ReLU6) it is quantized."""
    return _attr(node, "group", 1) > 1 and initializers[node.input[1]].dims[1] == 1


def _uint8_params(low: float, high: float) -> tuple[float, int]:
    """(scale, zero point) of uint8 covering [low, high] widened to hold 0 (a Relu's output:
    zero point 0, so that Q clamps at 0 as the Relu did)."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if not np.isfinite(low) or not np.isfinite(high):
        raise ValueError(f"calibration saw a non-finite value ({low}, {high})")
    scale = (high - low) / 255 if high > low else 1.0
    zero = int(np.clip(np.rint(-low / scale), 0, 255))
    return float(np.float32(scale)), zero


def _scalar_constants(graph: onnx.GraphProto) -> dict:
    """name -> float value of each one-element float initializer or Constant."""
    values = {}
    for t in graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) == 1:
            values[t.name] = float(numpy_helper.to_array(t).reshape(()))
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ONNX_DOMAINS and n.attribute and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) == 1:
                values[n.output[0]] = float(numpy_helper.to_array(t).reshape(()))
    return values


def _int_constants(graph: onnx.GraphProto) -> dict:
    """name -> list of ints of each int64 initializer or Constant of at most 8 elements."""
    values = {}
    tensors = [(t.name, t) for t in graph.initializer] + [
        (n.output[0], n.attribute[0].t) for n in graph.node if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
    ]
    for name, t in tensors:
        if t.data_type == onnx.TensorProto.INT64 and int(np.prod(t.dims)) <= 8:
            values[name] = [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
    return values


def _spatial_mean(node, ints: dict) -> bool:
    """A ReduceMean of a 4-D value over its last two axes, keeping them (= GlobalAveragePool)."""
    if _attr(node, "keepdims", 1) != 1 or _attr(node, "noop_with_empty_axes", 0):
        return False
    axes = ints.get(node.input[1]) if len(node.input) > 1 else _attr(node, "axes", None)
    return axes is not None and sorted(a % 4 for a in axes) == [2, 3]


def _readers(graph: onnx.GraphProto) -> dict:
    readers: dict = {}
    for n in graph.node:
        for name in _reads(n):
            readers.setdefault(name, []).append(n)
    return readers


def _float_constant(initializers: dict, name: str):
    t = initializers.get(name)
    if t is None or t.data_type != onnx.TensorProto.FLOAT:
        return None
    return numpy_helper.to_array(t).astype(np.float64)


def _attr(node, name, default):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)
