"""Where torch.compile(backend=ortlite)'s per-call time goes beside ortlite.compile's (issue 44),
stage by stage, on bench/precision.py's llama-decode model (LLaMA h512 L4, vocab 32000, a 1-token
call, no KV cache) with Options(quantize=...):

    python bench/tc_stages.py [--rounds 15] [--iters 20] [--tokens 1] [--quantize int8]

CPU time of the calling thread (1 thread: ONNX Runtime runs on it too), so that other jobs on a
shared machine inflate it less than wall time; each stage is timed right after an ortlite.compile
call and quoted as a ratio to that call (pairs; candidates in an order shuffled per round;
medians). The torch.compile call is split by timestamps where Dynamo hands over to
aot_autograd's compiled function and where that calls ortlite's runner (a Backend subclass
records them). Floors: Dynamo with a backend returning a constant, and Dynamo's guard check
alone, each warm (called back to back) and right after an ortlite.compile call (the caches as
the ONNX Runtime run leaves them).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings

import torch

import ortlite

sys.path.insert(0, os.path.dirname(__file__))
from precision import llama_decode  # noqa: E402

clock = time.thread_time_ns
stamps: dict = {}


class StampedBackend(ortlite.Backend):
    """ortlite's backend, recording when aot_autograd's function and the runner start and end."""

    def __call__(self, gm, example_inputs, **kwargs):
        compiled = super().__call__(gm, example_inputs, **kwargs)

        def stamped(*args):
            stamps["aot in"] = clock()
            result = compiled(*args)
            stamps["aot out"] = clock()
            return result

        return stamped

    def compile_graph(self, gm, kind, *args, **kwargs):
        compiled = super().compile_graph(gm, kind, *args, **kwargs)

        def stamped(boxed):
            stamps["runner in"] = clock()
            result = compiled(boxed)
            stamps["runner out"] = clock()
            return result

        stamped._boxed_call = True
        return stamped


def constant_backend(gm, example_inputs):
    out = gm(*example_inputs)
    return lambda *args: out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--quantize", default="int8", help="int8, int4 or none")
    a = parser.parse_args()
    quantize = None if a.quantize == "none" else a.quantize
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    name, model, _ = llama_decode()
    args = (torch.randint(0, 32000, (1, a.tokens)),)
    with torch.no_grad():
        aot = ortlite.compile(model, args, options={"quantize": quantize})
        backend = StampedBackend(ortlite.Options(quantize=quantize))
        tc = torch.compile(model, backend=backend)
        tc(*args)
        assert len(backend._runners) == 1 and not backend.stats.fallback_ops, backend.stats
        constant = torch.compile(model, backend=constant_backend)
        constant(*args)
        # the guards of the compiled frame, the module's forward (tc's and constant's entries guard the same)
        entry = torch._dynamo.eval_frame._debug_get_cache_entry_list(type(model).forward.__code__)[0]
        guards, frame_locals = entry.guard_manager, {"self": model, "ids": args[0]}
        assert guards.check(frame_locals)
        samples: dict = {}  # stage -> [(µs, µs / the ortlite.compile call just before)]
        recording = [True]

        def record(key, ns, reference):
            if recording[0]:
                samples.setdefault(key, []).append((ns / 1000, ns / reference))

        def tc_split(label, reference):
            start = clock()
            tc(*args)
            end = clock()
            parts = {
                "call": end - start,
                "  Dynamo in (frame, guards)": stamps["aot in"] - start,
                "  aot_autograd's wrapper": stamps["runner in"] - stamps["aot in"] + stamps["aot out"] - stamps["runner out"],
                "  ortlite's runner (ORT run included)": stamps["runner out"] - stamps["runner in"],
                "  Dynamo out": end - stamps["aot out"],
            }
            for part, ns in parts.items():
                record(label + part, ns, reference)

        def skipping_guards(reference):
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                tc_split("torch.compile, skip_guard_eval_unsafe: ", reference)

        def timed(key, fn, warm=False):
            def run(reference):
                if warm:
                    fn()
                start = clock()
                fn()
                record(key, clock() - start, reference)

            return run

        # each candidate timed right after a timed ortlite.compile call (its ratio is to that call)
        candidates = {
            "tc": lambda reference: tc_split("torch.compile(backend=ortlite): ", reference),
            "tc skipping guards": skipping_guards,
            "constant after ORT": timed("floor: Dynamo + a constant backend, after an ORT run", lambda: constant(*args)),
            "constant warm": timed("floor: Dynamo + a constant backend, warm", lambda: constant(*args), warm=True),
            "guards after ORT": timed("floor: Dynamo's guard check alone, after an ORT run", lambda: guards.check(frame_locals)),
            "guards warm": timed("floor: Dynamo's guard check alone, warm", lambda: guards.check(frame_locals), warm=True),
        }
        order, rng = list(candidates), random.Random(0)
        for _ in range(a.rounds):
            rng.shuffle(order)
            for candidate in order:
                for i in range(a.iters + 1):
                    recording[0] = i > 0  # one untimed pair first
                    start = clock()
                    aot(*args)
                    reference = clock() - start
                    record("ortlite.compile: call", reference, reference)
                    candidates[candidate](reference)
    order = ["ortlite.compile: call"] + [k for k in samples if k.startswith("torch.compile(")] + [k for k in samples if k.startswith("torch.compile,")]
    order += sorted(k for k in samples if k.startswith("floor"))
    print(f"torch {torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}")
    print(
        f"\n{name.split(',')[0]}, {a.tokens} token(s), quantize={quantize} (1 thread; CPU µs of the calling thread; "
        f"{a.rounds} rounds of {a.iters} pairs, each an ortlite.compile call and then the stage's; medians)"
    )
    print(f"| {'stage':58} | µs | × the ortlite.compile call before it |")
    print("|---|---|---|")
    for k in order:
        us, ratio = statistics.median(x[0] for x in samples[k]), statistics.median(x[1] for x in samples[k])
        print(f"| {k:58} | {us:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
