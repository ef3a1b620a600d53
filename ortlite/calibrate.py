"""Options.calibration: the float graph run in ONNX Runtime on the user's samples, each tensor
static quantization will quantize observed (its least and largest value: lower.qdq).

Samples are the arguments of the user's call. ortlite.compile flattens them as its exported
program does. Under torch.compile, Dynamo's graph reads them through its sources: each
graph input is an expression over the traced frame's locals (L['x'], L['args'][0],
L['x'].size()[0]); those whose root is one of the call's arguments are evaluated on each
sample, the others (parameters, buffers, globals) are the call's own example inputs."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import re

import torch
from torch.utils import _pytree as pytree

from . import _fast
from .lower import OBSERVE, TENSOR, InputSpec, OutputSpec
from .options import CALIBRATION_SAMPLES
from .runner import runner_for
from .session import SessionCache


def observe(observing, gm, options, calls) -> tuple[dict, int]:
    """(tensor name -> (min, max), the number of calls run): observing (a LoweredGraph lowered
    with calibration=OBSERVE) run on each argument list of calls (as its runner takes them)."""
    names = observing.observed
    outputs = observing.model.graph.output
    extra = [InputSpec(TENSOR, o.name, torch.float32, (), torch.device("cpu")) for o in outputs[len(outputs) - 2 * len(names) :]]
    first = len(observing.ort_outputs)
    lowered = dataclasses.replace(
        observing,
        ort_outputs=observing.ort_outputs + extra,
        outputs=observing.outputs + [OutputSpec("ort", first + i) for i in range(len(extra))],
        returns_tuple=True,
    )
    plain = options.with_changes(model_transforms=(), dump_dir=None, calibration=None, quantize=None, check_baseline=False)
    runner = runner_for("ortlite_calibration", lowered, gm, plain, SessionCache(), cls=_fast.Runner)
    low, high = [math.inf] * len(names), [-math.inf] * len(names)
    count = 0
    with torch.no_grad():
        for index, args in enumerate(calls):
            try:
                results = runner(*args)
            except (TypeError, ValueError) as e:
                raise type(e)(f"Options.calibration: sample {index}: {e}") from None
            observed = results[len(results) - 2 * len(names) :]
            for i in range(len(names)):
                low[i], high[i] = min(low[i], float(observed[2 * i])), max(high[i], float(observed[2 * i + 1]))
            count += 1
    if count == 0:
        raise ValueError("Options.calibration gave no samples")
    for name, lo, hi in zip(names, low, high):
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"Options.calibration: {name} took a value that is not finite ({lo}, {hi}) on the samples; it cannot be quantized")
    return {name: (lo, hi) for name, lo, hi in zip(names, low, high)}, count


def lower_calibrated(lower, gm, options, calls):
    """The LoweredGraph whose convolutions are quantized statically at the ranges calibrated
    on calls (argument lists as its runner takes them). lower: lower_graph with all but
    quantize and calibration given."""
    ranges, count = observe(lower(calibration=OBSERVE), gm, options, calls)
    lowered = lower(quantize="int8", calibration=ranges)
    lowered.calibration_samples = count
    return lowered


def exported_calls(options, weights: list, in_spec, io_dtype=None):
    """ortlite.compile: the first CALIBRATION_SAMPLES of options.calibration, each flattened
    as the exported call (in_spec); weights: the tensors bound ahead of it."""

    def calls():
        for index, sample in enumerate(itertools.islice(options.calibration, CALIBRATION_SAMPLES)):
            flat, spec = pytree.tree_flatten((_arguments(sample), {}))
            if spec != in_spec:
                raise TypeError(f"Options.calibration: sample {index} is structured as {spec}, but the model was exported with {in_spec}")
            if io_dtype is not None:
                flat = [t.to(torch.float32) if isinstance(t, torch.Tensor) and t.dtype == io_dtype else t for t in flat]
            yield [*weights, *flat]

    return calls()


def dynamo_graph_inputs(gm: torch.fx.GraphModule, example_inputs: list, samples: list) -> list | str:
    """torch.compile: per sample, the inputs Dynamo's graph gm would get from a call with it
    (see the module docstring); or why they cannot be told (a graph after a graph break reads
    values of the frame before it)."""
    context = torch._guards.TracingContext.try_get()
    code = context.traced_code[0] if context is not None and getattr(context, "traced_code", None) else None
    if code is None:
        return "Dynamo did not say which frame it traced"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = [getattr(getattr(n.meta.get("grapharg"), "source", None), "name", None) for n in placeholders]
    if len(sources) != len(example_inputs) or None in sources:
        return "a graph input has no source"
    roots = [m.group(1) if (m := re.match(r"L\['([^']+)'\]", s)) else None for s in sources]
    modules = {r for r, s in zip(roots, sources) if r is not None and re.match(r"L\['[^']+'\]\._(modules|parameters|buffers)\[", s)}
    names = list(code.co_varnames[: code.co_argcount])
    varargs = code.co_varnames[code.co_argcount + code.co_kwonlyargcount] if code.co_flags & inspect.CO_VARARGS else None
    # self: a module's forward, the module whose weights the graph reads (or whose forward reads none of its own)
    positional = names[1:] if names and (names[0] in modules or names[0] == "self") else names
    per_sample = []
    for index, sample in enumerate(samples):
        args = _arguments(sample)
        if len(args) > len(positional) and varargs is None:
            return f"sample {index} has {len(args)} arguments, the compiled {code.co_name} takes {len(positional)}"
        frame = dict(zip(positional, args))
        if varargs is not None:
            frame[varargs] = tuple(args[len(positional) :])
        inputs = []
        for root, source, example in zip(roots, sources, example_inputs):
            if root in frame:
                try:
                    inputs.append(eval(source, {"__builtins__": {}}, {"L": frame}))  # noqa: S307 (Dynamo's own source expression)
                except Exception as e:
                    return f"sample {index}: {source}: {type(e).__name__}: {e}"
            elif root is None or root in modules:
                inputs.append(example)
            else:
                return f"its input {source} is not read from the call's arguments (a graph after a graph break)"
        per_sample.append(inputs)
    return per_sample


def _arguments(sample) -> tuple:
    return tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
