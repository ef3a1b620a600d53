"""Where ONNX Runtime spends a model's run: kernel time per op type (ONNX Runtime's profiler,
one thread) of ortlite's AOT graph and of torch.onnx.export(dynamo=True)'s, as each session
optimized it; and the weight products (Gemm, MatMul and Conv with a constant weight, the
same MLAS kernels in both graphs) as a share of the peer's whole run: no rewrite of the
rest of the graph makes ortlite faster than that share of the peer.

    python bench/kernel_time.py [--models bert,gpt2,llama,vit,resnet] [--runs 40]

Needs the bench extra (onnxscript): pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import onnx
import onnxruntime
import torch

import ortlite
from ortlite.session import disabled_optimizers_for

sys.path.insert(0, os.path.dirname(__file__))
import models  # noqa: E402

WEIGHT_OPS = {"Gemm", "MatMul", "Conv", "FusedConv", "FusedGemm", "FusedMatMul"}


def profile(model: onnx.ModelProto, feeds: dict, runs: int, disabled=()) -> tuple[dict, dict, float]:
    """(op type -> µs a run, op type -> nodes, µs a run in weight products)."""
    with tempfile.TemporaryDirectory() as tmp:
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.log_severity_level = 4
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        session = onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        optimized = onnx.load(so.optimized_model_filepath, load_external_data=False)
        constants = {t.name for t in optimized.graph.initializer}
        weighted = {n.name for n in optimized.graph.node if n.op_type in WEIGHT_OPS and len(n.input) > 1 and n.input[1] in constants}
        warm = max(1, runs // 4)
        for _ in range(warm + runs):
            session.run(None, feeds)
        events = json.load(open(session.end_profiling()))
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    measured = starts[warm]  # the warm-up runs left out
    times, counts, weights = collections.defaultdict(float), collections.Counter(), 0.0
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < measured:
            continue
        op = e["args"]["op_name"]
        times[op] += e["dur"] / runs
        counts[op] += 1
        if e["name"][: -len("_kernel_time")] in weighted:
            weights += e["dur"] / runs
    return times, {op: n // runs for op, n in counts.items()}, weights


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2,llama,vit,resnet")
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for key in args.models.split(","):
        label, model, inputs = models.MODELS[key]()
        model.eval()
        with torch.no_grad():
            compiled = ortlite.compile(models._FirstOutput(model), inputs)
            ours = compiled.onnx_model_for_saving()
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "model.onnx")
                torch.onnx.export(models._FirstOutput(model), inputs, path, dynamo=True, external_data=False)
                theirs = onnx.load(path)
        disabled = disabled_optimizers_for(["CPUExecutionProvider"], compiled._lowered.disabled_optimizers)
        feeds = lambda m: {i.name: x.numpy() for i, x in zip(m.graph.input, inputs)}  # noqa: E731
        a, an, aw = profile(ours, feeds(ours), args.runs, disabled)
        b, bn, bw = profile(theirs, feeds(theirs), args.runs)
        print(f"\n{label}: kernel µs a run (ONNX Runtime's profiler, 1 thread, {args.runs} runs)")
        print(f"  {'op':30s} {'ortlite':>9s} {'nodes':>5s} {'export+ORT':>10s} {'nodes':>5s}")
        for op in sorted(a.keys() | b.keys(), key=lambda o: -max(a.get(o, 0.0), b.get(o, 0.0))):
            print(f"  {op:30s} {a.get(op, 0.0):9.1f} {an.get(op, 0):5d} {b.get(op, 0.0):10.1f} {bn.get(op, 0):5d}")
        ta, tb = sum(a.values()), sum(b.values())
        print(f"  {'total':30s} {ta:9.1f} {sum(an.values()):5d} {tb:10.1f} {sum(bn.values()):5d}")
        print(f"  {'weight products':30s} {aw:9.1f} {'':5s} {bw:10.1f}")
        print(f"  ortlite / export+ORT: {ta / tb:.3f}; ortlite's weight products alone: {aw / tb:.3f} of export+ORT's total")


if __name__ == "__main__":
    main()
