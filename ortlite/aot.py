"""ortlite.compile: ahead-of-time compilation through torch.export, for loops where even
Dynamo's guards cost too much. The whole graph goes to ONNX Runtime or compile fails."""

from __future__ import annotations

import copy
import itertools
import operator
import warnings

import onnx
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from . import _fast
from .decomp import export_decomposition_table
from .dynamo_backend import missing_kernel_origin
from .lower import InputSpec, finite_int, lower_graph
from .lower.registry import shape_env_of
from .options import Options
from .partition import source_line, unsupported_nodes
from .runner import runner_for
from .session import SessionCache

WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class CompileError(RuntimeError):
    """The exported graph cannot run entirely in ONNX Runtime."""


class CompiledModel(_fast.Runner):
    """A model compiled ahead of time. Calling it goes straight into the Cython runner.

    onnx_model: the onnx.ModelProto; providers: the session's execution providers;
    save(path): a self-contained .onnx file that plain onnxruntime runs and ortlite.load
    turns back into a CompiledModel.
    """

    def save(self, path, external_data: bool | None = None) -> None:
        """Write the model, with what ortlite.load needs to rebuild this CompiledModel, as one
        .onnx file (see ortlite.saved). external_data: weights in a file beside it
        (`<name>.data`); None: only when the model is over protobuf's 2 GB limit."""
        from .saved import save

        save(self, path, external_data)

    def onnx_model_for_saving(self) -> onnx.ModelProto:
        """The model with its current weights as initializers: weights bound by pointer stop
        being inputs, except buffers the model mutates, which stay inputs whose initializer
        is their default (plain onnxruntime uses it; ortlite.load binds them again)."""
        from .lower.builder import to_tensor_proto

        model = copy.deepcopy(self.onnx_model)
        mutated = self._mutated_weight_names()
        bound = {name: tensor for name, tensor in zip(self._weight_input_names, self._weights) if name}
        if bound:
            kept = [i for i in model.graph.input if i.name not in bound or i.name in mutated]
            del model.graph.input[:]
            model.graph.input.extend(kept)
            others = [t for t in model.graph.initializer if t.name not in bound]
            del model.graph.initializer[:]
            model.graph.initializer.extend(others)
            model.graph.initializer.extend(to_tensor_proto(t.detach().cpu().contiguous(), n) for n, t in bound.items())
        return model

    def _mutated_weight_names(self) -> set:
        """ONNX input names of the bound weights that are buffers the model mutates."""
        buffers = {target for kind, target in self._mutations if kind == OutputKind.BUFFER_MUTATION}
        return {name for name, target in zip(self._weight_input_names, self._weight_targets) if target in buffers}


class _StructuredCompiledModel(CompiledModel):
    """For programs whose calls need more than `runner(*tensors)`: kwargs or nested inputs,
    weights bound by pointer, nested outputs, or buffer and input mutations."""

    def __call__(self, *args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        reduced = self._lowered.io_dtype
        if reduced is not None:
            flat = _cast(flat, reduced, torch.float32)
        if spec != self._in_spec:
            raise TypeError(
                f"ortlite.compile: the call's arguments are structured as {spec}, but the model was "
                f"exported with {self._in_spec}"
            )
        results = _fast.Runner.__call__(self, *self._weights, *flat)
        if not isinstance(results, tuple):
            results = (results,)
        for (kind, target), value in zip(self._mutations, results):
            destination = self._mutation_target(kind, target, flat)
            with torch.no_grad():
                destination.copy_(value)
        user = list(results[len(self._mutations) :])
        if reduced is not None:
            user = _cast(user, torch.float32, reduced)
        for position, (source, chain) in self._lowered.input_views.items():
            user[position] = view_of(flat[source], chain, position)
        return pytree.tree_unflatten(user, self._out_spec)

    def _mutation_target(self, kind, target, flat):
        if kind == OutputKind.BUFFER_MUTATION:
            return self._buffers[target]
        return flat[target]


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
        program = torch.export.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes)
        module = model
    else:
        raise TypeError(f"ortlite.compile takes an nn.Module or an ExportedProgram, got {type(model).__name__}")
    with warnings.catch_warnings():  # torch 2.13's own deepcopy of its module call graph warns, every time
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        program = program.run_decompositions(export_decomposition_table())
    gm = program.graph_module
    signature = program.graph_signature

    _refuse_unsupported(gm)
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
    lowered = lower_graph(gm, options.opset, constants, ranges, stable_ties=options.sort_ties == "stable", quantize=options.quantize)
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
        compiled = runner_for("aot", lowered, gm, options, SessionCache(), cls=cls)
    except Exception as e:
        origin = missing_kernel_origin(e, lowered.node_origin)
        where = f" (node {origin}{_source(gm, origin)})" if origin else ""
        raise CompileError(f"ortlite.compile: ONNX Runtime cannot run the exported graph{where}: {e}") from e
    buffers = dict(module.named_buffers()) if module is not None else {k: v for k, v in state.items()}
    return attach(compiled, lowered, weights, weight_targets, in_spec, out_spec, mutations, buffers)


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


def _cast(tree, source: torch.dtype, target: torch.dtype):
    """tree with its tensors of dtype source cast to target."""
    return pytree.tree_map(lambda t: t.to(target) if isinstance(t, torch.Tensor) and t.dtype == source else t, tree)


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


def view_of(tensor: torch.Tensor, chain: list, position: int) -> torch.Tensor:
    """tensor viewed through a chain of aten view ops (names and their other arguments)."""
    try:
        for name, args in chain:
            packet, overload = name.split(".")
            tensor = getattr(getattr(torch.ops.aten, packet), overload)(tensor, *args)
    except (RuntimeError, IndexError, TypeError) as e:  # (a saved file's malformed chain)
        raise ValueError(f"ortlite.compile: output {position} cannot be made the view of its input that eager returns ({name}: {e})") from None
    return tensor


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


def model_class(lowered, has_weights: bool, mutations: list, in_spec, out_spec) -> type:
    """CompiledModel, or _StructuredCompiledModel when calls need more than runner(*tensors);
    sets lowered.returns_tuple to match (a single output comes back bare)."""
    simple = not has_weights and not mutations and not lowered.input_views and lowered.io_dtype is None and _is_plain_tuple_call(in_spec) and _is_plain_output(out_spec)
    lowered.returns_tuple = not (simple and out_spec.is_leaf())
    return CompiledModel if simple else _StructuredCompiledModel


def attach(compiled, lowered, weights, weight_targets, in_spec, out_spec, mutations, buffers) -> CompiledModel:
    """What a CompiledModel keeps beside its runner (ortlite.compile and ortlite.load).
    weights: tensors bound by pointer, ahead of the call's arguments; weight_targets: their
    names in the model's state; buffers: name -> tensor that buffer mutations write to."""
    compiled.onnx_model = lowered.model
    compiled._lowered = lowered
    compiled._weights = tuple(weights)
    compiled._weight_input_names = [spec.name for spec in lowered.inputs[: len(weights)]]
    compiled._weight_targets = list(weight_targets)
    compiled._in_spec, compiled._out_spec = in_spec, out_spec
    compiled._mutations = mutations
    compiled._buffers = buffers
    compiled.plain_tensors = True
    return compiled


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


def _user_input_index(signature, name) -> int:
    users = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    return users.index(name)


def _children(spec) -> list:
    return spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs


def _is_plain_tuple_call(in_spec) -> bool:
    """(args, kwargs) where args is a flat tuple and kwargs is empty."""
    args_spec, kwargs_spec = _children(in_spec)
    return args_spec.type is tuple and all(c.is_leaf() for c in _children(args_spec)) and kwargs_spec.num_leaves == 0


def _is_plain_output(out_spec) -> bool:
    return out_spec.is_leaf() or (out_spec.type is tuple and all(c.is_leaf() for c in _children(out_spec)))
