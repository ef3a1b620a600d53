"""bench/arch_sweep.py: its small configs keep every kind of layer of the defaults within the
small sizes, and one architecture's row (a subprocess, as the sweep runs each) has its fields,
with llama right and whole on both entry points."""

import json
import os
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "bench", "arch_sweep.py")
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import arch_sweep  # noqa: E402


def _small(model_type):
    if model_type not in arch_sweep.model_types():
        pytest.skip(f"this transformers has no {model_type}")
    transformers.logging.set_verbosity_error()
    return arch_sweep.small_config(model_type)


def test_deepseek_v3_keeps_a_dense_and_a_moe_layer_and_its_mla_sizes():
    c = _small("deepseek_v3")  # defaults: 61 layers, the first 3 dense, 256 experts, MLA
    assert c.num_hidden_layers == 2 and c.first_k_dense_replace == 1
    assert c.n_routed_experts == arch_sweep.EXPERTS and c.num_experts_per_tok == arch_sweep.TOP_K
    assert c.n_routed_experts % c.n_group == 0 and c.topk_group <= c.n_group
    assert c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim
    assert c.hidden_size == arch_sweep.HIDDEN and c.vocab_size == arch_sweep.VOCAB


def test_layer_kinds_are_kept_and_lists_match_the_layer_count():
    c = _small("qwen3_next")  # linear attention three layers in four, full in the fourth
    assert set(c.layer_types) == {"linear_attention", "full_attention"}
    assert len(c.layer_types) == c.num_hidden_layers <= 4
    c = _small("gemma3_text")  # sliding windows and global layers
    assert set(c.layer_types) == {"sliding_attention", "full_attention"} and len(c.layer_types) == c.num_hidden_layers
    assert c.sliding_window < 12  # shorter than the sweep's sequence


def test_token_ids_fit_the_small_vocabulary():
    c = _small("gemma3")  # a composite config: image tokens at the top of a 262k vocabulary
    text = c.get_text_config()
    for name in ("boi_token_index", "eoi_token_index", "image_token_index"):
        assert 0 <= getattr(c, name) < text.vocab_size == arch_sweep.VOCAB


@pytest.mark.slow
def test_one_architecture_row():
    done = subprocess.run([sys.executable, SCRIPT, "--one", "llama"], capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert rows, done.stderr[-2000:]
    row = rows[-1]
    for field in ("build", "eager", "moe", "tc_right", "tc_whole", "tc_graphs", "tc_fallback", "dyn_right", "dyn_graphs", "aot_right", "tc_seconds", "aot_seconds"):
        assert field in row, field
    assert row["step"] == "done" and row["build"] == "ok" and row["eager"] == "ok" and row["moe"] is False
    assert row["tc_right"] and row["tc_whole"] and row["tc_graphs"] == 1 and row["tc_fallback"] == {}
    assert row["aot_right"] and row["dyn_right"]
