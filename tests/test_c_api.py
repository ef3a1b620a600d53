"""Sessions through ONNX Runtime's C API (ortlite/_fast.pyx, _ort.pxd): chosen per session,
with the pybind module's path kept (and forced by ORTLITE_NO_C_API=1); errors carry ORT's
message; no OrtValue or OrtStatus leaks. (Threads sharing a runner, on whichever path is the default:
test_aot.py::test_concurrent_calls_from_threads.)"""

import logging
import os

import pytest
import torch
import torch.nn.functional as F

import ortlite
from ortlite import _fast, logs
from ortlite.lower.ops import index as index_ops
from ortlite.session import c_api_problem
from conftest import unchecked_index

pytestmark = pytest.mark.skipif(_fast.C_API_PROBLEM is not None, reason=f"no C API here: {_fast.C_API_PROBLEM}")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_cpu_sessions_go_through_the_c_api_by_default():
    model, x = MLP().eval(), torch.randn(3, 16)
    compiled = ortlite.compile(model, (x,))
    assert compiled.uses_c_api and compiled.providers == ["CPUExecutionProvider"]
    torch.testing.assert_close(compiled(x), model(x))
    bound = ortlite.compile(model, (x,), bind_weights=True)
    assert bound.uses_c_api
    torch.testing.assert_close(bound(x), model(x))
    with torch.no_grad():
        model.a.weight.mul_(2)  # bound by pointer: seen
    torch.testing.assert_close(bound(x), model(x))


def test_forced_pybind_path_warns_once_and_gives_the_same_results(monkeypatch, caplog):
    monkeypatch.setenv("ORTLITE_NO_C_API", "1")
    monkeypatch.setattr(logs, "_warned", set())
    caplog.set_level(logging.WARNING, logger="ortlite")
    assert c_api_problem() == "ORTLITE_NO_C_API is set"
    model, x = MLP().eval(), torch.randn(3, 16)
    first, second = ortlite.compile(model, (x,)), ortlite.compile(model, (x * 2,))
    assert not first.uses_c_api and not second.uses_c_api
    torch.testing.assert_close(first(x), model(x))
    messages = [r.getMessage() for r in caplog.records if r.name == "ortlite"]
    assert len(messages) == 1 and "Python module" in messages[0] and "ORTLITE_NO_C_API" in messages[0], messages
    monkeypatch.delenv("ORTLITE_NO_C_API")
    assert ortlite.compile(model, (x,)).uses_c_api


def test_a_library_that_cannot_load_is_named():
    assert _fast.check_library(_fast.C_API_LIBRARY) is None
    problem = _fast.check_library("/nonexistent/libonnxruntime.so.0")
    assert "cannot load /nonexistent/libonnxruntime.so.0" in problem


def test_c_api_errors_carry_ort_messages(unchecked_indices):  # (an out-of-bounds index fails the run)
    with pytest.raises(_fast.OrtError, match="ONNXRuntimeError.*(protobuf|parse|model)"):
        _fast.create_c_session(b"not a model", 1, 1, 99)

    class Gather(torch.nn.Module):
        def forward(self, x, i):
            return torch.index_select(x, 0, i) + 1

    x = torch.randn(4, 3)
    compiled = ortlite.compile(Gather(), (x, torch.tensor([0, 1])))
    assert compiled.uses_c_api
    for _ in range(3):  # a failed run leaves the runner usable
        with pytest.raises(ortlite.RunError, match="out of data bounds"):
            compiled(x, torch.tensor([0, 9]))
        torch.testing.assert_close(compiled(x, torch.tensor([3, 2])), x[[3, 2]] + 1)


def test_scalars_empty_tensors_and_ort_allocated_outputs():
    class Scale(torch.nn.Module):
        def forward(self, x, n: float):
            return x * n, (x * n).sum()

    x = torch.randn(0, 5)
    compiled = ortlite.compile(Scale(), (x, 2.0))
    assert compiled.uses_c_api
    for t in (torch.randn(0, 5), torch.empty(0, 5)):
        a, s = compiled(t, 3.0)
        assert a.shape == (0, 5) and s.item() == 0

    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    fn = torch.compile(lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest") + 1, backend=backend, dynamic=True)
    for n in (5, 9, 12):  # output sizes only ORT knows before the run: ORT allocates, ortlite copies
        x = torch.randn(1, 2, n, n)
        torch.testing.assert_close(fn(x), F.interpolate(x, scale_factor=1.7, mode="nearest") + 1)


def test_ort_allocated_outputs_through_the_c_api(monkeypatch):
    """Outputs whose sizes only ONNX Runtime knows before the run, from a C-API session.
    (This graph computes its sizes in float64, for which ortlite disables an optimizer and so
    uses pybind; it has no MatMul for that optimizer to touch, so the C API serves it here.)"""
    monkeypatch.setattr(ortlite.session, "_c_api_serves", lambda options, providers, disabled: True)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    fn = torch.compile(lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest") + 1, backend=backend, dynamic=True)
    for n in (5, 9, 12, 5):
        x = torch.randn(1, 2, n, n)
        torch.testing.assert_close(fn(x), F.interpolate(x, scale_factor=1.7, mode="nearest") + 1)
    assert backend._runners and all(r.uses_c_api for r in backend._runners)


def _rss_bytes():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_calls_do_not_leak():
    """OrtValues (replaced when a pointer changes) are released: RSS stays flat over 40k
    calls once warm, and the count of OrtValues ortlite holds too, failed runs included."""
    model, x = MLP().eval(), torch.randn(2, 16)
    compiled = ortlite.compile(model, (x,))

    class Gather(torch.nn.Module):
        def forward(self, x, i):
            return torch.index_select(x, 0, i) * 2

    checked = ortlite.compile(Gather(), (x, torch.tensor([0])))  # the index check raises after the run
    with pytest.MonkeyPatch.context() as patch:  # without the check ONNX Runtime fails the run
        patch.setattr(index_ops, "checked_index", unchecked_index)
        failing = ortlite.compile(Gather(), (x, torch.tensor([0])))
    bad = torch.tensor([7])

    def calls(n):
        for _ in range(n):
            compiled(x)
            compiled(torch.randn(2, 16))  # a new pointer each call: its OrtValue is replaced

    def failures(n):
        for _ in range(n):
            try:
                failing(x, bad)
            except ortlite.RunError:
                pass

    _assert_flat(calls, 20000, "of two runs")
    failures(10)
    values = _fast.live_values()
    failures(5000)  # RSS is no measure here: ORT's error path grows its allocators' arenas in steps
    assert _fast.live_values() == values

    def checked_failures(n):  # a run that succeeds and an index check that raises after it
        for _ in range(n):
            with pytest.raises(RuntimeError, match="index out of range"):
                checked(x, bad)

    _assert_flat(checked_failures, 20000, "raising from an index check")


def _assert_flat(run, n, what):
    """run(n) once to warm up, then again: RSS grows less than 2 MiB and ortlite holds as
    many OrtValues as before."""
    run(n)
    before, values = _rss_bytes(), _fast.live_values()
    run(n)
    grown = _rss_bytes() - before
    assert grown < 2 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over {n} calls {what}"
    assert _fast.live_values() == values


def test_frozen_weights_through_the_c_api(monkeypatch):
    made = []
    create = _fast.create_c_session
    monkeypatch.setattr(_fast, "create_c_session", lambda *a: made.append(a[5]) or create(*a))
    model = MLP().eval()
    backend = ortlite.Backend()
    fn = torch.compile(model, backend=backend)
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x))
        assert backend.stats.frozen == 4
        assert len(made) == 1 and len(made[0]) == 4  # one C session, the 4 weights its initializers
        model.b.weight.mul_(-1)  # refrozen: a new C session from the current weights
        torch.testing.assert_close(fn(x), model(x))
        assert len(made) == 2
