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
"""

from __future__ import annotations

import threading

import torch
import torch.fx

from .logs import warn_once

MAX_VARIANTS = 8
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


def _key(value) -> tuple:
    # a float by its bits: -0.0 is not 0.0 here, and every NaN its own
    return (type(value), value.hex() if isinstance(value, float) else value)


class Specializing:
    """A graph's callable (taking *args) that runs the variant compiled for the values of
    its specialized arguments. compile_variant(values) -> (callable, whether the variant
    runs the nodes that needed the values); generic() -> the callable without them."""

    def __init__(self, positions: dict[torch.fx.Node, int], compile_variant, generic, name: str):
        self.positions = list(positions.items())
        self.compile_variant, self.generic, self.name = compile_variant, generic, name
        self.variants: dict[tuple, object] = {}
        self.limit = MAX_VARIANTS
        self._generic = None
        self._lock = threading.Lock()

    def __call__(self, *args):
        key = tuple(_key(args[i]) for _, i in self.positions)
        run = self.variants.get(key)
        if run is None:
            run = self._variant(key, args)
        return run(*args)

    def _variant(self, key, args):
        with self._lock:
            if key in self.variants:
                return self.variants[key]
            if len(self.variants) >= self.limit:
                if self.limit == MAX_VARIANTS:
                    warn_once(
                        f"ortlite: graph {self.name} was compiled for {MAX_VARIANTS} sets of values of its arguments "
                        f"{[p.name for p, _ in self.positions]}; other values run with the nodes that need them in torch"
                    )
                if self._generic is None:
                    self._generic = self.generic()
                return self._generic
            run, helped = self.compile_variant({p: args[i] for p, i in self.positions})
            self.variants[key] = run
            if not helped:  # the values were not what those nodes lacked: no more variants
                self.limit = len(self.variants)
            return run
