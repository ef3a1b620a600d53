"""Per-call cost of the in-graph index checks (issue 33) on a small embedding model.

    python bench/index_checks.py [--rounds 21] [--iters 2000]

The same model compiled twice in one process, with the checks and without them (the check
function replaced by a plain cast while compiling), on both paths (torch.compile,
ortlite.compile); one thread for torch and ORT; candidates interleaved in rounds; medians of
per-call times; the difference is the checks' cost.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import ortlite
from ortlite.lower.ops import index as index_ops


class Embed(torch.nn.Module):
    def __init__(self, vocab=1000, dim=64):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, ids):
        return self.proj(self.embedding(ids))


def unchecked(g, node, index, size, *, negative, message):
    return g.cast(index, torch.int64)


def build(model, ids, checks: bool):
    """Both compiled forms of model (an instance of its own: Dynamo's cache entry for it is
    not the other candidate's), compiled now, while the check function is the chosen one."""
    real = index_ops.checked_index
    index_ops.checked_index = real if checks else unchecked
    try:
        dyn = torch.compile(model, backend=ortlite.Backend())
        dyn(ids)
        aot = ortlite.compile(model, (ids,))
    finally:
        index_ops.checked_index = real
    nodes = sum(n.op_type != "Constant" for n in aot.onnx_model.graph.node)
    return dyn, aot, nodes


def per_call(fn, ids, iters):
    start = time.perf_counter()
    for _ in range(iters):
        fn(ids)
    return (time.perf_counter() - start) / iters * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Embed().eval()
    ids = torch.randint(0, 1000, (1, args.tokens))
    with torch.no_grad():
        dyn_on, aot_on, nodes_on = build(model, ids, True)
        dyn_off, aot_off, nodes_off = build(copy.deepcopy(model), ids, False)
        expected = model(ids)
        for fn in (dyn_on, aot_on, dyn_off, aot_off):
            assert torch.allclose(fn(ids), expected, atol=1e-6)
        negative = torch.full_like(ids, -1)  # what each candidate claims: raise (checks) or read row -1 (none)
        for fn in (dyn_on, aot_on):
            try:
                fn(negative)
                raise AssertionError("a candidate with checks took index -1")
            except IndexError as e:  # eager's type for embedding
                assert "index out of range" in str(e)
        for fn in (dyn_off, aot_off):
            fn(negative)
        candidates = {"torch.compile, checks": dyn_on, "torch.compile, none": dyn_off, "ortlite.compile, checks": aot_on, "ortlite.compile, none": aot_off}
        times = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, fn in candidates.items():
                times[name].append(per_call(fn, ids, args.iters))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"embedding(1000, 64) + linear, ids (1, {args.tokens}), 1 thread, {args.rounds} rounds x {args.iters} calls, medians")
    print(f"ONNX nodes (AOT): {nodes_on} with checks, {nodes_off} without")
    for name, m in med.items():
        print(f"  {name:26s} {m:8.2f} us")
    for path in ("torch.compile", "ortlite.compile"):
        on, off = med[f"{path}, checks"], med[f"{path}, none"]
        print(f"  {path}: checks cost {on - off:+.2f} us a call ({(on / off - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
