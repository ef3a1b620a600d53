"""Graphs compiled for the values of some scalar arguments, checked at every call.

Some lowerings need a number where Dynamo passes a symbol: a convolution's stride or
padding, a norm's order, the bounds of linspace (dynamic=True and automatic dynamic make
int and float arguments symbolic). ONNX takes those as attributes or constants. When a
node is left to torch for want of such a number, and the number is a graph argument, the
graph is compiled for the values each call brings: the first call with new values builds a
variant whose nodes take them as literals, and every call compares its arguments with the
values of the variant it runs, so no result is ever computed for values other than the
ones its graph was built for. Past MAX_VARIANTS sets of values, calls with new values run
the graph compiled without them (those nodes in torch), with one warning.

Floats read from attributes (a norm's eps, an attention or rotary scale, math.pi): under
dynamic=True Dynamo does not specialize floats, and passes each as a 0-d float64 tensor
argument. As inputs they leave float64 in the graph (so ORT's MatMulScaleFusion is disabled
for exactness, and the session goes through the pybind module, not the C API) and block
fusions that need a constant (GPT-2's gelu_new with pi as an input is not a FastGelu).
Inference graphs are compiled per set of their values the same way (with_constants: each
becomes a constant, and what is computed from constants alone is computed now), each call
comparing the tensors' values with the variant's; past MAX_FLOAT_VARIANTS (each variant
holds its own copy of the frozen weights), new values run the
graph with them as inputs. Only attributes: a float the function takes as an argument is
the caller's to vary, and stays an input. (Dynamo still makes the tensors every call.)
"""

from __future__ import annotations

import operator
import threading

import torch
import torch.fx

from .logs import warn_once

MAX_VARIANTS = 8
# each float variant of an inference graph is a session with its own copy of the frozen weights
MAX_FLOAT_VARIANTS = 3
_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def scalar_arguments(gm: torch.fx.GraphModule, blocked: dict) -> dict[torch.fx.Node, int]:
    """The placeholders holding a symbolic int, float or bool that nodes left to torch
    (blocked: node -> why) take as arguments, directly or in a list, with their argument
    positions. Not a tensor's size (a graph per size is what symbolic sizes avoid), and not
    for nodes that numbers would not help (no lowering, a dtype, a layout)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = {n: i for i, n in enumerate(placeholders)}
    sizes = set()
    for p in placeholders:
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor):
            # every symbol a size is computed from: with sizes s0 and 2*s1, s1 is a size too
            sizes.update(*(d.node.expr.free_symbols for d in val.shape if isinstance(d, torch.SymInt)))
    found = {}
    for node, reason in blocked.items():
        if reason == "no lowering" or reason.startswith(("dtype ", "layout ", "mixed devices")):
            continue
        for arg in _flat_nodes((node.args, node.kwargs)):
            val = arg.meta.get("val")
            if arg in positions and isinstance(val, _SCALARS) and val.node.expr not in sizes:
                found[arg] = positions[arg]
    return found


def _flat_nodes(args) -> list[torch.fx.Node]:
    flat = []
    torch.fx.node.map_arg(args, flat.append)
    return flat


def with_values(gm: torch.fx.GraphModule, nodes, values: dict[torch.fx.Node, object]) -> torch.fx.GraphModule:
    """A copy of gm whose `nodes` take these placeholders' values as literals (the
    placeholders stay: the call's arguments do not change)."""
    graph = torch.fx.Graph()
    remap: dict[torch.fx.Node, torch.fx.Node] = {}
    output = graph.graph_copy(gm.graph, remap)
    graph.output(output)
    literal = {remap[p]: v for p, v in values.items()}
    for node in nodes:
        copied = remap[node]
        copied.args, copied.kwargs = torch.fx.node.map_arg((copied.args, copied.kwargs), lambda a: literal.get(a, a))
    return torch.fx.GraphModule(gm, graph)


def attribute_floats(dynamo_gm: torch.fx.GraphModule, n_lifted: int, gm: torch.fx.GraphModule) -> dict[torch.fx.Node, int]:
    """The placeholders of gm, an aten graph of aot_autograd, holding floats Dynamo read from
    an attribute (AttrSource: a module's eps, a Python module's math.pi) and passes as 0-d
    tensors (dynamic=True: specialize_float off), with their positions. gm's arguments are
    n_lifted lifted weights, then Dynamo's placeholders."""
    from torch._dynamo.source import AttrSource

    dynamo_placeholders = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != n_lifted + len(dynamo_placeholders):
        return {}
    found = {}
    for i, node in enumerate(dynamo_placeholders):
        arg, val = node.meta.get("grapharg"), placeholders[n_lifted + i].meta.get("val")
        if getattr(arg, "pass_arg_as_tensor", False) and isinstance(arg.source, AttrSource) and isinstance(val, torch.Tensor) and val.dim() == 0:
            if any(u.op == "call_function" for u in placeholders[n_lifted + i].users):
                found[placeholders[n_lifted + i]] = n_lifted + i
    return found


def pass_as_numbers(dynamo_gm: torch.fx.GraphModule, n_lifted: int, floats: dict[torch.fx.Node, int]) -> bool:
    """Have Dynamo pass the attribute floats at these positions (attribute_floats) as Python
    floats, not as the 0-d float64 tensors it builds for them per call (torch._as_tensor_fullprec
    in the bytecode before the graph: ~8 us each, 12 on a small T5, more than the graph saves
    by making them constants). Dynamo writes that bytecode after the backend returns, from
    its graph arguments' pass_arg_as_tensor. Returns whether every one was switched."""
    dynamo_placeholders = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    args = [dynamo_placeholders[i - n_lifted].meta.get("grapharg") for i in floats.values()]
    if not all(hasattr(a, "pass_arg_as_tensor") for a in args):
        return False
    for a in args:
        a.pass_arg_as_tensor = False
    return True


def as_tensors(run, positions: list[int]):
    """run, taking at these positions the Python floats pass_as_numbers made Dynamo pass, as
    the 0-d float64 tensors the graph takes."""

    def run_with_tensors(*args):
        args = list(args)
        for i in positions:
            args[i] = torch._as_tensor_fullprec(args[i])
        return run(*args)

    return run_with_tensors


def with_constants(gm: torch.fx.GraphModule, values: dict[torch.fx.Node, object]) -> torch.fx.GraphModule:
    """A copy of gm whose nodes take these 0-d tensor placeholders' values as constants
    (aten.scalar_tensor, which lowers to an ONNX constant), with the 0-d computations on
    them alone done now (dtype conversions, math.sqrt(2 / math.pi)): no float64 is left in
    the graph, which would disable an ORT fusion and the C API path. The placeholders stay."""
    graph = torch.fx.Graph()
    remap: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for placeholder, value in values.items():
        copied = remap[placeholder]
        users = [u for u in copied.users if u.op == "call_function"]
        if users:
            constant = _scalar(graph, copied, value.item() if isinstance(value, torch.Tensor) else value)
            for user in users:
                user.replace_input_with(copied, constant)
            _fold(graph, constant)
    for node in list(graph.nodes):
        if _is_constant(node) and not node.users:
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


def _scalar(graph: torch.fx.Graph, like: torch.fx.Node, number) -> torch.fx.Node:
    """A 0-d constant with like's value meta (a 0-d tensor of its dtype), after it."""
    with graph.inserting_after(like):
        node = graph.call_function(torch.ops.aten.scalar_tensor.default, (number,), {"dtype": like.meta["val"].dtype})
    node.meta["val"] = like.meta["val"]
    return node


def _is_constant(node: torch.fx.Node) -> bool:
    return node.target is torch.ops.aten.scalar_tensor.default and type(node.args[0]) in (int, float, bool) and "device" not in node.kwargs


def _fold(graph: torch.fx.Graph, constant: torch.fx.Node) -> None:
    """Users of a constant whose inputs are all constants and whose value is 0-d become
    constants, computed by torch's own kernel now (never a random op)."""
    for user in list(constant.users):
        val = user.meta.get("val")
        op = user.target
        if not (isinstance(op, torch._ops.OpOverload) and isinstance(val, torch.Tensor) and val.dim() == 0 and val.device.type == "cpu"):
            continue
        if op._schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags or not all(map(_is_constant, user.all_input_nodes)):
            continue
        real = torch.fx.node.map_arg((user.args, user.kwargs), lambda n: n.target(*n.args, **n.kwargs))
        try:
            result = op(*real[0], **real[1])
        except Exception:  # left to the graph, which computes it as before
            continue
        if not (isinstance(result, torch.Tensor) and result.dim() == 0 and result.dtype == val.dtype):
            continue
        folded = _scalar(graph, user, result.item())
        user.replace_all_uses_with(folded)
        graph.erase_node(user)
        _fold(graph, folded)


def _key(value) -> tuple:
    if type(value) is torch.Tensor:  # a float Dynamo passes as a 0-d tensor (attribute_floats)
        value = value.item()
    # a float by its bits: -0.0 is not 0.0 here, and every NaN its own
    return (type(value), value.hex() if isinstance(value, float) else value)


class Specializing:
    """A graph's callable (taking *args) that runs the variant compiled for the values of
    its specialized arguments. compile_variant(values) -> (callable, whether the variant
    runs the nodes that needed the values); generic() -> the callable without them."""

    def __init__(self, positions: dict[torch.fx.Node, int], compile_variant, generic, name: str, past_limit="run with the nodes that need them in torch", limit: int | None = None):
        self.positions = list(positions.items())
        self.indices = [i for _, i in self.positions]
        self._last = ([], None)  # the values of the last call, if all Python numbers, and its variant
        self.past_limit = past_limit
        self.compile_variant, self.generic, self.name = compile_variant, generic, name
        self.variants: dict[tuple, object] = {}
        self.max_variants = MAX_VARIANTS if limit is None else limit
        self.limit = self.max_variants
        self._generic = None
        self._lock = threading.Lock()

    def __call__(self, *args):
        values = [args[i] for i in self.indices]
        last_values, last_run = self._last
        if last_run is not None and all(map(operator.is_, values, last_values)):
            # the same objects as the last call's, numbers (immutable): the same variant; an
            # attribute's float is the same object every call
            return last_run(*args)
        key = tuple(_key(v) for v in values)
        run = self.variants.get(key)
        if run is None:
            run = self._variant(key, args)
        if all(type(v) in (int, float, bool) for v in values):
            self._last = (values, run)
        return run(*args)

    def _variant(self, key, args):
        with self._lock:
            if key in self.variants:
                return self.variants[key]
            if len(self.variants) >= self.limit:
                if self.limit == self.max_variants:
                    warn_once(
                        f"ortlite: graph {self.name} was compiled for {self.max_variants} sets of values of its arguments "
                        f"{[p.name for p, _ in self.positions]}; other values {self.past_limit}"
                    )
                if self._generic is None:
                    self._generic = self.generic()
                return self._generic
            run, helped = self.compile_variant({p: args[i] for p, i in self.positions})
            self.variants[key] = run
            if not helped:  # the values were not what those nodes lacked: no more variants
                self.limit = len(self.variants)
            return run
