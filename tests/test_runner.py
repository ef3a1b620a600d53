"""The Cython hot path on hand-built graphs: argument checks and Python scalar inputs."""

import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ortlite.lower import lower_graph
from ortlite.options import Options
from ortlite.runner import build_runner
from ortlite.session import SessionCache

aten = torch.ops.aten


def scaled_sum_graph(scalar_val):
    """x * n + y, with n a graph input whose meta value is a Python scalar."""
    mode = FakeTensorMode()
    with mode:
        fx, fy = torch.empty(2, 3), torch.empty(2, 3)
        fout = fx * scalar_val + fy
    g = torch.fx.Graph()
    x, n, y = g.placeholder("x"), g.placeholder("n"), g.placeholder("y")
    x.meta["val"], n.meta["val"], y.meta["val"] = fx, scalar_val, fy
    mul = g.call_function(aten.mul.Tensor, (x, n))
    mul.meta["val"] = fout
    add = g.call_function(aten.add.Tensor, (mul, y))
    add.meta["val"] = fout
    g.output((add,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    lowered = lower_graph(gm, Options().opset)
    sess = SessionCache().get(lowered.model.SerializeToString(), Options(), {torch.device("cpu")})
    return build_runner("scaled_sum", lowered, sess)


@pytest.mark.parametrize("example,values", [(3.0, [0.5, -2.0, 1e10]), (2, [0, 7, -3])])
def test_python_scalar_inputs(example, values):
    runner = scaled_sum_graph(example)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    for v in values:
        (out,) = runner(x, v, y)
        torch.testing.assert_close(out, x * v + y)


def test_argument_errors_name_the_input():
    runner = scaled_sum_graph(2.0)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(TypeError, match="expected 3 arguments, got 2"):
        runner(x, 1.0)
    with pytest.raises(TypeError, match=r"argument 0 \(x\).*torch.float32.*got a torch.float64"):
        runner(x.double(), 1.0, y)
    with pytest.raises(ValueError, match=r"argument 2 \(y\).*shape \(2, 3\).*got.*\(3, 2\)"):
        runner(x, 1.0, torch.randn(3, 2))
    with pytest.raises(TypeError, match="got list"):
        runner(x, 1.0, [1, 2])


def test_runner_counts_runs_and_reuses_bindings():
    runner = scaled_sum_graph(2.0)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    for i in range(5):
        (out,) = runner(x, float(i), y)
        torch.testing.assert_close(out, x * i + y)
    # a new tensor at another address is rebound; a non-contiguous one is copied first
    x2 = torch.randn(3, 2).t()
    (out,) = runner(x2, 1.5, y)
    torch.testing.assert_close(out, x2 * 1.5 + y)
    assert runner.runs == 6


def runner_for(fn, *example):
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*example)
    lowered = lower_graph(gm, Options().opset)
    sess = SessionCache().get(lowered.model.SerializeToString(), Options(), {torch.device("cpu")})
    return build_runner("fn", lowered, sess)


def test_guarded_fast_path_still_catches_changed_arguments():
    runner = runner_for(lambda x, y: (torch.relu(x * x + y),), torch.randn(8, 8), torch.randn(8, 8))
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    for _ in range(3):  # the first validated call builds the guard; the next ones use it
        torch.testing.assert_close(runner(x, y)[0], torch.relu(x * x + y))
    from ortlite import _fast

    assert runner.raw_guarded == (_fast.RAW_GUARD_LAYOUT is True)  # (test_raw_tensor_layout_found: on 2.13)
    xt = torch.randn(8, 8).t()
    torch.testing.assert_close(runner(xt, y)[0], torch.relu(xt * xt + y))
    y2 = torch.randn(8, 8, requires_grad=True)
    torch.testing.assert_close(runner(x, y2)[0], torch.relu(x * x + y2).detach())
    with pytest.raises(TypeError, match="float64"):
        runner(x.double(), y)
    with pytest.raises(ValueError, match="shape"):
        runner(torch.randn(8, 9), y)
    with pytest.raises(TypeError, match="int"):
        runner(x, 3)
    x.data = torch.randn(8, 8)  # same object, new memory: rebound by pointer
    torch.testing.assert_close(runner(x, y)[0], torch.relu(x * x + y))
    base = torch.randn(100)
    xo = base[5:69].view(8, 8)  # at a storage offset
    torch.testing.assert_close(runner(xo, y)[0], torch.relu(xo * xo + y))
    xe = torch.randn(8, 1).expand(8, 8)  # stride 0
    torch.testing.assert_close(runner(xe, y)[0], torch.relu(xe * xe + y))
    with torch.inference_mode():
        xi = torch.randn(8, 8)  # other dispatch keys
    torch.testing.assert_close(runner(xi, y)[0], torch.relu(xi * xi + y))
    xp = torch.nn.Parameter(torch.randn(8, 8), requires_grad=False)  # another type
    torch.testing.assert_close(runner(xp, y)[0], torch.relu(xp * xp + y))
    x.resize_(4, 16)  # same object, metadata changed in place
    with pytest.raises(ValueError, match="shape"):
        runner(x, y)
    x.resize_(8, 8)
    torch.testing.assert_close(runner(x, y)[0], torch.relu(x * x + y))


@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="layouts checked on the torch ortlite is tested on")
def test_raw_tensor_layout_found():
    """The recycling check, the guarded path and the frozen-weight check read use counts,
    data pointers, autograd metadata, version counters and the guard's fields (type, dispatch
    keys, dtype, sizes, strides) from torch's objects where the offsets check out at import
    (else through torch's accessors): on the tested torch they must, or the hot path silently
    got slower."""
    from ortlite import _fast

    assert _fast.RAW_LAYOUT is True and _fast.RAW_DATA_LAYOUT is True and _fast.RAW_GUARD_LAYOUT is True
    assert _fast.AUTOGRAD_LAYOUT is True and _fast.VERSION_LAYOUT is True


PROBE_IN_FRESH_ARENAS = """
import random, threading, torch
from ortlite import _fast
rng, hold, verdicts = random.Random(0), threading.Event(), []
def probe(n):
    junk = [torch.empty(rng.randrange(1, 64)) for _ in range(n)]  # moves the arena's top
    verdicts.append([find() for find in (_fast._find_raw_layout, _fast._find_data_layout, _fast._find_guard_layout)])
    hold.wait()  # alive: the next thread gets an arena of its own
threads = [threading.Thread(target=probe, args=(i % 7,)) for i in range(30)]
for t in threads:
    t.start()
hold.set()
for t in threads:
    t.join()
assert all(v == [True, True, True] for v in verdicts) and len(verdicts) == 30, verdicts
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc tunables make the probes' overreads certain to fault")
def test_layout_probes_read_only_inside_torchs_objects():
    """The import-time layout probes scan torch's C++ objects, whose sizes they do not know.
    `import ortlite` in a thread (a Ray Serve replica's) crashed in ~1 of 20 processes: past a
    TensorImpl, a thread's malloc arena may be unmapped (it grows a page at a time). With
    glibc's top pad at 0 and a fresh arena per thread, a probe reading past its object faults
    within 20 threads (every run did before the fix); the probes must also still find the layouts."""
    env = dict(os.environ, MALLOC_TOP_PAD_="0", MALLOC_ARENA_MAX="1000")
    result = subprocess.run([sys.executable, "-c", PROBE_IN_FRESH_ARENAS], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
