"""Frozen weights (Options.freeze_weights): the per-call cost of the staleness check, per
weight, and the memory of a compiled BERT-sized model against eager.

    python bench/frozen.py [--weights 256] [--rounds 15] [--iters 20000] [--rss]

Check: a graph with N parameters (or N BatchNorm-sized buffers) compiled under no_grad;
the runner's check alone (Runner.weights_changed: tensor identity, version counter, data
pointer, and for buffers a memcmp of their bytes), timed on the arguments aot_autograd
passes, against the same call with no weights; medians of interleaved rounds; one thread.
RSS (--rss, in subprocesses so that each starts clean): eager, torch.compile frozen,
torch.compile with freeze_weights=False, ortlite.compile, for BERT-base sized (h768 L12);
for frozen also the call after a weight changed (it builds a new session) and RSS after it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import ortlite

sys.path.insert(0, os.path.dirname(__file__))
from overhead import graph_args  # noqa: E402


class Weights(torch.nn.Module):
    """x times N parameters (or plus N buffers), each of `size` elements."""

    def __init__(self, n, size, buffers):
        super().__init__()
        for i in range(n):
            if buffers:
                self.register_buffer(f"w{i}", torch.rand(size) + 0.5)
            else:
                self.register_parameter(f"w{i}", torch.nn.Parameter(torch.rand(size) + 0.5))
        self.n = n

    def forward(self, x):
        x = x + 1
        for i in range(self.n):
            x = x * getattr(self, f"w{i}")
        return x


def check_cost(n, size, buffers, rounds, iters):
    """(µs per call of the check with n weights, µs with 0) for one kind of weight."""
    timings = {}
    for count in (n, 0):
        model = Weights(count, size, buffers).eval()
        x = torch.randn(size)
        backend = ortlite.Backend()
        with torch.no_grad():
            torch.compile(model, backend=backend)(x)
        (runner,) = backend._runners
        assert len(runner.frozen_tensors()) == count, (count, runner.frozen_tensors())
        args = graph_args(model, (x,))
        assert not runner.weights_changed(*args)
        timings[count] = runner, args
    samples = {count: [] for count in timings}
    for _ in range(rounds):
        for count, (runner, args) in timings.items():
            check = runner.weights_changed
            start = time.perf_counter()
            for _ in range(iters):
                check(*args)
            samples[count].append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples[n]), statistics.median(samples[0])


RSS_MODES = ("eager", "frozen", "unfrozen", "aot")


def rss_child(mode):
    """Runs in a subprocess: builds BERT-base sized, runs it once per mode, prints RSS (MB)."""
    from transformers import BertConfig, BertModel

    def rss_mb():
        with open("/proc/self/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) / 1024

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)).eval()
    ids = torch.randint(0, 30522, (1, 128))
    weights_mb = sum(t.nbytes for t in model.state_dict().values()) / 2**20
    with torch.no_grad():
        model(ids)
        before = rss_mb()
        if mode == "eager":
            call = model
        elif mode == "aot":

            class First(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.model = model

                def forward(self, ids):
                    return self.model(ids).last_hidden_state

            call = ortlite.compile(First(), (ids,))
        else:
            backend = ortlite.Backend(ortlite.Options(freeze_weights=mode == "frozen"))
            call = torch.compile(model, backend=backend)
        for _ in range(3):
            call(ids)
        result = {"mode": mode, "weights_mb": weights_mb, "rss_mb": rss_mb(), "after_model_mb": before}
        if mode == "frozen":  # a weight changes: the next call builds a new session
            model.encoder.layer[0].output.dense.weight.mul_(1.0)
            start = time.perf_counter()
            call(ids)
            result["rebuild_call_s"] = time.perf_counter() - start
            start = time.perf_counter()
            call(ids)
            result["next_call_s"] = time.perf_counter() - start
            result["rss_after_rebuild_mb"] = rss_mb()
            try:  # glibc keeps freed memory mapped: hand it back, to see the old session is gone
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                result["rss_after_trim_mb"] = rss_mb()
            except (OSError, AttributeError):
                pass
    print(json.dumps(result))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--rss", action="store_true", help="also measure RSS of a BERT-base sized model")
    parser.add_argument("--rss-child", choices=RSS_MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        return rss_child(args.rss_child)

    torch.set_num_threads(1)
    print(f"staleness check, per call (median of {args.rounds} interleaved rounds x {args.iters} checks; 1 thread)")
    for label, size, buffers in (("parameters", 64, False), ("buffers of 256 floats", 256, True)):
        with_n, with_0 = check_cost(args.weights, size, buffers, args.rounds, args.iters // 10)
        print(f"  {args.weights} {label}: {with_n:.2f} µs; no weights: {with_0:.3f} µs; per weight {(with_n - with_0) / args.weights * 1e3:.0f} ns")
    if args.rss:
        print("\nRSS after 3 calls, BERT-base sized (h768 L12, seq 128, b1), each in a fresh process")
        for mode in RSS_MODES:
            out = subprocess.run([sys.executable, __file__, "--rss-child", mode], capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"  {mode:<9} RSS {r['rss_mb']:.0f} MB (model built: {r['after_model_mb']:.0f} MB; its weights: {r['weights_mb']:.0f} MB)")
            if "rebuild_call_s" in r:
                print(
                    f"            after a weight changed: that call {r['rebuild_call_s']:.2f} s (a new session), "
                    f"the next {r['next_call_s'] * 1e3:.0f} ms; RSS then {r['rss_after_rebuild_mb']:.0f} MB"
                    + (f", {r['rss_after_trim_mb']:.0f} MB after malloc_trim" if "rss_after_trim_mb" in r else "")
                )


if __name__ == "__main__":
    main()
