"""ONNX Runtime sessions: provider choice, session options, device mapping."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import io
import os

import onnxruntime
import torch
from onnxruntime.capi import onnxruntime_pybind11_state as C
from torch.utils.dlpack import to_dlpack

from . import _fast
from .logs import warn_once
from .options import Options

NVIDIA_VENDOR_ID = 0x10DE


class ProviderUnavailable(RuntimeError):
    """The execution provider a graph's device needs is not active in its session."""


# Providers that live in a library of their own, which ORT loads (or silently fails to) at
# session creation; loading it ourselves gives the loader's message naming what is missing.
PROVIDER_LIBRARIES = {
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
    "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so",
}


@functools.cache
def provider_problem(name: str) -> str | None:
    """Why this onnxruntime cannot run provider `name` here, or None if it should."""
    if name not in onnxruntime.get_available_providers():
        return f"{name} is not in this onnxruntime build (for CUDA, install onnxruntime-gpu)"
    library = PROVIDER_LIBRARIES.get(name)
    if library is None:
        return None
    capi = os.path.dirname(C.__file__)
    try:
        ctypes.CDLL(os.path.join(capi, "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(os.path.join(capi, library))
    except OSError as e:
        return f"{name} cannot be loaded: {e}"
    return None


def _load_cuda_libraries_from_wheels() -> None:
    """torch's CUDA wheels bring CUDA and cuDNN as nvidia-* packages; onnxruntime can use
    them (preload_dlls) where the system has none. Best effort, once."""
    if provider_problem("CUDAExecutionProvider") and hasattr(onnxruntime, "preload_dlls"):
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints each library it misses
                onnxruntime.preload_dlls()
        except Exception:  # the libraries stay missing; the problem is reported below
            return
        provider_problem.cache_clear()


def device_provider(device: torch.device) -> tuple | None:
    """The provider that runs on `device`, as a normalized (name, options) pair."""
    if device.type == "cuda":
        return ("CUDAExecutionProvider", (("device_id", str(device.index or 0)),))
    if device.type == "cpu":
        return ("CPUExecutionProvider", ())
    return None


def resolve_providers(options: Options, devices: set[torch.device]) -> list[tuple]:
    """Preferred providers, then those the inputs' devices need, then the defaults; first wins."""
    chosen = list(options.providers)
    if options.infer_providers:
        chosen += [p for p in (device_provider(d) for d in sorted(devices, key=str)) if p is not None]
    chosen += list(options.default_providers)
    seen, result = set(), []
    for name, opts in chosen:
        if name not in seen:
            seen.add(name)
            result.append((name, opts))
    return result


def ort_device(device: torch.device) -> C.OrtDevice:
    if device.type == "cuda":
        return C.OrtDevice(C.OrtDevice.cuda(), C.OrtDevice.default_memory(), NVIDIA_VENDOR_ID, device.index or 0)
    if device.type == "cpu":
        return C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    raise ValueError(f"ortlite: no ONNX Runtime device for torch device {device}")


def session_options(options: Options, fresh: bool = False) -> onnxruntime.SessionOptions:
    """The user's SessionOptions, or ortlite's. fresh: an object of our own even when the user
    gave one (its attributes copied), for sessions that add initializers to it."""
    if options.session_options is not None:
        return _copy(options.session_options) if fresh else options.session_options
    so = onnxruntime.SessionOptions()
    # torch and ORT thread pools side by side: follow what the user asked of torch.
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # errors reach ortlite as exceptions; it reports what it does not handle
    return so


def _copy(user: onnxruntime.SessionOptions) -> onnxruntime.SessionOptions:
    """A new SessionOptions with the user's attributes (ORT has no copy; config entries made
    with add_session_config_entry cannot be listed, so they are not carried over)."""
    warn_once("ortlite: frozen-weight sessions copy Options.session_options' attributes but not its config entries")
    so = onnxruntime.SessionOptions()
    for name, attr in vars(type(user)).items():
        if isinstance(attr, property) and attr.fset is not None:
            try:
                setattr(so, name, getattr(user, name))
            except Exception:  # write-only or unreadable attributes
                pass
    return so


# cudaStreamLegacy: the explicit handle of CUDA's legacy default stream, which is torch's
# default stream. Its cuda_stream is 0, and a user_compute_stream of 0 means "none" to ORT.
CUDA_STREAM_LEGACY = 1


def with_compute_stream(providers: list[tuple], stream: int | None) -> list[tuple]:
    """Providers with the CUDA provider told to run on torch's stream `stream` (a
    cudaStream_t as an int), unless the user chose a stream in its options."""
    if stream is None:
        return providers
    result = []
    for name, opts in providers:
        if name == "CUDAExecutionProvider" and "user_compute_stream" not in dict(opts):
            handle = stream or CUDA_STREAM_LEGACY
            opts = tuple(sorted({**dict(opts), "user_compute_stream": str(handle), "has_user_compute_stream": "1"}.items()))
        result.append((name, opts))
    return result


def current_cuda_stream(devices: set[torch.device]) -> int | None:
    """torch's current cudaStream_t (as an int) for a graph on CUDA; None on CPU."""
    cuda = next((d for d in devices if d.type == "cuda"), None)
    return None if cuda is None else torch.cuda.current_stream(cuda.index or 0).cuda_stream


def ort_values(tensors) -> list:
    """OrtValues over the tensors' memory (DLPack: no copy) for add_external_initializers.
    ORT reads external initializers on the host (it turns them into TensorProtos pointing at
    the memory), so CUDA tensors go through a temporary host copy; ORT then copies them to
    the device itself."""
    values = []
    for t in tensors:
        host = t.detach() if t.device.type == "cpu" else t.detach().cpu()
        if t.dtype == torch.bool:  # ORT's DLPack reader takes bools as uint8 with a flag, not kDLBool
            host = host.view(torch.uint8)
        values.append(onnxruntime.OrtValue(C.OrtValue.from_dlpack(to_dlpack(host), t.dtype == torch.bool)))
    return values


class SessionCache:
    """One InferenceSession per (model bytes, providers, stream): recompiles of the same
    graph reuse it. On CUDA a session is bound to one torch stream (ORT fixes the compute
    stream when the session is made), so each stream a graph runs on gets its own."""

    def __init__(self, private: bool = False):
        """private: the cache of one compiled model, whose model bytes are one object for its
        life: its sessions are found by that object's identity, not by a hash of the bytes
        (0.24 s of BERT-base's compile, for a cache that never holds another model)."""
        self._sessions: dict[tuple, tuple] = {}  # key -> (session, the model bytes where private)
        self.created = 0
        self.private = private

    def get(
        self,
        model_bytes: bytes,
        options: Options,
        devices: set[torch.device],
        stream: int | None = None,
        disabled_optimizers: tuple = (),
        unplanned: bool = False,
        weights: dict | None = None,
    ) -> C.InferenceSession:
        """weights: initializers the model holds as external stubs (name -> tensor), in a
        private cache only (the bytes alone then do not say which weights they run)."""
        assert weights is None or self.private, "a shared cache keys sessions by the model's bytes, which must hold its weights"
        providers = with_compute_stream(resolve_providers(options, devices), stream)
        model_key = id(model_bytes) if self.private else hashlib.sha256(model_bytes).digest()
        key = (model_key, tuple(providers), id(options.session_options), disabled_optimizers, unplanned)
        entry = self._sessions.get(key)
        if entry is None:
            sess = create_session(model_bytes, options, providers, devices, disabled_optimizers, weights, unplanned=unplanned)
            entry = self._sessions[key] = (sess, model_bytes if self.private else None)  # (the bytes keep their id unique)
            self.created += 1
        return entry[0]

    def frozen(self, model_bytes, options, devices, stream, disabled_optimizers, weights: dict, unplanned: bool = False):
        """A session whose initializers include `weights` (name -> tensor, by pointer), for one
        runner alone: never shared through the cache, since its weights are a module's own."""
        providers = with_compute_stream(resolve_providers(options, devices), stream)
        sess = create_session(model_bytes, options, providers, devices, disabled_optimizers, weights, unplanned=unplanned)
        self.created += 1
        return sess

    def clear(self):
        self._sessions.clear()
        self.created = 0


def c_api_problem() -> str | None:
    """Why sessions cannot go through ONNX Runtime's C API here (None: they can).
    ORTLITE_NO_C_API=1 pretends its library failed to load."""
    if os.environ.get("ORTLITE_NO_C_API", "") not in ("", "0"):
        return "ORTLITE_NO_C_API is set"
    return _fast.C_API_PROBLEM


def _c_api_serves(options: Options, providers: list[tuple], disabled_optimizers: tuple) -> bool:
    """Whether this session goes through the C API: CPU alone, ortlite's own session options.
    (Not yet ported: CUDA, a user's SessionOptions, disabled optimizers: the pybind module.)"""
    if options.session_options is not None or disabled_optimizers or providers != [("CPUExecutionProvider", ())]:
        return False
    problem = c_api_problem()
    if problem is not None:
        warn_once(f"ortlite: running sessions through onnxruntime's Python module (slower per call): {problem}")
        return False
    return True


# ONNX Runtime's graph optimizers that make CPU sessions slower: its CPU
# SkipLayerNormalization (what SkipLayerNormFusion makes of an Add before a LayerNormalization)
# took 4-5x the time of the two ops it replaces (ORT 1.31, float32, (1, 128, 256): 198 vs 40 us;
# (1, 128, 768): 561 vs 103 us; a BERT h256 L4 0.89x the time without it). Not applied in CPU
# sessions; their values are the two ops' (within 1e-6 of the fused kernel's).
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)
# ONNX Runtime's graph optimizers that change results, on every provider: GatherToSliceFusion
# turns a Gather by a Range (only one whose bounds are not constants survives constant folding:
# symbolic sizes) into a Slice over the Range's bounds, which differs where the range holds
# negative indices: x[:, arange(-s, 0)] came back empty, x[:, arange(s - 1, -1, -1)] too.
WRONG_OPTIMIZERS = ("GatherToSliceFusion",)


def disabled_optimizers_for(providers, disabled: tuple = ()) -> list:
    """The graph optimizers a session for these providers runs without: the graph's own
    (LoweredGraph.disabled_optimizers), WRONG_OPTIMIZERS, and on CPU CPU_DISABLED_OPTIMIZERS."""
    return list(disabled) + list(WRONG_OPTIMIZERS) + (list(CPU_DISABLED_OPTIMIZERS) if cpu_only(providers) else [])


def cpu_only(providers) -> bool:
    return [p[0] if isinstance(p, tuple) else p for p in providers] == ["CPUExecutionProvider"]


def _c_session(model_bytes: bytes, weights: dict | None):
    """A CPU session through the C API, with the options session_options() gives pybind ones."""
    from .lower.builder import TORCH_TO_ONNX

    names = list(weights) if weights else None
    values = [(t.detach(), TORCH_TO_ONNX[t.dtype]) for t in weights.values()] if weights else None
    # ONNX Runtime splits this entry at ";" (a "," joined list disables none of its names)
    config = {"optimization.disable_specified_optimizers": ";".join(disabled_optimizers_for(["CPUExecutionProvider"]))}
    return _fast.create_c_session(model_bytes, torch.get_num_threads(), 1, 99, config, names, values)  # 99: ORT_ENABLE_ALL


def create_session(
    model_bytes: bytes | str,
    options: Options,
    providers: list[tuple],
    devices: set[torch.device],
    disabled_optimizers: tuple = (),
    weights: dict | None = None,
    unplanned: bool = False,
):
    """The session for these providers: through the C API where it serves them, else the
    pybind module. model_bytes: the serialized model, or the path of a saved one (whose
    external data lies beside it; the pybind module reads those). Raises ProviderUnavailable
    when the provider the graph's devices need cannot run (ORT itself would fall back to CPU
    in silence and then read device pointers on the host); drops other providers that cannot,
    with a warning. unplanned: a graph whose sizes vary without a memory-pattern key input
    (see ortlite.runner.unkeyed_varying_sizes; on CPU only graphs saved before the key
    existed): ortlite's own options then turn memory patterns off (a user's SessionOptions
    are theirs to set), through the pybind module."""
    if any(d.type == "cuda" for d in devices):
        _load_cuda_libraries_from_wheels()
    needed = {p[0] for p in (device_provider(d) for d in devices) if p is not None}
    problems = {name: provider_problem(name) for name, _ in providers}
    blocking = [problems[name] for name in sorted(needed) if problems.get(name)]
    if blocking:
        raise ProviderUnavailable(f"the graph's tensors are on {sorted(map(str, devices))}, but {'; '.join(blocking)}")
    skipped = [problem for problem in problems.values() if problem]
    if skipped:
        warn_once(f"ortlite: execution provider(s) skipped: {'; '.join(skipped)}")
    usable = [(name, opts) for name, opts in providers if not problems[name]]
    if isinstance(model_bytes, bytes) and _c_api_serves(options, usable, disabled_optimizers) and not unplanned:
        return _c_session(model_bytes, weights)
    so = session_options(options, fresh=bool(weights))
    if unplanned and options.session_options is None:
        so.enable_mem_pattern = False
    if weights:  # initializers over torch's memory; ORT takes what it needs from them
        so.add_external_initializers(list(weights), ort_values(weights.values()))
    wrapper = onnxruntime.InferenceSession(
        model_bytes,
        sess_options=so,
        providers=[name for name, _ in usable],
        provider_options=[dict(opts) for _, opts in usable],
        disabled_optimizers=disabled_optimizers_for(usable, disabled_optimizers),
    )
    active = wrapper.get_providers()
    inactive = [name for name, _ in usable if name not in active]
    if needed - set(active):
        raise ProviderUnavailable(f"the graph's tensors are on {sorted(map(str, devices))}, but {sorted(needed - set(active))} did not activate")
    if inactive:
        warn_once(f"ortlite: requested execution provider(s) {inactive} are not active in the session (active: {active})")
    return wrapper._sess
