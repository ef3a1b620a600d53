"""Size constants: the part of a symbolic graph that its integer arguments, the shapes of
its tensor arguments, its constants and its frozen weights alone determine
(Options.size_constants).

With static sizes ONNX Runtime folds such nodes (a causal mask, the indices of a padding-mask
gather, position ranges, a relative-position bias gathered from a weight, an interpolated
position embedding) into constants. With symbolic sizes it computes them at every run: a
LLaMA graph at zoo size runs 34 nodes more than its static twin. split_size_constants moves
the nodes that read a size (and what they need of weights and constants) into a prelude
model whose inputs are those integers, shapes and weights; the runner runs it once per set
of sizes (runner.SizeConstants keeps the results, and forgets them when a frozen weight
changes) and feeds its outputs to the main model as inputs. Nodes of weights and constants
alone stay in the main model, where ONNX Runtime folds them (and prepacks what they feed).
Where sizes change at nearly every call the prelude is only a second run per call: the
graph is then compiled again without one (SizeConstants.MISSES_BEFORE_REPLACING).

Nothing else counts as fixed: not tensor values, not weights bound as inputs (training
graphs, and weights ortlite.frozen does not freeze or the prelude cannot take:
PRELUDE_WEIGHT_DTYPES, CPU alone), not floats (0.0 and -0.0 are equal keys of different
values), not random ops, not nodes with subgraphs, not graph outputs.
"""

from __future__ import annotations

import dataclasses

import onnx
import torch
from onnx import helper

from .builder import IR_VERSION, ONNX_TO_TORCH, Names
from .fusions import live_nodes

VALUE, SHAPE, WEIGHT = "value", "shape", "weight"
# weights the runner can feed the prelude (as numpy arrays; CPU weights alone)
PRELUDE_WEIGHT_DTYPES = {
    torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool
}

# ops whose result is not a function of their inputs
_NOT_PURE = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}


@dataclasses.dataclass
class SizePrelude:
    model: bytes  # inputs: int64 scalars, shapes and weights; outputs: the values the main model takes as inputs
    # per prelude input, (main graph input, what the prelude takes of it: VALUE (an int
    # argument), SHAPE (a tensor's) or WEIGHT (a frozen weight's value)), in that order
    inputs: list[tuple[str, str]]
    outputs: list[str]  # its outputs, in the order the main graph takes them after its arguments


def _names_read(node: onnx.NodeProto) -> set[str]:
    """Values a node reads, including those its subgraphs (If, Loop) read from outside."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in graph.node:
                names |= _names_read(inner)
    return names


def _shape_of_input(node: onnx.NodeProto, tensor_inputs: set[str]) -> bool:
    return node.op_type == "Shape" and node.domain in ("", "ai.onnx") and node.input[0] in tensor_inputs


def _from_shape_input(node: onnx.NodeProto, shape_input: str, taken: Names) -> list[onnx.NodeProto]:
    """In the prelude, Shape(x, start, end) reads x's shape from an input of the prelude."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if not attrs:
        return [helper.make_node("Identity", [shape_input], list(node.output))]
    bounds = [taken.fresh(f"{node.output[0]}_start"), taken.fresh(f"{node.output[0]}_end")]
    values = [attrs.get("start", 0), attrs.get("end", 2**63 - 1)]
    return [
        *(helper.make_node("Constant", [], [b], value=helper.make_tensor(b, onnx.TensorProto.INT64, [1], [v])) for b, v in zip(bounds, values)),
        helper.make_node("Slice", [shape_input, *bounds], list(node.output)),
    ]


def split_size_constants(model: onnx.ModelProto, int_inputs: list[str], tensor_inputs: list[str] = (), weight_inputs: list[str] = ()):
    """(main model, SizePrelude, [(name, torch dtype, shape) per new input of the main model,
    shapes of ints and names of symbolic dims]); None where nothing is worth moving or onnx
    cannot infer the types of what would be moved. weight_inputs: tensor inputs whose values
    are fixed until the runner says otherwise (frozen weights). model is not changed."""
    graph = model.graph
    input_names = {i.name for i in graph.input}
    constant = {t.name for t in graph.initializer if t.name not in input_names}  # an initializer that is an input can be fed
    weight_inputs = [w for w in weight_inputs if w in input_names]
    fixed = set(int_inputs) | constant | set(weight_inputs)  # the same at every call with the same sizes
    sized = set(int_inputs)  # ... and read a size
    shape_readable = set(tensor_inputs) - set(weight_inputs)  # (a weight's shape is a constant)
    graph_outputs = {o.name for o in graph.output}
    hoisted, unsized = [], []  # nodes of sizes (moved), nodes of weights and constants alone (kept)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            fixed.update(node.output)
            unsized.append(node)
            continue
        has_subgraph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        reads_shape = _shape_of_input(node, shape_readable)
        of_fixed = reads_shape or (
            node.input and not has_subgraph and node.op_type not in _NOT_PURE and all(i in fixed for i in node.input if i)
        )
        if not of_fixed or graph_outputs.intersection(node.output):
            continue
        fixed.update(node.output)
        if reads_shape or any(i in sized for i in node.input):
            sized.update(node.output)
            hoisted.append(node)
        else:
            unsized.append(node)
    if not hoisted:
        return None
    hoisted_ids = {id(n) for n in hoisted}
    read_by_rest = set()
    for node in graph.node:
        if id(node) not in hoisted_ids:
            read_by_rest |= _names_read(node)
    frontier = [o for n in hoisted for o in n.output if o in read_by_rest]
    if not frontier:
        return None
    # the prelude: the hoisted nodes that the frontier needs, and the nodes of weights and
    # constants they read (copied: the main model may read them too)
    by_position = {id(n): k for k, n in enumerate(graph.node)}
    needed, nodes = set(frontier), []
    for node in sorted(hoisted + unsized, key=lambda n: -by_position[id(n)]):
        if needed.intersection(node.output):
            nodes.append(node)
            needed |= {i for i in node.input if i}
    nodes.reverse()
    graph_inputs = {i.name: i for i in graph.input}
    prelude_inputs = [(name, VALUE) for name in int_inputs if name in needed]
    value_infos = [helper.make_tensor_value_info(name, onnx.TensorProto.INT64, []) for name, _ in prelude_inputs]
    shape_inputs: dict[str, str] = {}  # tensor input -> the prelude input holding its shape
    ranks = {name: len(i.type.tensor_type.shape.dim) for name, i in graph_inputs.items()}
    taken = Names(input_names | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output})
    for k, node in enumerate(nodes):
        if _shape_of_input(node, shape_readable):
            x = node.input[0]
            if x not in shape_inputs:
                shape_inputs[x] = taken.fresh(f"{x}_shape")
                prelude_inputs.append((x, SHAPE))
                value_infos.append(helper.make_tensor_value_info(shape_inputs[x], onnx.TensorProto.INT64, [ranks[x]]))
            nodes[k] = _from_shape_input(node, shape_inputs[x], taken)
    nodes = [m for n in nodes for m in (n if isinstance(n, list) else [n])]
    for name in weight_inputs:
        if name in needed:
            prelude_inputs.append((name, WEIGHT))
            value_infos.append(graph_inputs[name])
    prelude = helper.make_graph(
        nodes,
        "ortlite_sizes",
        value_infos,
        [helper.make_value_info(name, onnx.TypeProto()) for name in frontier],
        [t for t in graph.initializer if t.name in needed],
    )
    prelude_model = helper.make_model(prelude, opset_imports=model.opset_import, ir_version=IR_VERSION)
    # where onnx cannot infer what would be moved, leave the graph as it is; what sizes alone
    # determine may still move without the weights
    def without_weights():
        return split_size_constants(model, int_inputs, tensor_inputs) if weight_inputs else None

    try:
        inferred = onnx.shape_inference.infer_shapes(prelude_model, strict_mode=True)
    except Exception:
        return without_weights()
    types = {v.name: v.type.tensor_type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    specs = []
    for name in frontier:
        t = types.get(name)
        if t is None or t.elem_type not in ONNX_TO_TORCH or not t.HasField("shape"):
            return without_weights()
        dims = tuple(d.dim_value if d.HasField("dim_value") else f"{name}_d{k}" for k, d in enumerate(t.shape.dim))
        specs.append((name, ONNX_TO_TORCH[t.elem_type], dims))
    del prelude_model.graph.output[:]
    prelude_model.graph.output.extend(helper.make_tensor_value_info(n, types[n].elem_type, None) for n in frontier)
    main = onnx.ModelProto()
    main.CopyFrom(model)
    del main.graph.node[:]
    main.graph.node.extend(live_nodes([n for n in graph.node if id(n) not in hoisted_ids], graph_outputs))
    # a weight that only the prelude reads is no input of the main model (the runner still watches it)
    read = set(graph_outputs).union(*(_names_read(n) for n in main.graph.node))
    kept = [i for i in main.graph.input if i.name in read or i.name not in weight_inputs]
    del main.graph.input[:]
    main.graph.input.extend(kept)
    main.graph.input.extend(helper.make_tensor_value_info(name, types[name].elem_type, dims) for name, _, dims in specs)
    return main, SizePrelude(prelude_model.SerializeToString(), prelude_inputs, frontier), specs
