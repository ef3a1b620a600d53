"""Held-out vision models (torchvision, timm; random weights, no downloads) under
torch.compile: each call's time, where a compile spent it (Dynamo, aot_autograd, ortlite's
own lowering and sessions), and the results against eager. Issue 33's held-out set:

    python bench/vision_models.py                                   # every model, dynamic=True
    python bench/vision_models.py --models swin_t,twins --dynamic auto
    python bench/vision_models.py --models fasterrcnn               # boxes, scores, labels vs eager
    python bench/vision_models.py --backend eager                   # Dynamo alone, for comparison
    python bench/vision_models.py --nesting 6 --backend eager       # plain torch: no torchvision needed
    python bench/vision_models.py --nesting 6 --size-oblivious      # the same in seconds

Needs torchvision (and timm for twins); torchvision must match the installed torch (PyPI's
torchvision wheels need their own torch: a separate venv, e.g. torch 2.14.1 + torchvision
0.29.1). Without them it prints why and exits 0.

Each model runs in a subprocess with a wall-clock limit (--timeout-s): a compile that does
not finish is reported with the stage it was in. Per call: wall and CPU seconds, and of the
CPU seconds those spent in aot_autograd (ortlite's Backend.__call__ less its compile_graph),
in ortlite (compile_graph: partition, lowering, sessions) and the rest of the call (Dynamo's
tracing, guards, the run itself).

--dynamic: "true" (torch.compile(dynamic=True): every size symbolic from the first call;
sizes 0 and 1 still specialize, so batch 1 compiles a graph of its own), "auto" (Dynamo's
automatic dynamic: the first call static, the second size seen symbolic in that dim only),
"false" (static: one compile per batch size).

--nesting N: what makes MaxViT's compile never end, in plain torch: 1 to N round trips of a
window partition (reshape(B, C, H // 7, 7, W // 7, 7), permute, reshape) and its reverse,
compiled with dynamic=True; Dynamo's time about triples with each (torch 2.13.0,
backend="eager": 1.4, 2.4, 5.9, 14, 42, 142 CPU seconds).

--size-oblivious: torch.fx.experimental._config.backed_size_oblivious = True, with which
torch's fake view takes the requested sizes instead of deriving them by floor divisions of
the input's (docs/dynamic-shapes.md): --nesting 6 in 0.3 to 0.9 s per compile.

Faster R-CNN: torchvision's random init is degenerate (backbone activations ~1e-8, every
score equal), which makes its boxes depend on float rounding: eager on 1 thread and on 2
disagree by hundreds of pixels. The bench re-initializes its convolutions and linears
(variance-preserving, gain 1.5) so that scores differ and the comparison has teeth, and sets
box_score_thresh=0 (100 boxes); --default-init keeps torchvision's and also reports eager
against eager on one thread.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

MODELS = ["fasterrcnn", "swin_t", "maxvit_t", "raft_small", "twins"]
DEFAULT_SIZE = {"swin_t": 224, "maxvit_t": 224, "raft_small": 128, "twins": 224, "fasterrcnn": 320}


def missing_packages(name: str) -> str | None:
    """Why this model cannot run here, or None."""
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # ImportError, or a torchvision built for another torch
        return f"torchvision is not importable ({type(e).__name__}: {e}); install one matching torch {_torch_version()}"
    if name == "twins":
        try:
            import timm  # noqa: F401
        except Exception as e:
            return f"timm is not importable ({type(e).__name__}: {e})"
    return None


def _torch_version() -> str:
    import torch

    return torch.__version__


def build(name: str, default_init: bool = False):
    import torch
    import torchvision

    torch.manual_seed(0)
    if name == "swin_t":
        return torchvision.models.swin_t(weights=None).eval()
    if name == "maxvit_t":
        return torchvision.models.maxvit_t(weights=None).eval()
    if name == "raft_small":
        return torchvision.models.optical_flow.raft_small(weights=None).eval()
    if name == "twins":
        import timm

        return timm.create_model("twins_svt_small", pretrained=False).eval()
    if name == "fasterrcnn":
        model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, box_score_thresh=0.0).eval()
        if not default_init:
            with torch.no_grad():
                for module in model.modules():
                    if isinstance(module, torch.nn.Conv2d):
                        torch.nn.init.normal_(module.weight, std=(1.5 / module.weight[0].numel()) ** 0.5)
                        if module.bias is not None:
                            torch.nn.init.normal_(module.bias, std=0.1)
                    elif isinstance(module, torch.nn.Linear):
                        torch.nn.init.normal_(module.weight, std=(1.0 / module.in_features) ** 0.5)
                        torch.nn.init.normal_(module.bias, std=0.1)
        return model
    raise ValueError(f"unknown model {name!r}; known: {MODELS}")


def inputs(name: str, batch: int, size: int):
    import torch

    g = torch.Generator().manual_seed(batch)
    if name == "raft_small":
        return (torch.rand(batch, 3, size, size, generator=g), torch.rand(batch, 3, size, size, generator=g))
    if name == "fasterrcnn":  # a list of images of their own sizes
        return ([torch.rand(3, size - 16 * i, size + 8 * i, generator=g) for i in range(batch)],)
    return (torch.rand(batch, 3, size, size, generator=g),)


def outputs(name: str, result) -> dict:
    """name -> tensor, of what the comparison reads."""
    if name == "raft_small":
        return {"flow": result[-1]}
    if name == "fasterrcnn":
        return {f"{k}[{i}]": v for i, r in enumerate(result) for k, v in r.items()}
    return {"logits": result}


def compare(expected: dict, got: dict) -> dict:
    """Max abs and rel (to the largest magnitude) error per output; shapes that differ say so."""
    errors = {}
    for key, e in expected.items():
        g = got.get(key)
        if g is None or g.shape != e.shape:
            errors[key] = f"shape {None if g is None else tuple(g.shape)} vs eager's {tuple(e.shape)}"
            continue
        if e.numel() == 0:
            errors[key] = (0.0, 0.0)
            continue
        diff = (g.double() - e.double()).abs().max().item()
        errors[key] = (diff, diff / max(e.double().abs().max().item(), 1e-30))
    return errors


def run_one(args) -> None:
    """In the subprocess: one model, its call sequence; prints one JSON line per call."""
    import torch

    import torch.fx.experimental._config

    import ortlite

    torch.fx.experimental._config.backed_size_oblivious = args.size_oblivious
    model = build(args.model, args.default_init)
    spent = collections.Counter()

    def timed(owner, attr, key):
        original = getattr(owner, attr)

        def wrapper(*a, **k):
            start = time.process_time()
            try:
                return original(*a, **k)
            finally:
                spent[key] += time.process_time() - start

        setattr(owner, attr, wrapper)

    timed(ortlite.Backend, "__call__", "aot_autograd+ortlite")
    timed(ortlite.Backend, "compile_graph", "ortlite")
    backend = ortlite.Backend() if args.backend == "ortlite" else args.backend
    dynamic = {"true": True, "auto": None, "false": False}[args.dynamic]
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    if args.default_init and args.model == "fasterrcnn":
        with torch.no_grad():
            x = inputs(args.model, args.batches[0], args.size)
            expected = outputs(args.model, model(*x))
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            one = outputs(args.model, model(*x))
            torch.set_num_threads(threads)
        print(json.dumps({"eager_1_thread_vs_eager": {k: v for k, v in compare(expected, one).items()}}), flush=True)
    for batch in args.batches:
        x = inputs(args.model, batch, args.size)
        with torch.no_grad():
            eager = time.perf_counter()
            expected = outputs(args.model, model(*x))
            eager = time.perf_counter() - eager
            spent.clear()
            wall, cpu = time.perf_counter(), time.process_time()
            got = outputs(args.model, compiled(*x))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            again = time.perf_counter()
            compiled(*x)
            again = time.perf_counter() - again
        ours = spent["ortlite"]
        aot = spent["aot_autograd+ortlite"] - ours
        record = {
            "batch": batch,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "cpu_aot_autograd_s": round(aot, 3),
            "cpu_ortlite_s": round(ours, 3),
            "cpu_rest_s": round(cpu - aot - ours, 3),  # Dynamo, guards, the run
            "again_wall_s": round(again, 4),
            "eager_wall_s": round(eager, 4),
            "errors": compare(expected, got),
        }
        print(json.dumps(record), flush=True)
    if not isinstance(backend, str):
        stats = backend.stats
        print(json.dumps({"stats": {"graphs": stats.graphs, "sessions": stats.sessions, "fallback_ops": stats.fallback_ops}}), flush=True)


def nesting(rounds: int, backend: str, size_oblivious: bool = False) -> None:
    """Compile time of 1..rounds window partition round trips under dynamic=True."""
    import torch
    import torch.fx.experimental._config

    torch.fx.experimental._config.backed_size_oblivious = size_oblivious

    p = 7

    def round_trips(k):
        def f(x):
            for _ in range(k):
                B, C, H, W = x.shape
                windows = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p, C)
                x = (windows * 2).reshape(B, H // p, W // p, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, (H // p) * p, (W // p) * p)
            return x

        return f

    for k in range(1, rounds + 1):
        torch._dynamo.reset()
        f = round_trips(k)
        compiled = torch.compile(f, backend=backend, dynamic=True)
        x = torch.rand(2, 8, 56, 56)
        start = time.process_time()
        got = compiled(x)
        seconds = time.process_time() - start
        print(f"  {k} round trip(s): {seconds:.2f} s CPU, {'same as eager' if torch.equal(got, f(x)) else 'DIFFERS from eager'}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dynamic", choices=["true", "auto", "false"], default="true")
    parser.add_argument("--batches", default="1,2,3", help="the batch sizes called in turn (fasterrcnn: images of different sizes)")
    parser.add_argument("--size", type=int, help="image side (default per model)")
    parser.add_argument("--backend", default="ortlite", help="ortlite, or a torch backend name for comparison (eager, aot_eager)")
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="per model, wall clock")
    parser.add_argument("--default-init", action="store_true", help="fasterrcnn: torchvision's own random init (degenerate)")
    parser.add_argument("--size-oblivious", action="store_true", help="torch.fx.experimental._config.backed_size_oblivious = True (see docs/dynamic-shapes.md)")
    parser.add_argument("--nesting", type=int, help="instead of the models: plain torch window partition round trips 1..N (see above)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the subprocess's model
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.nesting:
        print(f"window partition round trips, dynamic=True, backend={args.backend}, backed_size_oblivious={args.size_oblivious}:")
        nesting(args.nesting, args.backend, args.size_oblivious)
        return 0
    if args.one:
        args.model = args.one
        args.size = args.size or DEFAULT_SIZE[args.model]
        run_one(args)
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; known: {MODELS}")
        why = missing_packages(name)
        if why:
            print(f"{name}: skipped: {why}")
            continue
        command = [sys.executable, os.path.abspath(__file__), "--one", name, "--dynamic", args.dynamic, "--batches", ",".join(map(str, args.batches)), "--backend", args.backend]
        command += ["--size", str(args.size)] if args.size else []
        command += ["--default-init"] if args.default_init else []
        command += ["--size-oblivious"] if args.size_oblivious else []
        print(f"{name}: dynamic={args.dynamic} backend={args.backend} batches={args.batches}{' backed_size_oblivious' if args.size_oblivious else ''}", flush=True)
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            _report(name, out)
            print(f"  did not finish within {args.timeout_s:.0f} s (the calls above finished)")
            continue
        _report(name, done.stdout)
        if done.returncode != 0:
            tail = "\n    ".join(done.stderr.strip().splitlines()[-6:])
            print(f"  failed (exit {done.returncode}):\n    {tail}")
        print(f"  total {time.perf_counter() - start:.1f} s")
    return 0


def _report(name: str, stdout: str) -> None:
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "batch" in record:
            errors = ", ".join(f"{k} {v}" if isinstance(v, str) else f"{k} abs {v[0]:.3g} rel {v[1]:.3g}" for k, v in list(record["errors"].items())[:6])
            print(
                f"  batch {record['batch']}: {record['wall_s']:.2f} s wall, {record['cpu_s']:.2f} s CPU "
                f"(aot_autograd {record['cpu_aot_autograd_s']:.2f}, ortlite {record['cpu_ortlite_s']:.2f}, Dynamo and the rest {record['cpu_rest_s']:.2f}); "
                f"again {record['again_wall_s'] * 1e3:.1f} ms (eager {record['eager_wall_s'] * 1e3:.1f} ms); {errors}"
            )
        elif "stats" in record:
            print(f"  {record['stats']}")
        else:
            print(f"  {record}")


if __name__ == "__main__":
    sys.exit(main())
