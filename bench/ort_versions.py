"""Which onnxruntime versions run the files ortlite saves: each kind saved by this ortlite,
loaded and run by plain onnxruntime of older versions, each in a venv of its own; and whether
the minimum version each file records (ortlite.saved.MIN_ORT_*) is the one measured.

    python bench/ort_versions.py [--versions 1.15.1,1.16.3,...] [--venvs /tmp/ortlite-ort-venvs] [--record bench/ort_versions.json]

Kinds: float32 (README's MLP, dynamic batch; a BERT h64 L2: attention, LayerNorm, GELU),
int8 and int4 (Options(quantize=...)), and a static-cache decode step (a LLaMA h64 L2,
GroupQueryAttention); and probes, one-node graphs of each of the rules' rows (IR versions,
ai.onnx opsets, the com.microsoft ops ortlite writes). Each is run by the onnxruntime here (the
reference) and by each version (InferenceSession on CPU, GatherToSliceFusion disabled as
docs/aot-save-load-serving.md says); "ok" means its outputs equal the reference's within rtol
1e-4. Versions: the oldest that installs here, then each minor release on the index, and the
ones Triton's releases pin where a minor release starts (1.18.0, 1.19.0, 1.21.0, 1.23.0, 1.24.1). Venvs are made once
(pip install onnxruntime==V "numpy<2"), kept for later runs. --record writes the results as
JSON (tests/test_min_ort_version.py checks the rules against it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

VERSIONS = "1.15.1,1.16.3,1.17.3,1.18.0,1.18.1,1.19.0,1.19.2,1.20.1,1.21.0,1.21.1,1.22.1,1.23.0,1.23.2,1.24.1,1.24.4,1.26.0,1.28.0,1.30.0,1.32.0"

# runs inside each venv: numpy and onnxruntime alone
RUNNER = r"""
import json, sys, numpy as np, onnxruntime as ort
results = {}
def short(e):  # ONNX Runtime's reason, after its source location
    text = " ".join(str(e).split())
    return text.split("failed:")[-1].split(") : ")[-1][-220:]
for case in json.loads(sys.argv[1]):
    name = case["name"]
    options = ort.SessionOptions()
    options.log_severity_level = 4  # (an old version's warnings about a newer opset: the error says it)
    try:
        session = ort.InferenceSession(case["path"], options, providers=["CPUExecutionProvider"], disabled_optimizers=["GatherToSliceFusion"])
    except Exception as e:
        results[name] = "load: " + short(e)
        continue
    feeds = dict(np.load(case["inputs"]))
    try:
        outputs = session.run(None, feeds)
    except Exception as e:
        results[name] = "run: " + short(e)
        continue
    expected = np.load(case["expected"])
    same = [np.allclose(o, expected[f"o{i}"], rtol=1e-4, atol=1e-4) if o.dtype.kind == "f" else np.array_equal(o, expected[f"o{i}"]) for i, o in enumerate(outputs)]
    results[name] = "ok" if all(same) else f"differs (outputs {[i for i, s in enumerate(same) if not s]})"
print(json.dumps({"version": ort.__version__, "results": results}))
"""


def build(folder: str) -> list[dict]:
    """Each kind saved and each probe, with its inputs and the outputs of the onnxruntime here
    as .npz files, and the minimum version the file records (the rules' for a probe)."""
    import numpy as np
    import onnx
    import onnxruntime
    import torch
    from torch.export import Dim

    import ortlite
    import ortlite.decode
    from ortlite.saved import MIN_ORT_KEY, min_onnxruntime
    from ortlite.serve.model import ServedModel

    torch.manual_seed(0)
    cases = []

    def add(name, path, feeds, minimum, kind):
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], disabled_optimizers=["GatherToSliceFusion"])
        outputs = session.run(None, feeds)
        np.savez(path + ".inputs.npz", **feeds)
        np.savez(path + ".expected.npz", **{f"o{i}": o for i, o in enumerate(outputs)})
        cases.append({"name": name, "kind": kind, "min": minimum, "path": path, "inputs": path + ".inputs.npz", "expected": path + ".expected.npz"})

    def saved(name, compiled, args):
        path = os.path.join(folder, f"{name}.onnx")
        compiled.save(path)
        names = ServedModel.signature(path).input_names
        recorded = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}[MIN_ORT_KEY]
        add(name, path, {n: a.numpy() for n, a in zip(names, args)}, recorded, "saved")

    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    x = torch.randn(4, 64)
    saved("float32 MLP", ortlite.compile(mlp, (x,), dynamic_shapes={"input": {0: Dim("batch")}}), (x,))

    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(ids).last_hidden_state

    bert = Hidden(BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000))).eval()
    ids = torch.randint(0, 1000, (2, 16))
    saved("float32 BERT", ortlite.compile(bert, (ids,), dynamic_shapes={"ids": {0: Dim("batch")}}), (ids,))
    # opset 21: attention written out (ONNX's Attention is opset 23), its embeddings' index checks kept
    saved("float32 BERT, opset 21", ortlite.compile(bert, (ids,), dynamic_shapes={"ids": {0: Dim("batch")}}, options=ortlite.Options(opset=21)), (ids,))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10),
    ).eval()
    image = torch.randn(2, 3, 32, 32)
    saved("float32 CNN", ortlite.compile(cnn, (image,), dynamic_shapes={"input": {0: Dim("batch")}}), (image,))
    for mode in ("int8", "int4"):
        one = torch.randn(1, 64)  # one row: int4's own kernel (more rows take int8's)
        saved(f"{mode} MLP", ortlite.compile(mlp, (one,), options=ortlite.Options(quantize=mode)), (one,))
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    step = ortlite.decode.compile_static_cache_step(LlamaForCausalLM(config).eval(), max_cache_len=32)
    prompt = torch.randint(0, 256, (1, 6))
    saved("decode step (static cache)", step.prompt, (prompt, torch.arange(6)))
    step = ortlite.decode.compile_static_cache_step(LlamaForCausalLM(config).eval(), max_cache_len=32, options=ortlite.Options(opset=21))
    saved("decode step, opset 21", step.prompt, (prompt, torch.arange(6)))
    for name, (model, feeds) in probe_models().items():
        path = os.path.join(folder, f"{name}.onnx")
        onnx.save(model, path)
        add(name, path, feeds, "%d.%d" % min_onnxruntime(model)[0], "probe")
    return cases


def probe_models() -> dict:
    """name -> (a one-node ONNX model, its feeds): each row of ortlite.saved's MIN_ORT_* rules,
    and the com.microsoft ops ortlite writes in the forms it writes them."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    rand = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    value = lambda name, shape, kind=TensorProto.FLOAT: helper.make_tensor_value_info(name, kind, shape)  # noqa: E731
    models = {}

    def probe(name, node, x, outputs, initializers=(), opset=21, ir=10):
        inputs = [value("x", list(x.shape), helper.np_dtype_to_tensor_dtype(x.dtype))]
        graph = helper.make_graph([node], "probe", inputs, [value(*o) for o in outputs])
        graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n) for n, a in initializers)
        opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid("com.microsoft", 1)] * (node.domain == "com.microsoft")
        models[name] = (helper.make_model(graph, opset_imports=opsets, ir_version=ir), {"x": x})

    for ir, opset in [(9, 19), (9, 20), (10, 20), (10, 21), (10, 22), (10, 23), (11, 23), (12, 23), (13, 23), (10, 24), (10, 25), (10, 26)]:
        probe(f"IR {ir}, opset {opset}", helper.make_node("Add", ["x", "x"], ["y"]), rand(2, 3), [("y", [2, 3])], opset=opset, ir=ir)
    k, n, block = 64, 16, 32  # MatMulNBits as ortlite.lower.quantize writes it: 4 bits, no zero points, a bias or none
    weights = [("w", rng.integers(0, 255, (n, k // block, block // 2), dtype=np.uint8)), ("s", rand(n * k // block)), ("b", rand(n))]
    nbits = dict(domain="com.microsoft", K=k, N=n, bits=4, block_size=block, accuracy_level=4)
    for label, inputs in [("3 inputs", ["x", "w", "s"]), ("6 inputs, bias", ["x", "w", "s", "", "", "b"]), ("6 inputs, no bias", ["x", "w", "s", "", "", ""])]:
        probe(f"MatMulNBits, {label}", helper.make_node("MatMulNBits", inputs, ["y"], **nbits), rand(1, k), [("y", [1, n])], weights[: 2 + ("b" in inputs)])
    int8 = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]), helper.make_node("MatMulIntegerToFloat", ["q", "w8", "qs", "ws", "qz", "", "b"], ["y"], domain="com.microsoft")]
    probe("DynamicQuantizeLinear + MatMulIntegerToFloat", int8[1], rand(1, k), [("y", [1, n])], [("w8", rng.integers(-127, 127, (k, n), dtype=np.int8)), ("ws", np.float32(0.01)), weights[2]])
    models["DynamicQuantizeLinear + MatMulIntegerToFloat"][0].graph.node.insert(0, int8[0])
    heads, kv_heads, head, length, s = 4, 2, 16, 8, 3  # (do_rotary wants a head size that is a multiple of 16)
    cache = [("pk", np.zeros((1, kv_heads, length, head), np.float32)), ("pv", np.zeros((1, kv_heads, length, head), np.float32))]
    cache += [("sl", np.array([s - 1], np.int32)), ("total", np.array(s, np.int32))]
    outputs = [("y", [1, s, heads * head]), ("pko", [1, kv_heads, length, head]), ("pvo", [1, kv_heads, length, head])]
    gqa = dict(domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, scale=0.25)
    kv = [("k", rand(1, s, kv_heads * head)), ("v", rand(1, s, kv_heads * head))]
    probe("GroupQueryAttention, 7 inputs", helper.make_node("GroupQueryAttention", ["x", "k", "v", "pk", "pv", "sl", "total"], ["y", "pko", "pvo"], **gqa), rand(1, s, heads * head), outputs, kv + cache)
    tables = [("cos", rand(length, head // 2)), ("sin", rand(length, head // 2))]
    rotary = helper.make_node("GroupQueryAttention", ["x", "", "", "pk", "pv", "sl", "total", "cos", "sin"], ["y", "pko", "pvo"], do_rotary=1, **gqa)
    probe("GroupQueryAttention, packed, do_rotary", rotary, rand(1, s, (heads + 2 * kv_heads) * head), outputs, cache + tables)
    checks = [helper.make_node("Cast", ["x"], ["u"], to=TensorProto.UINT64), helper.make_node("GreaterOrEqual", ["u", "bound"], ["y"])]
    probe("GreaterOrEqual, uint64 (an index check)", checks[1], np.array([0, 3, -1, 9]), [("y", [4], TensorProto.BOOL)], [("bound", np.array(4, np.uint64))])
    models["GreaterOrEqual, uint64 (an index check)"][0].graph.node.insert(0, checks[0])
    skip = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "x", "g"], ["y", "", "", "sum"], domain="com.microsoft", epsilon=1e-5)
    probe("SkipSimplifiedLayerNormalization", skip, rand(2, 3, head), [("y", [2, 3, head]), ("sum", [2, 3, head])], [("g", rand(head))])
    q = rand(1, heads, s, head)
    probe("Attention (opset 23)", helper.make_node("Attention", ["x", "x", "x"], ["y"], is_causal=1), q, [("y", list(q.shape))], opset=23)
    halves = [("c", rand(1, s, head // 2)), ("t", rand(1, s, head // 2))]
    probe("RotaryEmbedding (opset 23)", helper.make_node("RotaryEmbedding", ["x", "c", "t"], ["y"]), q, [("y", list(q.shape))], halves, opset=23)
    probe("RMSNormalization (opset 23)", helper.make_node("RMSNormalization", ["x", "g"], ["y"]), rand(2, 3, head), [("y", [2, 3, head])], [("g", rand(head))], opset=23)
    return models


def minor(version: str) -> tuple[int, int]:
    return tuple(int(p) for p in version.split(".")[:2])


def agreement(minimum: str, results: dict) -> str:
    """Whether the versions that ran a case are exactly those at or past its minimum."""
    ran = {v: r == "ok" for v, r in results.items() if not r.startswith(("no venv", "runner failed"))}
    refused = sorted((v for v, ok in ran.items() if not ok and minor(v) >= minor(minimum)), key=minor)
    if refused:
        return f"NO: {refused[0]} fails"
    older = sorted((v for v, ok in ran.items() if ok and minor(v) < minor(minimum)), key=minor)
    return f"stricter than needed: {older[0]} runs it" if older else "yes"


def venv(root: str, version: str) -> str:
    folder = os.path.join(root, version)
    python = os.path.join(folder, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", folder], check=True)
        try:
            subprocess.run([python, "-m", "pip", "install", "-q", f"onnxruntime=={version}", "numpy<2"], check=True)
        except subprocess.CalledProcessError:
            shutil.rmtree(folder)  # (not kept half made)
            raise
    return python


def main(argv=None):
    import onnxruntime

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", default=VERSIONS)
    parser.add_argument("--venvs", default=os.path.join(tempfile.gettempdir(), "ortlite-ort-venvs"))
    parser.add_argument("--record", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    cases = build(tempfile.mkdtemp(prefix="ortlite-ort-versions-"))
    rows = {}
    for version in args.versions.split(","):
        try:
            python = venv(args.venvs, version)
        except subprocess.CalledProcessError as e:
            rows[version] = {c["name"]: f"no venv: {e}" for c in cases}
            continue
        done = subprocess.run([python, "-c", RUNNER, json.dumps(cases)], capture_output=True, text=True)
        if done.returncode != 0:
            rows[version] = {c["name"]: "runner failed: " + done.stderr.strip().splitlines()[-1][:200] for c in cases}
            continue
        rows[version] = json.loads(done.stdout.strip().splitlines()[-1])["results"]
        print(version, sum(r == "ok" for r in rows[version].values()), "of", len(cases), "ran", flush=True)
    print(f"\nreference: onnxruntime {onnxruntime.__version__}; tested: {', '.join(rows)}")
    print("\n| case | minimum (file / rules) | oldest tested that runs it | agree | the newest that does not says |")
    print("|---|---|---|---|---|")
    for c in cases:
        results = {v: r[c["name"]] for v, r in rows.items()}
        runs = [v for v, r in results.items() if r == "ok"]
        fails = [(v, r) for v, r in results.items() if r != "ok" and not r.startswith(("no venv", "runner failed"))]
        last = f"{fails[-1][0]}: {fails[-1][1][-120:]}" if fails else ""
        print(f"| {c['name']} | {c['min']} | {min(runs, key=minor) if runs else 'none'} | {agreement(c['min'], results)} | {last.replace('|', '/')} |")
    if args.record:
        record = {
            "reference": onnxruntime.__version__,
            "versions": list(rows),
            "cases": {c["name"]: {"kind": c["kind"], "min": c["min"], "results": {v: r[c["name"]] for v, r in rows.items()}} for c in cases},
        }
        with open(args.record, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
