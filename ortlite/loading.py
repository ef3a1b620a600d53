"""ortlite.load: a CompiledModel from a file CompiledModel.save wrote (the format, and the
checks that treat the file as hostile input, are ortlite.saved's), without torch.export or
the model's code."""

from __future__ import annotations

import os

from .compiled import attach, model_class
from .options import Options
from .runner import build_runner, unkeyed_varying_sizes
from .saved import read
from .session import ProviderUnavailable, create_session, current_cuda_stream, resolve_providers, with_compute_stream


def load(path, options=None):
    """A CompiledModel from a file written by CompiledModel.save (see the module docstring)."""
    options = Options.coerce(options)
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    model, lowered, saved = read(path, data)
    source = path if saved["external"] else data  # ORT finds external data beside the path
    # the mutated buffers' initial values (defaults of inputs, for plain onnxruntime) are bound
    # at every call: without them ONNX Runtime has no input-initializer to warn about
    defaults = set() if saved["external"] else {b["input"] for b in saved["bound"]}
    if defaults:
        kept = [t for t in model.graph.initializer if t.name not in defaults]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
    if saved["key_added"] or defaults:
        source = model.SerializeToString()
    if options.model_transforms:
        for transform in options.model_transforms:
            transform(model)
        source = model.SerializeToString()
    devices = {spec.device for spec in lowered.inputs + lowered.ort_outputs if spec.device is not None}
    providers = resolve_providers(options, devices)
    unplanned = unkeyed_varying_sizes(lowered)

    def session_for_stream(stream):
        return create_session(source, options, with_compute_stream(providers, stream), devices, lowered.disabled_optimizers, unplanned=unplanned)

    cls = model_class(lowered, bool(saved["weights"]), saved["mutations"], saved["in_spec"], saved["out_spec"])
    try:
        sess = session_for_stream(current_cuda_stream(devices))
    except ProviderUnavailable:
        raise
    except Exception as e:  # ORT's own checks of the graph
        raise ValueError(f"ortlite.load: {path}: ONNX Runtime cannot load the model: {e}") from None
    try:
        compiled = build_runner("aot", lowered, sess, cls=cls, session_for_stream=session_for_stream, from_file=True, ort_allocated=saved["unconfirmed"])
    except Exception as e:  # e.g. its sizes code: whatever fails here, the file's metadata made it fail
        raise ValueError(f"ortlite.load: {path}: its metadata does not make a runner: {type(e).__name__}: {e}") from None
    targets = [b["buffer"] for b in saved["bound"]]
    return attach(
        compiled, lowered, saved["weights"], targets, saved["in_spec"], saved["out_spec"], saved["mutations"], dict(zip(targets, saved["weights"]))
    )
