"""Decode loops, token by token, against ONNX Runtime's own (onnxruntime-genai), in one run.

The model: a LLaMA-style LlamaForCausalLM with random weights saved by save_pretrained
(bench/genai/make_model.py: hidden 512, 6 layers, 8 heads, 2 kv heads, intermediate 1408,
vocab 32000, untied LM head), made on first use. Batch 1, one thread, greedy, a 32-token
prompt (torch.manual_seed(0); randint(3, 32000)), 64 new tokens. Candidates:

  HF eager f32             model.generate, DynamicCache
  HF inductor, static      model.forward compiled by inductor, cache_implementation="static"
  HF ortlite, dynamic      model.forward compiled with backend=ortlite, DynamicCache
  HF ortlite, static       the same, cache_implementation="static"
  ortlite AOT [prec]       ortlite.compile of a decode step (transformers'
                           TorchExportableModuleWithStaticCache, exported strict, sequence length
                           dynamic) and ortlite.decode.generate's loop; f32, and int8/int4 with
                           Options(quantize=...) where --precisions asks
  ortlite AOT [prec], own process
                           the same steps saved, and loaded by ortlite.load in a process of their
                           own (bench/aot_worker.py), one process per round: as genai runs
  genai [prec]             onnxruntime-genai on the same saved folder, built by its model builder
                           (bench/genai/build_genai.sh), in a venv and a process of its own
                           (bench/genai/genai_worker.py), one process per round

Each round runs every candidate twice, an untimed run right before the timed one, in an order
shuffled per round (the worker processes at their place in it, each with its own untimed run);
medians over rounds. The untimed run matters: a loop that has been idle (another candidate's
turn, or only a 0.5 s sleep) runs its first ~16 tokens ~20% slower (caches refilled), which
made every in-process candidate 5-10% slower per token than the same loop warm. Prefill: from
the call to the first new token; decode: ms per token over the other 63. Tokens are compared with HF eager f32's, all 64.
Recompiles: Dynamo graphs compiled during the timed rounds (after each candidate's warm-up).

    python bench/generate.py [--rounds 5] [--precisions f32,int8,int4] [--only 'AOT|genai']
    python bench/generate.py --rss-steps 2000     # RSS of the AOT step loop over 2,000 steps
    python bench/generate.py --only 'AOT|genai' --huge-pages   # the AOT worker on huge pages too

genai needs .genai-venv (see bench/genai/README.md); without it genai is skipped, with the reason.
"""

from __future__ import annotations

import argparse
import gc
import functools
import json
import os
import random
import re
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from transformers.generation.streamers import BaseStreamer

import ortlite
import ortlite.decode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aot_worker import run as aot_worker_run  # noqa: E402 (the worker times its loop as this process does)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PRECISION_NAMES = {"f32": "fp32", "int8": "int8", "int4": "int4"}  # ours -> genai's builder's


class Stamps(BaseStreamer):
    """generate's streamer: a time stamp at the prompt (the start) and at each new token."""

    def __init__(self):
        self.t = []

    def put(self, value):
        self.t.append(time.perf_counter())

    def end(self):
        pass


def ensure_model(folder: str, genai_python: str | None) -> None:
    """The saved model folder (make_model.py) and genai's builds of it (build_genai.sh)."""
    if not os.path.exists(os.path.join(folder, "config.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "genai", "make_model.py"), "--out", folder], check=True)
    if genai_python and not all(os.path.exists(f"{folder}-genai-{p}/genai_config.json") for p in PRECISION_NAMES.values()):
        env = dict(os.environ, GENAI_PY=genai_python)
        subprocess.run(["bash", os.path.join(HERE, "genai", "build_genai.sh"), folder], check=True, env=env)


def hf_candidate(model, forward, new_tokens, **generate_kwargs):
    """A call running model.generate with model.forward = forward: (tokens, prefill ms, decode ms/token)."""

    def call(ids):
        model.forward = forward
        stamps = Stamps()
        out = model.generate(
            ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=stamps, **generate_kwargs
        )
        t = stamps.t
        return out[0, ids.shape[1] :].tolist(), (t[1] - t[0]) * 1000, (t[-1] - t[1]) * 1000 / (len(t) - 2)

    return call


def aot_candidate(step, new_tokens):
    return lambda ids: aot_worker_run(step, ids, new_tokens)


def aot_step(model, max_cache_len: int, prompt_len: int, options=None):
    """ortlite.compile of transformers' exportable static-cache step (of the eager forward:
    the HF candidates set model.forward to theirs)."""
    if "forward" in vars(model):
        del model.forward
    return ortlite.decode.compile_static_cache_step(model, max_cache_len, example_length=prompt_len, options=options)


class Worker:
    """A candidate in a process of its own, one per round: cmd prints one JSON line, key ->
    {tokens, prefill_ms, decode_ms} (and "versions"); rows: key -> the row's name."""

    def __init__(self, cmd: list, rows: dict, env: dict | None = None):
        self.cmd, self.rows, self.version = cmd, rows, None
        self.env = None if env is None else dict(os.environ, **env)

    def __call__(self) -> dict:
        out = subprocess.run(self.cmd, check=True, capture_output=True, text=True, env=self.env).stdout
        result = json.loads(out.strip().splitlines()[-1])
        self.version = result.pop("versions", None)
        return {row: result[key] for key, row in self.rows.items()}


def genai_peer(python: str, folder: str, prompt: list, precisions: list, new_tokens: int) -> Worker:
    """onnxruntime-genai (all precisions asked for)."""
    cmd = [
        python, os.path.join(HERE, "genai", "genai_worker.py"), "--hf", folder, "--prompt", ",".join(map(str, prompt)),
        "--precisions", ",".join(PRECISION_NAMES[p] for p in precisions), "--new-tokens", str(new_tokens),
    ]  # fmt: skip
    return Worker(cmd, {PRECISION_NAMES[p]: f"genai {p}" for p in precisions})


def save_steps(steps: dict, folder: str) -> None:
    """precision -> StaticCacheStep, saved as folder/<precision>/prompt.onnx (and decode.onnx)."""
    for precision, step in steps.items():
        os.makedirs(os.path.join(folder, precision))
        step.prompt.save(os.path.join(folder, precision, "prompt.onnx"))
        if step.decode is not None:
            step.decode.save(os.path.join(folder, precision, "decode.onnx"))


def aot_worker(steps: dict, folder: str, prompt: list, new_tokens: int, huge_pages: bool = False) -> Worker:
    """ortlite's AOT steps saved under folder (save_steps), loaded by ortlite.load in the
    worker's process; huge_pages: glibc's allocations on transparent huge pages (its
    glibc.malloc.hugetlb=1 tunable, set before the process starts)."""
    cmd = [
        sys.executable, os.path.join(HERE, "aot_worker.py"), "--prompt", ",".join(map(str, prompt)), "--new-tokens", str(new_tokens),
        "--steps", ",".join(f"{p}={os.path.join(folder, p)}" for p in steps),
    ]  # fmt: skip
    if not huge_pages:
        return Worker(cmd, {p: f"ortlite AOT {p}, own process" for p in steps})
    return Worker(cmd, {p: f"ortlite AOT {p}, own process, huge pages" for p in steps}, env={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})


def copy_of(function, tag: str):
    """function behind a code object of its own (Dynamo keeps its entries per code object)."""

    def forward(*args, **kwargs):
        return function(*args, **kwargs)

    forward.__code__ = forward.__code__.replace(co_name=f"forward_{tag}")
    return forward


def per_step_split(model, eager, compiled, ids, new_tokens: int, rounds: int) -> dict:
    """Where HF generate's time per token goes with forward compiled by ortlite (static cache),
    each part measured on its own, medians of interleaved rounds, ms:
      generate alone: generate per token with a forward that returns fixed logits at once
      Dynamo + aot_autograd: a call of forward compiled with a backend returning the graph's
        first outputs (no computing), the decode step's arguments
      forward, ortlite: a call of the compiled forward on the same arguments (Dynamo, aot_autograd
        and ortlite's graph)
    The decode step's arguments are those generate passed at its second token; the cache's
    lengths are set back before each call (a few µs, in every figure)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from transformers.modeling_outputs import CausalLMOutputWithPast

    seen = []

    def recorder(*a, **k):
        if k.get("input_ids") is not None and k["input_ids"].shape[1] == 1 and not seen:
            cache = k.get("cache", k.get("past_key_values"))
            seen.append((dict(k), [(layer.cumulative_length, int(layer.cumulative_length)) for layer in cache.layers]))
        return eager(*a, **k)

    def generate_ms(forward):
        model.forward = forward
        stamps = Stamps()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, streamer=stamps, cache_implementation="static")
        return (stamps.t[-1] - stamps.t[1]) * 1000 / (len(stamps.t) - 2)

    def constant_backend(gm, example_inputs):
        def compiler(graph, _):
            kept = []

            def run(*args):
                args = tuple(args[0]) if len(args) == 1 and isinstance(args[0], list) else args
                if not kept:
                    kept.append(graph(*args))
                return kept[0]

            return make_boxed_func(run)

        return aot_autograd(fw_compiler=compiler)(gm, example_inputs)

    with torch.no_grad():
        generate_ms(recorder)
        kwargs, lengths = seen[0]
        logits = torch.zeros(1, 1, model.config.vocab_size)

        def fake(*a, **k):
            return CausalLMOutputWithPast(logits=logits, past_key_values=k.get("cache", k.get("past_key_values")))

        floor = torch.compile(copy_of(eager, "floor"), backend=constant_backend)

        def call_ms(fn, n=30):
            for _ in range(3):
                for t, v in lengths:
                    t.fill_(v)
                fn(**kwargs)
            start = time.perf_counter()
            for _ in range(n):
                for t, v in lengths:
                    t.fill_(v)
                fn(**kwargs)
            return (time.perf_counter() - start) * 1000 / n

        parts = {"generate alone (fixed logits)": lambda: generate_ms(fake),
                 "Dynamo + aot_autograd (backend returning constants)": lambda: call_ms(floor, 200),
                 "forward call, ortlite (Dynamo + aot_autograd + graph)": lambda: call_ms(compiled)}
        samples = {name: [] for name in parts}
        order = list(parts)
        for r in range(rounds):
            random.Random(r).shuffle(order)
            for name in order:
                samples[name].append(parts[name]())
    return {name: statistics.median(v) for name, v in samples.items()}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_run(model, prompt, steps: int, new_tokens: int) -> None:
    """The AOT f32 step loop for `steps` decode steps (generations of new_tokens in turn):
    RSS after each generation, and the cache buffers' data pointers before and after."""
    step = aot_step(model, len(prompt) + new_tokens, len(prompt))
    ids = torch.tensor([prompt])
    pointers = [t.data_ptr() for t in ortlite.decode.cache_tensors(step)]
    samples, done = [], 0
    while done < steps:
        ortlite.decode.generate(step, ids, new_tokens)
        done += new_tokens - 1
        gc.collect()
        samples.append((done, rss_mb()))
    print(f"RSS over {done} decode steps (MB, after each generation of {new_tokens} tokens):")
    print("  " + ", ".join(f"{n}: {mb:.1f}" for n, mb in samples[:: max(1, len(samples) // 12)]))
    first, last = samples[min(2, len(samples) - 1)][1], samples[-1][1]
    print(f"  growth from generation 3 to the last: {last - first:+.2f} MB; cache data pointers unchanged: {pointers == [t.data_ptr() for t in ortlite.decode.cache_tensors(step)]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=os.path.join(HERE, "results", "models", "h512"))
    parser.add_argument("--genai-venv", default=os.path.join(ROOT, ".genai-venv"))
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precisions", default="f32", help="comma-separated: f32, int8, int4 (AOT and genai)")
    parser.add_argument("--only", default=None, help="regular expression: the candidates to run (HF eager always runs)")
    parser.add_argument("--rss-steps", type=int, default=0, help="only measure RSS of the AOT loop over this many steps")
    parser.add_argument(
        "--own-process", action=argparse.BooleanOptionalAction, default=True,
        help="also run the AOT steps, saved and loaded, in a process of their own (bench/aot_worker.py)",
    )  # fmt: skip
    parser.add_argument(
        "--huge-pages", action="store_true",
        help="also run the AOT worker with glibc's allocations on transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    precisions = args.precisions.split(",")
    genai_python = os.path.join(args.genai_venv, "bin", "python")
    why_no_genai = None
    if not os.path.exists(genai_python):
        why_no_genai = f"no venv at {args.genai_venv} (bench/genai/README.md says how to make it)"
        genai_python = None
    ensure_model(args.model_dir, genai_python)

    torch.manual_seed(0)
    prompt = torch.randint(3, 32000, (args.prompt,)).tolist()
    ids = torch.tensor([prompt])
    model = transformers.LlamaForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval().requires_grad_(False)
    if args.rss_steps:
        with torch.no_grad():
            rss_run(model, prompt, args.rss_steps, args.new_tokens)
        return

    eager = model.forward
    static_forward = torch.compile(copy_of(eager, "static"), backend=ortlite.Backend())
    counters = torch._dynamo.utils.counters
    static = dict(cache_implementation="static")
    # The AOT steps first: torch.export (strict) resets Dynamo's caches, which would make every
    # torch.compile candidate compiled before it compile again in the timed rounds.
    makers, steps = {}, {}

    def aot(precision):
        options = None if precision == "f32" else {"quantize": precision}
        steps[precision] = aot_step(model, args.prompt + args.new_tokens, args.prompt, options)
        return aot_candidate(steps[precision], args.new_tokens)

    for precision in precisions:
        makers[f"ortlite AOT {precision}"] = functools.partial(aot, precision)
    makers.update({
        "HF eager f32": lambda: hf_candidate(model, eager, args.new_tokens),
        "HF inductor f32, static cache": lambda: hf_candidate(model, torch.compile(copy_of(eager, "inductor")), args.new_tokens, **static),
        "HF ortlite f32, dynamic cache": lambda: hf_candidate(
            model, torch.compile(copy_of(eager, "dynamic"), backend=ortlite.Backend()), args.new_tokens
        ),
        "HF ortlite f32, static cache": lambda: hf_candidate(model, static_forward, args.new_tokens, **static),
    })
    only = re.compile(args.only) if args.only else None
    makers = {name: make for name, make in makers.items() if name == "HF eager f32" or only is None or only.search(name)}
    workers = {}
    if genai_python and (only is None or only.search("genai")):
        workers["genai"] = genai_peer(genai_python, args.model_dir, prompt, precisions, args.new_tokens)
    elif why_no_genai:
        print(f"genai skipped: {why_no_genai}")
    saved = tempfile.mkdtemp(prefix="ortlite-aot-steps-")

    results = {}  # name -> dict(tokens, prefill, decode, graphs, recompiles, compile_s)
    with torch.no_grad():
        for name, make in makers.items():
            graphs = counters["stats"]["unique_graphs"]
            start = time.perf_counter()
            call = make()
            tokens, *_ = call(ids)
            call(ids)  # a second warm-up: the static cache's first decode steps, automatic dynamic
            results[name] = dict(
                call=call, tokens=tokens, prefill=[], decode=[], recompiles=0, compile_s=time.perf_counter() - start,
                graphs=counters["stats"]["unique_graphs"] - graphs,
            )  # fmt: skip
            print(f"warm: {name} ({results[name]['compile_s']:.1f} s)", flush=True)
        if steps and (args.own_process or args.huge_pages):
            save_steps(steps, saved)
        if steps and args.own_process:
            workers["ortlite AOT"] = aot_worker(steps, saved, prompt, args.new_tokens)
        if steps and args.huge_pages:
            workers["ortlite AOT, huge pages"] = aot_worker(steps, saved, prompt, args.new_tokens, huge_pages=True)
        order = list(results) + list(workers)
        rng = random.Random(0)
        for r in range(args.rounds):
            rng.shuffle(order)
            for name in order:
                if name in workers:
                    for row, got in workers[name]().items():
                        entry = results.setdefault(row, dict(tokens=got["tokens"], prefill=[], decode=[], graphs=None))
                        assert entry["tokens"] == got["tokens"], f"{row}: tokens changed between runs"
                        entry["prefill"].append(got["prefill_ms"])
                        entry["decode"].append(got["decode_ms"])
                    continue
                graphs = counters["stats"]["unique_graphs"]
                results[name]["call"](ids)  # untimed, right before, as the workers do (see the module's doc)
                tokens, prefill, decode = results[name]["call"](ids)
                results[name]["recompiles"] += counters["stats"]["unique_graphs"] - graphs
                assert tokens == results[name]["tokens"], f"{name}: tokens changed between runs"
                results[name]["prefill"].append(prefill)
                results[name]["decode"].append(decode)
            print(f"round {r + 1}/{args.rounds}", flush=True)
    shutil.rmtree(saved)

    reference = results["HF eager f32"]["tokens"]
    genai_ms = {p: statistics.median(results[f"genai {p}"]["decode"]) for p in precisions if f"genai {p}" in results}
    genai_version = workers["genai"].version if "genai" in workers else None
    print()
    print(
        f"LLaMA h512 L6 (8 heads, 2 kv heads, vocab 32000, random weights), batch 1, prompt {args.prompt}, "
        f"{args.new_tokens} new tokens, 1 thread, {args.rounds} rounds, medians; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, onnxruntime {ortlite_ort_version()}"
        + (f", onnxruntime-genai {genai_version['onnxruntime_genai']}" if genai_version else "")
    )
    header = (
        "| candidate | decode ms/token | x genai f32 | x genai same precision | prefill ms | x genai's prefill | tokens = eager f32 "
        "| Dynamo graphs: warm-up, timed rounds |"
    )
    print(header)
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        decode, prefill = statistics.median(r["decode"]), statistics.median(r["prefill"])
        same = sum(a == b for a, b in zip(r["tokens"], reference))
        precision = next((p for p in ("int8", "int4") if p in name), "f32")
        peer = results.get(f"genai {precision}")
        ratios = [
            f"{decode / genai_ms['f32']:.2f}" if "f32" in genai_ms else "-",
            f"{decode / genai_ms[precision]:.2f}" if precision in genai_ms else "-",
        ]
        prefill_ratio = f"{prefill / statistics.median(peer['prefill']):.2f}" if peer else "-"
        graphs = "-" if r.get("graphs") is None else f"{r['graphs']}, {r['recompiles']}"
        print(f"| {name} | {decode:.2f} | {' | '.join(ratios)} | {prefill:.1f} | {prefill_ratio} | {same}/{len(reference)} | {graphs} |")
    if "HF ortlite f32, static cache" in results:
        with torch.no_grad():
            split = per_step_split(model, eager, static_forward, ids, args.new_tokens, args.rounds)
        print("HF generate + ortlite f32, static cache, per token (each part on its own, ms):")
        for name, ms in split.items():
            print(f"  {name}: {ms:.2f}")
    for precision in ("int8", "int4"):
        ours, theirs = results.get(f"ortlite AOT {precision}"), results.get(f"genai {precision}")
        if ours and theirs:
            agree = sum(a == b for a, b in zip(ours["tokens"], theirs["tokens"]))
            print(f"{precision}: ortlite AOT tokens = genai's {agree}/{len(reference)}")


def ortlite_ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    main()
