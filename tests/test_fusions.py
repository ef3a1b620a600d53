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
from ortlite.lower import fusions

from conftest import Wrap, assert_same


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
    "pool",
    [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, stride=2, ceil_mode=True), dict(kernel_size=3, dilation=2)],
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
        odd = (_with(x, float("nan")), _with(x, float("inf"), float("-inf")), _with(x, float("inf")), _with(x, float("-inf"), float("nan")))
        for inp in (x, *odd):
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


# -- attention -------------------------------------------------------------------------

FMIN = torch.finfo(torch.float32).min


def _sdpa(q, k, v, mask=None, causal=False, scale=None):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)[0]


class Attend(torch.nn.Module):
    def __init__(self, causal=False, scale=None, gqa=False):
        super().__init__()
        self.causal, self.scale, self.gqa = causal, scale, gqa

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale, enable_gqa=self.gqa)


def _fmin_rows(mask, rows):
    mask = mask.clone()
    mask[..., rows, :] = FMIN
    return mask


ATTENTION_CASES = {
    # name: (module, q shape, kv shape (k and v), mask shape or None, masks to call with too)
    "plain": (Attend(), (2, 4, 7, 16), (2, 4, 7, 16), None),
    "scale": (Attend(scale=0.3), (2, 4, 7, 16), (2, 4, 7, 16), None),
    "causal": (Attend(causal=True), (1, 4, 7, 16), (1, 4, 7, 16), None),
    "causal, query longer": (Attend(causal=True), (1, 4, 9, 16), (1, 4, 5, 16), None),
    "causal, keys longer": (Attend(causal=True), (1, 4, 3, 16), (1, 4, 8, 16), None),
    "grouped heads": (Attend(causal=True, gqa=True), (2, 8, 6, 16), (2, 2, 6, 16), None),
    "one query": (Attend(), (2, 4, 1, 16), (2, 4, 9, 16), None),
    "one key": (Attend(), (2, 4, 5, 16), (2, 4, 1, 16), None),
    "mask (B,1,S,S)": (Attend(), (2, 4, 7, 16), (2, 4, 7, 16), (2, 1, 7, 7)),
    "mask (B,1,1,S)": (Attend(), (2, 4, 7, 16), (2, 4, 9, 16), (2, 1, 1, 9)),
    "mask (S,S)": (Attend(), (2, 4, 7, 16), (2, 4, 7, 16), (7, 7)),
    "mask per head": (Attend(), (2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 7)),
    "mask, causal": (Attend(causal=True), (2, 4, 7, 16), (2, 4, 7, 16), (2, 1, 7, 7)),
    "mask, grouped heads": (Attend(gqa=True), (2, 4, 7, 16), (2, 2, 7, 16), (2, 1, 7, 7)),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_is_onnx_attention_and_matches_eager(case):
    """Inference graphs (AOT, float32, CPU) get ONNX Attention (opset 23), which ONNX
    Runtime runs as one kernel; values as eager's on odd inputs: fully masked rows (-inf:
    aten's zeros; the lowest float: aten's uniform weights, which the fused kernel zeroes,
    so those calls take the written-out ops), a NaN in the mask, one query, one key."""
    module, q_shape, kv_shape, mask_shape = ATTENTION_CASES[case]
    torch.manual_seed(0)
    q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)
    args = (q, k, v) if mask_shape is None else (q, k, v, torch.randn(mask_shape))
    with torch.no_grad():
        compiled = ortlite.compile(module, args)
    assert compiled.onnx_model.opset_import[0].version == 23
    ops = optimized_ops(compiled.onnx_model)
    assert ops["Attention"] + ops["If"] == 1 and ops["Softmax"] == 0, ops
    calls = [args]
    if mask_shape is not None:
        m = args[3]
        rows = [0, m.shape[-2] - 1] if m.shape[-2] > 1 else [0]
        calls += [
            (q, k, v, _fmin_rows(m, rows)),  # rows of the lowest float: the written-out ops
            (q, k, v, m.index_fill(-2, torch.tensor(rows), float("-inf"))),
            (q, k, v, torch.full_like(m, FMIN)),
            (q, k, v, torch.full_like(m, float("-inf"))),
            # (a NaN in the mask where the causal mask hides it: aten's rows are NaN or not
            # by its kernel's blocks; neither the fused nor the written-out ops follow them)
            *([] if module.causal else [(q, k, v, m.masked_fill(m > 1.0, float("nan")))]),
            (q, k, v, m.masked_fill(m > 0.5, FMIN)),  # the lowest float in places: fused
            (q, k, v, torch.full_like(m, -1e30)),
        ]
    for call in calls:
        assert_same(compiled(*call), module(*call), rtol=1e-5, atol=1e-5)


class ConstantMask(torch.nn.Module):
    """Attention under a mask computed from constants alone (HF's mask of a call without padding)."""

    def __init__(self, make, causal=False):
        super().__init__()
        self.make, self.causal = make, causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.make(q.shape[-2], k.shape[-2]), is_causal=self.causal)


CONSTANT_MASKS = {
    # name: (mask of (query rows, keys), causal, whether Attention must read it)
    "zeros": (lambda r, c: torch.zeros(r, c), False, False),
    "zeros, causal": (lambda r, c: torch.zeros(1, 1, r, c), True, False),
    "-0.0 (BERT without padding)": (lambda r, c: (1.0 - torch.ones(1, 1, 1, c)) * torch.finfo(torch.float32).min, False, False),
    "a NaN": (lambda r, c: torch.zeros(r, c).index_fill(1, torch.tensor([2]), float("nan")), False, True),
    "a column of -inf": (lambda r, c: torch.zeros(r, c).index_fill(1, torch.tensor([0]), float("-inf")), False, True),
    "ones": (lambda r, c: torch.ones(1, c), False, True),
    "a tiny value": (lambda r, c: torch.zeros(r, c).index_fill(0, torch.tensor([1]), 1e-30), False, True),
}


@pytest.mark.parametrize("case", list(CONSTANT_MASKS))
def test_attention_reads_a_constant_mask_only_where_it_adds_something(case):
    """A mask known at lowering that is 0.0 or -0.0 everywhere adds nothing: the Attention
    node reads no mask; any other constant mask (a NaN, -inf, a tiny value) is read, or takes
    the written-out ops. Values as eager's, both paths."""
    make, causal, read = CONSTANT_MASKS[case]
    module = ConstantMask(make, causal)
    torch.manual_seed(0)
    args = (torch.randn(2, 4, 7, 16), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16))
    with torch.no_grad():
        compiled = ortlite.compile(module, args)
        attentions = [n for n in compiled.onnx_model.graph.node if n.op_type == "Attention"]
        masked = [len(n.input) > 3 and n.input[3] != "" for n in attentions]
        assert all(masked) if read else masked == [False], masked  # (a NaN's rows take the written-out ops)
        expected = module(*args)
        assert_same(compiled(*args), expected, rtol=1e-5, atol=1e-5)
        backend = ortlite.Backend(ortlite.Options(fallback="error"))
        assert_same(torch.compile(module, backend=backend)(*args), expected, rtol=1e-5, atol=1e-5)

def test_attention_with_symbolic_sizes_under_torch_compile():
    """torch.compile, no_grad, dynamic: the fused kernel with symbolic batch and lengths."""
    module = Attend(causal=True, gqa=True)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    f = torch.compile(module, backend=backend)
    with torch.no_grad():
        for b, s, t in [(2, 5, 5), (3, 3, 8), (2, 9, 4)]:
            q, k, v = torch.randn(b, 4, s, 16), torch.randn(b, 2, t, 16), torch.randn(b, 2, t, 16)
            for x in (q, k, v):  # sizes but the head count and head size
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(x, 2)
            assert_same(f(q, k, v), module(q, k, v), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 1, backend.stats


def test_attention_training_keeps_written_out_ops_and_gradients():
    """With gradients the forward keeps its logsumexp for the backward: no fused kernel, and
    the gradients are eager's."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 16, requires_grad=True) for _ in range(3))
    mask = torch.randn(2, 1, 6, 6)
    twins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    out = torch.compile(Attend(causal=True), backend=backend)(q, k, v, mask)
    out.sum().backward()
    expected = Attend(causal=True)(*twins, mask)
    expected.sum().backward()
    assert_same(out.detach(), expected.detach(), rtol=1e-5, atol=1e-5)
    assert_same([t.grad for t in (q, k, v)], [t.grad for t in twins], rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs == 2 and backend.stats.fallback_ops == {}


def test_attention_below_opset_23_is_written_out():
    q = torch.randn(1, 2, 5, 8)
    with torch.no_grad():
        compiled = ortlite.compile(Attend(), (q, q, q), options=ortlite.Options(opset=19))
    assert compiled.onnx_model.opset_import[0].version == 19
    assert not any(n.op_type == "Attention" for n in compiled.onnx_model.graph.node)
    assert_same(compiled(q, q, q), Attend()(q, q, q))


# -- RMSNorm -----------------------------------------------------------------------------


class RMSNorm(torch.nn.Module):
    """LLaMA's (transformers' LlamaRMSNorm): weight * (x * rsqrt(mean(x^2) + eps))."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(size) + 0.5)
        self.eps = eps

    def forward(self, x):
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class TwoNorms(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.a, self.b, self.linear = RMSNorm(size), RMSNorm(size, eps=1e-5), torch.nn.Linear(size, size)

    def forward(self, x):
        return self.b(self.linear(self.a(x)) + x)


def test_rms_norm_is_one_kernel_and_matches_eager():
    """The aten pattern of RMSNorm becomes ONNX Runtime's SimplifiedLayerNormalization (its
    graph optimizer fuses only a Pow/Div spelling); values as eager's on odd rows: zeros,
    an infinity, a NaN, values whose squares overflow, tiny values."""
    torch.manual_seed(0)
    model = TwoNorms(64).eval()
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        compiled = ortlite.compile(model, (x,))
    ops = optimized_ops(compiled.onnx_model)
    # (the second norm reads a residual sum: SkipSimplifiedLayerNormalization, ortlite.lower.decoder)
    assert ops["SimplifiedLayerNormalization"] == 1 and ops["com.microsoft:SkipSimplifiedLayerNormalization"] == 1, ops
    assert ops["Sqrt"] == 0 and ops["ReduceMean"] == 0 and ops["Add"] == 0, ops
    odd = x.clone()
    odd[0, 0] = 0.0
    odd[0, 1, 3] = float("inf")
    odd[0, 2, 5] = float("nan")
    odd[1, 0] *= 1e20
    odd[1, 1] *= 1e-20
    for inp in (x, odd):
        assert_same(compiled(inp), model(inp), rtol=1e-5, atol=1e-5)


def test_rms_norm_whose_weight_broadcasts_keeps_its_ops():
    """A weight of one element (or one per row) broadcasts in aten; the fused kernel would
    take it as the normalized size's: left unfused, eager's values."""
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    for weight in (torch.rand(1) + 0.5, torch.rand(3, 1) + 0.5):
        model = RMSNorm(16)
        model.weight = torch.nn.Parameter(weight)
        with torch.no_grad():
            compiled = ortlite.compile(model, (x,))
        assert optimized_ops(compiled.onnx_model)["SimplifiedLayerNormalization"] == 0
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_rms_norm_in_training_keeps_its_ops_and_gradients():
    """A training graph saves the norm's intermediate values for the backward: not fused."""
    torch.manual_seed(0)
    model = RMSNorm(32)
    x = torch.randn(3, 32, requires_grad=True)
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    out = torch.compile(model, backend=backend)(x)
    out.sum().backward()
    twin = x.detach().clone().requires_grad_()
    expected = model(twin)
    grad_w = model.weight.grad.clone()
    model.weight.grad = None
    expected.sum().backward()
    assert_same(out.detach(), expected.detach(), rtol=1e-5, atol=1e-5)
    assert_same([x.grad, grad_w], [twin.grad, model.weight.grad], rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs == 2 and backend.stats.fallback_ops == {}


def test_rms_norm_under_torch_compile_with_frozen_and_bound_weights():
    torch.manual_seed(0)
    model = TwoNorms(32).eval()
    x = torch.randn(4, 32)
    for freeze in (True, False):
        torch._dynamo.reset()
        backend = ortlite.Backend(ortlite.Options(fallback="error", freeze_weights=freeze))
        with torch.no_grad():
            assert_same(torch.compile(model, backend=backend)(x), model(x), rtol=1e-5, atol=1e-5)
        assert backend.stats.fallback_ops == {}


def _symbolic_models(directory) -> list:
    models = [onnx.load(str(p)) for p in sorted(directory.glob("*.onnx"))]
    return [m for m in models if any(d.dim_param for i in m.graph.input for d in i.type.tensor_type.shape.dim)]


@pytest.mark.parametrize("dynamic", [None, True])
def test_rms_norm_with_sizes_that_change_between_calls(dynamic, tmp_path):
    """Batch and sequence change in a loop (automatic dynamic, and dynamic=True): eager's
    values every call, and the graph with symbolic batch and sequence has both norms as one
    kernel each (the hidden size stays static: the weights fix it). Under dynamic=True the
    eps reach the graph as float inputs ortlite makes constants; they were left behind an
    Identity the fusion did not look through, and the norms stayed written out."""
    torch.manual_seed(0)
    model = TwoNorms(32).eval()
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for batch, seq in ((2, 5), (3, 7), (1, 1), (4, 2)):
            x = torch.randn(batch, seq, 32)
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {}
    symbolic = _symbolic_models(tmp_path)
    assert symbolic, [p.name for p in tmp_path.glob("*.onnx")]
    for m in symbolic:
        assert sum(n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization") for n in m.graph.node) == 2


def test_cat_with_an_empty_part_copies_nothing():
    """An empty KV cache's first update (GPT-2's): the empty part is left out, no Concat."""
    fn = lambda cache, k: torch.cat([cache, k], -2) * 2  # noqa: E731
    cache, k = torch.randn(1, 4, 0, 8), torch.randn(1, 4, 5, 8)
    compiled = ortlite.compile(Wrap(fn), (cache, k))
    assert not any(n.op_type == "Concat" for n in compiled.onnx_model.graph.node)
    assert_same(compiled(cache, k), fn(cache, k))


def test_max_pool_with_indices_of_windows_of_minus_inf():
    """The indices path (training graphs) keeps the inline fixes: -inf-only windows are
    -inf (ONNX Runtime's float32 MaxPool: the lowest float), indices as aten's."""
    fn = lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)  # noqa: E731
    x = torch.randn(1, 2, 7, 7)
    x[0, 0] = float("-inf")
    x[0, 1, :3, :3] = float("-inf")
    x[0, 1, 4, 4] = float("nan")
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    got, expected = torch.compile(fn, backend=backend)(x), fn(x)
    assert_same(got, expected, rtol=0, atol=0)
    assert backend.stats.fallback_ops == {}


# -- what ONNX Runtime is not let to fuse on CPU -------------------------------------------


def test_add_before_layer_norm_stays_two_ops_on_cpu():
    """ONNX Runtime 1.31's CPU SkipLayerNormalization takes 4-5x the time of the Add and
    LayerNormalization it would replace: CPU sessions run without SkipLayerNormFusion
    (C API sessions through their config, pybind ones through disabled_optimizers)."""
    from ortlite.session import CPU_DISABLED_OPTIMIZERS

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.norm(self.linear(x) + x)

    model = Block().eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        compiled = ortlite.compile(model, (x,))
        assert_same(compiled(x), model(x))
    assert optimized_ops(compiled.onnx_model)["com.microsoft:SkipLayerNormalization"] == 1  # what ORT would do
    with tempfile.TemporaryDirectory() as tmp:
        so = onnxruntime.SessionOptions()
        so.log_severity_level = 4
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.add_session_config_entry("optimization.disable_specified_optimizers", ";".join(CPU_DISABLED_OPTIMIZERS))
        onnxruntime.InferenceSession(compiled.onnx_model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ops = collections.Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)
    assert ops["SkipLayerNormalization"] == 0 and ops["LayerNormalization"] == 1, ops
    report = ortlite.explain(model, x)  # explain's optimized graph is the session's
    assert all("SkipLayerNormalization" not in line for line in report.table(fusions=True).splitlines())


def test_attention_mask_check_with_symbolic_sizes():
    """The mask check (rows nowhere above -1e30 take the written-out ops) with symbolic
    batch and lengths, the mask a graph input broadcast over heads and queries."""
    module = Attend()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    f = torch.compile(module, backend=backend)
    with torch.no_grad():
        for b, s, t in [(2, 5, 5), (3, 3, 8), (2, 9, 4)]:
            q, k, v = torch.randn(b, 4, s, 16), torch.randn(b, 4, t, 16), torch.randn(b, 4, t, 16)
            mask = torch.zeros(b, 1, 1, t)
            mask[0, ..., 1:] = FMIN  # batch 0 sees key 0 only
            for x in (q, k, v, mask):
                torch._dynamo.mark_dynamic(x, 0)
            for x in (q, k, v):
                torch._dynamo.mark_dynamic(x, 2)
            torch._dynamo.mark_dynamic(mask, 3)
            for m in (mask, torch.full_like(mask, FMIN), mask.masked_fill(mask == 0, float("-inf"))):
                assert_same(f(q, k, v, m), module(q, k, v, m), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {}, backend.stats


def _ops_with_subgraphs(graph) -> list[str]:
    ops = []
    for n in graph.node:
        ops.append(n.op_type)
        for a in n.attribute:
            if a.HasField("g"):
                ops += _ops_with_subgraphs(a.g)
    return ops


@pytest.mark.parametrize("masked", [False, True])
def test_attention_whose_sizes_may_be_zero(masked, tmp_path):
    """Swin's windows: the sequence padded to a multiple of the window, cut into windows of
    4; the window count's bounds (interval arithmetic over the floor division) reach 0. The
    fused kernel stays, and Dynamo's guards establish the count is at least 1: no run-time
    check for empty inputs (an If, about 10 us a call in ONNX Runtime) where there is no mask."""
    torch._dynamo.reset()
    mask = torch.randn(1, 1, 4, 4)
    mask[..., 0, :] = FMIN  # a row the kernel would zero

    def fn(x):  # (batch, sequence, 16)
        x = F.pad(x, (0, 0, 0, (4 - x.shape[1] % 4) % 4))
        w = x.reshape(x.shape[0], -1, 4, 2, 8).permute(0, 1, 3, 2, 4).reshape(-1, 2, 4, 8)
        return F.scaled_dot_product_attention(w, w * 2, w + 1, attn_mask=mask if masked else None)

    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    f = torch.compile(fn, backend=backend)
    with torch.no_grad():
        for b, s in [(3, 5), (2, 8), (4, 13), (2, 6), (5, 7)]:
            x = torch.randn(b, s, 16)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(x, 1)
            assert_same(f(x), fn(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 1, backend.stats
    assert all("Attention" in _ops_with_subgraphs(onnx.load(p).graph) for p in tmp_path.glob("*.onnx"))
    if not masked:  # (a mask keeps its If: rows the kernel would zero)
        assert all("If" not in _ops_with_subgraphs(onnx.load(p).graph) for p in tmp_path.glob("*.onnx"))


class Projections(torch.nn.Module):
    """Linear layers on (batch, sequence, hidden) inputs, the way transformers use them: with
    and without bias, one on a transposed (non-contiguous) input, then a mask-like expand of
    a (batch, 1, sequence) tensor to (batch, heads, sequence)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 24), torch.nn.Linear(24, 16, bias=False)

    def forward(self, x, t):
        y = self.b(torch.relu(self.a(x))) + self.a(t.transpose(0, 1)).sum(-1, keepdim=True)
        return y, y.sum(-1).unsqueeze(1).expand(-1, 3, -1) * 2


@pytest.mark.parametrize("dynamic", [None, True])
def test_linear_on_3d_input_is_one_matmul_without_shape_arithmetic(dynamic, tmp_path):
    """aten's linear on a 3-D input flattens it, multiplies and unflattens: lowered as is that
    is two Reshapes a linear, and with symbolic sizes the second's target is computed per
    call (a third of a small transformer's nodes, the most of what made its symbolic graph
    slower than its static one). Without a bias the MatMul takes the 3-D input itself; with
    one it stays a Gemm between Reshapes whose targets the size prelude computes (a MatMul +
    Add would not fuse with symbolic sizes); an expand whose symbolic sizes are its input's
    has a constant target. Batch and sequence change in a loop; eager's values every call."""
    torch.manual_seed(0)
    model = Projections().eval()
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for batch, seq in ((2, 5), (3, 7), (0, 5), (4, 2), (3, 0), (2, 9)):  # empty batch, empty sequence too
            x, t = torch.randn(batch, seq, 16), torch.randn(seq, batch, 16)
            assert_same(compiled(x, t), model(x, t), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {}
    symbolic = _symbolic_models(tmp_path)
    assert symbolic
    for m in symbolic:
        ops = collections.Counter(n.op_type for n in m.graph.node)
        # a's linear on x: a Gemm; b's (no bias): a MatMul; a's on the transposed copy: either
        # (aten gives addmm, or mm then add, depending on how Dynamo traced the sizes)
        assert ops["Gemm"] >= 1 and ops["Gemm"] + ops["MatMul"] == 3, ops
        assert ops["Concat"] == 0, ops  # no size computed per call
        assert ops["Reshape"] <= 2 * ops["Gemm"] + 1, ops  # a Gemm's two, and at most the transposed input's copy


def _flatten_mm(x, w, shape):
    return torch.mm(x.reshape(-1, x.shape[-1]), w).view(shape)


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize(
    "case",
    [
        "swapped",  # the product viewed with the leading sizes in another order
        "regrouped",  # the rows viewed as (seq, batch) where batch * seq is the same
        "2-D product returned",  # the flattened product is also an output
        "flat input returned",  # the flattened input is also an output
    ],
)
def test_flattened_products_that_must_keep_their_reshapes(case, dynamic):
    """Where the view after the product is not x's leading sizes, or an intermediate is read
    elsewhere, the Reshapes stay: eager's values (a fold there would give a wrong layout)."""
    w = torch.randn(8, 6)
    fns = {
        "swapped": lambda x: _flatten_mm(x, w, (x.shape[1], x.shape[0], 6)) + 1,
        "regrouped": lambda x: _flatten_mm(x, w, (x.shape[0] * x.shape[1] // 2, 2, 6)) + 1,
        "2-D product returned": lambda x: (torch.mm(x.reshape(-1, 8), w).view(*x.shape[:-1], 6) + 1, torch.mm(x.reshape(-1, 8), w) * 2),
        "flat input returned": lambda x: (torch.mm(x.reshape(-1, 8), w).view(*x.shape[:-1], 6) + 1, x.reshape(-1, 8) * 3),
    }
    fn = fns[case]
    torch._dynamo.reset()
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for batch, seq in ((2, 4), (3, 6), (4, 8)):
        x = torch.randn(batch, seq, 8)
        assert_same(compiled(x), fn(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {}


# -- attention on token rows (ONNX Attention's 3-D form) ----------------------------------


class HeadsAttention(torch.nn.Module):
    """Attention as transformers spell it (GPT-2's, BERT's, ViT's, LLaMA's grouped heads): token
    rows (B, S, N*D) viewed into heads and transposed, attended, transposed back and merged.
    mask: None; "input" (a float mask argument); "causal" (GPT-2's: a static mask built from
    arange, 0 and -inf); "hole" (built so, and one query row sees no key: aten's zeros,
    where the fused kernel differs); a function allowed(b, s, t) -> bool (its keys, built
    so); also_heads: the 4-D result is returned too; repeat_kv:
    grouped heads copied as transformers' repeat_kv does; rotate: "llama", transformers'
    rotary embedding on q and k; "other": its ops with cos and sin whose halves differ."""

    def __init__(self, heads=4, kv_heads=4, size=16, causal=False, mask=None, also_heads=False, repeat_kv=False, rotate=False):
        super().__init__()
        self.heads, self.kv_heads, self.size, self.causal, self.mask, self.also_heads = heads, kv_heads, size, causal, mask, also_heads
        self.repeat_kv, self.rotate = repeat_kv, rotate
        self.q = torch.nn.Linear(32, heads * size)
        self.kv = torch.nn.Linear(32, 2 * kv_heads * size)

    def forward(self, x, y, mask=None):
        (b, s, _), t = x.shape, y.shape[1]
        q = self.q(x).view(b, s, self.heads, self.size).transpose(1, 2)
        k, v = self.kv(y).split(self.kv_heads * self.size, dim=-1)
        k = k.view(b, t, self.kv_heads, self.size).transpose(1, 2)
        v = v.reshape(b, t, -1, self.size).transpose(1, 2)
        half = self.size // 2
        rotate_half = lambda x: torch.cat((-x[..., half:], x[..., :half]), -1)  # noqa: E731
        if self.rotate == "llama":  # transformers' rotary embedding: cos and sin (1, S, D) of cat(freqs, freqs)
            freqs = torch.arange(s, dtype=torch.float32)[:, None] * 10000.0 ** (-torch.arange(half) / half)
            emb = torch.cat((freqs, freqs), -1)[None]
            cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        elif self.rotate:  # the same ops, cos and sin whose halves differ
            cos, sin = torch.linspace(0.5, 1, s * self.size).view(s, self.size).cos(), torch.linspace(0, 1, t * self.size).view(t, self.size).sin()
            q, k = q * cos + rotate_half(q) * cos, k * sin + rotate_half(k) * sin
        if self.repeat_kv:  # transformers' repeat_kv: each kv head copied for its group
            r = self.heads // self.kv_heads
            k = k[:, :, None].expand(b, self.kv_heads, r, t, self.size).reshape(b, self.heads, t, self.size)
            v = v[:, :, None].expand(b, self.kv_heads, r, t, self.size).reshape(b, self.heads, t, self.size)
        if self.mask in ("causal", "hole"):
            allowed = torch.arange(t)[None, :] <= torch.arange(s)[:, None]
            if self.mask == "hole":
                allowed[s // 2] = False
            mask = torch.zeros(s, t).masked_fill(~allowed, float("-inf"))[None, None].expand(b, 1, s, t)
        elif callable(self.mask):  # a static mask built from the sizes: allowed(b, s, t), bool
            allowed = self.mask(b, s, t)
            mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        gqa = k.shape[1] != self.heads
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=gqa)
        merged = out.transpose(1, 2).reshape(b, s, self.heads * self.size)
        return (merged, out) if self.also_heads else merged


def _heads_inputs(module, b, s, t):
    """x (b, s, 32), y (b, t, 32), and the arguments for module (with its mask if it takes one)."""
    torch.manual_seed(0)
    x, y = torch.randn(b, s, 32), torch.randn(b, t, 32)
    return x, y, ((x, y) if module.mask != "input" else (x, y, torch.randn(b, 1, s, t)))


TOKEN_ROW_CASES = {
    # name: (module, (batch, query length, key length), the 3-D form expected)
    "plain": (HeadsAttention(), (2, 7, 7), True),
    "causal": (HeadsAttention(causal=True), (1, 9, 9), True),
    "causal, keys longer": (HeadsAttention(causal=True), (2, 3, 8), True),
    "grouped heads, causal": (HeadsAttention(heads=8, kv_heads=2, causal=True), (2, 6, 6), True),
    "cross, one query": (HeadsAttention(), (3, 1, 5), True),
    "static causal mask": (HeadsAttention(mask="causal"), (2, 7, 7), True),
    "static mask with a row that sees nothing": (HeadsAttention(mask="hole"), (2, 6, 6), False),
    "mask argument": (HeadsAttention(mask="input"), (2, 5, 7), False),
    "heads returned too": (HeadsAttention(also_heads=True), (2, 5, 5), False),
    "repeat_kv, static causal mask": (HeadsAttention(heads=8, kv_heads=2, repeat_kv=True, mask="causal"), (2, 6, 6), True),
    "LLaMA's rotary, repeat_kv": (HeadsAttention(heads=8, kv_heads=2, repeat_kv=True, rotate="llama", causal=True), (2, 6, 6), True),
    "LLaMA's rotary, one sequence": (HeadsAttention(heads=8, kv_heads=2, rotate="llama", causal=True), (1, 5, 5), True),
    "rotary ops, other cos and sin": (HeadsAttention(heads=8, kv_heads=2, repeat_kv=True, rotate="other", causal=True), (2, 6, 6), False),
}


@pytest.mark.parametrize("case", list(TOKEN_ROW_CASES))
def test_attention_on_token_rows_loses_its_transposes(case):
    """Where q, k and v come from token rows and the result goes back to them, ONNX
    Runtime runs Attention's 3-D form: no Transpose is left. A static mask decides its row
    check now: no If; k and v copied per group (repeat_kv) are read uncopied. Where the
    pattern does not hold, the 4-D form and its Transposes stay.
    Values as eager's, also with scores that saturate the softmax and that vanish."""
    module, (b, s, t), three_d = TOKEN_ROW_CASES[case]
    x, y, args = _heads_inputs(module, b, s, t)
    with torch.no_grad():
        compiled = ortlite.compile(module.eval(), args)
        ops = optimized_ops(compiled.onnx_model)
        if three_d:
            attention = [n for n in compiled.onnx_model.graph.node if n.op_type == "Attention"]
            assert len(attention) == 1 and {a.name for a in attention[0].attribute} >= {"q_num_heads", "kv_num_heads"}
            assert ops["Transpose"] == 0 and ops["If"] == 0, ops
        elif module.mask == "hole":
            assert ops["Attention"] == 0 and ops["If"] == 0, ops  # the written-out ops, decided now
        else:
            assert ops["Transpose"] >= 2, ops
        if module.repeat_kv:  # Attention groups the heads itself: no copies
            assert ops["Expand"] == 0 and ops["Attention"] == 1, ops
        # q's and k's rotary embedding: one kernel each where cos's and sin's halves are equal
        assert ops["RotaryEmbedding"] == (2 if module.rotate == "llama" else 0), ops
        # (not NaN in q: aten's CPU kernel makes such a row 0 or NaN by the lengths, its blocks)
        for call in (args, (x * 40, *args[1:]), (x * 1e-30, *args[1:])):
            assert_same(compiled(*call), module(*call), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", ["same", "grouped", "repeat_kv"])
@pytest.mark.parametrize("rotate", [None, "llama", "other"])
def test_attention_rewrites_sweep(heads, rotate):
    """Every combination of the spellings the attention rewrites look for (grouped heads
    three ways, rotary embeddings with equal and unequal halves, causal flag or static or
    argument mask, the heads also returned) gives eager's values, whichever rewrites apply;
    batch 1 and 3."""
    kv_heads = 4 if heads == "same" else 2
    for causal, mask, also_heads in [(False, None, False), (True, None, False), (False, "causal", False), (False, "input", False), (True, None, True)]:
        module = HeadsAttention(
            heads=4, kv_heads=kv_heads, causal=causal, mask=mask, also_heads=also_heads, repeat_kv=heads == "repeat_kv", rotate=rotate
        ).eval()  # fmt: skip
        for b in (1, 3):
            torch.manual_seed(b)
            x, y = torch.randn(b, 6, 32), torch.randn(b, 6, 32)
            args = (x, y) if mask != "input" else (x, y, torch.randn(b, 1, 6, 6))
            with torch.no_grad():
                compiled = ortlite.compile(module, args)
                for call in (args, (x * 30, *args[1:])):
                    assert_same(compiled(*call), module(*call), rtol=1e-5, atol=1e-5)


SYMBOLIC_TOKEN_ROW_CASES = {
    # name: (module, head Transposes left)
    "causal": (HeadsAttention(heads=8, kv_heads=2, causal=True), 0),
    "mask built from the sizes": (HeadsAttention(heads=8, kv_heads=2, mask="causal"), 4),
    "LLaMA's rotary, repeat_kv": (HeadsAttention(heads=8, kv_heads=2, causal=True, rotate="llama", repeat_kv=True), 0),
}


@pytest.mark.parametrize("case", list(SYMBOLIC_TOKEN_ROW_CASES))
def test_attention_on_token_rows_with_symbolic_sizes(case, tmp_path):
    """torch.compile with symbolic batch and lengths, called in a loop where they change:
    the 3-D form (the hidden sizes declared: ONNX Runtime's shape inference takes unknown
    ones for 0), the rotary kernel's caches grown to the batch per call; a causal mask
    built from symbolic sizes keeps its check and the 4-D form."""
    torch._dynamo.reset()
    module, transposes = SYMBOLIC_TOKEN_ROW_CASES[case]
    module.eval()
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    f = torch.compile(module, backend=backend, dynamic=True)
    with torch.no_grad():
        for b, s in [(2, 5), (3, 3), (4, 9), (2, 2)]:
            x, y = torch.randn(b, s, 32), torch.randn(b, s, 32)
            assert_same(f(x, y), module(x, y), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == 1, backend.stats
    (path,) = tmp_path.glob("*.onnx")
    graph = onnx.load(path).graph
    head_transposes = [n for n in graph.node if n.op_type == "Transpose" and list(n.attribute[0].ints) == [0, 2, 1, 3]]
    assert len(head_transposes) == transposes, _ops_with_subgraphs(graph)
    assert ("RotaryEmbedding" in _ops_with_subgraphs(graph)) == (module.rotate == "llama")


def _window(width):
    """allowed(b, s, t): query i sees keys i - width < j <= i (a sliding window)."""
    return lambda b, s, t: (torch.arange(t)[None, :] <= torch.arange(s)[:, None]) & (torch.arange(t)[None, :] > torch.arange(s)[:, None] - width)


def _holes(b, s, t):
    """allowed(b, s, t): causal, with holes that differ by batch; key 0 seen by all."""
    i, j, batch = torch.arange(s)[:, None], torch.arange(t)[None, :], torch.arange(b)[:, None, None, None]
    return ((j <= i) & ((i * 7 + j * 3 + batch) % 5 != 0)) | (j == 0)


def _by_head(b, s, t):
    """allowed(b, s, t), (1, 4, s, t): heads 0 and 1 causal, 2 and 3 a window of 50 keys."""
    causal, window = torch.arange(t)[None, :] <= torch.arange(s)[:, None], _window(50)(b, s, t)
    return torch.stack([causal, causal, window, window])[None]


BLOCK_CASES = {
    # name: (module, (batch, query length, key length), Attentions in the graph)
    "causal": (HeadsAttention(causal=True), (1, 256, 256), 4),
    "causal, 300 rows": (HeadsAttention(causal=True), (2, 300, 300), 5),
    "causal, keys longer": (HeadsAttention(causal=True), (1, 260, 520), 5),
    "static causal mask, repeat_kv": (HeadsAttention(heads=8, kv_heads=2, repeat_kv=True, mask="causal"), (2, 256, 256), 4),
    "sliding window": (HeadsAttention(mask=_window(40)), (1, 320, 320), 5),
    "holes by batch": (HeadsAttention(mask=_holes), (2, 256, 256), 4),
    "by head": (HeadsAttention(mask=_by_head), (2, 256, 256), 4),
    "LLaMA's rotary": (HeadsAttention(heads=8, kv_heads=2, rotate="llama", causal=True), (1, 256, 256), 4),
    "heads returned too": (HeadsAttention(also_heads=True, causal=True), (1, 256, 256), 4),
    "not causal": (HeadsAttention(), (1, 256, 256), 1),
    "mask argument": (HeadsAttention(mask="input"), (1, 256, 256), 1),
    "causal, 255 rows": (HeadsAttention(causal=True), (1, 255, 255), 1),
}


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_attention_in_blocks_of_queries_reads_only_the_keys_they_see(case, monkeypatch):
    """Causal attention, or attention under a static mask, from 256 query rows on: blocks of
    64 query rows, each its own Attention on the keys its rows see (3-D and 4-D forms,
    windows that start later, masks per batch). Values as the whole kernel's, NaN included:
    a NaN or inf in a key that a block skips makes its rows NaN, as the whole kernel's
    masked scores and zero weights do; and as eager's on finite inputs."""
    module, (b, s, t), attentions = BLOCK_CASES[case]
    x, y, args = _heads_inputs(module, b, s, t)
    with torch.no_grad():
        compiled = ortlite.compile(module.eval(), args)
        assert _ops_with_subgraphs(compiled.onnx_model.graph).count("Attention") == attentions
        monkeypatch.setattr(fusions, "attention_in_query_blocks", lambda *a: 0)
        whole = ortlite.compile(module, args)
        assert _ops_with_subgraphs(whole.onnx_model.graph).count("Attention") == 1
        late, early = y.clone(), y.clone()
        late[:, -3] = float("nan")  # k and v of a key the first blocks skip
        early[:, 1, :4] = float("inf")  # of a key that windows leave behind
        for call in (args, (x * 40, *args[1:]), (x, late, *args[2:]), (x, early, *args[2:])):
            assert_same(compiled(*call), whole(*call), rtol=1e-6, atol=1e-6)
        for call in (args, (x * 40, *args[1:]), (x * 1e-30, *args[1:])):
            assert_same(compiled(*call), module(*call), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_attention_blocks_sweep(heads):
    """Static masks of many shapes (causal flag or mask, windows of 1 to 100 keys, holes by
    batch; query lengths that are no multiple of the block; keys as many or more; batch 1
    and 3): blocks or not, values as eager's and NaN where the whole kernel has it."""
    cases = [(True, None), (False, "causal"), (False, _window(1)), (False, _window(100)), (False, _holes), (True, _window(64))]
    for i, (causal, mask) in enumerate(cases * 2):
        (s, t), b = [(256, 256), (333, 333), (270, 400)][i % 3], (1, 3)[i % 2]
        module = HeadsAttention(heads=heads[0], kv_heads=heads[1], causal=causal, mask=mask).eval()
        torch.manual_seed(s + b)
        x, y = torch.randn(b, s, 32), torch.randn(b, t, 32)
        late = y.clone()
        late[:, t // 2 :, :2] = float("nan")
        with torch.no_grad():
            compiled = ortlite.compile(module, (x, y))
            assert_same(compiled(x, y), module(x, y), rtol=1e-5, atol=1e-5)
            assert compiled(x, late).isnan().any(-1).all(), "rows of blocks that skip a NaN key are NaN"


def test_attention_blocks_under_torch_compile_as_lengths_change(tmp_path):
    """torch.compile: the first call's static graph has the blocks; the graph Dynamo makes
    when the lengths change (symbolic) keeps one Attention; values as eager's throughout."""
    torch._dynamo.reset()
    module = HeadsAttention(heads=8, kv_heads=2, causal=True, rotate="llama").eval()
    backend = ortlite.Backend(ortlite.Options(fallback="error", dump_dir=str(tmp_path)))
    f = torch.compile(module, backend=backend)
    with torch.no_grad():
        for b, s in [(1, 256), (2, 300), (1, 257), (3, 256)]:
            x, y = torch.randn(b, s, 32), torch.randn(b, s, 32)
            assert_same(f(x, y), module(x, y), rtol=1e-5, atol=1e-5)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs >= 2, backend.stats
    counts = sorted(_ops_with_subgraphs(onnx.load(p).graph).count("Attention") for p in tmp_path.glob("*.onnx"))
    assert counts == [1] * (backend.stats.graphs - 1) + [4], counts  # (batch 1 specialized: 3 graphs)
