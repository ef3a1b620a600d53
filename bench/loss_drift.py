"""How far training trajectories drift apart from rounding alone: bench/train_ddp.py's model
trained in one process on its batches with its SGD, three ways: eager; eager from weights nudged
by one float32 rounding (each multiplied by 1 + 2**-23); ortlite (torch.compile). Prints each
step's loss and its relative difference from eager's.

    python bench/loss_drift.py [resnet18|mlp|gpt2] [steps, default 24]

ResNet-18 on random labels, batch 8, BatchNorm (2026-12-07): the nudged eager run is 6.6e-7
from eager at step 0, 8e-4 at step 2, and up to 0.49 by step 24; ortlite is 2.5e-7 at step 0
and up to 0.31. The "0.32 relative" between eager DDP and ortlite DDP (inductor 0.34) in
bench/train_ddp.py was this amplification, not a different computation.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ddp  # noqa: E402

import ortlite  # noqa: E402


def train(name: str, variant: str, steps: int) -> list[float]:
    make, batch_of = train_ddp.MODELS[name]
    torch.manual_seed(0)
    model = make().train()
    if variant == "nudged":
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + 2**-23)
    fn = torch.compile(model, backend=ortlite.Backend()) if variant == "ortlite" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x, y = batch_of(torch.Generator().manual_seed(1000 * step))  # rank 0's batches, as train_ddp.py
        torch.manual_seed(step)
        loss = train_ddp._loss(fn, x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet18"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    torch.set_num_threads(1)
    eager = train(name, "eager", steps)
    others = {variant: train(name, variant, steps) for variant in ("nudged", "ortlite")}
    relative = {v: [abs(a - b) / abs(b) for a, b in zip(losses, eager)] for v, losses in others.items()}
    print(f"{name}: step, eager's loss, relative difference from it of " + ", ".join(others))
    for i in range(steps):
        print(f"{i:4d}  {eager[i]:.6f}  " + "  ".join(f"{relative[v][i]:.2e}" for v in others))
    print("largest: " + ", ".join(f"{v} {max(r):.3f}" for v, r in relative.items()))


if __name__ == "__main__":
    main()
