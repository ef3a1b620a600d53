"""ONNX Runtime sessions: provider choice, session options, device mapping."""

from __future__ import annotations

import hashlib

import onnxruntime
import torch
from onnxruntime.capi import onnxruntime_pybind11_state as C

from .logs import warn_once
from .options import Options

NVIDIA_VENDOR_ID = 0x10DE


class ProviderUnavailable(RuntimeError):
    """The execution provider a graph's device needs is not active in its session."""


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


def session_options(options: Options) -> onnxruntime.SessionOptions:
    if options.session_options is not None:
        return options.session_options
    so = onnxruntime.SessionOptions()
    # torch and ORT thread pools side by side: follow what the user asked of torch.
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return so


class SessionCache:
    """One InferenceSession per (model bytes, providers): recompiles of the same graph reuse it."""

    def __init__(self):
        self._sessions: dict[tuple, C.InferenceSession] = {}
        self.created = 0

    def get(self, model_bytes: bytes, options: Options, devices: set[torch.device]) -> C.InferenceSession:
        providers = resolve_providers(options, devices)
        key = (hashlib.sha256(model_bytes).digest(), tuple(providers), id(options.session_options))
        sess = self._sessions.get(key)
        if sess is None:
            sess = create_session(model_bytes, options, providers, devices)
            self._sessions[key] = sess
            self.created += 1
        return sess

    def clear(self):
        self._sessions.clear()
        self.created = 0


def create_session(model_bytes: bytes, options: Options, providers: list[tuple], devices: set[torch.device]):
    available = set(onnxruntime.get_available_providers())
    names = [name for name, _ in providers if name in available]
    missing = [name for name, _ in providers if name not in available]
    if missing:
        warn_once(f"ortlite: execution provider(s) {missing} are not in this onnxruntime build; skipped")
    provider_options = [dict(opts) for name, opts in providers if name in available]
    wrapper = onnxruntime.InferenceSession(
        model_bytes, sess_options=session_options(options), providers=names, provider_options=provider_options
    )
    active = wrapper.get_providers()
    inactive = [name for name in names if name not in active]
    needed = {p[0] for p in (device_provider(d) for d in devices) if p is not None}
    if needed - set(active):
        raise ProviderUnavailable(
            f"the inputs are on {sorted(map(str, devices))} but ONNX Runtime could not activate {sorted(needed - set(active))} "
            f"(active: {active}); check that its libraries (e.g. CUDA and cuDNN for the CUDA provider) can be loaded"
        )
    if inactive:
        warn_once(f"ortlite: requested execution provider(s) {inactive} are not active in the session (active: {active})")
    return wrapper._sess
