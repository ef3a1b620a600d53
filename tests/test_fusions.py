"""Graphs ONNX Runtime optimizes well: each test reads ONNX Runtime's optimized model (the
fusion happened) and compares with eager on odd inputs (NaN, inf, edge sizes)."""

import collections
import os
import tempfile

import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F

import ortlite

from conftest import assert_same


def optimized_ops(model: onnx.ModelProto) -> collections.Counter:
    """ONNX Runtime's optimized graph of model (CPU, all optimizations, one thread): op
    counts of its main graph (not its If branches), "domain:op" for other domains."""
    with tempfile.TemporaryDirectory() as tmp:
        so = onnxruntime.SessionOptions()
        so.log_severity_level = 4
        so.intra_op_num_threads = 1
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath)
    return collections.Counter((n.domain + ":" if n.domain else "") + n.op_type for n in optimized.graph.node)


class ConvPool(torch.nn.Module):
    """ResNet's stem: conv, batch norm, relu, 3x3/2 max pooling, then a conv with a residual."""

    def __init__(self, pool=dict(kernel_size=3, stride=2, padding=1)):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.pool = pool
        self.conv2 = torch.nn.Conv2d(16, 16, 3, 1, 1)

    def forward(self, x):
        y = F.max_pool2d(torch.relu(self.bn(self.conv(x))), **self.pool)
        return torch.relu(self.conv2(y) + y)


def _with(x, *values):
    x = x.clone()
    flat = x.view(-1)
    for i, v in enumerate(values):
        flat[(i * 7919) % flat.numel()] = v
    return x


@pytest.mark.parametrize(
    "pool", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, stride=2, ceil_mode=True), dict(kernel_size=3, dilation=2)]
)
def test_max_pool_stays_in_nchwc_and_propagates_nan(pool):
    """aten's max pooling is NaN where a window holds a NaN; ONNX Runtime's MaxPool is not.
    The fix runs only when the input holds a NaN (an If on its sum), so ONNX Runtime's
    MaxPool stays in its NCHWc layout beside the convolutions and the BatchNorm folds."""
    torch.manual_seed(0)
    model = ConvPool(pool).eval()
    x = torch.randn(1, 3, 33, 31)
    with torch.no_grad():
        compiled = ortlite.compile(model, (x,))
        ops = optimized_ops(compiled.onnx_model)
        assert ops["com.microsoft.nchwc:MaxPool"] == 1 and ops["MaxPool"] == 0, ops
        assert ops["BatchNormalization"] == 0, ops
        # the stem's input: NaN in a few places, +inf beside -inf (a NaN sum, no NaN
        # window: the exact branch), infinities alone
        for inp in (x, _with(x, float("nan")), _with(x, float("inf"), float("-inf")), _with(x, float("inf")), _with(x, float("-inf"), float("nan"))):
            assert_same(compiled(inp), model(inp))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_max_pool_nan_branches(dtype):
    """Both branches of the If, each dtype: windows with NaN (first, last, alone), -inf-only
    windows in the padding, +inf beside -inf without NaN."""
    fn = lambda x: F.max_pool2d(x, 3, 2, 1)  # noqa: E731
    x = torch.randn(2, 3, 9, 8, dtype=dtype)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    f = torch.compile(fn, backend=backend)
    cases = [x, _with(x, float("nan")), _with(x, float("-inf"), float("inf")), torch.full_like(x, float("-inf")), torch.full_like(x, float("nan")),
             _with(x, *[float("nan")] * 5, float("inf"))]  # fmt: skip
    for inp in cases:
        assert_same(f(inp), fn(inp), rtol=0, atol=0)
    assert backend.stats.fallback_ops == {} and backend.stats.sessions == 1, backend.stats
