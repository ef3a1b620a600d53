"""Compile time: ortlite's, on both paths, against what torch itself takes to capture the same
model, so that a pass gone superlinear shows as a row (one made torchvision's deeplabv3 compile
for more than ten minutes). Every column runs in a fresh process of its own (cold, as a user's
first compile is), with a wall-clock limit.

    python bench/compile_time.py                                # README's models, T5, Qwen3-MoE, the synthetic depths
    python bench/compile_time.py --models deeplabv3,raft_small,maskrcnn --python /path/to/venv/bin/python

Columns, in wall seconds of the fresh process's compile (imports excluded):
  export           torch.export.export alone
  ortlite.compile  the whole ahead-of-time compile and its first call (export, lowering, session)
    lowering       of which ortlite's lowering (lower_graph: the op table and every pass), in CPU
                   seconds of the thread (steady on a busy machine, where wall time is not)
  onnx.export      torch.onnx.export(dynamo=True): torch's own exporter to an ONNX file (onnxscript)
  aot_eager        torch.compile(backend="aot_eager")'s first call: Dynamo and aot_autograd alone
  torch.compile    torch.compile(backend="ortlite")'s first call, under no_grad
  inductor         torch.compile's first call with inductor (--no-inductor leaves it out)
and two ratios, the bars of issue 53: ortlite.compile / export and torch.compile / aot_eager.

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
TRANSFORMERS = ["t5", "qwen3moe"]
VISION_MODELS = ["deeplabv3", "raft_small", "maskrcnn"]
SYNTHETIC = ["residual-16", "residual-32", "residual-64"]
COLUMNS = ["export", "ortlite.compile", "lowering", "onnx.export", "aot_eager", "torch.compile", "inductor"]
RATIOS = {"compile/export": ("ortlite.compile", "export"), "tc/aot_eager": ("torch.compile", "aot_eager")}


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
    if name == "t5":
        from transformers import T5Config, T5Model

        config = T5Config(d_model=256, d_ff=1024, num_layers=4, num_heads=4, vocab_size=32128)
        sys.path.insert(0, HERE)
        import models

        return models._FirstOutput(T5Model(config).eval()), (torch.randint(0, 32128, (1, 128)), None, torch.randint(0, 32128, (1, 32)))
    if name == "qwen3moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeModel

        config = Qwen3MoeConfig(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
            moe_intermediate_size=256, num_experts=16, num_experts_per_tok=2, vocab_size=32000,
        )
        sys.path.insert(0, HERE)
        import models

        return models._FirstOutput(Qwen3MoeModel(config).eval()), (torch.randint(0, 32000, (1, 128)),)
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


def measure(name: str, column: str) -> dict:
    """In the subprocess: one column of one model (its error text where that compile failed)."""
    import ortlite
    import ortlite.aot

    torch.set_num_threads(1)
    lowering = []
    _timing(ortlite.aot, "lower_graph", lowering)
    model, args = build(name)
    with torch.no_grad():
        model(*args)  # eager once: lazy module state and kernels, which no compiler should be charged for
    run = {
        "export": lambda: torch.export.export(model, args),
        "ortlite.compile": lambda: ortlite.compile(model, args)(*args),
        "onnx.export": lambda: torch.onnx.export(model, args, dynamo=True, verbose=False, optimize=False),
        "aot_eager": lambda: torch.compile(model, backend="aot_eager")(*args),
        "torch.compile": lambda: torch.compile(model, backend="ortlite")(*args),
        "inductor": lambda: torch.compile(model)(*args),
    }[column]
    start = time.perf_counter()
    try:
        with torch.no_grad():
            run()
    except Exception as e:  # a failed compile is a row, not the end of the bench
        return {column: f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"}
    row = {column: round(time.perf_counter() - start, 2)}
    if column == "ortlite.compile":
        row["lowering"] = round(sum(lowering), 2)
    return row


def _column(python: str, name: str, column: str, timeout_s: float) -> dict:
    command = [python, os.path.abspath(__file__), "--one", name, "--column", column]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {column: f"over {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    return {column: f"failed: {done.stderr.strip().splitlines()[-1][:60] if done.stderr.strip() else done.returncode}"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(README_MODELS + TRANSFORMERS + VISION_MODELS + SYNTHETIC))
    parser.add_argument("--timeout-s", type=float, default=600, help="per model and column")
    parser.add_argument("--python", default=sys.executable, help="the interpreter each model runs in (a venv with torchvision)")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the subprocess's model
    parser.add_argument("--column", help=argparse.SUPPRESS)  # and its column
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.column)))
        return
    columns = [c for c in COLUMNS if not (c == "inductor" and args.no_inductor)]
    print(f"torch {torch.__version__}, 1 thread, wall seconds in a fresh process each (first call for torch.compile); lowering: CPU seconds")
    print(f"{'model':<14}" + "".join(f"{c:>16}" for c in columns + list(RATIOS)))
    for name in args.models.split(","):
        row = {}
        for column in columns:
            if column != "lowering":
                row.update(_column(args.python, name, column, args.timeout_s))
        for ratio, (top, bottom) in RATIOS.items():
            if isinstance(row.get(top), float) and isinstance(row.get(bottom), float) and row[bottom] > 0:
                row[ratio] = f"{row[top] / row[bottom]:.2f}x"
        failed = {c: row[c] for c in columns if isinstance(row.get(c), str)}
        print(f"{name:<14}" + "".join(f"{'failed' if c in failed else str(row.get(c, '')):>16}" for c in columns + list(RATIOS)), flush=True)
        for c, error in failed.items():  # in full below the row
            print(f"  {c}: {error}")


if __name__ == "__main__":
    main()
