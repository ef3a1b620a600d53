"""bfloat16 and float16 inference graphs computed in float32 (torch.compile with
Options.quantize, on CPU): ONNX Runtime's CPU provider has almost no bfloat16 arithmetic and
little float16, so such a graph would otherwise stay in torch, its weight products unquantized.

widen() rewrites an aten graph so that its arguments of the reduced dtype are cast to float32
where the graph starts, every dtype argument naming it names float32 instead, and each result
of that dtype is cast back at the end: the results have eager's dtypes and shapes, their
values are float32 math rounded once (eager rounds after every op). The casts lower to ONNX
Cast, which ONNX Runtime computes exactly as torch does (round to nearest even, NaN kept); a
frozen weight's Cast is folded when the session is built, and ortlite.lower.quantize reads
through it. Only these casts of bfloat16 lower on CPU (registry.WIDENING_CAST): elsewhere a
lone cast would make a session of its own between torch's bfloat16 ops. ortlite.compile does the same by converting the model (ortlite.aot).
"""

from __future__ import annotations

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.multiprocessing.reductions import StorageWeakRef

from .lower.registry import WIDENING_CAST

REDUCED = (torch.bfloat16, torch.float16)
WIDENED_FROM = "ortlite_widened_from"  # the graph module's meta entry: the dtype widen() replaced
aten = torch.ops.aten
# Ops whose result depends on the bits of their input's dtype, not its values: not widened.
BIT_LEVEL = {aten.view.dtype, aten.frexp.Tensor, aten.nextafter.default}


def reduced_dtype(gm: torch.fx.GraphModule) -> torch.dtype | None:
    """The one reduced floating dtype of a CPU graph that widen() can compute in float32, else None."""
    floats, devices = set(), set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in BIT_LEVEL:
            return None
        for v in _tensors(node.meta.get("val")):
            devices.add(v.device.type)
            if v.is_floating_point():
                floats.add(v.dtype)
    reduced = floats & set(REDUCED)
    if len(reduced) != 1 or devices - {"cpu"} or _outputs_alias_inputs(gm):
        return None
    return reduced.pop()


def widen(gm: torch.fx.GraphModule, dtype: torch.dtype) -> None:
    """Rewrites gm in place to compute in float32 what it computed in dtype (see above)."""
    graph = gm.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    for node in graph.nodes:
        if node.op == "call_function":
            node.args = _map_dtype(node.args, dtype)
            node.kwargs = _map_dtype(node.kwargs, dtype)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for p in inputs:
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype == dtype:
            with graph.inserting_before(first):
                cast = graph.call_function(aten._to_copy.default, (p,), {"dtype": torch.float32})
            cast.meta[WIDENING_CAST] = True
            p.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
    output = next(n for n in graph.nodes if n.op == "output")
    results = output.args[0]
    originals = [r.meta.get("val") if isinstance(r, torch.fx.Node) else None for r in results]
    cast_back = []
    for r, val in zip(results, originals):
        if isinstance(val, torch.Tensor) and val.dtype == dtype:
            with graph.inserting_before(output):
                r = graph.call_function(aten._to_copy.default, (r,), {"dtype": dtype})
            r.meta[WIDENING_CAST] = True
        cast_back.append(r)
    output.args = (type(results)(cast_back),)
    graph.lint()
    gm.recompile()
    gm.meta[WIDENED_FROM] = dtype
    vals = [p.meta.get("val") for p in inputs]
    FakeTensorProp(gm, detect_fake_mode(vals)).propagate_dont_convert_inputs(*vals)


def _map_dtype(value, dtype):
    if value is dtype:
        return torch.float32
    if isinstance(value, (tuple, list)):
        return type(value)(_map_dtype(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _map_dtype(v, dtype) for k, v in value.items()}
    return value


def _tensors(val):
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [t for v in val for t in _tensors(v)]
    return []


def _outputs_alias_inputs(gm: torch.fx.GraphModule) -> bool:
    """Whether a result shares memory with an argument (a view of it, or itself): a cast
    would make it a copy."""
    storages = {StorageWeakRef(v.untyped_storage()) for n in gm.graph.nodes if n.op == "placeholder" for v in _tensors(n.meta.get("val"))}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = [r.meta.get("val") for r in output.args[0] if isinstance(r, torch.fx.Node)]
    return any(StorageWeakRef(v.untyped_storage()) in storages for v in _tensors(results))
