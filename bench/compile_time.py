"""Compile time: ortlite's, on both paths, against torch.export alone and inductor's, so that
a pass gone superlinear shows as a row (one made torchvision's deeplabv3 compile for more
than ten minutes). Each model compiles in a subprocess of its own with a wall-clock limit.

    python bench/compile_time.py                                # README's models and the synthetic depths
    python bench/compile_time.py --models deeplabv3,raft_small,maskrcnn --python /path/to/venv/bin/python

Columns, in wall seconds (first call for torch.compile):
  export         torch.export.export alone
  ortlite.compile  the whole ahead-of-time compile (export, decompositions, lowering, session)
    lowering     of which ortlite's lowering (lower_graph: the op table and every pass), in
                 CPU seconds of the thread (steady on a busy machine, where wall time is not)
  torch.compile  torch.compile(backend="ortlite")'s first call, under no_grad
    lowering     of which ortlite's lowering, CPU seconds
  inductor       torch.compile's first call with inductor (--no-inductor leaves it out)

"residual-N": tests/test_compile_time.py's net of N residual SE blocks with dense skips and
index checks: each doubling of N about doubles every column. torchvision's models need a
torchvision that matches torch (PyPI's wheels need their own torch: a separate venv, e.g.
torch 2.14.1 + torchvision 0.29.1, given with --python; the venv needs `pip install -e .`
of this checkout too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
README_MODELS = ["bert", "gpt2", "llama", "vit", "resnet"]
VISION_MODELS = ["deeplabv3", "raft_small", "maskrcnn"]
SYNTHETIC = ["residual-16", "residual-32", "residual-64"]
COLUMNS = ["export", "ortlite.compile", "aot lowering", "torch.compile", "dynamo lowering", "inductor"]


class _Block(torch.nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)
        self.squeeze = torch.nn.Linear(c, c)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        gate = torch.sigmoid(self.squeeze(y.mean((2, 3))))[:, :, None, None]
        return x + y * gate


class ReconvergentNet(torch.nn.Module):
    """Residual squeeze-excitation blocks; each block's output also skips ahead to the next two,
    and an index computed from it (argmax) reads a table through ortlite's checked gather: paths
    that reconverge at every block, and index checks on values the whole path above computes."""

    def __init__(self, depth: int, c: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(c) for _ in range(depth))
        self.table = torch.nn.Parameter(torch.randn(16, c))

    def forward(self, x):
        skips = []
        for block in self.blocks:
            x = block(x + sum(skips[-2:])) if skips else block(x)
            index = x.flatten(1).argmax(1) % 16
            x = x + self.table[index][:, :, None, None]
            skips.append(x)
        return x


def build(name: str):
    """(model, example args) with random weights."""
    torch.manual_seed(0)
    if name.startswith("residual-"):
        return ReconvergentNet(int(name.split("-")[1])).eval(), (torch.randn(2, 4, 6, 6),)
    if name in README_MODELS:
        sys.path.insert(0, HERE)
        import models

        _, model, args = getattr(models, name)()
        return models._FirstOutput(model.eval()), args
    import torchvision

    if name == "deeplabv3":
        return torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None).eval(), (torch.rand(1, 3, 224, 224),)
    if name == "raft_small":
        return torchvision.models.optical_flow.raft_small(weights=None).eval(), (torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128))
    if name == "maskrcnn":
        model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None).eval()
        return model, ([torch.rand(3, 320, 320)],)
    raise ValueError(f"unknown model {name!r}")


def _timing(module, name: str, spent: list):
    """module.name wrapped: each call's CPU seconds (this thread's) appended to spent."""
    original = getattr(module, name)

    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.thread_time() - start)

    setattr(module, name, timed)


def measure(name: str, with_inductor: bool) -> dict:
    """In the subprocess: one model's row (a column's error text where that compile failed)."""
    import ortlite
    import ortlite.aot
    import ortlite.dynamo_backend

    torch.set_num_threads(1)
    aot_lowering, dynamo_lowering = [], []
    _timing(ortlite.aot, "lower_graph", aot_lowering)
    _timing(ortlite.dynamo_backend, "lower_graph", dynamo_lowering)
    model, args = build(name)
    row = {}

    def column(key, fn):
        start = time.perf_counter()
        try:
            with torch.no_grad():
                fn()
            row[key] = round(time.perf_counter() - start, 2)
        except Exception as e:  # a failed compile is a row, not the end of the bench
            row[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"

    column("export", lambda: torch.export.export(model, args))
    column("ortlite.compile", lambda: ortlite.compile(model, args))
    row["aot lowering"] = round(sum(aot_lowering), 2) if aot_lowering else "-"
    column("torch.compile", lambda: torch.compile(model, backend="ortlite")(*args))
    row["dynamo lowering"] = round(sum(dynamo_lowering), 2) if dynamo_lowering else "-"
    if with_inductor:
        torch._dynamo.reset()
        column("inductor", lambda: torch.compile(model)(*args))
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(README_MODELS + VISION_MODELS + SYNTHETIC))
    parser.add_argument("--timeout-s", type=float, default=600, help="per model, all its compiles")
    parser.add_argument("--python", default=sys.executable, help="the interpreter each model runs in (a venv with torchvision)")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the subprocess's model
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, not args.no_inductor)))
        return
    print(f"torch {torch.__version__}, 1 thread, wall seconds (first call for torch.compile); lowering columns: CPU seconds")
    print(f"{'model':<14}" + "".join(f"{c:>17}" for c in COLUMNS))
    for name in args.models.split(","):
        command = [args.python, os.path.abspath(__file__), "--one", name] + (["--no-inductor"] if args.no_inductor else [])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"export": f"failed: {done.stderr.strip().splitlines()[-1][:60] if done.stderr.strip() else done.returncode}"}
        except subprocess.TimeoutExpired:
            row = {"export": f"over {args.timeout_s:.0f} s"}
        failed = {c: row[c] for c in COLUMNS if isinstance(row.get(c), str) and len(row[c]) > 16}
        print(f"{name:<14}" + "".join(f"{'failed' if c in failed else str(row.get(c, '')):>17}" for c in COLUMNS), flush=True)
        for c, error in failed.items():  # in full below the row
            print(f"  {c}: {error}")


if __name__ == "__main__":
    main()
