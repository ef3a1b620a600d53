"""bench/accuracy.py end to end on a tiny model: a few training steps on a few stdlib files
(seconds; the bench's own model trains for minutes and is never trained here)."""

import importlib.util
import math
import os

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import ortlite.lower.quantize as quantize  # noqa: E402


def _bench():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "accuracy.py")
    spec = importlib.util.spec_from_file_location("bench_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_corpus_split_is_deterministic():
    acc = _bench()
    first, second = acc.corpus(limit=30), acc.corpus(limit=30)
    assert first == second
    train, held, digest = first
    assert len(train) > 10 * len(held) / 9 > 0  # 3 files of 30 held out
    assert acc.corpus(limit=31)[2] != digest  # the file list is in the cache key


def test_pipeline_tiny_model():
    acc = _bench()
    train, held, _ = acc.corpus(limit=40)
    config = dict(acc.CONFIG, hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=32)
    model = acc.new_model(config)
    before = model.lm_head.weight.clone()
    seconds, done = acc.train(model, train, dict(acc.RECIPE, steps=3, batch=2, context=32, warmup=1), log=None)
    assert seconds > 0 and done == 3 and not torch.equal(before, model.lm_head.weight) and not model.training

    data = acc.windows(held, count=8, length=32)
    assert data.shape == (8, 33) and torch.equal(data, acc.windows(held, count=8, length=32))
    rows = {name: (ppl, top, kernels) for name, ppl, top, kernels in acc.measure(model, data, batch=4, log=None, experiments=True)}
    assert (quantize.INT4_MAX_ROWS, quantize.INT4_BLOCK, quantize.INT4_ACCURACY) == (1, 32, 4)  # restored after compiling

    assert list(rows) == [
        "eager float32", "eager bfloat16", "ortlite float32", "ortlite int8", "ortlite int4",
        "ortlite int4 (MatMulNBits at every row)",
        "eager, int8 weights (simulated; activations float)",
        "eager, int4 weights, blocks of 32 (simulated; activations float)",
        "ortlite int4, every row, accuracy_level 1 (activations float)",
        "ortlite int4, every row, blocks of 16", "ortlite int4, every row, blocks of 64", "ortlite int4, every row, blocks of 128",
    ]  # fmt: skip
    for ppl, top, _ in rows.values():
        assert math.isfinite(ppl) and 1 < ppl < 256 * 4 and 0 <= top <= 1
    eager = rows["eager float32"][0]
    assert abs(rows["ortlite float32"][0] / eager - 1) < 1e-4
    assert rows["ortlite float32"][1] >= 0.99
    # 2 layers x 7 products + the LM head, and the embedding; 4 x 32 = 128 rows: "int4" runs int8's kernel there
    assert rows["ortlite int8"][2] == rows["ortlite int4"][2] == "15 int8, 1 int8 rows"
    assert rows["ortlite int4 (MatMulNBits at every row)"][2] == "15 int4, 1 int8 rows"
    # MatMulNBits with float activations computes the simulated scheme: the same weights
    simulated = rows["eager, int4 weights, blocks of 32 (simulated; activations float)"][0]
    assert abs(rows["ortlite int4, every row, accuracy_level 1 (activations float)"][0] / simulated - 1) < 1e-4
    assert "| ortlite int8 |" in acc.table(list((k, *v) for k, v in rows.items()))
