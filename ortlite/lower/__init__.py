"""Lowering of an aten FX graph to one ONNX model, plus the plan the runner needs to call it."""

from __future__ import annotations

import dataclasses
import operator

import onnx
import onnx.numpy_helper
import sympy
import torch
import torch.fx

from . import ops  # noqa: F401  (registers the op table)
from .builder import TO_TORCH, TORCH_TO_ONNX, GraphBuilder, Value, sym_expr
from .decoder import (
    packed_products, proven_attention_masks, repeated_checks, rotary_inside_attention, scatters_in_place, shared_cache_offsets,
    skip_simplified_norms, static_cache_attention, unread_inputs_in_place,
)
from .fusions import attention_fusions, drop_unread_initializers, fold_flattening_reshapes, fuse_rms_norm, shield_range_gathers
from .hoist import PRELUDE_WEIGHT_DTYPES, SizePrelude, split_size_constants
from .qdq import fold_batch_norms, observer_outputs, plan, quantize_planned
from .quantize import add_domain, quantize_products
from .ops.common import declared_ranges
from .registry import lowering_for, meta, no_new_guards, shape_env_of, unsupported_reason
from .tie_order import sort_verdicts

__all__ = ["LoweredGraph", "InputSpec", "OutputSpec", "LoweringError", "NodeNotLowered", "lower_graph", "unsupported_reason"]

# What the runner receives for each graph argument.
TENSOR, INT, FLOAT, BOOL, UNUSED = "tensor", "int", "float", "bool", "unused"
SCALAR_DTYPES = {INT: torch.int64, FLOAT: torch.float64, BOOL: torch.bool}


class LoweringError(RuntimeError):
    pass


class NodeNotLowered(LoweringError):
    """One node's lowering failed (e.g. it specializes a symbolic size): the graph can be
    compiled again with that node left to torch."""

    def __init__(self, node: str, reason: str):
        super().__init__(f"{node}: {reason}")
        self.node, self.reason = node, reason


@dataclasses.dataclass
class InputSpec:
    kind: str  # TENSOR, INT, FLOAT, BOOL or UNUSED
    name: str | None = None  # the ONNX input name
    dtype: torch.dtype | None = None
    shape: tuple = ()
    device: torch.device | None = None


@dataclasses.dataclass
class OutputSpec:
    # "ort" (index into the ONNX outputs), "input" (an argument passed through), "const",
    # or "sym" (an integer size: value is its sympy expression over the input symbols)
    source: str
    index: int = 0
    value: object = None
    as_scalar: bool = False  # a 0-d ORT result the graph expects as a Python number


@dataclasses.dataclass
class LoweredGraph:
    model: onnx.ModelProto
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    ort_outputs: list[InputSpec]  # name, dtype, shape, device of each ONNX output
    returns_tuple: bool = True  # False: the graph returns its single output bare
    node_origin: dict = dataclasses.field(default_factory=dict)  # ONNX node name -> FX node name
    # symbol -> every (argument index, dim) it is the size of (dim None: an int argument)
    symbols: dict = dataclasses.field(default_factory=dict)
    symbol_ranges: dict = dataclasses.field(default_factory=dict)  # symbol -> (min, max or None)
    disabled_optimizers: tuple = ()  # ORT graph optimizations that would change results here
    # (ORT output index, message, to torch) per 0-d bool output: when true, raise the message
    # (as aten raises), or, to torch, fail the run at the node the message names
    failures: list = dataclasses.field(default_factory=list)
    pattern_key: str | None = None  # the input the runner feeds its memory-pattern key (see below)
    # nodes of int arguments, shapes, frozen weights and constants alone that read a size, run
    # apart once per set of sizes (lower.hoist); their results are the last inputs, after the
    # graph's own arguments
    size_prelude: SizePrelude | None = None
    # conditions on the symbols every call must meet (sympy booleans): torch.export's guards,
    # relations between sizes and int arguments (n <= x.shape[1]) its graph was traced under
    guards: list = dataclasses.field(default_factory=list)
    # ortlite.compile: outputs that are views of an input (as eager returns them): user
    # output index -> (user input index, [(aten view op name, its other arguments)...])
    input_views: dict = dataclasses.field(default_factory=dict)
    # ortlite.compile of a bfloat16/float16 model with Options.quantize: the graph computes in
    # float32; the call casts arguments of this dtype to float32 and float32 results back
    io_dtype: torch.dtype | None = None
    # Options.quantize: the products quantized (lower.quantize.QuantizedProduct), and the
    # stub initializers of quantized frozen weights: name -> (weight input, form, transposed)
    quantized: list = dataclasses.field(default_factory=list)
    derived_weights: dict = dataclasses.field(default_factory=dict)
    # Options.calibration: the convolutions quantized statically (lower.qdq.StaticConv); while
    # calibrating, the tensors observed, each one's min and max the ONNX outputs after the rest
    static_convs: list = dataclasses.field(default_factory=list)
    observed: list = dataclasses.field(default_factory=list)
    calibration_samples: int = 0  # how many samples calibrated static_convs' ranges
    # outputs ONNX Runtime must write into an input's memory (its kernel makes them from that
    # input in place: GroupQueryAttention's present key sharing the past key's buffer, see
    # lower.decoder): [(ONNX output name, ONNX input name)]; the runner binds both to it
    inplace: list = dataclasses.field(default_factory=list)
    # each sort and topk: (node, module or "", lower.tie_order.TieOrder), for ortlite.explain
    sorts: list = dataclasses.field(default_factory=list)


def _scalar_kind(val) -> str | None:
    if isinstance(val, (bool, torch.SymBool)):
        return BOOL
    if isinstance(val, (int, torch.SymInt)):
        return INT
    if isinstance(val, (float, torch.SymFloat)):
        return FLOAT
    return None


def lower_graph(
    gm: torch.fx.GraphModule,
    opset: int,
    constants: dict | None = None,
    symbol_ranges: dict | None = None,
    *,
    stable_ties: bool = False,
    hoist_sizes: bool = False,
    frozen: frozenset = frozenset(),
    quantize: str | None = None,
    mutated: dict | None = None,
    calibration: str | dict | None = None,
) -> LoweredGraph:
    """constants: placeholder name -> tensor, for placeholders that become initializers
    (the runner then takes no argument for them). symbol_ranges: symbol -> (min, max),
    overriding the ShapeEnv's (torch.export's range_constraints are the user's Dims).
    stable_ties: Options.sort_ties == "stable". hoist_sizes: move what int arguments,
    shapes, constants and frozen weights alone determine into a size prelude (see lower.hoist;
    the runner of runner.build_runner runs it). frozen: indices of the arguments that are
    frozen weights (ortlite.frozen). quantize: Options.quantize (see lower.quantize).
    calibration (lower.qdq): OBSERVE, the float graph with the min and max of each tensor
    static quantization would quantize as extra outputs (LoweredGraph.observed); or their
    calibrated ranges (name -> (min, max)), the convolutions then quantized statically."""
    with declared_ranges(symbol_ranges):
        return _lower_graph(gm, opset, constants, symbol_ranges, stable_ties, hoist_sizes, frozen, quantize, mutated or {}, calibration)


OBSERVE = "observe"


def _lower_graph(gm, opset, constants, symbol_ranges, stable_ties, hoist_sizes, frozen, quantize, mutated, calibration=None) -> LoweredGraph:
    g = GraphBuilder("ortlite", opset)  # the same graph gives the same bytes: sessions are cached by them
    g.stable_ties = stable_ties
    g.shape_env = next((env for n in gm.graph.nodes if (env := shape_env_of(n)) is not None), None)
    env: dict[torch.fx.Node, object] = {}
    inputs: list[InputSpec] = []
    constants = constants or {}

    symbols: dict = {}
    ranges: dict = {}

    # Placeholders first: a partition's placeholders may come after nodes that use sizes
    # they carry (torch.fx's fuse_partitions places them where first used).
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders + [n for n in gm.graph.nodes if n.op != "placeholder"]:
        if node.op == "placeholder" and node.name in constants:
            env[node] = g.weight(node.name, constants[node.name])
        elif node.op == "placeholder":
            val = meta(node)
            _collect_symbols(val, len(inputs), symbols, ranges)
            # (a tensor the graph mutates without reading it stays an input: its new value is
            # written into its memory, see unread_inputs_in_place)
            if not node.users and not (isinstance(val, torch.Tensor) and node.name in set(mutated.values())):
                if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:  # an input if a size needs it
                    g.deferred_inputs[val.node.expr] = _deferred_int_input(g, node.name, inputs, len(inputs))
                inputs.append(InputSpec(UNUSED))
                continue
            if isinstance(val, torch.Tensor):
                spec = InputSpec(TENSOR, g.fresh(node.name), val.dtype, tuple(val.shape), val.device)
            elif _scalar_kind(val) is not None:
                kind = _scalar_kind(val)
                spec = InputSpec(kind, g.fresh(node.name), SCALAR_DTYPES[kind], ())
            else:
                raise LoweringError(f"graph input {node.name} has unsupported meta value {val!r}")
            g.add_input(spec.name, spec.dtype, spec.shape)
            env[node] = Value(spec.name, spec.dtype, spec.shape)
            for d, size in enumerate(val.shape if spec.kind == TENSOR else [val]):
                expr = sym_expr(size) if isinstance(size, (int, torch.SymInt)) else None
                if expr is not None and expr.is_Symbol:
                    g.symbol_sources.setdefault(expr, (spec.name, d if spec.kind == TENSOR else None))
            inputs.append(spec)
        elif node.op == "call_function":
            g.current_origin = node.name
            try:
                with no_new_guards(node):
                    env[node] = _lower_node(g, node, env)
            except Exception as e:
                raise NodeNotLowered(node.name, f"{type(e).__name__}: {e}") from e
            if isinstance(meta(node), torch.SymInt):  # later sizes with this expression reuse it
                g.remember_size(meta(node).node.expr, env[node])
        elif node.op == "get_attr":  # a tensor constant of the graph: an initializer
            value = _attr(gm, node.target)
            if not isinstance(value, torch.Tensor) or value.dtype not in TORCH_TO_ONNX or value.layout != torch.strided:
                raise LoweringError(f"graph constant {node.target} is not a strided tensor ONNX holds: {type(value).__name__}")
            env[node] = g.weight(node.name, value)
        elif node.op == "output":
            outputs, ort_outputs = _lower_outputs(g, node, env, inputs, constants, symbols)
            returns_tuple = isinstance(node.args[0], (tuple, list))
        else:
            raise LoweringError(f"cannot lower FX node {node.format_node()}")
    ranges.update(symbol_ranges or {})
    # MatMulScaleFusion folds a scale into MatMul as a float32 attribute: a float64 graph
    # would then differ from aten by ~1e-8 (seen in attention: scores * 1/sqrt(d)).
    disabled = ("MatMulScaleFusion",) if torch.float64 in g.dtypes else ()
    pattern_key = g.fresh("ortlite_pattern_key") if _sizes_vary(inputs, ort_outputs) else None
    if pattern_key is not None:  # (a saved file gives it a default: see CompiledModel.onnx_model_for_saving)
        g.add_input(pattern_key, torch.uint8, (sympy.Symbol(pattern_key), 0))
    model = g.model()
    known = {str(v): (v.dtype, v.shape) for v in env.values() if isinstance(v, Value) and isinstance(v.dtype, torch.dtype)}
    # a static cache's offsets (a counter per layer) read as one, checked equal per call: before
    # the failures are made outputs, so that each layer's checks are then alike and kept once
    # (CPU graphs alone: the check is an index out of bounds, which ONNX Runtime's CPU Gather refuses)
    offset_checks: list = []
    if all(s.device.type == "cpu" for s in inputs if s.kind == TENSOR and s.device is not None):
        shared_cache_offsets(model.graph, known, {c for c, _, kind in g.failures if kind != TO_TORCH}, offset_checks)
    for check, write in offset_checks:  # (a run failing there: the cache write runs in torch)
        g.node_origin[check] = g.node_origin.get(write, "")
    failures = []
    # each check once: a condition computed alike with the same message is the same output
    repeated = repeated_checks(list(model.graph.node), list(model.graph.initializer), g.failures)
    for (condition, message, kind), again in zip(g.failures, repeated):  # extra 0-d bool outputs, read by the runner
        if again:
            continue
        failures.append((len(ort_outputs), message, kind))
        model.graph.output.append(onnx.helper.make_tensor_value_info(condition, onnx.TensorProto.BOOL, []))
        ort_outputs.append(InputSpec(TENSOR, condition, torch.bool, (), torch.device("cpu")))
    fuse_rms_norm(model.graph, known)
    raising = {ort_outputs[i].name for i, _, kind in failures if kind != TO_TORCH}  # outputs that make the call raise
    runtime_checks, checked_masks = [], {}
    proven_attention_masks(model.graph, known, raising, runtime_checks, checked_masks)
    repeated = repeated_checks(list(model.graph.node), list(model.graph.initializer), [(c, r, TO_TORCH) for c, r, _ in runtime_checks])
    for (condition, reason, onnx_node), again in zip(runtime_checks, repeated):  # (fail the run where true: that node runs in torch)
        if again:  # (the same check of another layer's attention: the same op, sent to torch alike)
            continue
        check = g.fresh(f"{g.node_origin.get(onnx_node, onnx_node)}__FallbackCheck")
        g.node_origin[check] = g.node_origin.get(onnx_node, "")
        failures.append((len(ort_outputs), f"while running FallbackCheck node. Name:'{check}' Status Message: {reason}", TO_TORCH))
        model.graph.output.append(onnx.helper.make_tensor_value_info(condition, onnx.TensorProto.BOOL, []))
        ort_outputs.append(InputSpec(TENSOR, condition, torch.bool, (), torch.device("cpu")))
    attention_fusions(model.graph, known, g.values_now)
    inplace: list = []
    mutations = _mutation_pairs(mutated, outputs, ort_outputs, placeholders, env, inputs)
    decoder_ops = static_cache_attention(model.graph, known, raising, inplace, mutations, checked_masks) + skip_simplified_norms(model.graph, known)
    scatters_in_place(model.graph, inplace, mutations)
    unread_inputs_in_place(model.graph, inplace, mutations)
    hoisting = hoist_sizes and pattern_key is not None  # (CPU graphs whose sizes vary: the same test)
    fold_flattening_reshapes(model.graph, known, g.node_origin, keep_gemm=hoisting)
    shield_range_gathers(model.graph)
    # q, k and v packed where they feed GroupQueryAttention (packing the MLP's gate and up measured
    # 1-5% slower a decode step with quantized weights: the Split costs what the call saves)
    # (frozen weights: packed where ONNX Runtime folds them, unless quantize needs them as they are)
    frozen_names = frozenset(s.name for i, s in enumerate(inputs) if i in frozen and s.kind == TENSOR) if quantize is None else frozenset()
    if decoder_ops and packed_products(model.graph, known, into=("GroupQueryAttention",), frozen=frozen_names):
        rotary_inside_attention(model.graph, known, model.opset_import, frozen_names)
    drop_unread_initializers(model.graph)
    prelude = None
    if hoisting:
        weights = [s.name for i, s in enumerate(inputs) if i in frozen and s.kind == TENSOR and s.device.type == "cpu" and s.dtype in PRELUDE_WEIGHT_DTYPES]
        split = split_size_constants(
            model, [s.name for s in inputs if s.kind == INT], [s.name for s in inputs if s.kind == TENSOR], weights
        )
        if split is not None:
            model, prelude, specs = split
            inputs = inputs + [InputSpec(TENSOR, name, dtype, shape, torch.device("cpu")) for name, dtype, shape in specs]
    if decoder_ops:
        add_domain(model)
    static_convs, observed = [], []
    if calibration is not None:
        fold_batch_norms(model.graph)
        planned = plan(model.graph)
        if calibration == OBSERVE:
            observed = list(dict.fromkeys(planned.points.values()))
            observer_outputs(model.graph, observed)
            quantize = None  # (calibration runs the float graph)
        else:
            static_convs = quantize_planned(model.graph, planned, calibration, g.node_origin)
    quantized, derived = [], {}
    if quantize is not None:
        frozen_names = {s.name for i, s in enumerate(inputs) if i in frozen and s.kind == TENSOR}
        quantized, derived = quantize_products(model.graph, quantize, known, frozen_names, g.node_origin, ranges)
        if quantized:
            add_domain(model)
    return LoweredGraph(
        model, inputs, outputs, ort_outputs, returns_tuple, g.node_origin, symbols, ranges, disabled, failures, pattern_key, prelude,
        quantized=quantized, derived_weights=derived, inplace=inplace, static_convs=static_convs, observed=observed, sorts=sort_verdicts(gm.graph),
    )


def _mutation_pairs(mutated: dict, outputs: list, ort_outputs: list, placeholders: list, env: dict, inputs: list) -> dict:
    """ONNX output name -> ONNX input name, for outputs that are the new values of inputs the
    graph mutates (mutated: FX output position -> the placeholder's name), each output read
    by that FX output alone: those an output may be written into in place."""
    by_name = {n.name: n for n in placeholders}
    tensor_inputs = {spec.name for spec in inputs if spec.kind == TENSOR}
    uses: dict[int, int] = {}
    for o in outputs:
        if o.source == "ort":
            uses[o.index] = uses.get(o.index, 0) + 1
    pairs = {}
    for position, name in mutated.items():
        o = outputs[position] if 0 <= position < len(outputs) else None
        node = by_name.get(name)
        value = env.get(node) if node is not None else None
        if o is not None and o.source == "ort" and uses[o.index] == 1 and isinstance(value, Value) and str(value) in tensor_inputs:
            pairs[ort_outputs[o.index].name] = str(value)
    return pairs


def _sizes_vary(inputs: list[InputSpec], ort_outputs: list[InputSpec]) -> bool:
    """Whether the graph needs a memory-pattern key input. ONNX Runtime caches a session's
    memory plan (one block for all intermediates, laid out after the first run) under the
    XOR of every fed dimension: inputs of equal shapes cancel out (input_ids and
    attention_mask: b^s^b^s = 0 for every b, s), and (2, 16) and (3, 17) collide. A
    session then keeps the plan of the first sizes it ran, and at other sizes allocates each
    intermediate on its own (LLaMA, zoo size: 12% slower). The runner feeds this extra,
    zero-element input a first dim that makes the key a hash of all argument sizes and
    integer arguments, so each set of sizes gets a plan of its own (the first few: see
    MAX_PATTERN_KEYS in _fast.pyx). CPU graphs alone: the CUDA path has not run on a GPU
    yet, and other sessions whose sizes vary make no plans (ortlite.session)."""
    devices = [s.device for s in inputs + ort_outputs if s.device is not None]
    return sizes_vary(inputs) and all(d.type == "cpu" for d in devices)


def sizes_vary(inputs: list[InputSpec]) -> bool:
    """Whether the graph takes int arguments or tensors of symbolic sizes."""
    return any(s.kind == INT or (s.kind == TENSOR and not all(isinstance(d, int) for d in s.shape)) for s in inputs)


def _deferred_int_input(g: GraphBuilder, name: str, inputs: list, index: int):
    """For a SymInt argument no node reads: makes it an ONNX input when a size needs it."""

    def add() -> str:
        inputs[index] = InputSpec(INT, g.fresh(name), torch.int64, ())
        g.add_input(inputs[index].name, torch.int64, ())
        return inputs[index].name

    return add


def finite_int(bound) -> int | None:
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):  # sympy's and torch's infinities
        return None


def _collect_symbols(val, index: int, symbols: dict, ranges: dict) -> None:
    """Record which argument sizes are plain symbols, and the symbols' value ranges."""
    sizes = [(d, s) for d, s in enumerate(val.shape)] if isinstance(val, torch.Tensor) else [(None, val)]
    for dim, size in sizes:
        if not isinstance(size, torch.SymInt):
            continue
        expr = size.node.expr
        if expr.is_Symbol:
            symbols.setdefault(expr, []).append((index, dim))
            bounds = size.node.shape_env.var_to_range.get(expr)
            if bounds is not None:
                ranges[expr] = (finite_int(bounds.lower), finite_int(bounds.upper))


def _attr(gm: torch.fx.GraphModule, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _lower_node(g: GraphBuilder, node: torch.fx.Node, env: dict):
    if node.target is operator.getitem:
        source, index = node.args
        return env[source][index]
    reason = unsupported_reason(node)
    if reason is not None:
        raise LoweringError(f"{node.target}: {reason}")
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
    result = lowering_for(node.target).fn(g, node, *args, **kwargs)
    val = meta(node)
    if val is None:  # an assertion node: no value
        return None
    if isinstance(val, (int, torch.SymInt)):
        return Value(result, torch.int64, ())
    if isinstance(val, (float, torch.SymFloat)):
        return Value(result, torch.float64, ())
    if isinstance(val, (tuple, list)):
        return tuple(
            Value(r, v.dtype, v.shape) if isinstance(v, torch.Tensor) and r is not None else None for r, v in zip(result, val)
        )
    return Value(result, val.dtype, val.shape)


def _lower_outputs(g: GraphBuilder, node: torch.fx.Node, env: dict, inputs: list[InputSpec], constants: dict, symbols: dict):
    arguments = [n for n in node.graph.nodes if n.op == "placeholder" and n.name not in constants]
    placeholders = {n: i for i, n in enumerate(arguments)}
    outputs: list[OutputSpec] = []
    ort_outputs: list[InputSpec] = []
    ort_index: dict[str, int] = {}
    graph_input_names = {spec.name for spec in inputs if spec.name}
    initializer_names = {t.name for t in g.initializers}
    (results,) = node.args
    for result in results if isinstance(results, (tuple, list)) else [results]:
        if not isinstance(result, torch.fx.Node):
            outputs.append(OutputSpec("const", value=result))
            continue
        if result in placeholders:
            outputs.append(OutputSpec("input", index=placeholders[result]))
            continue
        expr = meta(result).node.expr if isinstance(meta(result), torch.SymInt) else None
        if expr is not None and expr.free_symbols <= set(symbols) and not expr.atoms(sympy.Float):
            outputs.append(OutputSpec("sym", value=meta(result).node.expr))  # computed from argument sizes
            continue
        value = env[result]
        val = meta(result)
        if value in graph_input_names or value in initializer_names:
            value = Value(g.op("Identity", value), value.dtype, value.shape)
        if value not in ort_index:
            ort_index[value] = len(ort_outputs)
            dtype, shape = value.dtype, value.shape
            device = val.device if isinstance(val, torch.Tensor) else torch.device("cpu")
            g.add_output(value, dtype, shape)
            ort_outputs.append(InputSpec(TENSOR, value, dtype, shape, device))
        outputs.append(OutputSpec("ort", index=ort_index[value], as_scalar=not isinstance(val, torch.Tensor)))
    return outputs, ort_outputs
