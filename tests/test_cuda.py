"""CUDA execution (run by bench/gpu_check.sh on a GPU machine; skipped elsewhere, with the reason)."""

import pytest
import torch

import ortlite
from conftest import assert_same
from ortlite.session import provider_problem
from test_backend import MLP, Block

REASON = (
    "needs a CUDA GPU"
    if not torch.cuda.is_available()
    else (provider_problem("CUDAExecutionProvider") or "")
)
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(REASON), reason=REASON or "CUDA available")]


def on_cuda(*tensors):
    return [t.cuda() for t in tensors]


def test_mlp_and_block_on_cuda():
    for model, shape in ((MLP(), (4, 64)), (Block(), (2, 5, 32))):
        model = model.cuda().eval()
        backend = ortlite.Backend(ortlite.Options(fallback="error"))
        x = torch.randn(shape, device="cuda")
        with torch.no_grad():
            got = torch.compile(model, backend=backend)(x)
            assert got.device.type == "cuda"
            assert_same(got, model(x), atol=1e-4)
        assert backend.stats.fallback_ops == {} and backend.stats.sessions == 1


def test_training_on_cuda_matches_eager():
    model = MLP().cuda()
    x = torch.randn(8, 64, device="cuda")
    compiled = torch.compile(model, backend=ortlite.Backend())
    compiled(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    assert_same(grads, [p.grad for p in model.parameters()], atol=1e-4)


def test_runs_on_the_current_stream_without_sync():
    """A compiled call between two torch kernels on a side stream: ordered by the stream."""
    backend = ortlite.Backend()
    fn = torch.compile(lambda x, y: torch.relu(x @ y + 1), backend=backend)
    a, b = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    expected = torch.relu((a * 2) @ b + 1) - 3
    side = torch.cuda.Stream()
    fn(a, b)  # compiled on the default stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x = a * 2  # a torch kernel producing the input on `side`
            out = fn(x, b) - 3  # the ORT run, then a torch kernel consuming its output
    side.synchronize()
    assert_same(out, expected, atol=1e-3)
    assert backend.stats.sessions == 2  # one per stream the graph ran on


def test_mixed_device_inputs():
    fn = lambda x, s: x * s + 1  # noqa: E731  (a CPU 0-d tensor used in a CUDA op, as aten allows)
    x, s = torch.randn(4, 4, device="cuda"), torch.tensor(2.5)
    backend = ortlite.Backend()
    assert_same(torch.compile(fn, backend=backend)(x, s), fn(x, s))
    assert backend.stats.runs == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_on_cuda(dtype):
    model = Block().cuda().to(dtype).eval()
    x = torch.randn(2, 5, 32, device="cuda", dtype=dtype)
    with torch.no_grad():
        got = torch.compile(model, backend=ortlite.Backend())(x)
        assert got.dtype == dtype
        torch.testing.assert_close(got, model(x), rtol=2e-2, atol=2e-2)


def test_aot_on_cuda():
    model = MLP().cuda().eval()
    x = torch.randn(3, 64, device="cuda")
    compiled = ortlite.compile(model, (x,))
    assert "CUDAExecutionProvider" in compiled.providers
    with torch.no_grad():
        assert_same(compiled(x), model(x), atol=1e-4)
    with pytest.raises(ValueError, match="on cuda:0, got .* on cpu"):
        compiled(x.cpu())
