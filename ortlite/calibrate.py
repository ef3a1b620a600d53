"""Options.calibration: the float graph run in ONNX Runtime on the user's samples, each tensor
static quantization will quantize observed (its least and largest value: lower.qdq)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch
from torch.utils import _pytree as pytree

from . import _fast
from .lower import TENSOR, InputSpec, OutputSpec
from .options import CALIBRATION_SAMPLES
from .runner import runner_for
from .session import SessionCache


def calibrated_ranges(observing, gm, options, weights: list, in_spec, io_dtype=None) -> tuple[dict, int]:
    """(tensor name -> (min, max), the number of samples run) over the first
    CALIBRATION_SAMPLES of options.calibration.
    observing: a LoweredGraph lowered with calibration=OBSERVE; weights: the tensors bound
    ahead of the call's arguments; in_spec: the call's pytree structure (args, kwargs)."""
    names = observing.observed
    extra = [InputSpec(TENSOR, o.name, torch.float32, (), torch.device("cpu")) for o in observing.model.graph.output[len(observing.model.graph.output) - 2 * len(names) :]]
    first = len(observing.ort_outputs)
    lowered = dataclasses.replace(
        observing,
        ort_outputs=observing.ort_outputs + extra,
        outputs=observing.outputs + [OutputSpec("ort", first + i) for i in range(len(extra))],
        returns_tuple=True,
    )
    runner = runner_for("ortlite_calibration", lowered, gm, options.with_changes(model_transforms=(), dump_dir=None, calibration=None, quantize=None), SessionCache(), cls=_fast.Runner)
    low = [math.inf] * len(names)
    high = [-math.inf] * len(names)
    count = 0
    with torch.no_grad():
        for index, sample in enumerate(itertools.islice(options.calibration, CALIBRATION_SAMPLES)):
            args = sample if isinstance(sample, (tuple, list)) else (sample,)
            flat, spec = pytree.tree_flatten((tuple(args), {}))
            if spec != in_spec:
                raise TypeError(f"Options.calibration: sample {index} is structured as {spec}, but the model was exported with {in_spec}")
            if io_dtype is not None:
                flat = [t.to(torch.float32) if isinstance(t, torch.Tensor) and t.dtype == io_dtype else t for t in flat]
            try:
                results = runner(*weights, *flat)
            except (TypeError, ValueError) as e:
                raise type(e)(f"Options.calibration: sample {index}: {e}") from None
            for i, (lo, hi) in enumerate(zip(results[-2 * len(names) :: 2], results[-2 * len(names) + 1 :: 2])):
                low[i], high[i] = min(low[i], float(lo)), max(high[i], float(hi))
            count += 1
    if count == 0:
        raise ValueError("Options.calibration gave no samples")
    for name, lo, hi in zip(names, low, high):
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"Options.calibration: {name} took a value that is not finite ({lo}, {hi}) on the samples; it cannot be quantized")
    return {name: (lo, hi) for name, lo, hi in zip(names, low, high)}, count
