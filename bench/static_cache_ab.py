"""HF generate with a static cache and forward compiled by ortlite, two lowerings side by side in
one process, interleaved rounds, medians: "branch", ortlite as it is, and "main", without
ortlite.lower.decoder.shared_cache_offsets and without packing frozen weights (the lowering
before them, 7aa7366). The bench/generate.py model (made by it on first use); 1 thread; tokens
checked equal to eager's every run.

    python bench/static_cache_ab.py [rounds]
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import torch
import transformers

import ortlite
import ortlite.lower

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as bench  # noqa: E402


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    torch.set_num_threads(1)
    folder = os.path.join(bench.HERE, "results", "models", "h512")
    bench.ensure_model(folder, None)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval().requires_grad_(False)
    torch.manual_seed(0)
    ids = torch.randint(3, 32000, (1, 32))
    eager = model.forward
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
    forwards = {}

    def run(name):
        model.forward = forwards[name]
        stamps = bench.Stamps()
        out = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False, cache_implementation="static", streamer=stamps)
        assert torch.equal(out, expected), name
        return (stamps.t[-1] - stamps.t[1]) * 1000 / (len(stamps.t) - 2)

    shared, packed = ortlite.lower.shared_cache_offsets, ortlite.lower.packed_products
    with torch.no_grad():
        for name in ("main", "branch"):
            if name == "main":  # (compiled at its first calls: the patches hold while it compiles)
                ortlite.lower.shared_cache_offsets = lambda *args: 0
                ortlite.lower.packed_products = lambda graph, known, into=None, frozen=frozenset(): packed(graph, known, into)
            forwards[name] = torch.compile(bench.copy_of(eager, name), backend=ortlite.Backend())
            run(name)
            run(name)
            ortlite.lower.shared_cache_offsets, ortlite.lower.packed_products = shared, packed
        samples = {name: [] for name in forwards}
        order = list(forwards)
        for r in range(rounds):
            random.Random(r).shuffle(order)
            for name in order:
                samples[name].append(run(name))
    medians = {name: statistics.median(v) for name, v in samples.items()}
    for name, ms in medians.items():
        print(f"{name}: decode {ms:.2f} ms/token")
    print(f"branch / main: {medians['branch'] / medians['main']:.3f} ({rounds} rounds, {time.strftime('%Y-%m-%d %H:%M')})")


if __name__ == "__main__":
    main()
