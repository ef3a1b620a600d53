"""Conformance against PyTorch's OpInfo database: for every op, a few sample inputs in
float32 (and int64 / bool where the op takes them) run through
torch.compile(backend=ortlite.Backend()). An op may fall back to torch; it must never give
a result that differs from eager (wrong) or raise where eager does not (crash).

The full sweep, with every bucket counted: python bench/coverage.py
"""

import logging

import pytest
import torch

import opinfo_harness as h

pytestmark = pytest.mark.slow  # about 5 minutes on 2 cores: deselect with -m "not slow"

# Samples per op and dtype in CI (bench/coverage.py takes more): float32 first.
SAMPLES = {torch.float32: 2, torch.int64: 1, torch.bool: 1}

OPS = h.all_ops()


@pytest.fixture(autouse=True)
def quiet():
    logging.getLogger("ortlite").setLevel(logging.ERROR)
    yield
    logging.getLogger("ortlite").setLevel(logging.NOTSET)


@pytest.mark.parametrize("op", OPS, ids=[h.op_id(op) for op in OPS])
def test_opinfo_never_wrong_or_crashing(op):
    reason = h.excluded_reason(op)
    if reason:
        pytest.skip(reason)
    results = [h.sweep_op(op, (dtype,), limit) for dtype, limit in SAMPLES.items()]
    for result in results:
        assert result.bucket not in ("wrong", "crash"), f"{result.op} is {result.bucket}: {result.detail}"
    if all(r.bucket == "skipped" for r in results):
        pytest.skip(results[0].detail or "no sample could be compared")
