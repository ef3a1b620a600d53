"""Conformance against PyTorch's OpInfo database: for every op, a few sample inputs run
through torch.compile(backend=ortlite.Backend()). An op may fall back to torch; it must never
give a result that differs from eager (wrong) or raise where eager does not (crash).

Swept five ways: static shapes in float32, int64 and bool; float16 (a result that differs
from eager must be as accurate as eager's against float64); dynamic=True, where every size
and int argument is symbolic; Dynamo's automatic dynamic, where the same compiled function
is called with a sample and then one with other sizes or ints, as in a user's loop (the
second call recompiles with what changed symbolic); and gradients (float32, static: the
backward graph runs in ONNX Runtime; a gradient that differs from eager's must be as
accurate as eager's against float64).

The full sweeps, with every bucket counted: python bench/coverage.py [--mode dynamic|automatic|grad]
"""

import logging

import pytest
import torch

import opinfo_harness as h

pytestmark = pytest.mark.slow  # about 12 minutes on 2 cores: deselect with -m "not slow"

# (mode, dtype, samples per op) swept in CI; bench/coverage.py takes more.
SWEEPS = {
    "static": [(torch.float32, 2), (torch.int64, 1), (torch.bool, 1)],
    "float16": [(torch.float16, 1)],
    "dynamic": [(torch.float32, 1)],
    "automatic": [(torch.float32, 1)],
    "grad": [(torch.float32, 1)],
}

OPS = h.all_ops()


@pytest.fixture(autouse=True)
def quiet():
    logging.getLogger("ortlite").setLevel(logging.ERROR)
    yield
    logging.getLogger("ortlite").setLevel(logging.NOTSET)


# CI time: each op is swept in one of the two symbolic modes or for gradients, in turn down
# the list (bench/coverage.py --mode dynamic|automatic|grad sweeps every op in each).
ROTATING = {h.op_id(op): ("dynamic", "automatic", "grad")[k % 3] for k, op in enumerate(OPS)}
CASES = [(op, sweep) for op in OPS for sweep in ("static", "float16", ROTATING[h.op_id(op)])]


@pytest.mark.parametrize("op, sweep", CASES, ids=[f"{h.op_id(op)}-{sweep}" for op, sweep in CASES])
def test_opinfo_never_wrong_or_crashing(op, sweep):
    dtypes = [dtype for dtype, _ in SWEEPS[sweep]]
    reason = h.excluded_reason(op, dtypes)
    if reason:
        pytest.skip(reason)
    mode = "static" if sweep == "float16" else sweep
    results = [h.sweep_op(op, (dtype,), limit, mode=mode) for dtype, limit in SWEEPS[sweep]]
    for result in results:
        assert result.bucket not in ("wrong", "crash"), f"{result.op} is {result.bucket}: {result.detail}"
    if all(r.bucket == "skipped" for r in results):
        pytest.skip(results[0].detail or "no sample could be compared")
