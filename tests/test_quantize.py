"""Options(quantize=...): ONNX Runtime's integer kernels against the scheme's own math done
in float64 (exactness of the scheme, not only closeness to float32), on odd shapes; whole
models against float32; saved files."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch

import ortlite
from ortlite.lower.quantize import INT4_BLOCK

# ---------------------------------------------------------------- the scheme, in float64


def quantize_weight_int8(w: np.ndarray):
    """w (N, K) as a Linear holds it -> codes (K, N) int8 and scales (N,) float32:
    symmetric per output channel, scale = max|w| / 127, round half to even."""
    scale = (np.abs(w.astype(np.float64)).max(axis=1) / 127).astype(np.float32)
    codes = np.clip(np.rint(w.astype(np.float64).T / np.where(scale == 0, 1, scale)), -127, 127)
    return codes.astype(np.int64), scale


def dynamic_quantize_linear(x: np.ndarray):
    """ONNX DynamicQuantizeLinear as ONNX Runtime computes it (float32 arithmetic): uint8,
    range widened to hold 0, scale = (max - min) / 255, zero point round(-min / scale),
    codes saturate(round_half_even(x / scale) + zero point)."""
    x = x.astype(np.float32)
    low, high = min(np.float32(0), x.min()), max(np.float32(0), x.max())
    scale = np.float32((high - low) / np.float32(255))
    zero = np.clip(np.rint(np.float32(0) - low / scale), 0, 255) if scale else np.float32(0)
    codes = np.clip(np.rint(x / scale) + zero, 0, 255) if scale else np.zeros_like(x) + zero
    return codes.astype(np.int64), np.float64(scale), int(zero)


def int8_reference(x: np.ndarray, w: np.ndarray, bias):
    """(float64 result, float64 bound of float32 rounding per element)."""
    codes, w_scale = quantize_weight_int8(w)
    x_codes, x_scale, x_zero = dynamic_quantize_linear(x)
    product = (x_codes - x_zero) @ codes  # exact, int64
    y = product * (x_scale * w_scale.astype(np.float64))
    b = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
    return y + b, 4e-7 * (np.abs(y) + np.abs(b)) + 1e-30


def quantize_weight_int4(w: np.ndarray):
    """w (N, K) -> dequantized float64 blocks (N, blocks, INT4_BLOCK) as (code - 8) * scale:
    per block of INT4_BLOCK along K (zero padded), the value of largest magnitude maps to
    code 0 (scale = it / -8), codes round half to even, clipped to 0..15."""
    n, k = w.shape
    blocks = -(-k // INT4_BLOCK)
    padded = np.zeros((n, blocks * INT4_BLOCK))
    padded[:, :k] = w
    padded = padded.reshape(n, blocks, INT4_BLOCK)
    index = np.abs(padded).argmax(axis=-1)
    scale = (np.take_along_axis(padded, index[..., None], -1)[..., 0] / -8).astype(np.float32).astype(np.float64)
    codes = np.clip(np.rint(padded / np.where(scale == 0, 1, scale)[..., None]), -8, 7)
    return codes, scale


def int4_reference(x: np.ndarray, w: np.ndarray, bias):
    """MatMulNBits at accuracy_level 4: the left operand quantized to int8 per block of K
    (symmetric: scale = max|a| / 127, codes round(a * 127 / max|a|)), integer products
    per block, each scaled by both blocks' scales, summed."""
    codes, scale = quantize_weight_int4(w)  # (N, B, L), (N, B)
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    n, blocks, length = codes.shape
    a = np.zeros((rows.shape[0], blocks * length), np.float32)
    a[:, : rows.shape[1]] = rows
    a = a.reshape(-1, blocks, length)
    amax = np.abs(a).max(axis=-1)
    a_scale = (amax / np.float32(127)).astype(np.float32)
    inverse = np.where(amax != 0, np.float32(127) / np.where(amax == 0, 1, amax), 0).astype(np.float32)
    a_codes = np.rint((a * inverse[..., None]).astype(np.float32)).astype(np.float64)
    dots = np.einsum("mbl,nbl->mnb", a_codes, codes)  # exact
    scales = a_scale.astype(np.float64)[:, None, :] * np.abs(scale)[None, :, :]
    y = (dots * scales * np.sign(scale)[None]).sum(-1)
    b = np.zeros(n) if bias is None else bias.astype(np.float64)
    # the kernel sums codes 0..15 and takes 8 times the block's sum of A's codes away: its
    # float32 rounding is of those terms' size
    magnitudes = np.einsum("mbl,nbl->mnb", np.abs(a_codes), np.abs(codes) + 8) * scales
    bound = 1e-6 * (magnitudes.sum(-1) + np.abs(b)) + 1e-30
    return (y + b).reshape(*x.shape[:-1], n), bound.reshape(*x.shape[:-1], n)


# ---------------------------------------------------------------- the kernels


class Linear(torch.nn.Module):
    def __init__(self, k, n, bias=True):
        super().__init__()
        self.linear = torch.nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.linear(x)


def _ops(compiled) -> list[str]:
    return [n.op_type for n in compiled.onnx_model.graph.node]


def _assert_exact(got: torch.Tensor, reference):
    expected, bound = reference
    assert got.dtype == torch.float32 and tuple(got.shape) == expected.shape
    error = np.abs(got.numpy().astype(np.float64) - expected)
    worst = np.unravel_index(np.argmax(error / bound), error.shape)
    assert (error <= bound).all(), f"off by {error[worst]:.3g} (allowed {bound[worst]:.3g}) at {worst}"


INT8_OPS = ["DynamicQuantizeLinear", "MatMulIntegerToFloat"]
SHAPES = [(1, 50), (7, 50), (300, 50), (2, 3, 50), (1, 1, 96), (4, 96)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_int8_is_the_scheme_exactly(shape, bias):
    torch.manual_seed(0)
    model = Linear(shape[-1], 24, bias).eval()
    x = torch.randn(shape)
    compiled = ortlite.compile(model, (x,), options={"quantize": "int8"})
    assert _ops(compiled) == INT8_OPS  # the bias inside, the weight's Transpose folded
    [product] = compiled._lowered.quantized
    assert (product.kernel, product.k, product.n) == ("int8", shape[-1], 24)
    w = model.linear.weight.detach().numpy()
    b = model.linear.bias.detach().numpy() if bias else None
    for trial in range(3):
        x = torch.randn(shape) * (10.0 ** (trial - 1))
        _assert_exact(compiled(x), int8_reference(x.numpy(), w, b))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 50), (1, 1, 96), (1, 200)], ids=str)
def test_int4_at_one_row_is_the_scheme_exactly(shape, bias):
    torch.manual_seed(1)
    model = Linear(shape[-1], 40, bias).eval()  # K 50 and 200: not whole blocks
    x = torch.randn(shape)
    compiled = ortlite.compile(model, (x,), options={"quantize": "int4"})
    assert _ops(compiled) == ["MatMulNBits"]
    assert compiled._lowered.quantized[0].kernel == "int4"
    w = model.linear.weight.detach().numpy()
    b = model.linear.bias.detach().numpy() if bias else None
    for trial in range(3):
        x = torch.randn(shape) * (10.0 ** (trial - 1))
        _assert_exact(compiled(x), int4_reference(x.numpy(), w, b))


def test_int4_with_more_rows_runs_int8():
    torch.manual_seed(2)
    model = Linear(50, 24).eval()
    x = torch.randn(2, 3, 50)
    compiled = ortlite.compile(model, (x,), options={"quantize": "int4"})
    assert _ops(compiled) == INT8_OPS
    _assert_exact(compiled(x), int8_reference(x.numpy(), model.linear.weight.detach().numpy(), model.linear.bias.detach().numpy()))


def test_int4_with_symbolic_rows_chooses_per_call():
    torch.manual_seed(3)
    model = Linear(50, 24).eval()
    rows = torch.export.Dim("rows", min=1, max=64)
    compiled = ortlite.compile(model, (torch.randn(5, 50),), dynamic_shapes=({0: rows},), options={"quantize": "int4"})
    assert "If" in _ops(compiled) and compiled._lowered.quantized[0].kernel.startswith("int4 at <= 1 row")
    w, b = model.linear.weight.detach().numpy(), model.linear.bias.detach().numpy()
    one, many = torch.randn(1, 50), torch.randn(9, 50)
    _assert_exact(compiled(one), int4_reference(one.numpy(), w, b))
    _assert_exact(compiled(many), int8_reference(many.numpy(), w, b))


class Products(torch.nn.Module):
    """A weight read as it is (x @ W), a weight two products share, and an attention-like
    product of two activations (stays float)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(40, 40) / 8)
        self.shared = torch.nn.Linear(40, 40)

    def forward(self, x):
        h = x @ self.w
        h = self.shared(torch.relu(self.shared(h)))
        return torch.softmax(h @ h.transpose(-1, -2), -1) @ h


def test_which_products_are_quantized():
    torch.manual_seed(4)
    model = Products().eval()
    x = torch.randn(2, 6, 40)
    compiled = ortlite.compile(model, (x,), options={"quantize": "int8"})
    ops = _ops(compiled)
    assert ops.count("MatMulIntegerToFloat") == 3 and ops.count("MatMul") == 2  # x @ W, the Linear twice; QK and PV float
    weights = {t.name: t for t in compiled.onnx_model.graph.initializer}
    assert not any(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2 for t in weights.values())  # no float copy kept
    assert sum(t.data_type == onnx.TensorProto.UINT8 and len(t.dims) == 2 for t in weights.values()) == 2  # the shared Linear's once (codes + 128: see quantize.py)
    expected = model(x)
    got = compiled(x)
    assert torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0) > 0.999


def test_none_changes_nothing():
    torch.manual_seed(5)
    model = Products().eval()
    x = torch.randn(2, 6, 40)
    plain = ortlite.compile(model, (x,))
    none = ortlite.compile(model, (x,), options={"quantize": None})
    assert none.onnx_model.SerializeToString() == plain.onnx_model.SerializeToString()
    assert none._lowered.quantized == []
    torch.testing.assert_close(none(x), model(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- whole models, saved files


def _bert():
    import transformers

    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=1000)
    return transformers.BertModel(config).eval(), (torch.randint(0, 1000, (2, 16)),)


class _LogitsOf(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _llama(tokens):
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=2000
    )
    return _LogitsOf(transformers.LlamaForCausalLM(config)).eval(), (torch.randint(0, 2000, (1, tokens)),)


def _first(out):
    return out if isinstance(out, torch.Tensor) else out["last_hidden_state"] if isinstance(out, dict) else out[0]


def _cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


@pytest.mark.parametrize(
    "build,products,embeddings,kernels",
    [
        (_bert, 13, 3, {"int8": {"int8"}, "int4": {"int8"}}),  # 12 in the layers at 2x16 rows; the pooler at 2 rows
        (lambda: _llama(1), 15, 1, {"int8": {"int8"}, "int4": {"int4"}}),  # 7 a layer and the LM head, at 1 row
        (lambda: _llama(12), 15, 1, {"int8": {"int8"}, "int4": {"int8"}}),
    ],
    ids=["bert", "llama-1-token", "llama-12-tokens"],
)
def test_whole_models_close_to_float32(build, products, embeddings, kernels):
    pytest.importorskip("transformers")
    torch.manual_seed(6)
    model, args = build()
    with torch.no_grad():
        expected = _first(model(*args))
        plain = ortlite.compile(model, args)
        torch.testing.assert_close(_first(plain(*args)), expected, rtol=1e-4, atol=1e-4)
        for mode, least in (("int8", 0.999), ("int4", 0.95)):
            compiled = ortlite.compile(model, args, options={"quantize": mode})
            quantized = [q for q in compiled._lowered.quantized if q.kernel != "int8 rows"]
            assert len(quantized) == products and {q.kernel for q in quantized} == kernels[mode]
            assert len(compiled._lowered.quantized) - products == embeddings  # (word, position, token type)
            if mode == "int8":  # q, k and v (and gate and up) share their activations' quantization
                assert 0 < _ops(compiled).count("DynamicQuantizeLinear") < products
            # (int4's error is int4's only where its kernel runs)
            assert _cosine(_first(compiled(*args)), expected) > (least if "int4" in kernels[mode] else 0.999), mode


def _linear_stack():
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 2000)
    ).eval()


@pytest.mark.parametrize("mode,most", [("int8", 0.35), ("int4", 0.25)])
def test_saved_file_keeps_quantized_weights(tmp_path, mode, most):
    import onnxruntime

    model, x = _linear_stack(), torch.randn(1, 256)
    plain = ortlite.compile(model, (x,))
    plain.save(tmp_path / "f32.onnx")
    compiled = ortlite.compile(model, (x,), options={"quantize": mode})
    compiled.save(tmp_path / f"{mode}.onnx")
    ratio = (tmp_path / f"{mode}.onnx").stat().st_size / (tmp_path / "f32.onnx").stat().st_size
    assert ratio <= most, ratio
    loaded = ortlite.load(tmp_path / f"{mode}.onnx")
    for trial in range(2):
        x = torch.randn(1, 256)
        assert torch.equal(loaded(x), compiled(x))
    assert sum(n.domain == "com.microsoft" for n in loaded.onnx_model.graph.node) == 3
    session = onnxruntime.InferenceSession(str(tmp_path / f"{mode}.onnx"), providers=["CPUExecutionProvider"])  # plain onnxruntime
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), compiled(x), rtol=1e-5, atol=1e-5)


def test_saved_file_with_symbolic_rows(tmp_path):
    model = _linear_stack()
    rows = torch.export.Dim("rows", min=1, max=64)
    compiled = ortlite.compile(model, (torch.randn(4, 256),), dynamic_shapes=({0: rows},), options={"quantize": "int4"})
    compiled.save(tmp_path / "int4.onnx")
    loaded = ortlite.load(tmp_path / "int4.onnx")
    for n in (1, 5):
        x = torch.randn(n, 256)
        assert torch.equal(loaded(x), compiled(x))


# ---------------------------------------------------------------- torch.compile: frozen weights


@pytest.mark.parametrize("mode,rows", [("int8", 3), ("int4", 1), ("int4", 3)])
def test_torch_compile_quantizes_frozen_weights_at_session_build(mode, rows):
    torch.manual_seed(8)
    model = Linear(50, 24).eval()
    backend = ortlite.Backend(ortlite.Options(quantize=mode))
    compiled = torch.compile(model, backend=backend)
    reference = int4_reference if mode == "int4" and rows == 1 else int8_reference
    x = torch.randn(rows, 50)
    for change in range(2):  # the second time, from the weights' new values (a new session)
        with torch.no_grad():
            if change:
                model.linear.weight.mul_(-3)
            got = compiled(x)
        w, b = model.linear.weight.detach().numpy(), model.linear.bias.detach().numpy()
        _assert_exact(got, reference(x.numpy(), w, b))
    [runner] = backend._runners
    assert [q.kernel for q in runner.quantized] == ["int4" if reference is int4_reference else "int8"]


def test_torch_compile_with_grad_is_not_quantized():
    torch.manual_seed(9)
    model = Linear(50, 24)
    backend = ortlite.Backend(ortlite.Options(quantize="int8"))
    x = torch.randn(3, 50)
    got = torch.compile(model, backend=backend)(x)
    assert all(not getattr(r, "quantized", []) for r in backend._runners)
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_explain_lists_quantized_products():
    torch.manual_seed(10)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    with torch.no_grad():
        explanation = ortlite.explain(model, torch.randn(1, 64), options={"quantize": "int4"})
    text = explanation.table(fusions=True)
    assert "quantized (2 product(s)" in text
    assert ".0  64 x 128  int4" in text and ".2  128 x 10  int4" in text
    assert "MatMulIntegerToFloat" not in text  # (fusions: ONNX Runtime kept the int4 kernels)


def test_torch_compile_takes_a_frozen_bias_into_the_kernel(tmp_path):
    torch.manual_seed(11)
    model = Linear(50, 24).eval()
    x = torch.randn(2, 3, 50)  # rank 3: MatMul + Add after lowering, the Add's bias a frozen input
    with torch.no_grad():
        got = torch.compile(model, backend=ortlite.Backend(ortlite.Options(quantize="int8", dump_dir=str(tmp_path))))(x)
    [path] = tmp_path.glob("*.onnx")
    graph = onnx.load(str(path), load_external_data=False).graph
    assert [n.op_type for n in graph.node] == INT8_OPS and len(graph.node[1].input) == 7  # with the bias
    _assert_exact(got, int8_reference(x.numpy(), model.linear.weight.detach().numpy(), model.linear.bias.detach().numpy()))


class NotFitting(torch.nn.Module):
    """Products that do not fit the pattern exactly stay float: a scaled addmm, a batched
    (3-D) weight, a weight of float64."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(24, 40) / 8)
        self.b = torch.nn.Parameter(torch.randn(24))
        self.batched = torch.nn.Parameter(torch.randn(2, 24, 24) / 8)
        self.w64 = torch.nn.Parameter(torch.randn(24, 24, dtype=torch.float64) / 8)

    def forward(self, x):
        h = torch.addmm(self.b, x, self.w.t(), alpha=0.5)
        h = torch.bmm(h.expand(2, -1, -1), self.batched)
        return h, h.double() @ self.w64


def test_products_that_do_not_fit_stay_float():
    torch.manual_seed(12)
    model = NotFitting().eval()
    x = torch.randn(5, 40)
    compiled = ortlite.compile(model, (x,), options={"quantize": "int8"})
    assert compiled._lowered.quantized == [] and "com.microsoft" not in {n.domain for n in compiled.onnx_model.graph.node}
    for got, expected in zip(compiled(x), model(x)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_reduced_precision_models_quantized_run_whole_in_onnxruntime(tmp_path, dtype, mode):
    """A bfloat16/float16 model with quantize set: float32 inside (ONNX Runtime's CPU provider
    has no bfloat16 arithmetic), its weights quantized from their values, called in and
    returning its own dtype; the same as quantizing its float32 copy, and saved files too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 8)).to(dtype).eval()
    x = torch.randn(1, 64).to(dtype)
    compiled = ortlite.compile(model, (x,), options={"quantize": mode})
    as_float32 = ortlite.compile(copy.deepcopy(model).float(), (x.float(),), options={"quantize": mode})
    got = compiled(x)
    assert got.dtype == dtype and torch.equal(got, as_float32(x.float()).to(dtype))
    assert next(model.parameters()).dtype == dtype  # the user's model is left as it was
    assert torch.nn.functional.cosine_similarity(got.float().flatten(), model(x).float().flatten(), 0) > 0.99
    compiled.save(tmp_path / "m.onnx")
    assert torch.equal(ortlite.load(tmp_path / "m.onnx")(x), got)


class ReducedBlock(torch.nn.Module):
    """Ops that name the model's dtype (full_like, arange, to), a norm, a softmax, and an
    integer result beside the floating ones."""

    def __init__(self):
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(64, 96), torch.nn.Linear(96, 8), torch.nn.LayerNorm(96)

    def forward(self, x):
        h = self.norm(torch.nn.functional.gelu(self.up(x)))
        h = h + torch.arange(96, dtype=x.dtype) / 96 + torch.full_like(h, 0.5)
        y = self.down(h).softmax(-1)
        return y, y.argmax(-1), (y * 2).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode,dynamic", [("int8", False), ("int4", False), ("int4", True)])
def test_torch_compile_of_reduced_precision_models_quantized(dtype, mode, dynamic):
    """torch.compile of a bfloat16/float16 model with quantize set: computed in float32 inside
    (ortlite.widen), its frozen weights quantized from their values, the whole graph in ONNX
    Runtime, results in eager's dtypes: the same as torch.compile of its float32 copy; new
    weight values (a new session) and changing row counts included."""
    torch.manual_seed(1)
    model = ReducedBlock().to(dtype).eval()
    twin = copy.deepcopy(model).float()
    backend = ortlite.Backend(ortlite.Options(quantize=mode))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    as_float32 = torch.compile(twin, backend=ortlite.Backend(ortlite.Options(quantize=mode)), dynamic=dynamic)
    for step, rows in enumerate((1, 3, 1) if dynamic else (2, 2)):
        x = torch.randn(rows, 64).to(dtype)
        with torch.no_grad():
            if step == 1:  # new values: the session is rebuilt from them
                for m in (model, twin):
                    m.up.weight.mul_(-2)
            got, expected = compiled(x), as_float32(x.float())
            eager = model(x)
        assert [t.dtype for t in got] == [t.dtype for t in eager] == [dtype, torch.int64, dtype]
        assert torch.equal(got[0], expected[0].to(dtype)) and torch.equal(got[1], expected[1])
        assert torch.equal(got[2], (expected[0] * 2).to(dtype))
        assert torch.nn.functional.cosine_similarity(got[0].float().flatten(), eager[0].float().flatten(), 0) > 0.99
    # (dynamic: Dynamo compiles 1 row apart, a size it specializes)
    assert backend.stats.fallback_ops == {} and backend.stats.graphs == (2 if dynamic else 1)
    assert all(len(r.quantized) == 2 for r in backend._runners) and next(model.parameters()).dtype == dtype


class ReturnsAView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.linear(x), x[1:]


class ReadsBits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.linear(x) + x.view(torch.int16)[:, :8].float()


@pytest.mark.parametrize("model", [ReturnsAView(), ReadsBits()], ids=["view_of_input", "bit_level"])
def test_reduced_precision_graphs_widen_cannot_keep_eager_semantics_stay_in_torch(model):
    """ortlite.widen refuses a graph whose result aliases an argument (a cast would copy it) or
    that reads a value's bits: such a graph stays in torch, and is eager's."""
    torch.manual_seed(2)
    model = model.to(torch.bfloat16).eval()
    x = torch.randn(4, 16).to(torch.bfloat16)
    backend = ortlite.Backend(ortlite.Options(quantize="int8"))
    with torch.no_grad():
        got, expected = torch.compile(model, backend=backend)(x), model(x)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    if isinstance(model, ReturnsAView):
        assert got[1]._base is x or got[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert all(r.widened_from is None for r in backend.graph_reports)


# ---------------------------------------------------------------- embeddings


class Embedded(torch.nn.Module):
    """An embedding (with a padding row and a row of zeros), a product, and an LM head tied
    to the embedding."""

    def __init__(self, tied: bool):
        super().__init__()
        self.embed = torch.nn.Embedding(300, 48, padding_idx=0)
        with torch.no_grad():
            self.embed.weight[7] = 0
            self.embed.weight[9, 3] = 40.0  # an outlier: its row's scale only
        self.mix = torch.nn.Linear(48, 48)
        self.head = torch.nn.Linear(48, 300, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        e = self.embed(ids)
        return e, self.head(self.mix(e))


def _rows_reference(w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The scheme: per row, scale = max|row| / 127, int8 = rint(row / scale), read back as int8 * scale."""
    w = w.detach().double()
    scale = (w.abs().amax(1, keepdim=True) / 127).float()
    q = torch.clamp(torch.round(w / torch.where(scale == 0, 1, scale).double()), -127, 127).to(torch.int8)
    return (q.float() * scale)[ids]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("path", ["aot", "compile", "compile-dynamic"])
def test_embeddings_read_int8_rows_exactly(tied, path):
    """An embedding's rows are int8 with a scale each (in both modes): its lookups are the
    scheme's values exactly, on odd ids (the padding row, a row of zeros, an outlier's row,
    repeats), with the ids' sizes changing; out-of-range ids raise as eager."""
    torch.manual_seed(13)
    model = Embedded(tied).eval()
    calls = [torch.tensor([[0, 7, 9, 299, 9], [9, 9, 1, 2, 3]]), torch.tensor([[5, 6], [0, 0], [7, 8]]), torch.tensor([[1, 2], [3, 0]])]
    if path == "aot":
        compiled = ortlite.compile(model, (calls[2],), dynamic_shapes=({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},), options={"quantize": "int8"})
        kinds = [q.kernel for q in compiled._lowered.quantized]
    else:
        backend = ortlite.Backend(ortlite.Options(quantize="int8"))
        compiled = torch.compile(model, backend=backend, dynamic=path == "compile-dynamic")
    with torch.no_grad():
        for ids in calls:
            e, logits = compiled(ids)
            assert e.dtype == torch.float32 and e.shape == model(ids)[0].shape
            assert torch.equal(e, _rows_reference(model.embed.weight, ids))
            assert _cosine(logits, model(ids)[1]) > 0.999
        with pytest.raises(IndexError, match="index out of range in self"):
            compiled(torch.tensor([[1, 300], [2, 3]]))
    if path != "aot":
        kinds = [q.kernel for r in backend._runners for q in r.quantized]
    assert kinds.count("int8 rows") >= 1 and kinds.count("int8") >= 2


def test_saved_llama_files_shrink_with_quantized_embeddings(tmp_path):
    """The file targets on a LLaMA-style model, whose embedding and LM head are most of it."""
    pytest.importorskip("transformers")
    torch.manual_seed(14)
    model, args = _llama(1)
    sizes = {}
    with torch.no_grad():
        for mode in (None, "int8", "int4"):
            path = tmp_path / f"{mode}.onnx"
            ortlite.compile(model, args, options={"quantize": mode}).save(path)
            sizes[mode] = path.stat().st_size
            if mode:
                assert _cosine(ortlite.load(path)(*args), model(*args)) > (0.999 if mode == "int8" else 0.95)
    assert sizes["int8"] <= 0.35 * sizes[None] and sizes["int4"] <= 0.25 * sizes[None], sizes
