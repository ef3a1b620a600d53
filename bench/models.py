"""Model latency: eager, inductor, ortlite (torch.compile), ortlite with changing shapes
(dynamic=True: sequence length and image size symbolic) and ortlite AOT on transformers
models built from configs (random weights, no downloads). One thread, interleaved rounds,
medians; first-call (compile + run) times; what fell back to torch.

    python bench/models.py [--models bert,gpt2,llama,llama-long,llama-decode,moe,vit,resnet,mobilenet] [--rounds 7]
        [--no-inductor] [--no-dynamic] [--precision] [--device cpu|cuda]

Peers in the same run: inductor, and torch.onnx.export(dynamo=True) + ONNX Runtime
("export+ORT"; needs onnxscript, the bench extra: pip install -e ".[bench]").
The MoE row needs no options: its router's sort of expert ids runs unchecked (lower/tie_order.py).
--precision adds, in the same rounds: ortlite AOT with Options(quantize="int8"/"int4"), eager
bf16 and inductor bf16 (freezing); "llama-decode" is a 1-token call of a causal LM with a
32000-token vocabulary (the LM head included).

ortlite runs with frozen weights (the default under no_grad); "ortlite unfrozen" is the same
with Options(freeze_weights=False), weights bound as inputs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

import ortlite  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from overhead import interleaved, own_code  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402

TRACE_ONLY = aot_autograd(fw_compiler=lambda gm, example_inputs: make_boxed_func(gm))


def bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=30522)
    return "BERT h256 L4 seq128 b1", BertModel(config), (torch.randint(0, 30522, (1, 128)),)


def gpt2():
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=50257, n_positions=256)
    return "GPT-2 h256 L4 seq128 b1", GPT2Model(config), (torch.randint(0, 50257, (1, 128)),)


def llama(length=128):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=32000
    )
    return f"LLaMA h256 L4 seq{length} b1", LlamaModel(config), (torch.randint(0, 32000, (1, length)),)


def llama_decode():
    """One decode-shaped call (1 token, no cache) of a causal LM with a 32000-token vocabulary
    and its LM head: the weight products' shape in a decode loop."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, vocab_size=32000
    )
    return "LLaMA-LM h512 L4 1 token", _Logits(LlamaForCausalLM(config)), (torch.randint(0, 32000, (1, 1)),)


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def llama_long():
    """A long prompt: attention is most of the time (causal attention in blocks of queries)."""
    return llama(1024)


def moe():
    from transformers import MixtralConfig, MixtralModel

    config = MixtralConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, vocab_size=32000,
    )
    return "Mixtral-MoE h256 L4 E4 seq128 b1", MixtralModel(config), (torch.randint(0, 32000, (1, 128)),)


def vit():
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, image_size=224, patch_size=16)
    return "ViT h256 L4 224px b1", ViTModel(config), (torch.randn(1, 3, 224, 224),)


def resnet():
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="basic")
    return "ResNet basic-4 224px b1", ResNetModel(config), (torch.randn(1, 3, 224, 224),)


class _InvertedResidual(torch.nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        bn_act = lambda c: [torch.nn.BatchNorm2d(c), torch.nn.ReLU6()]  # noqa: E731
        self.block = torch.nn.Sequential(
            *([torch.nn.Conv2d(cin, hidden, 1, bias=False), *bn_act(hidden)] if expand != 1 else []),
            torch.nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            *bn_act(hidden),
            torch.nn.Conv2d(hidden, cout, 1, bias=False),
            torch.nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2Like(torch.nn.Module):
    """MobileNetV2's layout (inverted residuals, depthwise convs, BatchNorm, ReLU6), width 1.0."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, classes=1000):
        super().__init__()
        layers = [torch.nn.Conv2d(3, 32, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU6()]
        cin = 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(_InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers += [torch.nn.Conv2d(cin, 1280, 1, bias=False), torch.nn.BatchNorm2d(1280), torch.nn.ReLU6()]
        self.features = torch.nn.Sequential(*layers)
        self.classifier = torch.nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def mobilenet():
    torch.manual_seed(0)
    model = MobileNetV2Like()
    with torch.no_grad():  # statistics as a trained model has them
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return "MobileNetV2-like 224px b1", model, (torch.randn(1, 3, 224, 224),)


MODELS = {
    "bert": bert, "gpt2": gpt2, "llama": llama, "llama-long": llama_long, "llama-decode": llama_decode, "moe": moe, "vit": vit,
    "resnet": resnet, "mobilenet": mobilenet,
}


def first_output(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        return next(iter(out.values()))
    return out[0]


class _FirstOutput(torch.nn.Module):
    """The model returning its main tensor only (torch.export cannot return a KV cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return first_output(self.model(*args))


def synchronize():
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed_first_call(fn, args):
    start = time.perf_counter()
    out = fn(*args)
    synchronize()
    return time.perf_counter() - start, out


def export_ort(model, args):
    """The peer: torch.onnx.export(dynamo=True) (onnxscript: `pip install -e ".[bench]"`),
    then an ONNX Runtime session like ortlite's (one thread, all optimizations)."""
    import onnxruntime

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        torch.onnx.export(_FirstOutput(model), args, path, dynamo=True, external_data=False)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs):
        return torch.from_numpy(session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})[0])

    return run


def bench_model(make, rounds, iters, with_inductor, with_dynamic=True, options=None, device="cpu", with_precision=False):
    label, model, args = make()
    model.eval().to(device)
    args = tuple(a.to(device) for a in args)
    torch.manual_seed(0)
    expected = first_output(model(*args))
    candidates, first, notes = {"eager": model}, {}, {}
    options = ortlite.Options(**(options or {}))

    backend = ortlite.Backend(options)
    compiled = torch.compile(own_code(model), backend=backend)
    first["ortlite"], out = timed_first_call(compiled, args)
    torch.testing.assert_close(first_output(out), expected, rtol=1e-3, atol=1e-3)
    candidates["ortlite"] = compiled
    notes["ortlite fallback_ops"] = backend.stats.fallback_ops
    notes["ortlite sessions"] = backend.stats.sessions
    notes["ortlite frozen weights"] = backend.stats.frozen
    # the same with weights bound as inputs (Options(freeze_weights=False))
    unfrozen = torch.compile(own_code(model), backend=ortlite.Backend(options.with_changes(freeze_weights=False)))
    first["ortlite unfrozen"], out = timed_first_call(unfrozen, args)
    torch.testing.assert_close(first_output(out), expected, rtol=1e-3, atol=1e-3)
    candidates["ortlite unfrozen"] = unfrozen
    # changing shapes: dynamic=True makes every size but the batch of 1 symbolic (sequence
    # length, image size), one graph serving them all; timed at the same inputs
    if with_dynamic:
        dynamic_backend = ortlite.Backend(options)
        dynamic = torch.compile(own_code(model), backend=dynamic_backend, dynamic=True)
        first["ortlite dynamic"], out = timed_first_call(dynamic, args)
        torch.testing.assert_close(first_output(out), expected, rtol=1e-3, atol=1e-3)
        candidates["ortlite dynamic"] = dynamic
        notes["ortlite dynamic fallback_ops"] = dynamic_backend.stats.fallback_ops
        notes["ortlite dynamic sessions"] = dynamic_backend.stats.sessions
    # what any backend pays first: Dynamo + aot_autograd tracing (the graph then runs in torch)
    first["dynamo+aot floor"], _ = timed_first_call(torch.compile(own_code(model), backend=TRACE_ONLY), args)

    try:
        start = time.perf_counter()
        aot = ortlite.compile(_FirstOutput(model), args, options=options)
        first["ortlite AOT"] = time.perf_counter() - start + timed_first_call(aot, args)[0]
        torch.testing.assert_close(first_output(aot(*args)), expected, rtol=1e-3, atol=1e-3)
        candidates["ortlite AOT"] = aot
    except Exception as e:  # the AOT path needs every op in ONNX
        notes["ortlite AOT"] = f"not compiled: {type(e).__name__}: {str(e).splitlines()[0][:160]}"

    try:
        if device != "cpu":
            raise NotImplementedError("the export+ORT peer runs on CPU only here")
        start = time.perf_counter()
        peer = export_ort(model, args)
        first["export+ORT"] = time.perf_counter() - start + timed_first_call(peer, args)[0]
        torch.testing.assert_close(peer(*args), expected, rtol=1e-3, atol=1e-3)
        candidates["export+ORT"] = peer
    except Exception as e:  # onnxscript not installed, or the exporter failed on this model
        notes["export+ORT"] = f"not run: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"

    if with_inductor:
        inductor = torch.compile(own_code(model), backend="inductor")
        first["inductor"], out = timed_first_call(inductor, args)
        candidates["inductor"] = inductor

    if with_precision:  # reduced precision in the same rounds (docs/reduced-precision.md)
        reference = expected.double().flatten()
        for mode in ("int8", "int4"):
            quantized = ortlite.compile(_FirstOutput(model), args, options=options.with_changes(quantize=mode))
            candidates[f"ortlite AOT {mode}"] = quantized
            notes[f"1-cos AOT {mode}"] = float(1 - torch.nn.functional.cosine_similarity(quantized(*args).double().flatten(), reference, dim=0))
        bf16 = copy.deepcopy(model).to(torch.bfloat16)
        candidates["eager bf16"] = bf16
        if with_inductor:
            with torch._inductor.config.patch(freezing=True):
                inductor_bf16 = torch.compile(own_code(copy.deepcopy(bf16)), backend="inductor")
                first["inductor bf16"], _ = timed_first_call(inductor_bf16, args)
            candidates["inductor bf16"] = inductor_bf16

    def block(call):
        start = time.perf_counter()
        for _ in range(iters):
            call()
        synchronize()
        return (time.perf_counter() - start) / iters * 1e3

    samples = interleaved({name: (lambda c=c: c(*args)) for name, c in candidates.items()}, rounds, block)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    # each against eager in the same round, then the median over rounds
    ratios = {name: statistics.median(c / e for c, e in zip(samples[name], samples["eager"])) for name in samples if name != "eager"}
    return label, medians, ratios, first, notes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--no-dynamic", action="store_true", help="skip the dynamic=True candidate")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", action="store_true", help="also ortlite AOT int8/int4, eager bf16 and inductor bf16 (freezing)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # Dynamo's one-time imports
    results, failed = [], []
    with torch.no_grad():
        for key in args.models.split(","):
            try:
                label, medians, ratios, first, notes = bench_model(
                    MODELS[key], args.rounds, args.iters, not args.no_inductor, not args.no_dynamic, None, args.device, args.precision
                )
            except Exception as e:  # one model's failure (a mismatch with eager, a crash) must not hide the others'
                print(f"{key}: FAILED: {type(e).__name__}: {e}", flush=True)
                failed.append(key)
                continue
            results.append({"model": label, "latency_ms": medians, "vs_eager": ratios, "first_call_s": first, "notes": notes})
            print(f"{label}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in medians.items()), flush=True)

    names = ["eager", "inductor", "export+ORT", "ortlite", "ortlite unfrozen", "ortlite dynamic", "ortlite AOT"]
    if args.precision:
        names += ["ortlite AOT int8", "ortlite AOT int4", "eager bf16", "inductor bf16"]
    print(f"\nlatency, ms (median of {args.rounds} interleaved rounds x {args.iters} calls; 1 thread; no_grad; {args.device})")
    print(f"{'model':<26}" + "".join(f"{n:>17}" for n in names))
    for r in results:
        print(f"{r['model']:<26}" + "".join(f"{r['latency_ms'][n]:>17.2f}" if n in r["latency_ms"] else f"{'-':>17}" for n in names))
    print("\nagainst eager (median over rounds of each round's ratio); target: ortlite/eager <= 1.15 x AOT/eager")
    print(f"{'model':<26}" + "".join(f"{n + '/eager':>23}" for n in names[1:]) + f"{'(ortlite/eager)/(AOT/eager)':>30}")
    for r in results:
        v = r["vs_eager"]
        target = f"{v['ortlite'] / v['ortlite AOT']:>30.2f}" if "ortlite AOT" in v else f"{'-':>30}"
        print(f"{r['model']:<26}" + "".join(f"{v[n]:>23.2f}" if n in v else f"{'-':>23}" for n in names[1:]) + target)
    print("\nortlite AOT against the peers (each against eager in the same rounds); targets: <= 0.9 x export+ORT, <= 0.7 x inductor")
    for r in results:
        v = r["vs_eager"]
        peers = [f"AOT/{p} {v['ortlite AOT'] / v[p]:.2f}" for p in ("export+ORT", "inductor") if p in v and "ortlite AOT" in v]
        print(f"  {r['model']}: " + ("; ".join(peers) or "-"))
    print("\nfirst call (compile + run), s")
    for r in results:
        print(f"  {r['model']}: " + "; ".join(f"{k} {v:.2f}" for k, v in r["first_call_s"].items()))
    print("\nnotes")
    for r in results:
        print(f"  {r['model']}: {r['notes']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
