"""Options: one frozen, validated dataclass shared by torch.compile and the AOT path."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import onnxruntime

MIN_OPSET = 18
DEFAULT_OPSET = 20
QUANTIZE_MODES = (None, "int8", "int4")
RANDOM_MODES = ("torch", "onnxruntime")
CALIBRATION_SAMPLES = 300  # the most samples of Options.calibration that calibration runs (NNCF's default)


def _normalize_providers(field: str, value: Any) -> tuple:
    """Providers as a tuple of (name, ((key, value), ...)) pairs: hashable and ordered."""
    if value is None:
        return ()
    if isinstance(value, str) or _is_provider_pair(value):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"Options.{field} must be a list of provider names or (name, options) pairs, got {value!r}")
    normalized = []
    for entry in value:
        if isinstance(entry, str):
            name, opts = entry, {}
        elif _is_provider_pair(entry):
            name, opts = entry[0], dict(entry[1])
        else:
            raise TypeError(f"Options.{field}: each provider must be a name or a (name, options) pair, got {entry!r}")
        if not name.endswith("ExecutionProvider"):
            raise ValueError(f"Options.{field}: {name!r} is not an execution provider name (e.g. 'CPUExecutionProvider')")
        normalized.append((name, tuple(sorted((str(k), str(v)) for k, v in opts.items()))))
    return tuple(normalized)


def _is_provider_pair(value: Any) -> bool:
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], (dict, tuple))
        and not isinstance(value[1], str)
    )


class CalibrationSamples:
    """Options.calibration's iterable, equal and hashed by identity: Options with other samples
    are other Options (a Backend per options), and tensors have no equality to compare by."""

    __slots__ = ("samples",)

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        return iter(self.samples)

    def __eq__(self, other):
        return isinstance(other, CalibrationSamples) and other.samples is self.samples

    def __hash__(self):
        return id(self.samples)


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class Options:
    """How ortlite compiles and runs graphs.

    providers: preferred execution providers, names or (name, options) pairs, tried first.
    infer_providers: add the provider that matches the inputs' device (CUDA for cuda:N).
    default_providers: used after those; CPU by default.
    session_options: an onnxruntime.SessionOptions; by default ortlite makes one whose
        intra-op thread count follows torch.get_num_threads().
    fallback: "torch" leaves unsupported work to torch (with one warning per cause);
        "error" raises instead.
    model_transforms: callables applied in place to each onnx.ModelProto before its session.
    dump_dir: write each compiled graph as .onnx plus its FX graph as text (env ORTLITE_DUMP_DIR).
    check_baseline: also run torch and assert the results match (env ORTLITE_CHECK_BASELINE=1).
    opset: the ONNX opset of the graphs built (>= 18).
    sort_ties: where the keys of a sort or topk (not stable=True) tie and the order of the
        tied indices can reach an output, aten's order is its kernel's (x86-simd-sort,
        std::sort), which no lowering reproduces. "torch" (default) runs such a call in
        torch, so the indices are eager's; "stable" orders ties by index in ONNX Runtime: an
        order aten's contract allows, the values identical, the indices of tied keys possibly
        not eager's. Either way, a sort whose tie order provably cannot reach an output (MoE
        routing: lower.tie_order) runs in ONNX Runtime unchecked.
    freeze_weights: in inference graphs (torch.compile under no_grad/inference_mode, or
        nothing requiring grad), parameters and buffers become ONNX Runtime initializers,
        watched for changes every call (see ortlite.frozen). False binds them as inputs.
    size_constants: in CPU graphs with symbolic sizes (torch.compile), compute what integer
        arguments, sizes and constants alone determine (masks, position ranges, gather
        indices) apart, once per set of sizes, and keep it for later calls with the same
        sizes (see ortlite.lower.hoist). Pays where sizes repeat (a few padded lengths:
        ONNX Runtime's work is then that of a static graph). A graph whose sizes change
        at nearly every call (generate) is compiled again without it after 16 such calls.
    quantize: None (default: float math as the model has it), "int8" or "int4": the weights
        of matrix products whose weight is a constant (ortlite.compile's initializers; frozen
        weights under torch.compile) are quantized, and those products run in ONNX Runtime's
        integer kernels (see ortlite.lower.quantize). "int8": weights int8, symmetric, per
        output channel; activations quantized per call (uint8, per tensor). "int4": weights
        int4 in blocks along K where the call has one row (decode), the int8 kernel where it
        has more (int4's kernel is slower there). Embeddings: rows int8, a scale each.
        Attention's products, norms and the rest stay float. A bfloat16 or float16 model on
        CPU is computed in float32 inside (ortlite.widen), called in its own dtype.
    random: who draws the random numbers of training graphs (dropout). "torch" (default):
        torch's generator, the values eager draws: dropout's mask is drawn by torch from the
        input's size ahead of the graph (CPU), the graph stays one ONNX Runtime session.
        "onnxruntime": ONNX Runtime's generators (dropout as RandomUniformLike >= p; also
        rand, rand_like, bernoulli), the same distributions, not eager's values; seeded per
        node from torch's generator state (read, not advanced) and the graph when it is
        compiled, then advancing call by call (a torch.manual_seed after that does not reset
        them). See docs/training.md.
    calibration: with quantize="int8", convolutions are quantized statically (ortlite.lower.
        qdq): uint8 activations at scales calibrated on these samples, int8 weights per output
        channel, BatchNormalization folded in; ONNX Runtime runs conv -> relu -> conv,
        residual adds and max pooling on uint8. An iterable (a list, a DataLoader) of samples,
        each the call's positional arguments (a tuple) or its one tensor; the first
        CALIBRATION_SAMPLES (300) run through the float graph, each quantized tensor's least
        and largest value kept (ortlite.calibrate: under torch.compile, in inference graphs
        the samples reach through Dynamo's sources). See docs/reduced-precision.md.
    """

    providers: tuple = ()
    infer_providers: bool = True
    default_providers: tuple = ("CPUExecutionProvider",)
    session_options: onnxruntime.SessionOptions | None = None
    fallback: str = "torch"
    model_transforms: tuple = ()
    dump_dir: str | None = dataclasses.field(default_factory=lambda: os.environ.get("ORTLITE_DUMP_DIR") or None)
    check_baseline: bool = dataclasses.field(default_factory=lambda: _env_flag("ORTLITE_CHECK_BASELINE"))
    opset: int = DEFAULT_OPSET
    freeze_weights: bool = True
    size_constants: bool = True
    sort_ties: str = "torch"
    quantize: str | None = None
    random: str = "torch"
    calibration: Any = dataclasses.field(default=None, repr=False)  # (held as CalibrationSamples: compared by identity)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("providers", _normalize_providers("providers", self.providers))
        set_("default_providers", _normalize_providers("default_providers", self.default_providers))
        for name in ("infer_providers", "check_baseline", "freeze_weights", "size_constants"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Options.{name} must be a bool, got {getattr(self, name)!r}")
        if self.session_options is not None and not isinstance(self.session_options, onnxruntime.SessionOptions):
            raise TypeError(f"Options.session_options must be an onnxruntime.SessionOptions, got {type(self.session_options).__name__}")
        if self.fallback not in ("torch", "error"):
            raise ValueError(f"Options.fallback must be 'torch' or 'error', got {self.fallback!r}")
        if self.sort_ties not in ("torch", "stable"):
            raise ValueError(f"Options.sort_ties must be 'torch' or 'stable', got {self.sort_ties!r}")
        if self.quantize not in QUANTIZE_MODES:
            raise ValueError(f"Options.quantize must be one of {QUANTIZE_MODES}, got {self.quantize!r}")
        if self.calibration is not None:
            if self.quantize != "int8":
                raise ValueError(f"Options.calibration quantizes convolutions to int8 and needs quantize='int8', got quantize={self.quantize!r}")
            if isinstance(self.calibration, (str, bytes, dict)) or not hasattr(self.calibration, "__iter__") or _is_tensor(self.calibration):
                raise TypeError(
                    "Options.calibration must be an iterable (a list, a DataLoader) of samples, each the call's arguments as a tuple "
                    f"or its one tensor; got {type(self.calibration).__name__}"
                )
            if not isinstance(self.calibration, CalibrationSamples):
                set_("calibration", CalibrationSamples(self.calibration))
        if self.random not in RANDOM_MODES:
            raise ValueError(f"Options.random must be one of {RANDOM_MODES}, got {self.random!r}")
        transforms = self.model_transforms
        if callable(transforms):
            transforms = (transforms,)
        if not isinstance(transforms, (list, tuple)) or not all(callable(t) for t in transforms):
            raise TypeError(f"Options.model_transforms must be a list of callables taking an onnx.ModelProto, got {self.model_transforms!r}")
        set_("model_transforms", tuple(transforms))
        if self.dump_dir is not None:
            if not isinstance(self.dump_dir, (str, os.PathLike)):
                raise TypeError(f"Options.dump_dir must be a path, got {self.dump_dir!r}")
            set_("dump_dir", os.fspath(self.dump_dir))
        if not isinstance(self.opset, int) or isinstance(self.opset, bool):
            raise TypeError(f"Options.opset must be an int, got {self.opset!r}")
        if self.opset < MIN_OPSET:
            raise ValueError(f"Options.opset must be >= {MIN_OPSET}, got {self.opset}")

    @classmethod
    def coerce(cls, value: "Options | dict | None") -> "Options":
        """Options from None, an Options, or a dict of field names (unknown keys are a TypeError)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise TypeError(f"unknown ortlite option(s) {unknown}; known options are {sorted(known)}")
            return cls(**value)
        raise TypeError(f"ortlite options must be an ortlite.Options or a dict, got {type(value).__name__}")

    def with_changes(self, **changes: Any) -> "Options":
        return dataclasses.replace(self, **changes)

