"""Frozen weights: in inference graphs, parameters and buffers become ONNX Runtime
initializers (so ORT can fold BatchNorm into Conv, prepack MatMul/Gemm weights and
constant-fold), and are never stale.

- Which inputs: those aot_autograd marks static (fw_metadata.static_input_indices) that
  Dynamo read from a module's _parameters/_buffers, that the graph does not mutate, and
  that are plain dense contiguous tensors.
- No copy of our own: the ONNX model gets empty external-data stubs for them, and the
  session takes OrtValues over torch's memory (SessionOptions.add_external_initializers).
  ORT keeps its own copy of what it needs (a prepacked weight, a folded Conv) and copies
  the rest (measured: it does not run on external memory in place): one copy of the
  weights in all, never a protobuf one (no 2 GB protobuf limit either).
- Never stale: every call, the runner compares each frozen argument with what the session
  was built from (same tensor object, data pointer, version counter; for buffers, which
  BatchNorm updates without bumping the version counter, the bytes too: so only small CPU
  buffers are frozen). A write that bypasses the version counter into a parameter
  (`p.data.mul_()`, through numpy or DLPack) is not seen. On a change it builds
  a new session from the current tensors (and clears what the size prelude computed from
  them, lower.hoist); a graph whose sessions keep going stale within a few calls goes back
  to binding its weights as inputs (one log line). A weight that only the size prelude
  reads is no initializer of the session, but is watched all the same.
- Memory: the runner holds its frozen tensors by weak reference; when one dies (the model
  was dropped, a parameter replaced) the frozen session is released at once.
"""

from __future__ import annotations

import ctypes
import warnings

import onnx
import torch

from .logs import warn_once
from .lower.builder import ONNX_TO_TORCH, TORCH_TO_ONNX
from .lower.quantize import derived_values
from .session import current_cuda_stream

# A frozen session that served fewer calls than this before its weights changed did not
# pay for its build; after STALE_QUICKLY_LIMIT such sessions the graph binds its weights.
MIN_CALLS = 4
STALE_QUICKLY_LIMIT = 2


def weight_indices(dynamo_gm: torch.fx.GraphModule, n_lifted: int) -> set[int]:
    """Positions (in aot_autograd's flat arguments) of the module parameters and buffers
    Dynamo passes as graph inputs: those lifted by aot_autograd (n_lifted, first), and
    Dynamo placeholders read from an nn.Module's _parameters or _buffers."""
    from torch._dynamo.source import is_from_unspecialized_param_buffer_source

    placeholders = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    weights = set(range(n_lifted))
    for i, node in enumerate(placeholders):
        source = getattr(node, "_dynamo_source", None)
        if source is not None and is_from_unspecialized_param_buffer_source(source):
            weights.add(n_lifted + i)
    return weights


# Buffers are also compared by contents per call (see contents()): only small CPU ones freeze.
BUFFER_MAX_BYTES = 64 * 1024


def freezable(t) -> bool:
    parameter = type(t) is torch.nn.Parameter
    return (
        (parameter or (type(t) is torch.Tensor and t.device.type == "cpu" and t.nbytes <= BUFFER_MAX_BYTES))
        and t.layout == torch.strided
        and t.device.type in ("cpu", "cuda")
        and t.dtype in TORCH_TO_ONNX
        and t.numel() > 0
        and t.is_contiguous()
        and not t.is_inference()  # no version counter to watch
    )


def frozen_inputs(gm: torch.fx.GraphModule, real_inputs: list, weights: set[int]) -> dict[int, torch.Tensor]:
    """Placeholder index -> real tensor, for the inputs of an inference graph that can be
    frozen: weights (see weight_indices) that aot_autograd marks static, that this graph
    does not mutate, with the static shape and dtype the graph was traced with."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if metadata is None or not (len(placeholders) == len(real_inputs) == len(metadata.input_info)):
        return {}
    result = {}
    for i in metadata.static_input_indices or ():
        info, t, val = metadata.input_info[i], real_inputs[i], placeholders[i].meta.get("val")
        if i not in weights or info.mutates_data or info.mutates_metadata or not freezable(t):
            continue
        static = isinstance(val, torch.Tensor) and all(type(d) is int for d in val.shape)  # comparing a SymInt would guard
        # (a weight the graph only returns, as is, is no initializer: ONNX Runtime drops one that
        # no node reads, and then cannot be given its value: ctrl's pos_encoding, reassigned)
        read = any(user.op != "output" for user in placeholders[i].users)
        if static and val.dtype == t.dtype and tuple(val.shape) == tuple(t.shape) and read:
            result[i] = t
    return result


def sub_frozen(frozen: dict[int, torch.Tensor], parent: torch.fx.GraphModule, call: torch.fx.Node) -> dict[int, torch.Tensor]:
    """The frozen inputs of a fused submodule, by its own placeholder index, from the call
    node's arguments (a submodule's placeholders are its call's arguments, in order)."""
    index = {n: i for i, n in enumerate(n for n in parent.graph.nodes if n.op == "placeholder")}
    return {j: frozen[index[a]] for j, a in enumerate(call.args) if isinstance(a, torch.fx.Node) and index.get(a) in frozen}


def contents(tensors) -> list:
    """Per tensor, a copy of a buffer's bytes (None for a parameter). BatchNorm's kernels
    update running statistics in place without bumping the version counter, so the runner
    compares a frozen buffer's memory with this copy every call (memcmp; buffers are small)."""
    return [None if type(t) is torch.nn.Parameter else ctypes.string_at(t.data_ptr(), t.nbytes) for t in tensors]


# Initializers of this many bytes or more reach a private session (one compiled model's) as
# external initializers, not inside the serialized model: serializing BERT-base's 440 MB of
# weights took 0.7 s of its 3.3 s compile, and ONNX Runtime then parsed them out again.
LARGE_INITIALIZER_BYTES = 1 << 20


def without_large_initializers(model: onnx.ModelProto) -> tuple[bytes, dict[str, torch.Tensor]]:
    """The model serialized with its large initializers as external-data stubs, and their
    values (name -> CPU tensor over a copy of the bytes) for add_external_initializers. Every
    other field is copied as it is."""
    stubbed = onnx.ModelProto()
    _copy_fields(model, stubbed, skip="graph")
    graph = stubbed.graph
    _copy_fields(model.graph, graph, skip="initializer")
    weights = {}
    for tensor in model.graph.initializer:
        dtype = ONNX_TO_TORCH.get(tensor.data_type)
        raw = tensor.raw_data if tensor.HasField("raw_data") else b""  # (each read of the field is a copy)
        if dtype is None or len(raw) < LARGE_INITIALIZER_BYTES or tensor.data_location == onnx.TensorProto.EXTERNAL:
            graph.initializer.append(tensor)
            continue
        with warnings.catch_warnings():  # a read-only buffer: torch warns, and nothing writes to it
            warnings.simplefilter("ignore", UserWarning)
            weights[tensor.name] = torch.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))
        _add_stub(graph, tensor.name, dtype, tensor.dims)
    return stubbed.SerializeToString(), weights


def _copy_fields(source, target, skip: str) -> None:
    """Every field set in the protobuf message source, but `skip`, set on target."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED:  # (protobuf < 6 has label)
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _add_stub(graph: onnx.GraphProto, name: str, dtype: torch.dtype, dims) -> None:
    stub = graph.initializer.add()
    stub.name = name
    stub.data_type = TORCH_TO_ONNX[dtype]
    stub.dims.extend(dims)
    stub.data_location = onnx.TensorProto.EXTERNAL
    entry = stub.external_data.add()
    entry.key, entry.value = "location", "ortlite-frozen-weight"  # never read


def frozen_model_bytes(model: onnx.ModelProto, names: dict[str, torch.Tensor]) -> bytes:
    """The model with these graph inputs turned into initializers whose data is external
    (an empty stub: the session gets the values from add_external_initializers)."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    kept = [i for i in frozen.graph.input if i.name not in names]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    for name, tensor in names.items():
        _add_stub(frozen.graph, name, tensor.dtype, tensor.shape)
    return frozen.SerializeToString()


class BoundWeights:
    """The weights policy of a graph that takes its weights as inputs, bound per call like
    any argument: its sessions (one per CUDA stream) come from the model as lowered."""

    indices = frozenset()  # no argument is an initializer of the session

    def __init__(self, lowered, options, sessions, devices: set, unplanned: bool):
        self.lowered, self.options, self.sessions, self.devices, self.unplanned = lowered, options, sessions, devices, unplanned
        if sessions.private:  # a cache keyed by these bytes' identity: the weights need not be in them
            self.model_bytes, self.weights = without_large_initializers(lowered.model)
        else:
            self.model_bytes, self.weights = lowered.model.SerializeToString(), None

    def session_for_stream(self, stream):
        return self.sessions.get(self.model_bytes, self.options, self.devices, stream, self.lowered.disabled_optimizers, self.unplanned, self.weights)

    def attach(self, runner) -> None:
        pass


class FrozenWeights:
    """The weights policy of a graph whose weights (frozen: argument index -> tensor) become
    initializers of its sessions: builds the sessions from the current tensors, and on a
    change (the runner calls changed) rebuilds one or decides to stop freezing.

    unfrozen() -> a callable taking the graph's arguments, with the weights bound as inputs
    (used once the weights keep changing, or can no longer be frozen)."""

    def __init__(self, name: str, lowered, frozen: dict, unfrozen, options, sessions, devices: set, unplanned: bool):
        self.name, self.lowered, self.unfrozen = name, lowered, unfrozen
        self.options, self.sessions, self.devices, self.unplanned = options, sessions, devices, unplanned
        self.indices = sorted(frozen)
        self.input_names = [lowered.inputs[i].name for i in self.indices]
        # initializers: the weights the model reads (one only its size prelude reads is watched all the same)
        self.in_model = {i.name for i in lowered.model.graph.input}
        stubs = {n: frozen[i] for i, n in zip(self.indices, self.input_names) if n in self.in_model}
        self.model_bytes = frozen_model_bytes(lowered.model, stubs)
        self.tensors = [frozen[i] for i in self.indices]  # until attached: then the runner holds them (weakly)
        self.runner = None
        self.layout = [(t.shape, t.dtype, t.device) for t in self.tensors]  # what the model's stubs say
        self.built_at_run = 0
        self.stale_quickly = 0

    def session(self, tensors: list, stream=None):
        """A session whose initializers are these tensors (stream None: torch's current one)."""
        if stream is None:
            stream = current_cuda_stream(self.devices)
        weights = dict(zip(self.input_names, tensors))
        derived = derived_values(self.lowered.derived_weights, weights)  # Options.quantize: from the current values
        weights = {n: t for n, t in weights.items() if n in self.in_model} | derived
        return self.sessions.frozen(self.model_bytes, self.options, self.devices, stream, self.lowered.disabled_optimizers, weights, self.unplanned)

    def session_for_stream(self, stream):
        tensors = self.tensors if self.runner is None else list(self.runner.frozen_tensors().values())
        return self.session(tensors, stream)

    def attach(self, runner) -> None:
        """The runner watches the tensors from now on (and calls changed when one changes)."""
        tensors, self.tensors, self.runner = self.tensors, None, runner
        runner.on_weights_changed = self.changed
        runner.set_frozen(self.indices, tensors, None, contents(tensors))

    def changed(self, args) -> None:
        """The runner saw a frozen argument change (or die): refreeze, or stop freezing."""
        runner = self.runner
        if runner.runs - self.built_at_run < MIN_CALLS:
            self.stale_quickly += 1
        tensors = [args[i] for i in self.indices]
        same_layout = [(t.shape, t.dtype, t.device) for t in tensors] == self.layout
        if self.stale_quickly >= STALE_QUICKLY_LIMIT or not same_layout or not all(map(freezable, tensors)):
            warn_once(
                f"ortlite: the weights of graph {self.name} keep changing between calls (or can no longer be frozen): "
                "bound as inputs from now on (Options(freeze_weights=False) does so from the start)"
            )
            runner.replace(self.unfrozen())
            return
        self.built_at_run = runner.runs
        if runner.size_constants is not None:  # what its size prelude computed from the old weights
            runner.size_constants.weights_changed()
        runner.set_frozen(self.indices, tensors, self.session(tensors), contents(tensors))
