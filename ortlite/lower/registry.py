"""The op table: one lowering function per aten overload, registered by decorator.

    @lower(aten.addmm.default)
    def addmm(g, node, bias, a, b, *, beta=1, alpha=1): ...

A lowering gets the GraphBuilder, the FX node, then the node's args and kwargs with each
tensor replaced by its `Value`. It returns the output name (a tuple for several outputs).
`check(node)` returns a reason string when the lowering cannot match aten's semantics for
this node's arguments; the partitioner then leaves the node to torch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.fx

from .builder import TORCH_TO_ONNX


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    check: Callable[[torch.fx.Node], str | None] | None
    symbolic: bool  # handles symbolic sizes (builds them with g.shape / g.sym)


LOWERINGS: dict[object, Lowering] = {}


def lower(*targets, check: Callable[[torch.fx.Node], str | None] | None = None, symbolic: bool = False):
    """Register a lowering. symbolic=True says it is exact with symbolic sizes too: sizes
    reach ONNX through g.shape()/g.sym(), never through Python arithmetic on SymInts
    (which would also add guards after Dynamo has finished)."""

    def register(fn):
        for target in targets:
            if target in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {target}")
            LOWERINGS[target] = Lowering(fn, check, symbolic)
        return fn

    return register


def meta(node) -> object:
    """The meta value (FakeTensor, SymInt, number, tuple) of an FX node, or the value itself."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def node_tensors(node: torch.fx.Node):
    """Meta values of the tensors a node reads and writes."""
    vals = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: vals.append(meta(n)))
    out = meta(node)
    vals.extend(out if isinstance(out, (tuple, list)) else [out])
    return [v for v in vals if isinstance(v, torch.Tensor)]


def has_symbolic_shape(t: torch.Tensor) -> bool:
    return any(not isinstance(d, int) for d in t.shape)


def is_symbolic(node: torch.fx.Node) -> bool:
    """Does the node read or write symbolic sizes?"""
    if any(has_symbolic_shape(t) for t in node_tensors(node)):
        return True
    values = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values.append(meta(n)))
    values.append(meta(node))
    return any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in values)


def _returns_nothing(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and not schema.returns


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """None when ortlite can lower this node exactly; else why not."""
    lowering = LOWERINGS.get(node.target)
    if lowering is None:
        return "no lowering"
    if "val" not in node.meta and not _returns_nothing(node.target):
        return "no meta value"
    devices = set()
    for t in node_tensors(node):
        if t.dtype not in TORCH_TO_ONNX:
            return f"dtype {t.dtype}"
        if t.layout != torch.strided:
            return f"layout {t.layout}"
        if not (t.device.type == "cpu" and t.dim() == 0):  # aten mixes CPU scalars into device ops
            devices.add(t.device)
    if not lowering.symbolic and is_symbolic(node):
        return "symbolic sizes"
    if len(devices) > 1:
        return "mixed devices"
    if lowering.check is not None:
        return lowering.check(node)
    return None
