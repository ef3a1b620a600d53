"""HuggingFace generate with model.forward compiled: a LLaMA-style model from a config
(random weights), a padded batch, a DynamicCache growing every step, so the sequence
length changes at every call. Checks the tokens equal eager's, counts graphs and
recompiles, and times ms per generated token (medians of interleaved rounds in shuffled
order, 1 thread).

    python bench/generate.py [--hidden 256 --layers 4 --new-tokens 32 --rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time

import torch
import transformers

import ortlite
from overhead import interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=args.hidden, intermediate_size=args.hidden * 4, num_hidden_layers=args.layers,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512, pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 1000, (args.batch, args.prompt))
    mask = torch.ones_like(ids)
    mask[-1, : args.prompt // 4] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    eager_forward = model.forward
    backend = ortlite.Backend()
    compiled_forward = torch.compile(model.forward, backend=backend)
    copies = itertools.count()

    def copy(**options):
        """model.forward behind a code object of its own (Dynamo keeps entries per code)."""

        def forward(*args, **kwargs):
            return eager_forward(*args, **kwargs)

        forward.__code__ = forward.__code__.replace(co_name=f"forward_{next(copies)}")
        return torch.compile(forward, backend=ortlite.Backend(ortlite.Options(**options)))

    # The default, Options.size_constants=True: sizes change at every step here, so each call
    # computes its size constants anew (see the option's doc for where it pays); the other
    # candidate turns it off. A graph compiled later in a process ran up to 10% faster on
    # these machines: each variant is compiled twice, in opposite orders, and timed as the
    # mean of both.
    candidates = {
        "eager": eager_forward,
        "ortlite": compiled_forward,
        "ortlite, no size constants": copy(size_constants=False),
        "ortlite, no size constants (2)": copy(size_constants=False),
        "ortlite (2)": copy(),
    }

    def generate(forward):
        model.forward = forward
        return model.generate(ids, **kwargs)

    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        start = time.perf_counter()
        tokens = {name: generate(fn) for name, fn in candidates.items()}
        first_call_s = time.perf_counter() - start

        def block(call):
            start = time.perf_counter()
            call()
            return (time.perf_counter() - start) * 1000 / args.new_tokens

        times = interleaved({name: functools.partial(generate, fn) for name, fn in candidates.items()}, args.rounds, block)
    counters = torch._dynamo.utils.counters
    print(f"LLaMA h{args.hidden} L{args.layers}, batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens, 1 thread")
    print(f"same tokens as eager: {all(torch.equal(tokens['eager'], t) for t in tokens.values())}")
    print(f"Dynamo graphs: {counters['stats']['unique_graphs']}, ortlite {backend.stats}")
    print(f"first generate (all candidates, with compiles): {first_call_s:.1f} s")
    medians = {name: statistics.median(values) for name, values in times.items()}
    print({k: round(v, 2) for k, v in medians.items()})
    for name in [n for n in medians if not n.endswith(" (2)")]:
        median = (medians[name] + medians[f"{name} (2)"]) / 2 if f"{name} (2)" in medians else medians[name]
        print(f"{name:>28}: {median:.2f} ms/token  ({median / medians['eager']:.2f}x eager)")


if __name__ == "__main__":
    main()
