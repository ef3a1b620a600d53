"""Which onnxruntime versions run the files ortlite saves: each kind saved by this ortlite,
loaded and run by plain onnxruntime of older versions, each in a venv of its own.

    python bench/ort_versions.py [--versions 1.15.1,1.16.3,...] [--venvs /tmp/ortlite-ort-venvs]

Kinds: float32 (README's MLP, dynamic batch; a BERT h64 L2: attention, LayerNorm, GELU),
int8 and int4 (Options(quantize=...)), and a static-cache decode step (a LLaMA h64 L2,
GroupQueryAttention). Each is run by the newest onnxruntime here (the reference) and by each
version (InferenceSession on CPU, GatherToSliceFusion disabled as docs/aot-save-load-serving.md
says); "ok" means its outputs equal the reference's within rtol 1e-4. Venvs are made once
(pip install onnxruntime==V "numpy<2"), kept for later runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

VERSIONS = "1.15.1,1.16.3,1.17.3,1.18.1,1.19.2,1.20.1,1.21.1,1.22.1,1.23.2,1.24.4,1.26.0,1.28.0,1.30.0,1.32.0"

# runs inside each venv: numpy and onnxruntime alone
RUNNER = r"""
import json, sys, numpy as np, onnxruntime as ort
results = {}
def short(e):  # ONNX Runtime's reason, after its source location
    text = " ".join(str(e).split())
    return text.split("failed:")[-1].split(") : ")[-1][-220:]
for case in json.loads(sys.argv[1]):
    name = case["name"]
    try:
        session = ort.InferenceSession(case["path"], providers=["CPUExecutionProvider"], disabled_optimizers=["GatherToSliceFusion"])
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
    """Each kind saved, with its inputs and the newest onnxruntime's outputs as .npz files."""
    import numpy as np
    import onnxruntime
    import torch
    from torch.export import Dim

    import ortlite
    import ortlite.decode
    from ortlite.serve.model import ServedModel

    torch.manual_seed(0)
    cases = []

    def add(name, compiled, args):
        path = os.path.join(folder, f"{name}.onnx")
        compiled.save(path)
        names = ServedModel.signature(path).input_names
        feeds = {n: a.numpy() for n, a in zip(names, args)}
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], disabled_optimizers=["GatherToSliceFusion"])
        outputs = session.run(None, feeds)
        np.savez(path + ".inputs.npz", **feeds)
        np.savez(path + ".expected.npz", **{f"o{i}": o for i, o in enumerate(outputs)})
        cases.append({"name": name, "path": path, "inputs": path + ".inputs.npz", "expected": path + ".expected.npz"})

    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    x = torch.randn(4, 64)
    add("float32 MLP", ortlite.compile(mlp, (x,), dynamic_shapes={"input": {0: Dim("batch")}}), (x,))

    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(ids).last_hidden_state

    bert = Hidden(BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000))).eval()
    ids = torch.randint(0, 1000, (2, 16))
    add("float32 BERT", ortlite.compile(bert, (ids,), dynamic_shapes={"ids": {0: Dim("batch")}}), (ids,))
    for mode in ("int8", "int4"):
        one = torch.randn(1, 64)  # one row: int4's own kernel (more rows take int8's)
        add(f"{mode} MLP", ortlite.compile(mlp, (one,), options=ortlite.Options(quantize=mode)), (one,))
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    step = ortlite.decode.compile_static_cache_step(LlamaForCausalLM(config).eval(), max_cache_len=32)
    prompt = torch.randint(0, 256, (1, 6))
    add("decode step (static cache)", step.prompt, (prompt, torch.arange(6)))
    return cases


def venv(root: str, version: str) -> str:
    python = os.path.join(root, version, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", os.path.join(root, version)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", f"onnxruntime=={version}", "numpy<2"], check=True)
    return python


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", default=VERSIONS)
    parser.add_argument("--venvs", default=os.path.join(tempfile.gettempdir(), "ortlite-ort-venvs"))
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
        print(version, rows[version], flush=True)
    names = [c["name"] for c in cases]
    print("\n| onnxruntime | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for version, results in rows.items():
        print(f"| {version} | " + " | ".join(results.get(n, "?") for n in names) + " |")


if __name__ == "__main__":
    main()
