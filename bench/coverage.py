"""Op coverage: sweeps PyTorch's OpInfo database through ortlite and prints how many ops land
in each bucket (ort / fallback / wrong / crash / skipped), the ops that fall back most and
why; writes coverage.json and coverage.md.

    python bench/coverage.py                      # float32, int64, bool; 8 samples per dtype
    python bench/coverage.py --samples 0          # every sample
    python bench/coverage.py --ops 'div|remainder' --dtypes float32
    python bench/coverage.py --backend onnxrt     # torch 2.8's removed DORT backend, for
                                                  # comparison (run with a torch 2.8 + onnxscript python)
    python bench/coverage.py --mode dynamic       # dynamic=True: every size and int symbolic
    python bench/coverage.py --mode automatic     # each sample then another of other sizes or
                                                  # ints through the same compiled function
    python bench/coverage.py --mode grad --dtypes float32   # static, and the gradients of every
                                                  # input that requires grad (backward graphs)

The sweep runs in worker subprocesses, so an op that kills the process (a segfault in ONNX
Runtime) is recorded as a crash and the sweep goes on.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def worker(ops_file: str, out_file: str, dtypes: list[str], samples: int | None, backend: str, mode: str) -> None:
    import logging

    import torch

    import opinfo_harness as h

    logging.getLogger("ortlite").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    wanted = json.load(open(ops_file))
    by_id = {h.op_id(op): op for op in h.all_ops()}
    dtype_objs = [getattr(torch, d) for d in dtypes]
    with open(out_file, "a") as out:
        for name in wanted:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            start = time.perf_counter()
            try:
                result = h.sweep_op(by_id[name], dtype_objs, samples, backend_name=backend, mode=mode).to_json()
            except Exception as e:  # the harness itself failed: count it as a crash
                result = h.OpResult(name, "crash", detail=f"harness: {type(e).__name__}: {e}").to_json()
            result["seconds"] = round(time.perf_counter() - start, 2)
            out.write(json.dumps(result) + "\n")
            out.flush()


def sweep(names: list[str], dtypes: list[str], samples: int | None, jobs: int, timeout: float, backend: str, mode: str) -> list[dict]:
    """Runs the sweep in `jobs` worker processes; restarts a worker past an op that killed it."""
    chunks = [names[i::jobs] for i in range(jobs)]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        pending = [(i, chunk) for i, chunk in enumerate(chunks) if chunk]
        while pending:
            procs = []
            for i, chunk in pending:
                ops_file, out_file = os.path.join(tmp, f"ops{i}.json"), os.path.join(tmp, f"out{i}.jsonl")
                json.dump(chunk, open(ops_file, "w"))
                cmd = [sys.executable, __file__, "--worker", ops_file, out_file, "--dtypes", ",".join(dtypes)]
                cmd += ["--samples", str(samples or 0), "--backend", backend, "--mode", mode]
                procs.append((i, chunk, out_file, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            pending = []
            for i, chunk, out_file, proc in procs:
                try:
                    _, stderr = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, stderr = proc.communicate()
                started = None
                if os.path.exists(out_file):
                    for line in open(out_file):
                        record = json.loads(line)
                        if "start" in record:
                            started = record["start"]
                        else:
                            results[record["op"]] = record
                            started = None
                if started is not None:  # the process died inside this op
                    tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
                    why = f"process died (exit {proc.returncode}): {' | '.join(tail)}"
                    results[started] = {"op": started, "bucket": "crash", "samples": 0, "fallback_ops": {}, "reasons": {}, "detail": why}
                rest = [n for n in chunk if n not in results]
                if rest:
                    if started is None:  # died outside an op: do not loop forever
                        for n in rest:
                            results[n] = {"op": n, "bucket": "crash", "samples": 0, "fallback_ops": {}, "reasons": {}, "detail": "worker failed"}
                    else:
                        os.remove(out_file)
                        pending.append((i, rest))
    return [results[n] for n in names if n in results]


def summarize(results: list[dict]) -> dict:
    buckets = collections.Counter(r["bucket"] for r in results)
    swept = sum(v for k, v in buckets.items() if k != "skipped")
    missing = collections.Counter()  # fallback op -> ops (OpInfos) it made fall back
    reasons = collections.defaultdict(set)
    for r in results:
        for op, why in r["reasons"].items():
            reasons[op].update(why)
        for op in r["fallback_ops"]:
            missing[op] += 1
    return {
        "buckets": {b: buckets.get(b, 0) for b in ("ort", "fallback", "wrong", "crash", "skipped")},
        "swept": swept,
        "ort_percent": round(100 * buckets.get("ort", 0) / swept, 1) if swept else 0.0,
        "top_missing": [
            {"op": op, "opinfos": n, "reasons": sorted(reasons[op])[:5]} for op, n in missing.most_common()
        ],
    }


def torch_version() -> str:
    import torch

    return torch.__version__


def markdown(summary: dict, results: list[dict], args) -> str:
    lines = [
        "# ortlite op coverage (OpInfo sweep)",
        "",
        f"backend {args.backend}, torch {torch_version()}, mode {args.mode}, dtypes {args.dtypes}, samples per dtype {args.samples or 'all'}; `python bench/coverage.py --mode {args.mode}`",
        "",
        "| bucket | ops | % of swept |",
        "|---|---|---|",
    ]
    for b, n in summary["buckets"].items():
        pct = "" if b == "skipped" else f"{100 * n / summary['swept']:.1f}" if summary["swept"] else ""
        lines.append(f"| {b} | {n} | {pct} |")
    lines += ["", "## What falls back, by the number of OpInfos it affects", "", "| op | OpInfos | reasons |", "|---|---|---|"]
    for m in summary["top_missing"]:
        why = "; ".join(m["reasons"]).replace("|", "\\|")
        lines.append(f"| `{m['op']}` | {m['opinfos']} | {why} |")
    for bucket in ("wrong", "crash", "skipped"):
        rows = [r for r in results if r["bucket"] == bucket]
        if rows:
            lines += ["", f"## {bucket}", ""]
            lines += [f"- `{r['op']}`: {r['detail']}".replace("|", "\\|") for r in rows]
    lines += ["", "## Per op", "", "| op | bucket | samples | left to torch |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| `{r['op']}` | {r['bucket']} | {r['samples']} | {', '.join(sorted(r['fallback_ops']))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("OPS_JSON", "OUT_JSONL"), help=argparse.SUPPRESS)
    parser.add_argument("--ops", default="", help="regex: only OpInfos whose name matches")
    parser.add_argument("--dtypes", default="float32,int64,bool")
    parser.add_argument("--samples", type=int, default=8, help="samples per op and dtype (0: all)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    parser.add_argument("--backend", default="ortlite", choices=["ortlite", "onnxrt"], help="onnxrt: torch <= 2.8's DORT")
    parser.add_argument("--mode", default="static", choices=["static", "dynamic", "automatic", "grad"], help="shapes (or gradients): see the docstring")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for coverage.json and coverage.md")
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker, args.dtypes.split(","), args.samples or None, args.backend, args.mode)

    import opinfo_harness as h

    ops = [op for op in h.all_ops() if re.search(args.ops, h.op_id(op))]
    names = [h.op_id(op) for op in ops]
    start = time.perf_counter()
    results = sweep(names, args.dtypes.split(","), args.samples or None, args.jobs, args.timeout, args.backend, args.mode)
    summary = summarize(results)
    os.makedirs(args.out, exist_ok=True)
    suffix = "" if args.mode == "static" else f"_{args.mode}"
    with open(os.path.join(args.out, f"coverage{suffix}.json"), "w") as f:
        json.dump({"args": vars(args), "summary": summary, "results": results}, f, indent=1)
    with open(os.path.join(args.out, f"coverage{suffix}.md"), "w") as f:
        f.write(markdown(summary, results, args))

    print(f"OpInfo sweep ({args.mode}) of {args.backend} on torch {torch_version()}: {len(results)} OpInfos, {summary['swept']} swept, {time.perf_counter() - start:.0f} s")
    print(f"{'bucket':<10}{'ops':>6}{'%':>8}")
    for b, n in summary["buckets"].items():
        pct = f"{100 * n / summary['swept']:.1f}" if b != "skipped" and summary["swept"] else ""
        print(f"{b:<10}{n:>6}{pct:>8}")
    print("\ntop ops left to torch (OpInfos affected):")
    for m in summary["top_missing"][:25]:
        print(f"  {m['opinfos']:>4}  {m['op']:<50} {'; '.join(m['reasons'])[:100]}")
    for bucket in ("wrong", "crash"):
        for r in results:
            if r["bucket"] == bucket:
                print(f"{bucket}: {r['op']}: {r['detail'][:200]}")
    print(f"\nwrote {os.path.join(args.out, f'coverage{suffix}.md')} and coverage{suffix}.json")


if __name__ == "__main__":
    main()
