"""Build a random-weight LLaMA-style model from a transformers config and save_pretrained it
(with a stand-in WordLevel tokenizer of the same vocab, which genai's model builder copies).

    python make_model.py --out models/h512 --hidden 512 --layers 6 --intermediate 1408
"""
import argparse

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--layers", type=int, default=6)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--intermediate", type=int, default=1408)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

torch.manual_seed(a.seed)
config = transformers.LlamaConfig(
    vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
    num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=2048,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, torch_dtype="float32",
)
model = transformers.LlamaForCausalLM(config).eval()
# config's default init (std 0.02) gives near-uniform logits; keep it (greedy is still deterministic)
model.save_pretrained(a.out, safe_serialization=True)

vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
vocab.update({f"t{i}": i for i in range(3, a.vocab)})
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>")
fast.save_pretrained(a.out)
print("saved", a.out, sum(p.numel() for p in model.parameters()) / 1e6, "M params")
