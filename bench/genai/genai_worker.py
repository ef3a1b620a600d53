"""One round of onnxruntime-genai for bench/generate.py, in a process (and venv) of its own:
loads the models build_genai.sh made (<hf>-genai-<precision>), sets one intra-op thread in
each genai_config.json, runs each once untimed, then `--reps` timed generations each
(greedy, batch 1, min_length = max_length so all new tokens run). Prints one JSON line:
precision -> {tokens, prefill_ms, decode_ms}: prefill = append_tokens + the first
generate_next_token (which only selects: append_tokens computed the prompt's logits), decode
= (last token - first token) / (n - 1), as bench/generate.py times the other candidates.

    .genai-venv/bin/python bench/genai/genai_worker.py --hf DIR --prompt 3,17,... [--precisions fp32,int8,int4]
"""

import argparse
import json
import os
import statistics
import time

import onnxruntime_genai as og

p = argparse.ArgumentParser()
p.add_argument("--hf", required=True)
p.add_argument("--prompt", required=True, help="comma-separated token ids")
p.add_argument("--precisions", default="fp32")
p.add_argument("--new-tokens", type=int, default=64)
p.add_argument("--reps", type=int, default=1)
a = p.parse_args()

prompt = [int(t) for t in a.prompt.split(",")]
max_length = len(prompt) + a.new_tokens


def load(precision):
    path = f"{a.hf}-genai-{precision}"
    cfg_path = os.path.join(path, "genai_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    so = cfg["model"]["decoder"]["session_options"]
    if so.get("intra_op_num_threads") != 1 or so.get("inter_op_num_threads") != 1:
        so["intra_op_num_threads"] = so["inter_op_num_threads"] = 1
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=4)
    return og.Model(path)


def run(model):
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length, min_length=max_length, batch_size=1)
    gen = og.Generator(model, params)
    t = [time.perf_counter()]
    gen.append_tokens(prompt)
    tokens = []
    while not gen.is_done():
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
        t.append(time.perf_counter())
    return tokens, (t[1] - t[0]) * 1000, (t[-1] - t[1]) * 1000 / (len(tokens) - 1)


out = {}
for precision in a.precisions.split(","):
    model = load(precision)
    tokens, *_ = run(model)  # untimed
    prefill, decode = [], []
    for _ in range(a.reps):
        again, p_ms, d_ms = run(model)
        assert again == tokens, precision
        prefill.append(p_ms)
        decode.append(d_ms)
    out[precision] = dict(tokens=tokens, prefill_ms=statistics.median(prefill), decode_ms=statistics.median(decode))
    del model
out["versions"] = dict(onnxruntime_genai=og.__version__)
print(json.dumps(out))
