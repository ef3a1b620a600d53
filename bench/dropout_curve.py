"""In-graph dropout over a whole training run: a small GPT-2 trained from scratch, dropout's
masks drawn by eager torch, by ortlite with Options(random="torch") and by ortlite with
Options(random="onnxruntime") (ONNX Runtime's own generator: other masks, same distribution).

    nice -n 5 python bench/dropout_curve.py [--steps 200] [--seeds 3]

Model: transformers GPT2LMHeadModel from a config (CONFIG: 4 layers, 128 wide, 4 heads,
bytes as tokens, dropout 0.1 on embeddings, residuals and attention), the same initial
weights for every run (torch.manual_seed(0)). Data: bench/accuracy.py's corpus() (the Python
standard library's .py files, training part); step i trains on the same BATCH windows of
CONTEXT bytes in every run (the model's own loss: each byte predicts the next). AdamW (LR, constant). So runs differ only in their dropout
masks: eager and random="torch" draw from torch.manual_seed(seed, step) before each step
(random="torch" must equal eager step by step: a check); random="onnxruntime" seeds its nodes
from torch's generator state when its graphs are compiled (after the first step's manual_seed).

All runs train in one process, 1 thread, in lockstep: step i of every run, in an order rotated
each step, so that step times of the variants are interleaved under the same load. Reported:
the loss at steps 50/100/150/200 (mean of the 10 steps up to it); whether each
random="onnxruntime" run's final loss lies in eager's seed spread (min..max) and in the 95%
prediction interval of one more eager run (mean +- t(0.975, n-1) * sd * sqrt(1 + 1/n), normal
approximation: with 3 eager runs, a fourth run from the same distribution falls outside
their min..max half the time, so min..max alone is no test), and the same for the
random="torch" runs as a calibration (eager's masks; AdamW grows rounding differences over
200 steps into run-to-run differences of the spread's size); ONNX Runtime session runs per
step (backend.stats); step time medians per variant (steps after WARMUP, all seeds pooled).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy import corpus  # noqa: E402
from train_ddp import own_forward  # noqa: E402

import ortlite  # noqa: E402

CONFIG = dict(n_layer=4, n_embd=128, n_head=4, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=0, embd_pdrop=0.1, resid_pdrop=0.1, attn_pdrop=0.1)
BATCH, CONTEXT, LR = 8, 128, 2e-3
VARIANTS = ("eager", "ortlite random=torch", "ortlite random=onnxruntime")
WARMUP = 3  # steps of each run not timed (the compiled ones compile there)
MARKS = (50, 100, 150, 200)
SMOOTH = 10
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # t(0.975, df)


def batches(steps: int) -> list[torch.Tensor]:
    train, _, _ = corpus()
    tokens = torch.frombuffer(bytearray(train), dtype=torch.uint8)
    generator = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(tokens) - CONTEXT, (steps, BATCH), generator=generator)
    return [torch.stack([tokens[s : s + CONTEXT] for s in row.tolist()]).long() for row in starts]


class Run:
    def __init__(self, variant: str, seed: int, tag: int):
        import transformers

        torch.manual_seed(0)  # the same initial weights for every run
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).train()
        model.loss_type = "ForCausalLM"  # (unset, transformers logs a warning in forward: a graph break)
        self.variant, self.seed, self.backend, self.model = variant, seed, None, model
        if variant == "eager":
            self.fn = model
        else:
            self.backend = ortlite.Backend({"random": variant.split("=")[1]})
            self.fn = torch.compile(own_forward(model, tag), backend=self.backend)  # (a code object per run: no run finds another's compiled code)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        self.losses, self.times = [], []

    def step(self, i: int, batch: torch.Tensor) -> None:
        torch.manual_seed(self.seed * 1_000_003 + i)  # dropout's draws (random="onnxruntime": only its first step's)
        start = time.perf_counter()
        loss = self.fn(input_ids=batch, labels=batch).loss
        self.optimizer.zero_grad()
        loss.backward()
        between = time.perf_counter()
        self.optimizer.step()
        self.times.append((time.perf_counter() - start, between - start))
        self.losses.append(loss.item())

    def loss_at(self, batch: torch.Tensor) -> float:
        torch.manual_seed(self.seed)
        return self.fn(input_ids=batch, labels=batch).loss.item()  # (with grad: the training graph)

    def smoothed(self, step: int) -> float:
        return statistics.fmean(self.losses[max(0, step - SMOOTH) : step])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = batches(args.steps)
    runs = [Run(v, seed, tag) for tag, (v, seed) in enumerate((v, s) for v in VARIANTS for s in range(1, args.seeds + 1))]
    began = time.perf_counter()
    for i, batch in enumerate(data):
        for k in range(len(runs)):
            run = runs[(i + k) % len(runs)]
            run.step(i, batch)
        if (i + 1) % 25 == 0:
            print(f"step {i + 1}/{args.steps}, {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)

    for run in runs:
        run.stats = run.backend and run.backend.stats  # (before the checks below run more)
    print(f"torch {torch.__version__}, 1 thread; GPT-2 {CONFIG}; batch {BATCH} x {CONTEXT} bytes; AdamW lr {LR}; {args.steps} steps, seeds 1..{args.seeds}")
    marks = [m for m in MARKS if m <= args.steps] or [args.steps]
    print(f"\nloss (mean of the {SMOOTH} steps up to each):")
    print("| variant | seed | " + " | ".join(f"step {m}" for m in marks) + " |")
    print("|---|---|" + "---|" * len(marks))
    for run in runs:
        print(f"| {run.variant} | {run.seed} | " + " | ".join(f"{run.smoothed(m):.4f}" for m in marks) + " |")

    by = {v: [r for r in runs if r.variant == v] for v in VARIANTS}
    for eager, same in zip(by["eager"], by["ortlite random=torch"]):
        first = max(abs(a - b) / abs(b) for a, b in zip(same.losses[:10], eager.losses[:10]))
        every = max(abs(a - b) / abs(b) for a, b in zip(same.losses, eager.losses))
        # AdamW turns rounding differences into weight differences (an update ~lr whatever a
        # gradient's size) that grow over the run; the computation itself is checked at the
        # run's own final weights: eager's loss there against ortlite's, the same masks.
        probe = Run("eager", eager.seed, -1)
        probe.model.load_state_dict(same.model.state_dict())
        here = [same.loss_at(data[-1]), probe.loss_at(data[-1])]
        print(
            f"random=torch vs eager, seed {eager.seed}: largest relative loss difference {first:.1e} over steps 1-10, {every:.1e} over all;"
            f" at random=torch's final weights, eager's loss and ortlite's differ by {abs(here[0] - here[1]) / here[1]:.1e}"
        )

    final = {v: [r.smoothed(args.steps) for r in rs] for v, rs in by.items()}
    low, high = min(final["eager"]), max(final["eager"])
    n = len(final["eager"])
    mean = statistics.fmean(final["eager"])
    half = T975.get(n - 1, 1.96) * statistics.stdev(final["eager"]) * math.sqrt(1 + 1 / n) if n > 1 else 0.0
    print(f"\nfinal loss (steps {args.steps - SMOOTH + 1}-{args.steps}): eager {low:.4f}..{high:.4f} (mean {mean:.4f}, 95% prediction interval {mean - half:.4f}..{mean + half:.4f})")
    for variant in VARIANTS[1:]:  # (random=torch: eager's masks, apart from eager by rounding only: the spread's calibration)
        values = final[variant]
        in_range = sum(low <= v <= high for v in values)
        in_interval = sum(abs(v - mean) <= half for v in values)
        print(f"{variant}: {', '.join(f'{v:.4f}' for v in values)} (mean {statistics.fmean(values):.4f}); {in_range}/{len(values)} in eager's min..max, {in_interval}/{len(values)} in its prediction interval")

    print("\n| variant | graphs | dropouts in the forward graph | ONNX Runtime runs/step | ops left to torch | step ms | vs eager | vs random=torch | forward+backward ms | vs eager | vs random=torch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    median = {v: [statistics.median(t[k] for r in rs for t in r.times[WARMUP:]) for k in (0, 1)] for v, rs in by.items()}
    for variant, rs in by.items():
        cells = ["", "", "", ""]
        if variant != "eager":
            stats = [r.stats for r in rs]
            dropouts = {r.backend.graph_reports[0].ort_ops.get("ortlite.dropout.default", 0) for r in rs}
            cells = [
                "/".join(str(s.graphs) for s in stats),
                "/".join(map(str, sorted(dropouts))),
                "/".join(f"{s.runs / args.steps:.0f}" for s in stats),
                ", ".join(f"{op} x{count}" for op, count in stats[0].fallback_ops.items()) or "none",
            ]
        for k in (0, 1):
            ms, versus = median[variant][k], [median["eager"][k], median["ortlite random=torch"][k]]
            cells += [f"{ms * 1e3:.1f}", f"{ms / versus[0]:.3f}x", "" if variant == "eager" else f"{ms / versus[1]:.3f}x"]
        print(f"| {variant} | " + " | ".join(cells) + " |")
    print(f"(step = forward, backward, AdamW; medians over steps {WARMUP + 1}-{args.steps} of every seed; total {time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
