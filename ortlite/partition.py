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
from .lower.ops.common import arg_val, fills_its_storage, has_contiguous_strides
from .lower.registry import meta

# Why a node runs in torch by design, not as a fallback: see alias_views_to_torch.
ALIAS_VIEW = "a view aliasing an input or another output: torch makes it"
READS_INPUT_STORAGE = "reads the storage of a graph input (as_strided): torch runs it on the real tensor"
STORAGE_READERS = {torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default, torch.ops.aten.as_strided_scatter.default}


def node_reason(node: torch.fx.Node, excluded: dict[str, str]) -> str | None:
    """None when ortlite lowers this call node; else why not. `excluded` maps FX node
    names to reasons found while compiling (e.g. ONNX Runtime has no kernel for a dtype)."""
    if node.target is operator.getitem:
        source = node.args[0]
        return node_reason(source, excluded) if isinstance(source, torch.fx.Node) else "getitem of a non-node"
    if node.op != "call_function":
        return f"{node.op} node"
    if node.meta.get("ortlite_alias_view"):
        return ALIAS_VIEW
    if node.meta.get("ortlite_reads_input_storage"):
        return READS_INPUT_STORAGE
    if node.name in excluded:
        return excluded[node.name]
    return unsupported_reason(node)


def unsupported_nodes(gm: torch.fx.GraphModule, excluded: dict[str, str]) -> dict[torch.fx.Node, str]:
    return {n: reason for n in gm.graph.nodes if n.op == "call_function" and (reason := node_reason(n, excluded)) is not None}


def op_name(node: torch.fx.Node) -> str:
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)  # e.g. "aten.cumsum.default"
    return getattr(node.target, "__name__", str(node.target))


def source_line(node: torch.fx.Node) -> str:
    """The user's line a node comes from ('File "m.py", line 3, in f: y = x.cumsum(0)'), or ""."""
    lines = [line.strip() for line in (node.meta.get("stack_trace") or "").strip().splitlines()]
    last = max((i for i, line in enumerate(lines) if line.startswith("File ")), default=None)
    if last is None:
        return ""
    code = lines[last + 1] if last + 1 < len(lines) and not lines[last + 1].startswith("File ") else ""
    return f"{lines[last]}: {code}" if code else lines[last]


def is_fallback(node: torch.fx.Node, reason: str) -> bool:
    """Is a node left to torch a loss (counted, warned about), not torch's part by design?"""
    return node.target is not operator.getitem and reason != ALIAS_VIEW


def fallback_counts(unsupported) -> collections.Counter:
    return collections.Counter(op_name(n) for n, reason in unsupported.items() if is_fallback(n, reason))


def alias_views_to_torch(gm: torch.fx.GraphModule) -> bool:
    """Make torch compute each forward output that is a view aliasing a graph input or
    another output; returns whether there was one.

    aot_autograd does not take such outputs as values: it regenerates them from the
    compiled output's view metadata (size, stride, storage offset, and its _base), over
    the real input or the real base output (functional_utils.gen_alias_from_base). With
    static sizes it replays the recorded view functions; once a view's arguments are
    symbolic (automatic dynamic: t[:, i:i+4] at the second call) it takes the metadata
    of what the backend returned. A fresh contiguous tensor from ONNX Runtime there has
    offset 0 and contiguous strides: wrong values, or an as_strided out of bounds
    (expand). So each such output gets its own copy of its chain of view ops (and the
    integer arithmetic they read) from its base, run by torch on the real tensors: exact
    eager aliasing, at the cost of a few view calls. The original chain stays for any
    ONNX Runtime user, so partitions do not split."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    chains = {r: _view_chain(r) for r in set(results) if isinstance(r, torch.fx.Node)}
    roots = collections.Counter(chain[-1] for chain in chains.values())
    aliased = {
        r: chain
        for r, chain in chains.items()
        if len(chain) > 1 and (chain[-1].op == "placeholder" or roots[chain[-1]] > 1 or chain[-1] in chains)
    }
    if not aliased:
        return False
    copies: dict[torch.fx.Node, torch.fx.Node] = {}

    def copy_of(node: torch.fx.Node) -> torch.fx.Node:
        if node not in copies:
            with gm.graph.inserting_before(output):
                copies[node] = gm.graph.node_copy(node, lambda n: copy_of(n) if _needs_copy(n, within) else n)
            copies[node].meta["ortlite_alias_view"] = True
        return copies[node]

    for result, chain in aliased.items():
        within = set(chain[:-1])
        output.replace_input_with(result, copy_of(result))
    for node in reversed(list(copies)):  # originals that only the outputs read are dead now
        if not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return True


def storage_readers_see_eager_storage(gm: torch.fx.GraphModule) -> bool:
    """Make each as_strided (and _copy, _scatter) read the storage eager's would; returns
    False when that cannot be arranged and the whole graph must run in torch.

    as_strided reads its argument's storage: in eager the storage of the tensor it views
    (the end of its chain of views), laid out as eager laid it out (x.t() * 2 keeps the
    transposed strides). ONNX Runtime returns every value compact and contiguous, and a
    torch island that reads it would read another layout. So:
    - a storage made in the graph, dense with a known layout: the argument becomes
      permute(base, order).contiguous(), a fresh tensor holding exactly eager's storage
      (offset made explicit); then the read is right whoever runs it;
    - a graph input's storage: the chain and the read run in torch on the real tensor;
    - anything else (overlapping or partial layouts, unknown orders): False."""
    readers = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in STORAGE_READERS]
    for reader in readers:
        chain = _view_chain(reader.args[0])
        base, source = chain[-1], meta(reader.args[0])
        if base.op == "placeholder":
            for n in [reader, *chain[:-1]]:
                n.meta["ortlite_reads_input_storage"] = True
            continue
        order = _dense_order(meta(base))
        offset = arg_val(reader, 4 if reader.target is torch.ops.aten.as_strided_scatter.default else 3, "storage_offset")
        offset = source.storage_offset() if offset is None else offset
        if order is None or not isinstance(offset, int) or reader.target is torch.ops.aten.as_strided_scatter.default:
            return False
        if base is reader.args[0] and order == list(range(len(order))):
            continue  # a contiguous result: ONNX Runtime's copy has eager's layout
        with gm.graph.inserting_before(reader):
            permuted = gm.graph.call_function(torch.ops.aten.permute.default, (base, order))
            permuted.meta["val"] = meta(base).permute(order)
            storage = gm.graph.call_function(torch.ops.aten.clone.default, (permuted,), {"memory_format": torch.contiguous_format})
            storage.meta["val"] = permuted.meta["val"].clone(memory_format=torch.contiguous_format)
        args = list(reader.args) + [None] * (4 - len(reader.args))
        args[0], args[3] = storage, offset
        reader.args = tuple(args)
        reader.kwargs = {k: v for k, v in reader.kwargs.items() if k != "storage_offset"}
    if readers:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return True


def _dense_order(t) -> list[int] | None:
    """The dims of t from outermost to innermost in memory, when its elements fill its
    storage exactly (no gaps, no overlap, offset 0) and that order is known without a
    guard (contiguous, or static strides); else None."""
    if not fills_its_storage(t):
        return None
    strides, sizes = t.stride(), t.shape
    if has_contiguous_strides(sizes, strides):
        return list(range(t.dim()))
    if not all(isinstance(v, int) for v in (*strides, *sizes)):
        return None
    order = sorted(range(t.dim()), key=lambda d: (-strides[d], -sizes[d]))
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return None
        expected *= sizes[d]
    return order


def _storages(node) -> set:
    from torch.multiprocessing.reductions import StorageWeakRef

    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    vals = val if isinstance(val, (tuple, list)) else [val]
    return {StorageWeakRef(v.untyped_storage()) for v in vals if isinstance(v, torch.Tensor)}


def _is_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (node.target is operator.getitem or getattr(node.target, "is_view", False))


def _view_chain(node: torch.fx.Node) -> list[torch.fx.Node]:
    """node, the view ops it comes through, and last the node whose storage it views."""
    chain = [node]
    while _is_view(node):
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or not (_storages(source) & _storages(node)):
            break
        chain.append(source)
        node = source
    return chain


def _needs_copy(node: torch.fx.Node, chain: set) -> bool:
    """Is node part of what the copied chain recomputes: a view in it, or integer arithmetic
    (a SymInt) it reads that is not a graph input?"""
    if node in chain:
        return True
    return node.op == "call_function" and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))



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
    calls = [n for n in fused.graph.nodes if n.op == "call_module" and n.target.startswith("fused_")]
    for call in calls:
        _pass_sizes_in(fused, call)
    fused.recompile()
    return fused, [call.target for call in calls]


def _pass_sizes_in(fused: torch.fx.GraphModule, call: torch.fx.Node) -> None:
    """Give a fused submodule, as SymInt arguments, the sizes its nodes use that none of
    its inputs has whole (e.g. h, where its input is h // 2 high after a pooling left to
    torch): read in torch from a graph input or an earlier tensor that has them."""
    sub = getattr(fused, call.target)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    available = set()
    for p in placeholders:
        available |= {e for e in _size_exprs(p.meta.get("val")) if e.is_Symbol}
    needed = set()
    for n in sub.graph.nodes:
        for e in _size_exprs(n.meta.get("val")):
            needed |= e.free_symbols
    missing = sorted(needed - available, key=str)
    if not missing:
        return
    providers = _size_providers(fused, call)
    added = []
    for symbol in missing:
        if symbol not in providers:
            continue  # its lowering will say so, and that node is left to torch
        source, dim = providers[symbol]
        if dim is None:
            value = source
        else:
            with fused.graph.inserting_before(call):
                value = fused.graph.call_function(torch.ops.aten.sym_size.int, (source, dim))
            value.meta["val"] = source.meta["val"].shape[dim]
        with sub.graph.inserting_after(placeholders[-1] if placeholders else next(iter(sub.graph.nodes))):
            placeholder = sub.graph.placeholder(f"size_{symbol}")
        placeholder.meta["val"] = value.meta["val"]
        placeholders.append(placeholder)
        added.append(value)
    if added:
        call.args = (*call.args, *added)
        sub.recompile()


def _size_exprs(val) -> list:
    """The sympy expressions of the SymInts in a meta value: tensor sizes, SymInt values."""
    vals = val if isinstance(val, (tuple, list)) else [val]
    exprs = []
    for v in vals:
        sizes = list(v.shape) if isinstance(v, torch.Tensor) else [v]
        exprs += [s.node.expr for s in sizes if isinstance(s, torch.SymInt)]
    return exprs


def _size_providers(fused: torch.fx.GraphModule, before: torch.fx.Node) -> dict:
    """symbol -> (node, dim) in fused's graph ahead of `before` whose value is that size:
    dim None for a SymInt node, else the tensor's dim."""
    providers = {}
    for n in fused.graph.nodes:
        if n is before:
            break
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            providers.setdefault(val.node.expr, (n, None))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    providers.setdefault(size.node.expr, (n, d))
    return providers
