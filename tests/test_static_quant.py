"""Options(quantize="int8", calibration=samples): convolutions in static int8 (lower.qdq,
ortlite.calibrate). Checked against the scheme's own math (one convolution: within one
output step of a numpy reference at the calibrated scales), against float32 (nets: close),
for structure (ONNX Runtime runs every convolution as QLinearConv), batch independence,
save/load, and bad calibration input."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import ortlite
from ortlite.lower.qdq import _uint8_params


def _static(model, samples, example=None, **kwargs):
    example = example if example is not None else samples[0]
    return ortlite.compile(model, example if isinstance(example, tuple) else (example,), options=dict(quantize="int8", calibration=samples), **kwargs)


def _fake_quant(x: np.ndarray, scale: float, zero: int) -> np.ndarray:
    return (np.clip(np.rint(x / np.float64(scale)) + zero, 0, 255) - zero) * np.float64(scale)


def _randomize_norms(model):
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.uniform_(-0.3, 0.3, generator=g)
            m.running_var.uniform_(0.5, 2.0, generator=g)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.uniform_(-0.2, 0.2, generator=g)
    return model.eval()


CONVS = [  # (in channels, out channels, kernel, stride, padding, dilation, groups, bias, activation, dims)
    (3, 8, 3, 1, 1, 1, 1, True, "relu", 2),
    (8, 16, 1, 1, 0, 1, 1, False, None, 2),
    (8, 8, 3, 2, 1, 1, 8, True, "relu", 2),  # depthwise
    (6, 12, 3, 1, 2, 2, 3, True, None, 2),  # grouped, dilated
    (4, 8, 5, 2, 0, 1, 1, True, "relu6", 2),
    (4, 6, 3, 1, 1, 1, 1, True, "relu", 1),  # Conv1d
    (3, 4, 3, 1, 1, 1, 1, True, "relu6", 2),  # (inputs x3: outputs past 6, clamped)
]
ACTIVATIONS = {None: lambda y: y, "relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6)}


@pytest.mark.parametrize("cin,cout,k,stride,pad,dilation,groups,bias,activation,dims", CONVS)
def test_one_convolution_is_the_schemes_math(cin, cout, k, stride, pad, dilation, groups, bias, activation, dims):
    torch.manual_seed(0)
    conv = (nn.Conv2d if dims == 2 else nn.Conv1d)(cin, cout, k, stride, pad, dilation, groups, bias=bias)
    model = nn.Sequential(conv, *{None: [], "relu": [nn.ReLU()], "relu6": [nn.ReLU6()]}[activation])
    model.eval()
    shape = (2, cin) + (11,) * dims
    samples = [torch.randn(shape) * (1 + i) for i in range(4)]
    if cout == 4:
        samples = [s * 3 for s in samples]
    compiled = _static(model, samples)
    if groups == cin and cin > 1:  # depthwise on a float input stays float (lower.qdq._depthwise)
        assert compiled._lowered.static_convs == []
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        return
    (static,) = compiled._lowered.static_convs
    lows = [float(s.min()) for s in samples]
    highs = [float(s.max()) for s in samples]
    assert static.input_range == pytest.approx((min(lows), max(highs)))  # min/max over the samples
    sx, zx = _uint8_params(*static.input_range)
    sy, zy = _uint8_params(*static.output_range)
    if activation:
        assert zy == 0  # (the clamp absorbed: Q clamps at 0)
    w = conv.weight.detach().double().numpy()
    ws = (np.abs(w.reshape(cout, -1)).max(1) / 127).astype(np.float32).astype(np.float64)
    wd = np.clip(np.rint(w / ws.reshape(-1, *[1] * (w.ndim - 1))), -127, 127) * ws.reshape(-1, *[1] * (w.ndim - 1))
    x = torch.randn(shape) * 2
    xd = torch.from_numpy(_fake_quant(x.double().numpy(), sx, zx))
    bd = None
    if bias:
        bs = (np.float64(sx) * ws).astype(np.float32).astype(np.float64)
        bd = torch.from_numpy(np.rint(conv.bias.detach().double().numpy() / bs) * bs)
    f = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv1d
    y = f(xd, torch.from_numpy(wd), bd, stride, pad, dilation, groups).numpy()
    expected = _fake_quant(ACTIVATIONS[activation](y), sy, zy)
    got = compiled(x).double().numpy()
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= sy * 1.001  # int32 sums exact; requantizing rounds once


class _Block(nn.Module):
    def __init__(self, c, cout, stride, norm=True):
        super().__init__()
        self.c1 = nn.Conv2d(c, cout, 3, stride, 1, bias=not norm)
        self.b1 = nn.BatchNorm2d(cout) if norm else nn.Identity()
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=not norm)
        self.b2 = nn.BatchNorm2d(cout) if norm else nn.Identity()
        self.down = None if stride == 1 and c == cout else nn.Sequential(nn.Conv2d(c, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class _ResNet(nn.Module):
    def __init__(self, width=8, classes=10, norm=True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 5, 2, 2, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(_Block(width, width, 1, norm), _Block(width, 2 * width, 2, norm))
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


class _MobileBlock(nn.Module):  # depthwise after ReLU6 and after SiLU, squeeze-excitation, a residual
    def __init__(self, c=8):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(3, c, 3, 1, 1), nn.BatchNorm2d(c), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c), nn.SiLU())
        self.squeeze = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, 4, 1), nn.SiLU(), nn.Conv2d(4, c, 1), nn.Sigmoid())
        self.dw2 = nn.Sequential(nn.Conv2d(c, c, 5, 1, 2, groups=c), nn.BatchNorm2d(c), nn.SiLU())
        self.project = nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = self.dw(self.expand(x))
        y = self.dw2(y * self.squeeze(y))
        return torch.flatten(nn.functional.adaptive_avg_pool2d(y + self.project(y), 1), 1)


class _MobileV3Block(nn.Module):  # torch's hardswish and hardsigmoid decompositions
    def __init__(self, c=8):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(3, c, 3, 1, 1), nn.BatchNorm2d(c), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c), nn.Hardswish())
        self.squeeze = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, 4, 1), nn.ReLU(), nn.Conv2d(4, c, 1), nn.Hardsigmoid())
        self.project = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        y = self.dw(self.expand(x))
        return self.project(y * self.squeeze(y))


class _InputResiduals(nn.Module):  # adds reading the graph's input (no rank known for it) and each other
    def __init__(self, c=3, depth=3):
        super().__init__()
        self.convs = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)) for _ in range(depth))

    def forward(self, x):
        y = x
        for conv in self.convs:
            y = torch.relu(conv(y) + y) + x
        return y


NETS = {
    "resnet": lambda: _ResNet(),
    "resnet without norms": lambda: _ResNet(norm=False),
    "mobile": lambda: _MobileBlock(),
    "mobile v3": lambda: _MobileV3Block(),
    "input residuals": lambda: _InputResiduals(),
}


def _optimized_ops(compiled, tmp_path) -> collections.Counter:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(compiled.onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("name", list(NETS))
def test_nets_close_to_float_all_convolutions_integer(name, tmp_path):
    torch.manual_seed(0)
    model = _randomize_norms(NETS[name]())
    samples = [torch.randn(1, 3, 32, 32) for _ in range(8)]
    compiled = _static(model, samples)
    float32 = ortlite.compile(model, (samples[0],))
    convs = sum(isinstance(m, (nn.Conv2d,)) for m in model.modules())
    assert len(compiled._lowered.static_convs) == convs
    ops = _optimized_ops(compiled, tmp_path)
    assert ops["QLinearConv"] == convs and ops["Conv"] == 0 and ops["FusedConv"] == 0, ops
    # the weights' codes as uint8 at zero point 128: ORT's u8 x s8 kernels saturate on CPUs
    # without VNNI, so int8 weights would be exact on some machines only (a saved file too)
    graph = compiled.onnx_model.graph
    initializers = {t.name: t for t in graph.initializer}
    weights = [initializers[n.input[0]] for n in graph.node if n.op_type == "DequantizeLinear" and initializers.get(n.input[0]) is not None and len(initializers[n.input[0]].dims) == 4]
    assert len(weights) == convs and all(w.data_type == onnx.TensorProto.UINT8 for w in weights)
    if name.startswith("resnet"):
        assert ops["QLinearAdd"] == 2 and ops["If"] == 0, ops  # residuals in uint8; the max pool's NaN guard dropped
    if name == "mobile v3":  # one ONNX op for each of torch's five (four) of a hardswish (hardsigmoid)
        assert ops["Max"] == ops["Min"] == ops["Div"] == 0 and ops["QLinearMul"] == 1, ops
    if name == "mobile":  # SiLU, the squeeze-excitation and its pooling in uint8 too
        assert ops["QLinearSigmoid"] == 4 and ops["QLinearMul"] == 4 and ops["QLinearGlobalAveragePool"] == 2 and ops["Sigmoid"] == 0, ops
    for x in [torch.randn(1, 3, 32, 32) for _ in range(3)]:
        expected = float32(x)
        got = compiled(x)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert (got - expected).abs().max() <= 0.1 * expected.abs().max() + 1e-3
        assert torch.allclose(expected, model(x), atol=1e-4, rtol=1e-4)


def test_symbolic_batch_in_a_loop_each_sample_independent():
    torch.manual_seed(0)
    resnet = _randomize_norms(_ResNet())
    model = nn.Sequential(resnet.stem, resnet.blocks)  # (the head's Linear is quantized per call: its scale follows the batch)
    samples = [torch.randn(b, 3, 32, 32) for b in (1, 3, 2, 4)]
    compiled = _static(model, samples, example=samples[1], dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    for batch in (5, 1, 7, 2):
        x = torch.randn(batch, 3, 32, 32)
        got = compiled(x)
        assert got.shape == (batch, 16, 4, 4)
        assert (got - model(x)).abs().max() <= 0.1 * got.abs().max()
        alone = torch.cat([compiled(x[i : i + 1]) for i in range(batch)])
        assert torch.equal(got, alone)  # per-tensor scales fixed by calibration: a sample's result is its own
        channels_last = compiled(x.to(memory_format=torch.channels_last))
        assert torch.equal(channels_last, got)


def test_saved_file_keeps_the_quantized_model(tmp_path):
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())
    samples = [torch.randn(1, 3, 32, 32) for _ in range(4)]
    compiled = _static(model, samples)
    path = os.fspath(tmp_path / "int8.onnx")
    compiled.save(path)
    loaded = ortlite.load(path)
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(loaded(x), compiled(x))
    ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > ops["QuantizeLinear"]
    plain = ort.InferenceSession(path, providers=["CPUExecutionProvider"])  # plain onnxruntime runs it alike
    (out,) = plain.run(None, {plain.get_inputs()[0].name: x.numpy()})
    assert np.array_equal(out, compiled(x).numpy())


def test_calibration_takes_a_dataloader_and_at_most_its_first_samples(monkeypatch):
    import ortlite.calibrate

    monkeypatch.setattr(ortlite.calibrate, "CALIBRATION_SAMPLES", 3)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.cat([torch.ones(3, 3, 8, 8), 100 * torch.ones(1, 3, 8, 8)])), batch_size=1)
    compiled = _static(model, data, example=torch.ones(1, 3, 8, 8))
    assert compiled._lowered.static_convs[0].input_range == (1.0, 1.0)  # (the 4th sample, 100, never ran)


@pytest.mark.parametrize(
    "samples,error,words",
    [
        ([], ValueError, "no samples"),
        ([torch.randn(1, 3, 9, 9)], ValueError, "sample 0"),  # not the exported size
        ([torch.randn(1, 3, 8, 8), (torch.randn(1, 3, 8, 8), torch.randn(1))], TypeError, "sample 1"),
        ([torch.full((1, 3, 8, 8), float("nan"))], ValueError, "not finite"),
    ],
)
def test_bad_calibration_samples_are_named(samples, error, words):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    with pytest.raises(error, match=words):
        _static(model, samples, example=torch.randn(1, 3, 8, 8))


def test_options_with_other_samples_are_other_options():
    samples = [torch.ones(1)]
    a, b = ortlite.Options(quantize="int8", calibration=samples), ortlite.Options(quantize="int8", calibration=list(samples))
    assert a != b and a != ortlite.Options(quantize="int8") and a == a.with_changes() and hash(a) == hash(a.with_changes())
    backend = ortlite.Backend()  # torch.compile(options=...) picks the Backend of equal options: not one without the samples
    assert backend.for_options(dict(quantize="int8")) is not backend.for_options(dict(quantize="int8", calibration=samples))
    assert list(a.calibration) == samples


def test_calibration_needs_int8():
    with pytest.raises(ValueError, match="quantize='int8'"):
        ortlite.Options(calibration=[torch.ones(1)])
    with pytest.raises(TypeError, match="iterable"):
        ortlite.Options(quantize="int8", calibration=torch.ones(4, 3))


def test_torch_compile_gives_ortlite_compiles_results_and_explains():
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())
    samples = [torch.randn(1, 3, 32, 32) for _ in range(6)]
    aot = _static(model, samples)
    backend = ortlite.Backend(dict(quantize="int8", calibration=iter(samples)))  # (a generator: taken once)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 3, 32, 32)
            assert torch.equal(compiled(x), aot(x))  # the same graph, the same calibration
    (report,) = backend.graph_reports
    assert len(report.static_convs) == 6 and report.calibration_samples == 6
    assert report.static_convs[0][0] == "L['self'].stem.0"
    with torch.no_grad():
        text = str(ortlite.explain(model, samples[0], options=dict(quantize="int8", calibration=samples)))
    assert "quantized statically (6 convolution(s)" in text and "L['self'].blocks.1.down.0" in text


def test_torch_compile_maps_samples_onto_a_functions_arguments_and_symbolic_sizes():
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())

    def fn(scale, images):
        return model(images) * scale

    samples = [(torch.tensor(2.0), torch.randn(b, 3, 32, 32)) for b in (2, 3, 4)]
    aot = _static(model, [s[1] for s in samples], example=samples[0][1], dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    backend = ortlite.Backend(dict(quantize="int8", calibration=samples))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch in (2, 5, 3):
            x = torch.randn(batch, 3, 32, 32)
            torch.testing.assert_close(compiled(torch.tensor(2.0), x), 2 * aot(x), rtol=0, atol=1e-6)
    assert sum(len(r.static_convs) for r in backend.graph_reports) == 6


def test_torch_compile_where_samples_cannot_reach_a_graph_warns_and_stays_right(caplog):
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())

    def fn(x):
        y = x * 2
        torch._dynamo.graph_break()  # the graph after it reads y, not the call's argument
        return model(y)

    backend = ortlite.Backend(dict(quantize="int8", calibration=[torch.randn(1, 3, 32, 32)]))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), caplog.at_level("WARNING", logger="ortlite"):
        got = torch.compile(fn, backend=backend)(x)
    torch.testing.assert_close(got, model(2 * x), atol=0.02, rtol=0.02)  # (its Linear quantized per call)
    assert sum(len(r.static_convs) for r in backend.graph_reports) == 0
    assert any("stay float" in r.message and "graph break" in r.message for r in caplog.records)


def test_torch_compile_a_weight_changed_after_calibration_runs_unquantized(caplog):
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())
    samples = [torch.randn(1, 3, 32, 32) for _ in range(3)]
    compiled = torch.compile(model, backend=ortlite.Backend(dict(quantize="int8", calibration=samples)))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), caplog.at_level("WARNING", logger="ortlite"):
        compiled(x)
        model.stem[0].weight.mul_(-1)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert sum("a weight changed after static quantization" in r.message for r in caplog.records) == 1


def test_explain_lists_the_static_convolutions_and_their_ranges():
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())
    compiled = _static(model, [torch.randn(1, 3, 32, 32) for _ in range(5)])
    text = str(ortlite.explain(compiled))
    assert "quantized statically (6 convolution(s)" in text and "min/max over 5 sample(s)" in text
    first = compiled._lowered.static_convs[0]
    assert f"[{first.input_range[0]:.4g}, {first.input_range[1]:.4g}]" in text
    assert "QuantizeLinear" in text


def test_torch_compile_of_a_module_reading_no_weight_through_self():
    """A module's forward whose weights are not its own (here a network it calls from outside):
    its `self` is not the first sample argument."""
    torch.manual_seed(0)
    model = _randomize_norms(_ResNet())

    class Outer(torch.nn.Module):
        def forward(self, x):
            return model(x)

    samples = [torch.randn(1, 3, 32, 32) for _ in range(4)]
    backend = ortlite.Backend(dict(quantize="int8", calibration=samples))
    compiled = torch.compile(Outer(), backend=backend)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(compiled(x), _static(model, samples)(x))
    assert sum(len(r.static_convs) for r in backend.graph_reports) == 6
