"""Convolution networks in int8 (Options(quantize="int8", calibration=samples), issue 43): ortlite's
static int8 against its float32, inductor float32 and bfloat16, PT2E int8 + inductor and ONNX
Runtime's own quantize_static, each model in one run, 1 thread, rounds interleaved, medians.

    python bench/precision_vision.py [--models resnet18,resnet50] [--batches 1,8] [--rounds 7] [--iters 3]

Needs torchvision matching the installed torch (a venv of its own: torch 2.14.1 + torchvision
0.29.1) and, for the PT2E row, torchao (torch 2.14 moved X86InductorQuantizer out of torch.ao;
`pip install --no-deps --target DIR torchao` and PYTHONPATH=DIR keep the venv as it was). Run it
outside the repository so that the installed ortlite is the one imported.

Models: torchvision's, random weights, 224 px; each BatchNorm's running statistics and affine
parameters drawn a little away from 0/1 so that folding it into the convolution is not trivial.
Calibration samples: 32 standard-normal images (speed only; accuracy is measured elsewhere), in
tensors of the timed batch size, the same ones for every calibrated candidate. Candidates:

- eager f32; inductor f32 and inductor bf16: torch.compile with freezing, under no_grad (bf16:
  model and input in bfloat16);
- PT2E int8: torch.export (strict), torchao's X86InductorQuantizer (default config: u8 activations per
  tensor, s8 weights per channel), prepare_pt2e, the samples, convert_pt2e, torch.compile with
  freezing; skipped with the reason where torchao is missing or fails;
- ORT quantize_static: torch.onnx.export (TorchScript exporter, opset 17) as the float ONNX
  file, quant_pre_process (symbolic shape inference, ORT's basic optimizations), then
  quantize_static (QDQ, per_channel=True, u8 activations, s8 weights, MinMax, the same samples),
  run in a plain onnxruntime session (1 intra-op thread, ORT_ENABLE_ALL). --ort-export ortlite
  starts from ortlite.compile(model, (x,)).save() instead: its max pool's NaN guard (an If)
  hides the MaxPool from quantize_static, which then leaves the stem's Conv and the MaxPool in
  float32 (ResNets);
- ortlite f32 and ortlite int8 (ortlite.compile).

Each model and batch runs in a subprocess with a wall-clock limit (--timeout-s). Per model: ms
per candidate, ratios of ortlite int8 to its peers, the max |int8 - eager f32| of the logits
beside max |eager f32 logits| (a sanity check with random weights, not accuracy), and the op
counts of ONNX Runtime's optimized graphs of both int8 files (what fused into QLinear* kernels,
what stayed float, how many Q/DQ remain). At the end: one table over the models and the geomean
of int8 / ortlite f32.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import interleaved, per_call_us  # noqa: E402

MODELS = {  # key: (torchvision builder, name)
    "resnet18": ("resnet18", "ResNet-18"),
    "resnet50": ("resnet50", "ResNet-50"),
    "mobilenet_v2": ("mobilenet_v2", "MobileNetV2"),
    "mobilenet_v3_large": ("mobilenet_v3_large", "MobileNetV3-L"),
    "efficientnet_b0": ("efficientnet_b0", "EfficientNet-B0"),
    "convnext_tiny": ("convnext_tiny", "ConvNeXt-T"),
    "regnet_y_400mf": ("regnet_y_400mf", "RegNetY-400MF"),
}
CALIBRATION_IMAGES = 32
INT8 = "ortlite int8"
PEERS = ("ortlite f32", "inductor bf16", "ORT quantize_static", "PT2E int8")


def build(key: str) -> torch.nn.Module:
    import torchvision

    model = getattr(torchvision.models, MODELS[key][0])(weights=None)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(torch.empty(m.num_features).uniform_(0.5, 1.5, generator=gen))
                m.weight.copy_(1 + 0.1 * torch.randn(m.num_features, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=gen))
    return model.eval()


def optimized_ops(path: str) -> collections.Counter:
    """Op types of ONNX Runtime's optimized graph of the file (CPU, ORT_ENABLE_ALL)."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    so.optimized_model_filepath = path + ".optimized.onnx"
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


def ort_quantize_static(model, x, samples, workdir: str, exporter: str):
    """(a callable, its file): the float ONNX file (torch.onnx.export's TorchScript exporter, or
    ortlite's) through ORT's quant_pre_process and quantize_static."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    import ortlite

    float_path, pre_path, q_path = (os.path.join(workdir, n) for n in ("f32.onnx", "f32.pre.onnx", "ort_int8.onnx"))
    if exporter == "ortlite":
        ortlite.compile(model, (x,)).save(float_path)
    else:  # (the dynamo exporter needs onnxscript)
        torch.onnx.export(model, (x,), float_path, dynamo=False, opset_version=17)
    graph = onnx.load(float_path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    (name,) = [i.name for i in graph.input if i.name not in inits]
    quant_pre_process(float_path, pre_path)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            s = next(self.it, None)
            return None if s is None else {name: s.numpy()}

    quantize_static(
        pre_path, q_path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    session = ort.InferenceSession(q_path, so, providers=["CPUExecutionProvider"])
    out = session.get_outputs()[0].name
    return (lambda t: torch.from_numpy(session.run([out], {name: t.numpy()})[0])), q_path


def pt2e(model, x, samples):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer, get_default_x86_inductor_quantization_config

    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    # strict: torch 2.14's non-strict export leaves source_fn_stack out, and the quantizer's
    # fallback groups a module called twice (torchvision's BasicBlock.relu) into one partition
    # with two outputs ("Input partition has more than one output node")
    prepared = prepare_pt2e(torch.export.export(copy.deepcopy(model), (x,), strict=True).module(), quantizer)
    for s in samples:
        prepared(s)
    return torch.compile(convert_pt2e(prepared))


def one(key: str, batch: int, rounds: int, iters: int, exporter: str) -> dict:
    """Compile every candidate, time them; the result as a dict (also printed as a table)."""
    import torch._inductor.config as inductor_config

    import ortlite

    torch.manual_seed(0)
    model = build(key)
    x = torch.randn(batch, 3, 224, 224)
    images = torch.randn(CALIBRATION_IMAGES, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    samples = list(images.split(batch))
    inductor_config.freezing = True
    made, skipped, compile_s = {}, {}, {}
    workdir = tempfile.mkdtemp(prefix="precision_vision_")

    def add(name, make):
        start = time.perf_counter()
        try:
            made[name] = make()
            made[name](x)  # inductor compiles on the first call
        except Exception as e:  # noqa: BLE001 (a peer that does not run here is skipped, said why)
            made.pop(name, None)
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(f"  {name}: skipped ({skipped[name]})", flush=True)
        compile_s[name] = time.perf_counter() - start

    with torch.no_grad():
        expected = model(x)
        made["eager f32"] = model
        add("ortlite f32", lambda: ortlite.compile(model, (x,)))
        int8_path = os.path.join(workdir, "ortlite_int8.onnx")

        def ortlite_int8():
            compiled = ortlite.compile(model, (x,), options=dict(quantize="int8", calibration=samples))
            compiled.save(int8_path)
            return compiled

        add(INT8, ortlite_int8)
        ort_path = []

        def ort_qs():
            fn, path = ort_quantize_static(model, x, samples, workdir, exporter)
            ort_path.append(path)
            return fn

        add("ORT quantize_static", ort_qs)
        add("inductor f32", lambda: torch.compile(copy.deepcopy(model)))
        bf16_model = copy.deepcopy(model).to(torch.bfloat16)
        bf16_compiled = torch.compile(bf16_model)
        xb = x.to(torch.bfloat16)
        add("inductor bf16", lambda: (lambda t: bf16_compiled(xb)))
        add("PT2E int8", lambda: pt2e(model, x, samples))

        diffs = {k: float((f(x).float() - expected).abs().max()) for k, f in made.items()}
        timed = interleaved({k: (lambda f=f: f(x)) for k, f in made.items()}, rounds, lambda call: per_call_us(call, iters, lambda: None))
    ms = {k: statistics.median(v) / 1000 for k, v in timed.items()}
    ops = {}
    for label, path in (("ortlite int8", int8_path), ("ORT quantize_static", ort_path[0] if ort_path else None)):
        if path and os.path.exists(path):
            ops[label] = dict(optimized_ops(path))
    shutil.rmtree(workdir, ignore_errors=True)
    return dict(key=key, name=MODELS[key][1], batch=batch, ms=ms, diffs=diffs, scale=float(expected.abs().max()),
                skipped=skipped, compile_s=compile_s, ops=ops)


def print_one(r: dict, rounds: int, iters: int) -> None:
    print(f"\n{r['name']}, batch {r['batch']}, 224 px (1 thread, {rounds} interleaved rounds of {iters} calls, medians)")
    print("| candidate | ms | x ortlite f32 | max abs diff vs eager f32 | compile s |")
    print("|---|---|---|---|---|")
    f32 = r["ms"].get("ortlite f32", math.nan)
    for k, ms in r["ms"].items():
        print(f"| {k} | {ms:.2f} | {ms / f32:.2f} | {r['diffs'][k]:.3g} | {r['compile_s'].get(k, 0):.0f} |")
    for k, why in r["skipped"].items():
        print(f"| {k} | skipped: {why} | | | |")
    print(f"max |eager f32 logits| = {r['scale']:.3g}")
    for label, counts in r["ops"].items():
        print(f"ONNX Runtime's optimized graph, {label}: " + ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: -kv[1])))


def summary(results: list) -> None:
    print("\nSummary: ms per call (1 thread), ortlite int8 / peer")
    head = ["eager f32", "inductor f32", "inductor bf16", "PT2E int8", "ORT quantize_static", "ortlite f32", INT8]
    print("| model | batch | " + " | ".join(head) + " | " + " | ".join(f"int8 / {p}" for p in PEERS) + " | max abs diff int8 (max abs f32) |")
    print("|---|---|" + "---|" * (len(head) + len(PEERS) + 1))
    ratios = collections.defaultdict(list)
    for r in results:
        ms = r["ms"]
        cells = [f"{ms[k]:.1f}" if k in ms else "–" for k in head]
        rs = [f"{ms[INT8] / ms[p]:.2f}" if INT8 in ms and p in ms else "–" for p in PEERS]
        if INT8 in ms and "ortlite f32" in ms:
            ratios[r["batch"]].append(ms[INT8] / ms["ortlite f32"])
        diff = f"{r['diffs'][INT8]:.3g} ({r['scale']:.3g})" if INT8 in r["diffs"] else "–"
        print(f"| {r['name']} | {r['batch']} | " + " | ".join(cells) + " | " + " | ".join(rs) + f" | {diff} |")
    for batch, rs in sorted(ratios.items()):
        print(f"geomean int8 / ortlite f32, batch {batch}: {math.exp(statistics.fmean(math.log(v) for v in rs)):.2f} over {len(rs)} models")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1", help="comma-separated, e.g. 1,8")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--timeout-s", type=int, default=1200)
    parser.add_argument("--ort-export", choices=("torch", "ortlite"), default="torch", help="the float ONNX file quantize_static starts from")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # key:batch, the subprocess's own run
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if args.one:
        key, batch = args.one.split(":")
        r = one(key, int(batch), args.rounds, args.iters, args.ort_export)
        print_one(r, args.rounds, args.iters)
        print("RESULT " + json.dumps(r), flush=True)
        return
    try:
        import torchvision
    except ImportError as e:
        print(f"needs torchvision matching torch {torch.__version__}: {e}")
        return
    import onnxruntime

    import ortlite

    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, onnxruntime {onnxruntime.__version__}, ortlite {ortlite.__file__}")
    print(f"load average at start: {os.getloadavg()}")
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        for key in args.models.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", f"{key}:{batch}", "--rounds", str(args.rounds), "--iters", str(args.iters), "--ort-export", args.ort_export]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                print(f"\n{key} batch {batch}: over {args.timeout_s} s, stopped")
                continue
            lines = done.stdout.splitlines()
            print("\n".join(line for line in lines if not line.startswith("RESULT ")), flush=True)
            found = [json.loads(line[len("RESULT "):]) for line in lines if line.startswith("RESULT ")]
            if found:
                results.append(found[0])
            else:
                print(f"{key} batch {batch}: failed (exit {done.returncode})\n" + "\n".join(done.stderr.splitlines()[-15:]))
            print(f"load average: {os.getloadavg()}", flush=True)
    summary(results)


if __name__ == "__main__":
    main()
