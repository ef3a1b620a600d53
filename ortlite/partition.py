"""Which nodes ONNX Runtime runs: a support query per node, and torch.fx's
CapabilityBasedPartitioner to fuse supported runs into subgraphs."""

from __future__ import annotations

import collections
import copy
import operator

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .lower import unsupported_reason


def node_reason(node: torch.fx.Node, excluded: dict[str, str]) -> str | None:
    """None when ortlite lowers this call node; else why not. `excluded` maps FX node
    names to reasons found while compiling (e.g. ONNX Runtime has no kernel for a dtype)."""
    if node.target is operator.getitem:
        source = node.args[0]
        return node_reason(source, excluded) if isinstance(source, torch.fx.Node) else "getitem of a non-node"
    if node.op != "call_function":
        return f"{node.op} node"
    if node.name in excluded:
        return excluded[node.name]
    return unsupported_reason(node)


def unsupported_nodes(gm: torch.fx.GraphModule, excluded: dict[str, str]) -> dict[torch.fx.Node, str]:
    return {n: reason for n in gm.graph.nodes if n.op == "call_function" and (reason := node_reason(n, excluded)) is not None}


def op_name(node: torch.fx.Node) -> str:
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)  # e.g. "aten.cumsum.default"
    return getattr(node.target, "__name__", str(node.target))


def fallback_counts(unsupported) -> collections.Counter:
    return collections.Counter(op_name(n) for n in unsupported if n.target is not operator.getitem)


class _Support(OperatorSupportBase):
    def __init__(self, excluded: dict[str, str]):
        super().__init__()
        self.excluded = excluded

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node_reason(node, self.excluded) is None


def partition(gm: torch.fx.GraphModule, excluded: dict[str, str]) -> tuple[torch.fx.GraphModule, list[str]]:
    """Fuse supported runs into submodules of a copy of gm; returns it and their names."""
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    partitioner = CapabilityBasedPartitioner(gm, _Support(excluded), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions)
    names = [n.target for n in fused.graph.nodes if n.op == "call_module" and n.target.startswith("fused_")]
    return fused, names
