"""The op table: one lowering function per aten overload, registered by decorator.

    @lower(aten.addmm.default)
    def addmm(g, node, bias, a, b, *, beta=1, alpha=1): ...

A lowering gets the GraphBuilder, the FX node, then the node's args and kwargs with each
tensor replaced by its `Value`. It returns the output name (a tuple for several outputs).
`check(node)` returns a reason string when the lowering cannot match aten's semantics for
this node's arguments; the partitioner then leaves the node to torch.

Symbolic sizes: sizes reach ONNX through g.shape()/g.sym() (computed in the graph), or as
Python ints where the ShapeEnv knows them for every size the graph serves. Checks and
lowerings run under `no_new_guards`: a size turned into a Python value that the ShapeEnv
does not already know (`if n == 1`, `int(n)`) would hold for this size only, so the node
is left to torch instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Callable

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import _ShapeEnvGuardError

from .builder import TORCH_TO_ONNX


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    check: Callable[[torch.fx.Node], str | None] | None
    complex_pairs: bool = False  # takes or gives complex values, as ONNX real pairs (ortlite.complex)


COMPLEX_PAIRS = (torch.complex64, torch.complex128)


LOWERINGS: dict[object, Lowering] = {}  # by OpOverload; custom ops of libraries ortlite does not import by name


def lowering_for(target) -> Lowering | None:
    """The lowering of an FX node's target: its OpOverload, or for a custom op its name
    ("transformers.grouped_mm_fallback.default")."""
    lowering = LOWERINGS.get(target)
    if lowering is None and isinstance(target, torch._ops.OpOverload):
        lowering = LOWERINGS.get(str(target))
    return lowering


def lower(*targets, check: Callable[[torch.fx.Node], str | None] | None = None, complex_pairs: bool = False):
    """Register a lowering (see the module docstring). complex_pairs: its complex values are
    ONNX real values of one more dim, (real, imaginary) last, as view_as_real has them; its
    check keeps them from crossing into or out of ONNX Runtime."""

    def register(fn):
        for target in targets:
            if target in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {target}")
            LOWERINGS[target] = Lowering(fn, check, complex_pairs)
        return fn

    return register


def module_path(node: torch.fx.Node) -> str:
    """The module a node came from (e.g. "L['self'].encoder.layer.0.output.dense"), or ""."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()), ("",))[0] if stack else ""


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


class SpecializesSize(Exception):
    """A check or lowering turned a symbolic size into a Python value the ShapeEnv does
    not know for every size: its result would hold for this size only."""


def shape_env_of(node: torch.fx.Node):
    """The ShapeEnv of the symbolic sizes a node reads or writes, or None (all static)."""
    values = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values.append(meta(n)))
    out = meta(node)
    values.extend(out if isinstance(out, (tuple, list)) else [out])
    for v in values:
        sizes = list(v.shape) + ([v.storage_offset()] if v.layout == torch.strided else []) if isinstance(v, torch.Tensor) else [v]
        for s in sizes:
            if isinstance(s, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return s.node.shape_env
    return None


@contextlib.contextmanager
def no_new_guards(node: torch.fx.Node):
    """Raise SpecializesSize where the body would add a guard on the node's sizes."""
    shape_env = shape_env_of(node)
    if shape_env is None:
        yield
        return
    torch_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")  # logs the refused guard
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)
    try:
        with shape_env.error_on_new_guards():
            yield
    except _ShapeEnvGuardError as e:
        raise SpecializesSize(f"specializes a symbolic size ({e})") from None
    finally:
        torch_log.setLevel(level)


def _returns_nothing(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and not schema.returns


WIDENING_CAST = "ortlite_widening_cast"  # a node's meta entry, set by ortlite.widen


def _float32_cast(node: torch.fx.Node) -> bool:
    """One of the casts ortlite.widen's graphs start and end with (ONNX Cast between bfloat16
    and float32 is exact on the CPU, rounding as torch does)."""
    return node.meta.get(WIDENING_CAST, False)


_BFLOAT16_READS = {"aten._to_copy.default", "prims.convert_element_type.default"}


def _bfloat16_read(node: torch.fx.Node) -> bool:
    """A bfloat16 graph input or weight read exactly into a graph that computes in float32 or
    float64: its cast to one of them (every bfloat16 is such a float; ONNX Cast is exact),
    read by a node that lowers (recurrent_gemma's bfloat16 normalizer, a buffer of a float32
    model); or torch.export's assert of the metadata of a value read so, which computes
    nothing. Such a node adds no session: it joins its reader's."""
    source, out = (node.args[0] if node.args else None), meta(node)
    if not isinstance(source, torch.fx.Node) or source.op not in ("placeholder", "get_attr"):
        return False
    if str(node.target) == "aten._assert_tensor_metadata.default":
        return any(str(user.target) in _BFLOAT16_READS and _bfloat16_read(user) for user in source.users)
    if str(node.target) not in _BFLOAT16_READS:
        return False
    if not isinstance(out, torch.Tensor) or out.dtype not in (torch.float32, torch.float64) or getattr(meta(source), "dtype", None) != torch.bfloat16:
        return False
    return any(user.op == "call_function" and not _bfloat16_read(user) and unsupported_reason(user) is None for user in node.users)


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """None when ortlite can lower this node exactly; else why not."""
    lowering = lowering_for(node.target)
    if lowering is None:
        return "no lowering"
    if "val" not in node.meta and not _returns_nothing(node.target):
        return "no meta value"
    devices, bf16 = set(), False
    for t in node_tensors(node):
        bf16 |= t.dtype == torch.bfloat16
        if t.dtype not in TORCH_TO_ONNX and not (lowering.complex_pairs and t.dtype in COMPLEX_PAIRS):
            return f"dtype {t.dtype}"
        if t.layout != torch.strided:
            return f"layout {t.layout}"
        if not (t.device.type == "cpu" and t.dim() == 0):  # aten mixes CPU scalars into device ops
            devices.add(t.device)
    if len(devices) > 1:
        return "mixed devices"
    if bf16 and all(d.type == "cpu" for d in devices) and not _float32_cast(node) and not _bfloat16_read(node):
        # (its missing kernels would leave the arithmetic to torch node by node, and the data
        # movement between them in sessions of their own: copies torch's views do not make)
        return "bfloat16 on CPU: ONNX Runtime's CPU provider has almost no bfloat16 kernels; torch runs it (Options(quantize=...) runs such graphs in float32)"
    if lowering.check is not None:
        try:
            with no_new_guards(node):
                return lowering.check(node)
        except SpecializesSize as e:
            return f"its check {e}"
        except Exception as e:  # e.g. a symbolic argument where the check expects a number
            return f"its check failed: {type(e).__name__}: {e}"
    return None
