"""One round of ortlite's AOT decode loop for bench/generate.py in a process of its own, as
genai runs (bench/genai/genai_worker.py): loads the steps bench/generate.py saved
(ortlite.load of <dir>/prompt.onnx, and <dir>/decode.onnx where the step has a one-token
graph), runs each once untimed, then `--reps` timed generations each with
ortlite.decode.generate (greedy, batch 1, all new tokens). One thread. Prints one JSON line:
precision -> {tokens, prefill_ms, decode_ms}, timed as bench/generate.py times the others.

    python bench/aot_worker.py --steps f32=DIR,int8=DIR --prompt 3,17,... [--new-tokens 64]
"""

import argparse
import json
import os
import statistics
import time

import torch

import ortlite
import ortlite.decode


def load(folder: str) -> ortlite.decode.StaticCacheStep:
    prompt = ortlite.load(os.path.join(folder, "prompt.onnx"))
    decode = os.path.join(folder, "decode.onnx")
    return ortlite.decode.StaticCacheStep(prompt, ortlite.load(decode) if os.path.exists(decode) else None)


def run(step, ids: torch.Tensor, new_tokens: int):
    t = [time.perf_counter()]
    tokens = ortlite.decode.generate(step, ids, new_tokens, on_token=lambda: t.append(time.perf_counter()))
    return tokens[0].tolist(), (t[1] - t[0]) * 1000, (t[-1] - t[1]) * 1000 / (len(t) - 2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", required=True, help="comma-separated precision=folder")
    p.add_argument("--prompt", required=True, help="comma-separated token ids")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    ids = torch.tensor([[int(t) for t in a.prompt.split(",")]])
    out = {}
    with torch.no_grad():
        for item in a.steps.split(","):
            precision, folder = item.split("=", 1)
            step = load(folder)
            tokens, *_ = run(step, ids, a.new_tokens)  # untimed
            prefill, decode = [], []
            for _ in range(a.reps):
                again, p_ms, d_ms = run(step, ids, a.new_tokens)
                assert again == tokens, precision
                prefill.append(p_ms)
                decode.append(d_ms)
            out[precision] = dict(tokens=tokens, prefill_ms=statistics.median(prefill), decode_ms=statistics.median(decode))
            del step
    print(json.dumps(out))


if __name__ == "__main__":
    main()
