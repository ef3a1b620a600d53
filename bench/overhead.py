"""Per-call overhead of ortlite against eager, inductor and two floors, in one run.

    python bench/overhead.py [--rounds 15] [--iters 2000] [--device cpu|cuda] [--verbose] [--json out.json]

Candidates: eager, inductor, ortlite (torch.compile), ortlite AOT (ortlite.compile); with
--verbose also ortlite unfrozen (torch.compile with Options(freeze_weights=False)) and both
ortlite paths with sessions through onnxruntime's Python module (ortlite pybind, ortlite AOT
pybind: ORTLITE_NO_C_API=1, as before the C-API path), and every ratio.
Floors, measured in the same run:
  raw ORT       the same ONNX model ortlite built, I/O pre-bound, only run_with_iobinding timed
  C-API floor   the same model through ONNX Runtime's C API: Run on OrtValues made once (CPU only)
  dynamo+aot    torch.compile through aot_autograd with a compiler that returns a constant
  dynamo+aot+ORT  the same, its compiled graph running the C-API floor (raw ORT without the C
                API) inside each call: the least a backend that runs ORT can cost through
                Dynamo. It exceeds the sum of the two floors measured apart: each is timed in
                a tight loop of its own, with warm caches, which a call through Dynamo is not.
One thread for torch and ORT; candidates interleaved in rounds; medians of per-call times.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import types

# inductor's compile worker processes would otherwise share the CPU with the timings
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import onnxruntime  # noqa: E402
import torch  # noqa: E402
from onnxruntime.capi import onnxruntime_pybind11_state as C  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402

import ortlite  # noqa: E402


def relu_case(device):
    x = torch.randn(8, 8, device=device)
    y = torch.randn(8, 8, device=device)
    return "relu(x*x+y) 8x8", (lambda x, y: torch.relu(x * x + y)), (x, y)


def mlp_case(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).to(device)
    model.eval()
    return "MLP 64-64-64-10 b1", model, (torch.randn(1, 64, device=device),)


CASES = {"relu": relu_case, "mlp": mlp_case}


def constant_backend(result):
    """The Dynamo + aot_autograd floor: the same capture, a compiled graph that does nothing."""

    def compiler(gm, example_inputs):
        def run(args):
            args.clear()
            return result

        run._boxed_call = True
        return run

    return aot_autograd(fw_compiler=compiler)


def calling_backend(result, call):
    """dynamo+aot+ORT: the constant backend's capture, a compiled graph that runs call()."""

    def compiler(gm, example_inputs):
        def run(args):
            args.clear()
            call()
            return result

        run._boxed_call = True
        return run

    return aot_autograd(fw_compiler=compiler)


def raw_ort_floor(onnx_path, args, device):
    """run_with_iobinding on pre-bound inputs and outputs: the least a call can cost in ORT.
    `args` are the graph's inputs in order; returns the call and its first output, which
    the caller checks against eager."""
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    ro = C.RunOptions()
    providers = ["CPUExecutionProvider"]
    if device == "cuda":  # on torch's stream, no end-of-run sync: as ortlite runs it
        stream = torch.cuda.current_stream().cuda_stream or 1  # 1 = cudaStreamLegacy, torch's default
        providers = [("CUDAExecutionProvider", {"user_compute_stream": str(stream), "has_user_compute_stream": "1"}), "CPUExecutionProvider"]
        ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    sess = onnxruntime.InferenceSession(onnx_path, so, providers=providers)._sess
    iob = C.SessionIOBinding(sess)
    dev = (
        C.OrtDevice(C.OrtDevice.cuda(), C.OrtDevice.default_memory(), 0x10DE, 0)
        if device == "cuda"
        else C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    )
    from ortlite.lower.builder import TORCH_TO_ONNX

    keep = []
    tensors = [a.detach().contiguous() for a in args]
    assert len(tensors) == len(sess.inputs_meta), "the raw floor must bind every graph input"
    for meta, t in zip(sess.inputs_meta, tensors):
        iob.bind_input(meta.name, dev, TORCH_TO_ONNX[t.dtype], list(t.shape), t.data_ptr())
        keep.append(t)
    outputs = []
    for meta in sess.outputs_meta:
        out = torch.empty([int(d) for d in meta.shape], dtype=torch.float32, device=device)
        iob.bind_output(meta.name, dev, TORCH_TO_ONNX[out.dtype], list(out.shape), out.data_ptr())
        outputs.append(out)

    def run():
        sess.run_with_iobinding(iob, ro)

    run.keep = keep + outputs
    run()
    return run, outputs[0]


def c_api_floor(onnx_path, args, device):
    """Run through the C API on OrtValues made once over the inputs and outputs: what a call
    costs in ONNX Runtime itself, without pybind. None where the C API is not used (CUDA)."""
    from ortlite import _fast
    from ortlite.lower.builder import TORCH_TO_ONNX

    if device != "cpu" or _fast.C_API_PROBLEM is not None:
        return None, None
    import onnx

    model = onnx.load(onnx_path)
    sess = _fast.create_c_session(model.SerializeToString(), 1, 1, 99)
    tensors = [a.detach().contiguous() for a in args]
    inputs = {i.name: t for i, t in zip(model.graph.input, tensors)}
    outputs = {}
    for o in model.graph.output:
        dims = [d.dim_value for d in o.type.tensor_type.shape.dim]
        outputs[o.name] = torch.empty(dims, dtype=torch.float32)
    run = _fast.CFloor(sess, inputs, outputs, TORCH_TO_ONNX)
    run()
    return run, next(iter(outputs.values()))


def graph_args(fn, args):
    """The arguments aot_autograd passes to the compiled graph (parameters lifted in
    Dynamo's order), recorded with the same capture ortlite uses."""
    from ortlite.decomp import decomposition_table

    recorded = []

    def compiler(gm, example_inputs):
        def run(*graph_args):
            recorded.append(list(graph_args))
            return gm(*graph_args)

        return run

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, decompositions=decomposition_table()))(*args)
    torch._dynamo.reset()
    return recorded[0]


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def as_module(fn):
    return fn if isinstance(fn, torch.nn.Module) else _Wrap(fn)


_own_code_ids = itertools.count()


def own_code(fn):
    """fn behind a function with a code object of its own. Dynamo keeps compiled entries
    per code object and checks them in turn: candidates compiled from one function would
    pay for each other's entries."""

    def call(*args):
        return fn(*args)

    # A distinct name too: Dynamo's automatic-dynamic state is keyed by file, line and name,
    # and sizes seen by one candidate must not make another's graph dynamic.
    name = f"call_{next(_own_code_ids)}"
    code = call.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, call.__globals__, name, None, call.__closure__)


@contextlib.contextmanager
def pybind_sessions():
    old = os.environ.get("ORTLITE_NO_C_API")
    os.environ["ORTLITE_NO_C_API"] = "1"
    logger = logging.getLogger("ortlite")
    level, logger.level = logger.level, logging.ERROR  # (its warning that the variable is set: set here on purpose)
    try:
        yield
    finally:
        logger.setLevel(level)
        if old is None:
            del os.environ["ORTLITE_NO_C_API"]
        else:
            os.environ["ORTLITE_NO_C_API"] = old


def interleaved(calls: dict, rounds: int, block) -> dict:
    """Samples per candidate (name -> zero-argument call): each round times block(call) once
    per candidate, in an order shuffled per round (seeded), each block after one untimed
    call. A fixed order slows whichever candidate always comes right after the heaviest:
    after eager, a zoo model's ortlite graph ran up to 25% slower than the same graph
    elsewhere in the round (eager's allocations evict the caches)."""
    samples = {name: [] for name in calls}
    order, rng = list(calls), random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            calls[name]()
            samples[name].append(block(calls[name]))
    return samples


def per_call_us(fn, iters, sync):
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e6


def first_call_s(make, args, sync):
    torch._dynamo.reset()
    fn = make()
    start = time.perf_counter()
    fn(*args)
    sync()
    return time.perf_counter() - start


def bench_case(case, device, rounds, iters, with_inductor, verbose=False):
    label, fn, args = case(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    expected = fn(*args)
    dump_dir = tempfile.mkdtemp(prefix="ortlite-bench-")
    be = ortlite.Backend(ortlite.Options(dump_dir=dump_dir))

    first = {}
    first["ortlite"] = first_call_s(lambda: torch.compile(own_code(fn), backend=be), args, sync)
    first["dynamo+aot floor"] = first_call_s(lambda: torch.compile(own_code(fn), backend=constant_backend(expected)), args, sync)
    onnx_files = sorted(glob.glob(os.path.join(dump_dir, "*.onnx")))
    if be.stats.fallback_ops or len(onnx_files) != 1:
        print(f"note: {label}: ortlite compiled {len(onnx_files)} graphs, fallback {be.stats.fallback_ops}", file=sys.stderr)
    if with_inductor:
        first["inductor"] = first_call_s(lambda: torch.compile(own_code(fn), backend="inductor"), args, sync)

    torch._dynamo.reset()
    candidates = {"eager": fn}
    if with_inductor:
        candidates["inductor"] = torch.compile(own_code(fn), backend="inductor")
    candidates["ortlite"] = torch.compile(own_code(fn), backend=ortlite.Backend())
    if verbose:  # weights bound as inputs (as before frozen weights; the same for graphs without weights)
        candidates["ortlite unfrozen"] = torch.compile(own_code(fn), backend=ortlite.Backend(ortlite.Options(freeze_weights=False)))
    candidates["dynamo+aot floor"] = torch.compile(own_code(fn), backend=constant_backend(expected))
    start = time.perf_counter()
    candidates["ortlite AOT"] = ortlite.compile(as_module(fn), args)
    first["ortlite AOT"] = time.perf_counter() - start
    if verbose:
        with pybind_sessions():  # as before the C-API path: sessions through onnxruntime's Python module
            candidates["ortlite pybind"] = torch.compile(own_code(fn), backend=ortlite.Backend())
            candidates["ortlite pybind"](*args)
            candidates["ortlite AOT pybind"] = ortlite.compile(as_module(fn), args)
    raw, raw_out = raw_ort_floor(onnx_files[0], graph_args(fn, args), device)
    torch.testing.assert_close(raw_out, expected, rtol=1e-4, atol=1e-5)
    c_floor, c_out = c_api_floor(onnx_files[0], graph_args(fn, args), device)
    candidates["dynamo+aot+ORT floor"] = torch.compile(own_code(fn), backend=calling_backend(expected, c_floor or raw))

    for name, c in candidates.items():
        got = c(*args)
        if name not in ("dynamo+aot floor", "dynamo+aot+ORT floor"):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    calls = {name: (lambda c=c: c(*args)) for name, c in candidates.items()}
    calls["raw ORT floor"] = raw
    if c_floor is not None:
        torch.testing.assert_close(c_out, expected, rtol=1e-4, atol=1e-5)
        calls["C-API floor"] = c_floor
    for name, call in calls.items():  # warm up
        per_call_us(call, max(iters // 10, 10), sync)
    samples = interleaved(calls, rounds, lambda call: per_call_us(call, iters, sync))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    # Ratios per round (candidates interleaved within a round see the same machine state),
    # then their median: steadier than a ratio of medians when the machine drifts.
    floors = [a + r for a, r in zip(samples["dynamo+aot floor"], samples["raw ORT floor"])]
    ratios = {"ortlite / (dynamo+aot floor + raw ORT floor)": statistics.median(o / f for o, f in zip(samples["ortlite"], floors))}
    ratios["ortlite / dynamo+aot+ORT floor"] = statistics.median(o / f for o, f in zip(samples["ortlite"], samples["dynamo+aot+ORT floor"]))
    ratios["ortlite / eager"] = statistics.median(o / e for o, e in zip(samples["ortlite"], samples["eager"]))
    if "inductor" in samples:
        ratios["ortlite / inductor"] = statistics.median(o / i for o, i in zip(samples["ortlite"], samples["inductor"]))
    ratios["ortlite - both floors (µs)"] = statistics.median(o - f for o, f in zip(samples["ortlite"], floors))
    ratios["AOT - raw ORT floor (µs)"] = statistics.median(a - r for a, r in zip(samples["ortlite AOT"], samples["raw ORT floor"]))
    ratios["AOT / eager"] = statistics.median(a / e for a, e in zip(samples["ortlite AOT"], samples["eager"]))
    ratios["AOT / raw ORT floor"] = statistics.median(a / r for a, r in zip(samples["ortlite AOT"], samples["raw ORT floor"]))
    if verbose:
        ratios["ortlite / ortlite unfrozen"] = statistics.median(o / u for o, u in zip(samples["ortlite"], samples["ortlite unfrozen"]))
        ratios["AOT / AOT pybind"] = statistics.median(a / p for a, p in zip(samples["ortlite AOT"], samples["ortlite AOT pybind"]))
        ratios["ortlite / ortlite pybind"] = statistics.median(o / p for o, p in zip(samples["ortlite"], samples["ortlite pybind"]))
    if "C-API floor" in samples:
        ratios["C-API floor / raw ORT floor"] = statistics.median(c / r for c, r in zip(samples["C-API floor"], samples["raw ORT floor"]))
        ratios["AOT / C-API floor"] = statistics.median(a / c for a, c in zip(samples["ortlite AOT"], samples["C-API floor"]))
    return label, medians, ratios, first


def _table(title: str, results: list, field: str, fmt: str) -> None:
    """One row per key of each result's field, one column per case, aligned."""
    keys = list(results[0][field])
    first, width = max(map(len, keys)) + 2, max(len(r["case"]) for r in results) + 2
    print(f"\n{title}\n{'':<{first}}" + "".join(f"{r['case']:>{width}}" for r in results))
    for k in keys:
        print(f"{k:<{first}}" + "".join(f"{r[field][k]:>{width}{fmt}}" for r in results))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", default="relu,mlp")
    parser.add_argument("--no-inductor", action="store_true", help="skip inductor (it needs a C++ compiler)")
    parser.add_argument("--verbose", action="store_true", help="also the unfrozen and pybind candidates, every ratio")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    # Dynamo imports much of itself at its first compile in a process (~0.4 s, whatever the
    # backend): pay that once here so first-call times are each candidate's own.
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    results = []
    for key in args.cases.split(","):
        with torch.no_grad():
            label, medians, ratios, first = bench_case(CASES[key], args.device, args.rounds, args.iters, not args.no_inductor, args.verbose)
        results.append({"case": label, "per_call_us": medians, "ratios": ratios, "first_call_s": first})

    _table(f"per-call time, µs (median of {args.rounds} interleaved rounds x {args.iters} calls; 1 thread; {args.device})", results, "per_call_us", ".2f")
    _table("ratios (median over rounds of each round's ratio)", results, "ratios", ".2f")
    _table("first call (compile + run), s; Dynamo already warm in the process", results, "first_call_s", ".3f")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
