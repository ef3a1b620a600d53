import logging
import os
import socket

import pytest
import torch

import ortlite
import ortlite.logs

if os.environ.get("PYTEST_XDIST_WORKER"):
    # a worker of several (pyproject.toml's -n): one thread each for torch and ONNX Runtime
    # (ortlite's sessions follow torch's count); two pools a worker on two cores spin against
    # each other (half the CPU time went to the kernel)
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    ortlite.logs._warned.clear()  # each test sees its own once-per-cause warnings
    yield
    torch._dynamo.reset()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server or process group a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_same(got, expected, rtol=1e-4, atol=1e-5):
    """Values, dtype and shape equal to eager (NaN where eager has NaN)."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e, rtol, atol)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        assert got.dtype == expected.dtype, f"dtype {got.dtype} != eager's {expected.dtype}"
        assert got.shape == expected.shape, f"shape {tuple(got.shape)} != eager's {tuple(expected.shape)}"
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert got == expected or (got != got and expected != expected)


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def run_compiled(fn, *args, options=None, dynamic=False, **check):
    """Compile fn with a fresh Backend, compare with eager; returns the backend."""
    options = ortlite.Options.coerce(options)
    backend = ortlite.Backend(options)
    expected = fn(*[_clone(a) for a in args])
    got = torch.compile(fn, backend=backend, dynamic=dynamic)(*args)
    assert_same(got, expected, **check)
    return backend


def check_lowered(fn, *args, **check):
    """fn runs entirely in ONNX Runtime (fallback='error') and matches eager."""
    backend = run_compiled(fn, *args, options=ortlite.Options(fallback="error"), **check)
    stats = backend.stats
    assert stats.graphs >= 1 and stats.runs >= 1, stats
    assert stats.fallback_ops == {}, stats.fallback_ops
    return backend


def check_fallback(fn, *args, op, **check):
    """fn is correct, and `op` ran in torch."""
    backend = run_compiled(fn, *args, **check)
    assert op in backend.stats.fallback_ops, backend.stats.fallback_ops
    return backend


def unchecked_index(g, node, i, size, *, negative, message, error=IndexError, wrap=False):
    """ortlite.lower.ops.index.checked_index without the check."""
    from ortlite.lower.ops import index

    i = g.cast(i, torch.int64)
    return index.Value(index._wrap_negative(g, i, size), torch.int64, i.shape) if negative and wrap else i


@pytest.fixture
def unchecked_indices(monkeypatch):
    """ortlite's in-graph index checks off (tests/test_index_checks.py tests them): an index
    out of bounds then reaches ONNX Runtime's Gather, which fails the run, as a lowering
    without checks would (the trigger of tests of failed runs)."""
    from ortlite.lower.ops import index

    monkeypatch.setattr(index, "checked_index", unchecked_index)


@pytest.fixture
def ortlite_log(caplog):
    caplog.set_level(logging.WARNING, logger="ortlite")
    return caplog


@torch.library.custom_op("ortlite_test::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    """An op ortlite can never lower: the stand-in for "no lowering" in tests."""
    return torch.cumsum(x, 0).clone()


@opaque.register_fake
def _(x):
    return torch.empty_like(x)


OPAQUE = "ortlite_test.opaque.default"


class Wrap(torch.nn.Module):
    """A function as a module (ortlite.compile and torch.export take modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
