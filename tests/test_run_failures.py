"""ONNX Runtime failing at run time (a kernel that refuses a dtype, an index out of
bounds where ortlite's index checks are off: on the CPU they raise before ONNX Runtime sees
such an index, tests/test_index_checks.py): on the torch.compile path the failing node runs in torch from then on, the call
that failed returns torch's result, one warning names the node and the reason, and ONNX
Runtime prints nothing to stderr. ortlite.compile and Options(fallback="error") raise
ortlite.RunError naming the graph."""

import logging

import pytest
import torch

import ortlite
from conftest import assert_same


@pytest.fixture
def warnings_seen(caplog):
    caplog.set_level(logging.WARNING, logger="ortlite")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "ortlite"]


def index_then_scale(x, i):
    return torch.index_select(x, 0, i) * 2 + 1


def test_out_of_bounds_index_raises_as_eager_and_later_calls_are_right(unchecked_indices, warnings_seen, capfd):
    backend = ortlite.Backend()
    fn = torch.compile(index_then_scale, backend=backend)
    x = torch.randn(4, 3)
    assert_same(fn(x, torch.tensor([0, 3])), index_then_scale(x, torch.tensor([0, 3])))
    with pytest.raises(IndexError, match="index out of range"):  # eager's error, from torch
        fn(x, torch.tensor([0, 7]))
    for i in ([1, 2], [3, 3, 0]):
        assert_same(fn(x, torch.tensor(i)), index_then_scale(x, torch.tensor(i)))
    messages = warnings_seen()
    assert len(messages) == 1 and "aten.index_select" in messages[0] and "out of data bounds" in messages[0], messages
    assert set(backend.stats.fallback_ops) == {"aten.index_select.default"}  # also in the recompiled graph
    assert "[E:onnxruntime" not in capfd.readouterr().err


def scatter_add_half(x, i, s):
    return (x * 1).scatter_add(0, i, s) + 1


def test_kernel_refusing_a_dtype_at_run_time_is_routed_around_once(warnings_seen, capfd):
    """ScatterElements with a reduction exists for float16 on CPU when the session is built
    but refuses it when run (ONNX Runtime 1.31)."""
    backend = ortlite.Backend()
    fn = torch.compile(scatter_add_half, backend=backend)
    x, i, s = torch.randn(4, 3, dtype=torch.float16), torch.tensor([[0, 1, 2], [3, 0, 1]]), torch.randn(2, 3, dtype=torch.float16)
    for _ in range(3):
        assert_same(fn(x, i, s), scatter_add_half(x, i, s))
    if backend.stats.fallback_ops == {}:
        pytest.skip("this ONNX Runtime runs ScatterElements add in float16 on CPU: nothing to route around")
    assert backend.stats.fallback_ops == {"aten.scatter_add.default": 1}
    assert len(warnings_seen()) == 1
    assert "[E:onnxruntime" not in capfd.readouterr().err
    # a later graph with the same op and dtypes leaves it out up front: no failed run
    fn2 = torch.compile(lambda x, i, s: scatter_add_half(x, i, s) * 3, backend=backend)
    runs = backend.stats.runs
    assert_same(fn2(x, i, s), scatter_add_half(x, i, s) * 3)
    assert backend.stats.runs > runs


def test_fallback_error_and_aot_raise_run_error(unchecked_indices):
    x = torch.randn(4, 3)
    fn = torch.compile(index_then_scale, backend=ortlite.Backend(ortlite.Options(fallback="error")))
    fn(x, torch.tensor([0, 1]))
    with pytest.raises(ortlite.RunError, match="ONNX Runtime failed running graph .*out of data bounds"):
        fn(x, torch.tensor([0, 9]))

    class Model(torch.nn.Module):
        def forward(self, x, i):
            return index_then_scale(x, i)

    compiled = ortlite.compile(Model(), (x, torch.tensor([0, 1])))
    with pytest.raises(ortlite.RunError, match="ONNX Runtime failed running graph"):
        compiled(x, torch.tensor([0, 9]))
    assert_same(compiled(x, torch.tensor([2, 1])), index_then_scale(x, torch.tensor([2, 1])))


class _PositionTable(torch.nn.Module):
    """A frozen weight gathered by indices built from a size: computed in the size prelude."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(8, 3))

    def forward(self, x):
        return x + torch.index_select(self.table, 0, torch.arange(x.shape[0])) * 2


def test_a_failure_in_the_size_prelude_is_routed_around_as_a_failed_run(unchecked_indices, warnings_seen, capfd):
    """ONNX Runtime failing in the size prelude (lower.hoist) is a failed run like any other:
    the node runs in torch from then on, the failing call raises eager's error."""
    model = _PositionTable()
    backend = ortlite.Backend()
    fn = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for s in (4, 6):
            x = torch.randn(s, 3)
            assert_same(fn(x), model(x))
        assert any(r.size_constants is not None and r.size_constants.weights for r in backend._runners)
        with pytest.raises(IndexError, match="index out of range"):  # eager's error, from torch
            fn(torch.randn(10, 3))
        for s in (5, 8, 6):
            x = torch.randn(s, 3)
            assert_same(fn(x), model(x))
    messages = warnings_seen()
    assert len(messages) == 1 and "aten.index_select" in messages[0], messages
    assert "[E:onnxruntime" not in capfd.readouterr().err
