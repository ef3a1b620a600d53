"""Reduced precision (Options(quantize=...), issue 31): ortlite float32 / int8 / int4 against
inductor bf16 (freezing) and eager bf16, in one process, 1 thread, rounds interleaved, medians.

    python bench/precision.py [--rounds 9] [--iters 10] [--models bert,llama-decode]

bert: BertModel h512 L4, 128 tokens, batch 1 (the pooler included). llama-decode: a LLaMA-style
causal LM h512 L4 (8 heads, 4 KV heads, MLP 1376), vocab 32000, logits of a 1-token call
(no KV cache: the decode shape of the weight products). Random weights (transformers configs).
ortlite rows are ortlite.compile; "ortlite tc int8" is torch.compile(backend=ortlite) with
frozen weights under no_grad, "ortlite tc int8 bf16" the same of the bfloat16 model (float32
inside, called in bfloat16). Error: 1 - cosine of the output against eager float32.
bench/tc_stages.py splits the "ortlite tc int8" row's time by stage (Dynamo, aot_autograd, runner).
Convolution networks in int8 (calibrated static quantization) against inductor bf16, PT2E int8
and ONNX Runtime's quantize_static: bench/precision_vision.py (torchvision: a venv of its own).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

import ortlite  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from overhead import interleaved, per_call_us  # noqa: E402


def bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048)
    return "BERT h512 L4, 128 tokens", _First(BertModel(config)).eval(), (torch.randint(0, 30522, (1, 128)),)


def llama_decode():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, vocab_size=32000
    )
    return "LLaMA h512 L4 vocab 32000, 1 token", _Logits(LlamaForCausalLM(config)).eval(), (torch.randint(0, 32000, (1, 1)),)


class _First(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


class _Logits(_First):
    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


MODELS = {"bert": bert, "llama-decode": llama_decode}


def candidates(model, args) -> dict:
    import copy

    import torch._inductor.config as inductor_config

    made = {}
    for mode in (None, "int8", "int4"):
        made[f"ortlite {mode or 'f32'}"] = ortlite.compile(model, args, options={"quantize": mode})
    tc = torch.compile(model, backend=ortlite.Backend(ortlite.Options(quantize="int8")))
    made["ortlite tc int8"] = tc
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    made["eager bf16"] = bf16
    # a bfloat16 model under torch.compile with quantize: float32 inside (ortlite.widen), called in bfloat16
    made["ortlite tc int8 bf16"] = torch.compile(copy.deepcopy(bf16), backend=ortlite.Backend(ortlite.Options(quantize="int8")))
    inductor_config.freezing = True
    made["inductor bf16"] = torch.compile(copy.deepcopy(bf16))
    return made


def run(name, model, args, rounds, iters):
    with torch.no_grad():
        expected = model(*args).double()
        made = candidates(model, args)
        errors = {k: 1 - float(torch.nn.functional.cosine_similarity(f(*args).double().flatten(), expected.flatten(), dim=0)) for k, f in made.items()}
        samples = interleaved({k: (lambda f=f: f(*args)) for k, f in made.items()}, rounds, lambda call: per_call_us(call, iters, lambda: None))
    medians = {k: statistics.median(v) / 1000 for k, v in samples.items()}
    f32, bf16 = medians["ortlite f32"], medians["inductor bf16"]
    print(f"\n{name} (1 thread, {rounds} interleaved rounds of {iters} calls, medians)")
    print(f"| {'candidate':16} | ms | x ortlite f32 | x inductor bf16 | 1 - cos vs eager f32 |")
    print("|---|---|---|---|---|")
    for k, ms in medians.items():
        print(f"| {k:16} | {ms:.2f} | {ms / f32:.2f} | {ms / bf16:.2f} | {errors[k]:.1e} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="bert,llama-decode")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}, ortlite {ortlite.__file__}")
    for key in args.models.split(","):
        name, model, inputs = MODELS[key]()
        run(name, model, inputs, args.rounds, args.iters)


if __name__ == "__main__":
    main()
