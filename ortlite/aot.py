"""ortlite.compile: ahead-of-time compilation through torch.export, for loops where even
Dynamo's guards cost too much. The whole graph goes to ONNX Runtime or compile fails."""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import operator
import warnings

import onnx
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from .calibrate import exported_calls, lower_calibrated
from .compiled import CompiledModel, _cast, attach, model_class
from .decomp import export_decomposition_table
from .dynamo_backend import missing_kernel_origin
from .lower import InputSpec, finite_int, lower_graph
from .lower.registry import shape_env_of
from .lower.tie_order import mark_tie_orders
from .options import Options
from .partition import source_line, unsupported_nodes
from .runner import runner_for
from .session import SessionCache

log = logging.getLogger("ortlite")

WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class CompileError(RuntimeError):
    """The exported graph cannot run entirely in ONNX Runtime."""


def compile(  # noqa: A001 (ortlite.compile mirrors torch.compile)
    model,
    args=(),
    kwargs=None,
    *,
    dynamic_shapes=None,
    options: Options | dict | None = None,
    bind_weights: bool = False,
) -> CompiledModel:
    """Compile `model` (an nn.Module or a torch.export ExportedProgram) for these example
    inputs. Parameters, buffers and constants become initializers; bind_weights=True binds
    them by data pointer instead (shared with torch: in-place updates are seen, no copy)."""
    options = Options.coerce(options)
    reduced = _reduced_precision(model, options)
    if reduced is not None:  # computed in float32 (weights quantized from their values), called in the model's dtype
        model, args, kwargs = copy.deepcopy(model).float(), _cast(args, reduced, torch.float32), _cast(kwargs, reduced, torch.float32)
    if isinstance(model, ExportedProgram):
        program, module = model, None
    elif isinstance(model, torch.nn.Module):
        program, module = export_to_aten(model, tuple(args), kwargs, dynamic_shapes), model
    else:
        raise TypeError(f"ortlite.compile takes an nn.Module or an ExportedProgram, got {type(model).__name__}")
    if _needs_decompositions(program):
        with warnings.catch_warnings():  # torch 2.13's own deepcopy of its module call graph warns, every time
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
            program = program.run_decompositions(export_decomposition_table())
    gm = program.graph_module
    signature = program.graph_signature

    _refuse_unsupported(gm)
    mark_tie_orders(gm.graph)
    state = {**program.state_dict, **program.constants}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mutated_buffers = set(signature.buffers_to_mutate.values())
    weights, weight_targets, constants = [], [], {}
    for spec, node in zip(signature.input_specs, placeholders):
        if spec.kind in WEIGHT_KINDS:
            tensor = state[spec.target]
            if bind_weights or spec.target in mutated_buffers:
                weights.append(tensor)
                weight_targets.append(spec.target)
            else:
                constants[node.name] = tensor
        elif spec.kind != InputKind.USER_INPUT:
            raise CompileError(f"ortlite.compile: unsupported exported input kind {spec.kind} ({spec.target})")

    ranges = _ranges_run(program, placeholders)
    lower = functools.partial(
        lower_graph, gm, options.opset, constants, ranges, stable_ties=options.sort_ties == "stable", mutated=_mutated_inputs(signature, placeholders)
    )
    if options.calibration is not None:  # the float graph run on the samples first (ortlite.calibrate)
        lowered = lower_calibrated(lower, gm, options, exported_calls(options, weights, program.call_spec.in_spec, reduced))
    else:
        lowered = lower(quantize=options.quantize)
    lowered.guards = _export_guards(placeholders, lowered.symbols)
    lowered.input_views = _input_views(gm, signature)
    lowered.io_dtype = reduced
    if not lowered.ort_outputs:
        _give_an_output(lowered)
    mutations = [
        (spec.kind, spec.target if spec.kind == OutputKind.BUFFER_MUTATION else _user_input_index(signature, spec.target))
        for spec in signature.output_specs
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)
    ]
    in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
    cls = model_class(lowered, bool(weights), mutations, in_spec, out_spec)
    try:
        compiled = runner_for("aot", lowered, gm, options, SessionCache(private=True), cls=cls)
    except Exception as e:
        origin = missing_kernel_origin(e, lowered.node_origin)
        where = f" (node {origin}{_source(gm, origin)})" if origin else ""
        raise CompileError(f"ortlite.compile: ONNX Runtime cannot run the exported graph{where}: {e}") from e
    buffers = dict(module.named_buffers()) if module is not None else {k: v for k, v in state.items()}
    return attach(compiled, lowered, weights, weight_targets, in_spec, out_spec, mutations, buffers)


def export_to_aten(model: torch.nn.Module, args: tuple, kwargs, dynamic_shapes, strict: bool = False) -> ExportedProgram:
    """The model exported in one trace to post-dispatch ATen: functional, its composite ops
    decomposed as dispatch decomposes them. torch.export.export's own IR keeps composite ops
    (linear, layer_norm, scaled_dot_product_attention) and in-place ones, and
    run_decompositions re-traces the whole program to remove them, which took longer than
    the export itself (LLaMA h256: 1.6 s against 0.9). Through torch's private
    `_export(pre_dispatch=False)`; where that fails, the public export (whose error, if it
    fails too, is the one the user sees)."""
    try:
        from torch.export._trace import _export

        return _export(model, args, kwargs, dynamic_shapes, strict=strict, pre_dispatch=False)
    except Exception as e:  # noqa: BLE001 (the public export below raises what the user should see)
        log.debug("ortlite.compile: export to ATen in one trace failed (%s: %s); torch.export.export", type(e).__name__, e)
    return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)


def _needs_decompositions(program: ExportedProgram) -> bool:
    """Whether the program holds what ortlite's table does not lower as it stands: an op
    outside the table (or one its check refuses), an op of a training IR (composite or
    in-place), or complex values (ortlite.complex decomposes them into real arithmetic)."""
    if program.verifier.dialect != "ATEN":
        return True
    gm = program.graph_module
    if any(isinstance(v, torch.Tensor) and v.dtype.is_complex for n in gm.graph.nodes for v in pytree.tree_leaves(n.meta.get("val"))):
        return True
    return bool(unsupported_nodes(gm, {}))


def _reduced_precision(model, options: Options):
    """bfloat16 or float16, for an nn.Module on CPU whose floating weights all have that dtype,
    compiled with Options.quantize: ONNX Runtime's CPU provider has no bfloat16 arithmetic
    (and little float16), so such a model runs in float32 inside, its weight products in the
    integer kernels; the call takes and returns the model's dtype. Else None."""
    if options.quantize is None or not isinstance(model, torch.nn.Module):
        return None
    floats = [t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_floating_point()]
    dtypes = {t.dtype for t in floats}
    if len(dtypes) != 1 or not dtypes <= {torch.bfloat16, torch.float16} or any(t.device.type != "cpu" for t in floats):
        return None
    return dtypes.pop()


def _give_an_output(lowered) -> None:
    """A graph whose results are all arguments, constants or sizes (`return x`) has no node
    for ONNX Runtime, which refuses a model without outputs: one constant output it ignores."""
    name = "ortlite_no_results"
    lowered.model.graph.node.append(onnx.helper.make_node("Constant", [], [name], value=onnx.helper.make_tensor("v", onnx.TensorProto.BOOL, [], [False])))
    lowered.model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, []))
    lowered.ort_outputs.append(InputSpec("tensor", name, torch.bool, (), torch.device("cpu")))


def _input_views(gm: torch.fx.GraphModule, signature) -> dict:
    """User outputs that eager returns as views of a user input (x[1:], x.t(), a returned
    x.add_(1)): user output index -> (user input index, the view ops from it). The graph
    computes them as new tensors; the call makes them views of the input again, as eager.
    Only chains of view ops with constant arguments (symbolic ones are left as copies)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    user_inputs = {
        node: index
        for index, node in enumerate(n for n, spec in zip(placeholders, signature.input_specs) if spec.kind == InputKind.USER_INPUT)
    }
    (outputs,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
    mutated = {}  # the node holding a user input's new value -> that input
    for spec, node in zip(signature.output_specs, outputs):
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            mutated[node] = _user_input_index(signature, spec.target)
    views, user = {}, [node for spec, node in zip(signature.output_specs, outputs) if spec.kind == OutputKind.USER_OUTPUT]
    for position, node in enumerate(user):
        chain = []
        while isinstance(node, torch.fx.Node) and node not in user_inputs and node not in mutated:
            op = node.target
            if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or not op.is_view or op.namespace != "aten":
                break
            rest = (node.args[1:], node.kwargs)
            if any(isinstance(a, (torch.fx.Node, torch.SymInt)) for a in pytree.tree_leaves(rest)):
                break
            chain.append((f"{op._opname}.{op._overloadname}", list(node.args[1:])))
            node = node.args[0]
        source = user_inputs.get(node, mutated.get(node))
        if source is not None and isinstance(node, torch.fx.Node):
            views[position] = (source, chain[::-1])
    return views


def _ranges_run(program: ExportedProgram, placeholders) -> dict:
    """symbol -> (min, max or None) of the sizes and int arguments the compiled graph takes:
    the exported ranges, except that a Dim which allows 0 runs from 1. Export traced the graph
    with sizes of at least 2, and ortlite's lowerings assume inputs that are not empty."""
    sizes = {
        d.node.expr
        for n in placeholders
        if isinstance(val := n.meta.get("val"), torch.Tensor)
        for d in val.shape
        if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol
    }
    ranges = {}
    for symbol, r in program.range_constraints.items():
        low, high = finite_int(r.lower), finite_int(r.upper)
        ranges[symbol] = (max(low or 0, 1) if symbol in sizes else low, high)
    return ranges


def _export_guards(placeholders, symbols: dict) -> list:
    """The exported program's guards on its inputs' sizes and int arguments (what
    ExportedProgram.module() asserts per call): a slice bound n of x[:, :n] traced with
    0 <= n <= x.shape[1] gives a graph that is wrong for other n."""
    env = next((env for n in placeholders if (env := shape_env_of(n)) is not None), None)
    if env is None:
        return []
    return [g.expr for g in env.guards if g.expr.free_symbols and g.expr.free_symbols <= set(symbols)]


def _refuse_unsupported(gm: torch.fx.GraphModule) -> None:
    unsupported = unsupported_nodes(gm, {})
    if unsupported:
        lines = [f"  {n.target} ({reason}){_source(gm, n.name)}" for n, reason in unsupported.items() if n.target is not operator.getitem]
        raise CompileError(
            "ortlite.compile needs the whole graph in ONNX Runtime, but these ops cannot run there:\n"
            + "\n".join(lines)
            + "\nUse torch.compile(model, backend='ortlite') to run the rest in ONNX Runtime and these in torch."
        )


def _source(gm: torch.fx.GraphModule, node_name: str) -> str:
    node = next((n for n in gm.graph.nodes if n.name == node_name), None)
    line = source_line(node) if node is not None else ""
    return f", from {line}" if line else ""


def _mutated_inputs(signature, placeholders) -> dict:
    """FX output position -> the name of the placeholder whose new value it is (the buffers
    and user inputs the program mutates)."""
    by_target = {}
    for spec, node in zip(signature.input_specs, placeholders):
        if spec.kind == InputKind.BUFFER:
            by_target[("buffer", spec.target)] = node.name
        elif spec.kind == InputKind.USER_INPUT:
            by_target[("user", spec.arg.name)] = node.name
    mutated = {}
    for position, spec in enumerate(signature.output_specs):
        key = ("buffer", spec.target) if spec.kind == OutputKind.BUFFER_MUTATION else ("user", spec.target) if spec.kind == OutputKind.USER_INPUT_MUTATION else None
        if key in by_target:
            mutated[position] = by_target[key]
    return mutated


def _user_input_index(signature, name) -> int:
    users = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    return users.index(name)


