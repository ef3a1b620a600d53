"""Deploying: CompiledModel.save / ortlite.load, ortlite.explain, ONNX Runtime's log."""

import copy
import json
import os
import re
import subprocess
import sys
import textwrap

import onnx
import onnxruntime
import pytest
import torch
from torch.export import Dim

import ortlite
import ortlite.saved
from conftest import assert_same
from test_backend import MLP

torch.manual_seed(0)


def _errors(model, calls, positions=True) -> list[tuple]:
    """(exception type, message) of each bad call. positions=False: without the runner's
    argument positions, which count the weights it binds (with bind_weights=True a loaded
    model binds fewer: they became initializers)."""
    got = []
    for call in calls:
        with pytest.raises((TypeError, ValueError)) as info:
            call(model)
        message = str(info.value)
        got.append((type(info.value).__name__, message if positions else re.sub(r"argument \d+", "argument", message)))
    return got


def test_save_load_plain(tmp_path):
    model = MLP().eval()
    x = torch.randn(2, 64)
    compiled = ortlite.compile(model, (x,), dynamic_shapes=({0: Dim("batch", max=64)},))
    path = tmp_path / "mlp.onnx"
    compiled.save(path)
    loaded = ortlite.load(path)
    assert type(loaded) is ortlite.CompiledModel and loaded.providers == ["CPUExecutionProvider"]
    for batch in (2, 7):  # the batch dim stays dynamic
        x = torch.randn(batch, 64)
        assert_same(loaded(x), compiled(x))
    bad = [lambda m: m(x.double()), lambda m: m(torch.randn(3, 65)), lambda m: m(torch.randn(65, 64)), lambda m: m(x, x)]
    assert _errors(loaded, bad) == _errors(compiled, bad)
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # plain ORT still runs it
    (out,) = sess.run(None, {"x": x.numpy()})
    assert_same(torch.from_numpy(out), compiled(x))


class Structured(torch.nn.Module):
    """kwargs, nested inputs and outputs, a mutated buffer, a size output."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x, pair, *, scale):
        self.calls.add_(1)
        return {"a": self.lin(x) * scale, "b": (pair[0] - pair[1]).sum(0)}, x.shape[0] + 1


@pytest.mark.parametrize("bind_weights", [False, True])
def test_save_load_structured(tmp_path, bind_weights):
    model = Structured()
    x, pair, scale = torch.randn(3, 8), (torch.randn(5, 2), torch.randn(5, 2)), torch.tensor(2.0)
    shapes = {"x": {0: Dim("b")}, "pair": ({0: Dim("n")}, {0: Dim("n")}), "scale": None}
    compiled = ortlite.compile(model, (x, pair), {"scale": scale}, dynamic_shapes=shapes, bind_weights=bind_weights)
    compiled(x, pair, scale=scale)
    compiled.save(tmp_path / "m.onnx")
    with torch.no_grad():
        model.lin.weight.mul_(2)  # after saving: the loaded model has the weights saved
    loaded = ortlite.load(tmp_path / "m.onnx")
    model.lin.weight.data.div_(2)
    assert loaded._buffers["calls"].item() == 1  # the buffer's value when saved
    x, pair = torch.randn(6, 8), (torch.randn(4, 2), torch.randn(4, 2))
    got, expected = loaded(x, pair, scale=scale), compiled(x, pair, scale=scale)
    assert got[1] == expected[1] == 7
    assert_same(got[0]["a"], expected[0]["a"])
    assert_same(got[0]["b"], expected[0]["b"])
    assert loaded._buffers["calls"].item() == 2 and model.calls.item() == 2  # each updates its own
    bad = [
        lambda m: m(x, pair, factor=scale),
        lambda m: m(x.double(), pair, scale=scale),
        lambda m: m(x, (pair[0], torch.randn(5, 2)), scale=scale),
    ]
    assert _errors(loaded, bad, positions=not bind_weights) == _errors(compiled, bad, positions=not bind_weights)
    loaded.save(tmp_path / "again.onnx")  # a loaded model saves too
    assert_same(ortlite.load(tmp_path / "again.onnx")(x, pair, scale=scale)[0]["a"], expected[0]["a"])


class ScaleBy(torch.nn.Module):
    def forward(self, x, n: int):
        return x * n + x.shape[0]


def test_save_load_int_argument_and_options(tmp_path):
    x = torch.randn(3, 4)
    compiled = ortlite.compile(ScaleBy(), (x, 2), dynamic_shapes={"x": {0: Dim("b")}, "n": Dim.DYNAMIC})
    compiled.save(tmp_path / "scale.onnx")
    seen = []
    loaded = ortlite.load(tmp_path / "scale.onnx", options={"model_transforms": [lambda m: seen.append(len(m.graph.node))]})
    assert seen == [len(compiled.onnx_model.graph.node)]
    for n, rows in ((5, 2), (-3, 6)):
        x = torch.randn(rows, 4)
        assert_same(loaded(x, n), compiled(x, n))
    with pytest.raises(TypeError, match="unknown ortlite option"):
        ortlite.load(tmp_path / "scale.onnx", options={"bogus": 1})


def test_mutated_buffer_file_runs_in_plain_onnxruntime(tmp_path):
    model = Structured()
    x, pair, scale = torch.randn(3, 8), (torch.randn(5, 2), torch.randn(5, 2)), torch.tensor(2.0)
    ortlite.compile(model, (x, pair), {"scale": scale}).save(tmp_path / "m.onnx")
    sess = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in sess.get_inputs()][-4:], (t.numpy() for t in (x, *pair, scale))))
    new_calls, a, b = sess.run(None, feeds)[:3]  # the buffer's default is its initializer
    assert new_calls.tolist() == [1.0]
    with torch.no_grad():
        assert_same(torch.from_numpy(a), model.lin(x) * scale)


class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_external_data(tmp_path, monkeypatch):
    model, x = Wide(), torch.randn(2, 64)
    compiled = ortlite.compile(model, (x,))
    path = tmp_path / "wide.onnx"
    monkeypatch.setattr(ortlite.saved, "PROTOBUF_LIMIT", 10_000)  # as if it were over 2 GB
    compiled.save(path)
    data = tmp_path / "wide.onnx.data"
    assert data.stat().st_size >= 64 * 64 * 4 > path.stat().st_size
    loaded = ortlite.load(path)
    assert_same(loaded(x), compiled(x))
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert_same(torch.from_numpy(sess.run(None, {"x": x.numpy()})[0]), compiled(x))
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"{path}: cannot read its external data"):
        ortlite.load(path)
    monkeypatch.undo()
    compiled.save(path)  # small: one file, and the stale .data is not read
    assert_same(ortlite.load(path)(x), compiled(x))


def _saved_mlp(tmp_path):
    path = tmp_path / "mlp.onnx"
    ortlite.compile(MLP().eval(), (torch.randn(2, 64),)).save(path)
    return path


def test_truncated_file(tmp_path):
    path = _saved_mlp(tmp_path)
    whole = path.read_bytes()
    for size in (len(whole) // 2, len(whole) - 10, len(whole) - 200, 100):
        path.write_bytes(whole[:size])
        with pytest.raises(ValueError) as info:
            ortlite.load(path)
        message = str(info.value)
        assert str(path) in message and "truncated" in message, message


def _metadata(path) -> dict:
    (entry,) = [p for p in onnx.load(path).metadata_props if p.key == "ortlite"]
    return json.loads(entry.value)


def _rewrite_metadata(path, change):
    model = onnx.load(path)
    (entry,) = [p for p in model.metadata_props if p.key == "ortlite"]
    metadata = json.loads(entry.value)
    change(metadata)
    entry.value = json.dumps(metadata)
    onnx.save(model, path)


@pytest.mark.parametrize(
    "change,problem",
    [
        (lambda m: m.update(format=2), "written in ortlite format 2; this ortlite reads format 1"),
        (lambda m: m["inputs"][0].update(dtype="float64"), "says input x is torch.float64 \\[2, 64\\], but the graph says FLOAT \\[2, 64\\]"),
        (lambda m: m["inputs"][0].update(name="y"), "names the inputs \\['y'\\], but the graph has \\['x'\\]"),
        (lambda m: m["outputs"][0].update(index=3), "malformed ortlite metadata: output from ort 3 of 1"),
        (lambda m: m["inputs"][0].update(shape=[["Add", "__import__('os')", 1], 64]), "unknown size symbol"),
        (lambda m: m.update(out_spec="[1, {"), "its outputs structure cannot be read"),
        (lambda m: m["inputs"][0].update(device="warp:0"), "malformed ortlite metadata \\(RuntimeError: .*warp"),
        (lambda m: m.pop("in_spec"), "malformed ortlite metadata \\(KeyError: 'in_spec'\\)"),
    ],
    ids=["newer", "dtype", "name", "index", "expression", "spec", "device", "missing"],
)
def test_tampered_metadata(tmp_path, change, problem):
    path = _saved_mlp(tmp_path)
    _rewrite_metadata(path, change)
    with pytest.raises(ValueError, match=f"^ortlite.load: {path}: .*{problem}"):
        ortlite.load(path)


class Positive(torch.nn.Module):
    def forward(self, x, n: int):
        return x > n


def _int_index(metadata) -> int:
    return next(i for i, a in enumerate(metadata["inputs"]) if a["kind"] == "int")


@pytest.mark.parametrize(
    "change,problem",
    [
        # the runner writes an int argument as 8 bytes on the host: a 1-byte dtype, a shape or
        # a device for it would be a write past its buffer
        (lambda m: m["inputs"][_int_index(m)].update(dtype="int8"), "int argument .* as torch.int8"),
        (lambda m: m["inputs"][_int_index(m)].update(device="cuda:0"), "int argument .* on cuda:0"),
        # a failure flag is read as one byte of a 0-d CPU bool: not a bool tensor of 3 (or 0)
        (lambda m: m.update(failures=[[0, "boom", False]]), "failure output 0"),
        # sizes code writes s**e as e multiplications
        (lambda m: m["inputs"][0].update(shape=[["Pow", ["Add", 1, 2], 2**62]]), "second argument must be an int in \\[-64, 64\\]"),
    ],
    ids=["scalar_dtype", "scalar_device", "failure_flag", "power"],
)
def test_metadata_that_would_make_the_runner_unsafe_is_refused(tmp_path, change, problem):
    path = tmp_path / "positive.onnx"
    ortlite.compile(Positive(), (torch.randn(3), 2), dynamic_shapes={"x": None, "n": Dim.DYNAMIC}).save(path)
    _rewrite_metadata(path, change)
    with pytest.raises(ValueError, match=f"^ortlite.load: {path}: .*{problem}"):
        ortlite.load(path)


class Lookups(torch.nn.Module):
    def forward(self, x, i):  # aten raises IndexError for the first, RuntimeError for the second
        return torch.index_select(x, 0, i), x.gather(0, i.view(-1, 1).expand(-1, x.shape[1]))


def test_index_checks_raise_eagers_error_types_after_load(tmp_path):
    x, good = torch.randn(4, 3), torch.tensor([0, 3])
    path = tmp_path / "lookups.onnx"
    ortlite.compile(Lookups(), (x, good)).save(path)
    kinds = [kind for _, _, kind in _metadata(path)["failures"]]
    assert sorted(kinds) == ["IndexError", "RuntimeError"]
    loaded = ortlite.load(path)
    assert all(torch.equal(a, b) for a, b in zip(loaded(x, good), Lookups()(x, good)))
    for bad in (torch.tensor([0, 4]), torch.tensor([-1, 0])):
        with pytest.raises(IndexError, match="index out of range in self"):
            Lookups()(x, bad)
        with pytest.raises(IndexError, match="index out of range in self"):
            loaded(x, bad)
    # files from before failures had kinds say false for "raise" (RuntimeError): they load
    _rewrite_metadata(path, lambda m: m.update(failures=[[i, message, False] for i, message, _ in m["failures"]]))
    with pytest.raises(RuntimeError, match="index out of range in self"):
        ortlite.load(path)(x, torch.tensor([0, 4]))
    _rewrite_metadata(path, lambda m: m.update(failures=[[i, message, "SystemExit"] for i, message, _ in m["failures"]]))
    with pytest.raises(ValueError, match="failure kind 'SystemExit'"):
        ortlite.load(path)


def test_metadata_nested_past_pythons_limits_is_a_value_error(tmp_path):
    path = _saved_mlp(tmp_path)
    model = onnx.load(path)
    (entry,) = [p for p in model.metadata_props if p.key == "ortlite"]
    deep = '["Add", ' * 5000 + "1" + ", 1]" * 5000  # json.loads and sympy both recurse
    for text in (deep, json.dumps(json.loads(entry.value) | {"format": 1}).replace('"shape": [2, 64]', f'"shape": [{deep}, 64]', 1)):
        entry.value = text
        onnx.save(model, path)
        with pytest.raises(ValueError, match=f"^ortlite.load: {path}: "):
            ortlite.load(path)


def test_edited_graph_and_foreign_file(tmp_path):
    path = _saved_mlp(tmp_path)
    model = onnx.load(path)
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 11
    onnx.save(model, path)
    with pytest.raises(ValueError, match=f"{path}: its metadata says output .* \\[2, 10\\], but the graph says FLOAT \\[2, 11\\]"):
        ortlite.load(path)
    del model.metadata_props[:]
    onnx.save(model, path)
    with pytest.raises(ValueError, match=f"{path}: it has no ortlite metadata"):
        ortlite.load(path)


BERT_COMPILE = textwrap.dedent(
    """
    import sys, time
    import torch
    import transformers
    import ortlite

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    model = transformers.BertModel(config).eval()
    x = torch.randint(0, config.vocab_size, (1, 128))
    start = time.perf_counter()
    compiled = ortlite.compile(model, (x,))
    seconds = time.perf_counter() - start
    compiled.save(sys.argv[1])
    torch.save({"x": x, "out": compiled(x).last_hidden_state}, sys.argv[2])
    print(seconds)
    """
)

BERT_LOAD = textwrap.dedent(
    """
    import sys, time
    import torch
    import transformers.modeling_outputs  # registers the output type (BaseModelOutput...) with pytree

    def refuse(*args, **kwargs):
        raise AssertionError("torch.export.export called")

    torch.export.export = refuse
    import ortlite

    io = torch.load(sys.argv[2])
    start = time.perf_counter()
    loaded = ortlite.load(sys.argv[1])
    out = loaded(io["x"])
    seconds = time.perf_counter() - start
    expected = io["out"]
    assert torch.equal(out.last_hidden_state, expected), (out.last_hidden_state - expected).abs().max()
    assert not [m for m in sys.modules if "modeling_bert" in m], "the model's code was imported"
    print(seconds)
    """
)


def test_load_bert_in_a_fresh_process(tmp_path):
    """Load + first call of a saved BERT h256 L4 in a fresh process: <= 1/4 of compiling it
    in a fresh process (imports of torch, transformers and ortlite not counted in either),
    equal results. Both cold: compiling in this process, warm from the tests before it, was
    up to 3x faster than in a fresh one, and made the ratio depend on test order."""
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(ortlite.__file__)), os.environ.get("PYTHONPATH", "")])}

    def seconds(source: str, *args) -> float:
        script = tmp_path / "script.py"
        script.write_text(source)
        run = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        return float(run.stdout.split()[-1])

    compile_seconds = seconds(BERT_COMPILE, tmp_path / "bert.onnx", tmp_path / "io.pt")
    times = []
    for _ in range(3):  # another fresh process only if one was slowed by the shared machine
        times.append(seconds(BERT_LOAD, tmp_path / "bert.onnx", tmp_path / "io.pt"))
        if times[-1] <= compile_seconds / 4:
            break
    # the 0.5 s is a figure for the note (measured on a quiet machine); here, where CI
    # shares its cores, only the ratio to compiling, and a bound 3x looser
    assert min(times) <= compile_seconds / 4 and min(times) <= 1.5, (times, compile_seconds)


def airy_after_sin(x):
    y = torch.sin(x) * 2
    z = torch.special.airy_ai(y)  # no lowering: runs in torch
    return z + 1


def test_explain_names_the_op_left_to_torch_its_reason_and_source():
    x = torch.randn(4)
    report = ortlite.explain(airy_after_sin, x)
    (graph,) = report.graphs
    assert graph.ort_ops == {"aten.sin.default": 1, "aten.mul.Tensor": 1, "aten.add.Tensor": 1}
    ((op, reason, source),) = graph.torch_ops
    assert (op, reason) == ("aten.special_airy_ai.default", "no lowering")
    assert source == f'File "{__file__}", line {airy_after_sin.__code__.co_firstlineno + 2}, in airy_after_sin: z = torch.special.airy_ai(y)  # no lowering: runs in torch'
    assert len(graph.sessions) == 2 and graph.providers == ["CPUExecutionProvider"]
    table = str(report)
    for text in ("aten.special_airy_ai.default", "no lowering", "in airy_after_sin: z = torch.special.airy_ai(y)", "aten.sin.default", "2 session(s) on CPUExecutionProvider"):
        assert text in table, table


def test_explain_fusions():
    """ONNX Runtime fuses MatMul+Add into Gemm-like ops and folds BatchNorm into the
    convolution when the weights are initializers (frozen, under no_grad)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    with torch.no_grad():
        report = ortlite.explain(model, torch.randn(1, 3, 8, 8))
    (graph,) = report.graphs
    assert graph.torch_ops == []
    (session,) = graph.sessions
    ops = report.fusions()[session]
    assert ops["BatchNormalization"] == (1, 0) and ops["Relu"] == (1, 0), ops
    assert "BatchNormalization  1 -> 0" in report.table(fusions=True)


def test_onnxruntime_log_stays_off_stderr(capfd, caplog, unchecked_indices):
    """A compile that hits missing kernels (erf in float64), bfloat16 on CPU, an op left to
    torch and a failed run (an out-of-bounds index, with ortlite's index checks off): what
    ortlite handles goes to the "ortlite" logger, and
    nothing of ONNX Runtime's own log reaches stderr (fd 2, where its C++ logger writes)."""
    import logging

    import numpy as np
    from onnx import TensorProto, helper

    # the check can fail: plain onnxruntime with its default log level writes an [E:onnxruntime line
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]), helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    plain = onnxruntime.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString())
    with pytest.raises(Exception, match="out of data bounds"):
        plain.run(None, {"x": np.zeros(4, np.float32), "i": np.array([9])})
    assert "[E:onnxruntime" in capfd.readouterr().err

    caplog.set_level(logging.WARNING, logger="ortlite")

    def f(x, y, t, i):
        return torch.special.airy_ai(torch.erf(x) + 1), torch.sin(y.bfloat16()).float(), torch.index_select(t, 0, i) * 2

    backend = ortlite.Backend()
    fn = torch.compile(f, backend=backend)
    x, y, t = torch.randn(4, dtype=torch.float64), torch.randn(3), torch.randn(4, 3)
    fn(x, y, t, torch.tensor([0, 3]))
    with pytest.raises(IndexError):  # ONNX Runtime fails the run; torch then raises as eager does
        fn(x, y, t, torch.tensor([0, 7]))
    # (bfloat16 on CPU stays in torch by rule, the cast to it included)
    expected = {"aten.erf.default", "aten.special_airy_ai.default", "aten.sin.default", "aten._to_copy.default", "aten.index_select.default"}
    assert set(backend.stats.fallback_ops) == expected
    assert "[E:onnxruntime" not in capfd.readouterr().err
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "ortlite")
    for text in ("aten.erf.default runs in torch (ONNX Runtime has no kernel", "aten.sin.default runs in torch", "aten.index_select", "no lowering"):
        assert text in logged, logged


# ---------------------------------------------------------------- a saved file is hostile input


def test_load_fuzz_10000_mutations():
    """tests/load_fuzz.py: 10,000 mutated files (metadata and ONNX structure); in a process of
    its own, so a crash or a hang fails this test with the case that caused it."""
    script = os.path.join(os.path.dirname(__file__), "load_fuzz.py")
    done = subprocess.run([sys.executable, "-W", "ignore", script, "--cases", "10000"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.startswith("ok 10000 cases"), done.stdout[-3000:] + done.stderr[-3000:]


def _saved_with_spec(tmp_path, key, spec) -> str:
    path = _saved_mlp(tmp_path)
    _rewrite_metadata(path, lambda m: m.update({key: json.dumps(spec)}))
    return path


LEAF = {"type": None, "context": None, "children_spec": []}
PLANTED = "ortlite_planted_module"  # a module on sys.path that records being imported


@pytest.mark.parametrize(
    "spec,problem",
    [
        # torch's treespec_loads imports the factory's module, and the enum's
        ([1, {"type": "collections.defaultdict", "context": {"default_factory_module": PLANTED, "default_factory_name": "f", "dict_context": ["a"]}, "children_spec": [LEAF]}], "only builtin factories"),
        ([1, {"type": "builtins.dict", "context": json.dumps([{"__enum__": True, "fqn": PLANTED + ":E", "name": "A"}]), "children_spec": [LEAF]}], "enum"),
        ([1, {"type": PLANTED + ".Out", "context": "null", "children_spec": [LEAF]}], "not registered with pytree"),
        ([1, {"type": "collections.namedtuple", "context": PLANTED + ".P", "children_spec": [LEAF]}], "namedtuple"),
        ([1, {"type": "builtins.dict", "context": '["a", "a"]', "children_spec": [LEAF, LEAF]}], "keys"),
        ([1, {"type": "collections.deque", "context": "1", "children_spec": [LEAF, LEAF]}], "maxlen"),
        ([2, LEAF], "protocol 2"),
    ],
    ids=["defaultdict", "enum", "type", "namedtuple", "duplicate_keys", "deque", "protocol"],
)
def test_load_imports_nothing_a_pytree_spec_names(tmp_path, monkeypatch, spec, problem):
    (tmp_path / f"{PLANTED}.py").write_text("import builtins\nbuiltins.ortlite_planted_imported = True\nf = list\nclass E: A = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _saved_with_spec(tmp_path, "out_spec", spec)
    with pytest.raises(ValueError, match=f"^ortlite.load: {path}: .*{problem}"):
        ortlite.load(path)
    assert PLANTED not in sys.modules and not hasattr(__builtins__ if isinstance(__builtins__, dict) else vars(__builtins__), "ortlite_planted_imported")


def test_load_reads_nothing_outside_the_folder(tmp_path, monkeypatch):
    """External data anywhere but the graph's initializers (a Constant node's value, a
    subgraph's initializer: ONNX Runtime resolves those against the working directory) is
    refused; so is an initializer's path that leaves the folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(bytes(range(256)) * 4)
    monkeypatch.chdir(tmp_path)  # where ONNX Runtime would find "secret.bin"
    path = _saved_mlp(folder)
    base = onnx.load(path)

    def constant(model):
        tensor = onnx.helper.make_tensor("c", onnx.TensorProto.FLOAT, [10], bytes(40), raw=True)
        onnx.external_data_helper.set_external_data(tensor, "secret.bin")
        tensor.ClearField("raw_data")
        model.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["c"], value=tensor))
        model.graph.node.append(onnx.helper.make_node("Add", [model.graph.output[0].name, "c"], ["out2"]))
        model.graph.output[0].name = "out2"

    def subgraph(model):
        inner = onnx.helper.make_tensor("inner", onnx.TensorProto.FLOAT, [1], bytes(4), raw=True)
        onnx.external_data_helper.set_external_data(inner, "secret.bin")
        inner.ClearField("raw_data")
        branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["inner"], ["o"])], "b", [], [onnx.helper.make_tensor_value_info("o", 1, [1])], [inner])
        cond = onnx.helper.make_tensor("cond", onnx.TensorProto.BOOL, [], [True])
        model.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["cond"], value=cond))
        model.graph.node.insert(1, onnx.helper.make_node("If", ["cond"], ["unused"], then_branch=branch, else_branch=branch))

    def initializer(model):
        tensor = model.graph.initializer[0]
        onnx.external_data_helper.set_external_data(tensor, "../secret.bin")
        tensor.ClearField("raw_data")

    for change, problem in ((constant, "keeps its data in a file, and only the graph's initializers may"), (subgraph, "keeps its data in a file"), (initializer, "cannot read its external data")):
        model = copy.deepcopy(base)
        change(model)
        onnx.save(model, path)
        with pytest.raises(ValueError, match=f"^ortlite.load: {path}: .*{problem}"):
            ortlite.load(path)


@pytest.mark.parametrize(
    "expression,problem",
    [
        (["PowByNatural", "s0", 2**62], "second argument must be an int in \\[-64, 64\\]"),
        (["FloatPow", "s0", 100], "second argument"),
        (["LShift", 1, 2**40], "second argument"),
        (["RoundDecimal", "s0", -(2**63)], "second argument"),
        (["Pow", ["Pow", ["Pow", ["Pow", "s0", 64], 64], 64], 64], "past 4096 bits"),
        (["FloorDiv", "s0", 0], "divides by 0"),
        (["Add", "s0", True], "mixes numbers and truth values"),
    ],
    ids=["pow_by_natural", "float_pow", "shift", "round", "nested_powers", "zero_divisor", "mixed"],
)
def test_size_expressions_that_would_hang_or_fail_every_call_are_refused(tmp_path, expression, problem):
    path = tmp_path / "positive.onnx"
    ortlite.compile(Positive(), (torch.randn(3), 2), dynamic_shapes={"x": None, "n": Dim.DYNAMIC}).save(path)

    def guard(m):
        (name,) = m["symbols"]
        m["guards"] = [["StrictLessThan", json.loads(json.dumps(expression).replace('"s0"', json.dumps(name))), 5]]

    _rewrite_metadata(path, guard)
    with pytest.raises(ValueError, match=f"^ortlite.load: {path}: .*{problem}"):
        ortlite.load(path)


class Halves(torch.nn.Module):
    def forward(self, x):
        return x[:, ::2] * 2


@pytest.mark.parametrize(
    "size",
    [["FloorDiv", "SYM", ["Add", "SYM", -7]], ["Add", "SYM", -100], ["Mul", "SYM", 2**61], ["Add", "SYM", 1]],
    ids=["zero_division", "negative", "overflow", "off_by_one"],
)
def test_output_sizes_shape_inference_leaves_unknown_are_not_taken_from_the_file(tmp_path, size):
    """A size ONNX Runtime's shape inference cannot compute ((c + 1) // 2, of a strided slice)
    is not read from the file: ONNX Runtime allocates that output at each call, so a file
    whose expression there is wrong (a divisor that is 0 for some sizes, a size negative,
    past int64 or off by one) still runs the graph and gives its results."""
    path = tmp_path / "halves.onnx"
    compiled = ortlite.compile(Halves(), (torch.randn(2, 6),), dynamic_shapes=({1: Dim("c", min=3)},))
    compiled.save(path)

    def change(m):
        (name,) = m["symbols"]
        m["ort_outputs"][0]["shape"][1] = json.loads(json.dumps(size).replace('"SYM"', json.dumps(name)))

    _rewrite_metadata(path, change)
    loaded = ortlite.load(path)
    for x in (torch.randn(2, 7), torch.randn(2, 12)):
        assert_same(loaded(x), compiled(x))


class WrittenHalves(torch.nn.Module):
    """Rows of a buffer written in place (index_copy_: an output ONNX Runtime writes into the
    buffer's memory) beside outputs whose sizes a loaded file leaves to ONNX Runtime (a
    strided slice's (c + 1) // 2)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.zeros(4, 3))

    def forward(self, x, at):
        self.rows.index_copy_(0, at, x[:, :3])
        return x[:, ::2] * 2, self.rows.sum(1), x[:, 1::2]


@pytest.mark.parametrize("session_options", [False, True], ids=["c_api", "pybind"])
def test_loaded_outputs_come_in_order_with_outputs_in_place_and_ort_allocated(tmp_path, session_options):
    """Every output of a loaded file is its own, whichever way the outputs are bound: in place,
    allocated by ONNX Runtime, preallocated; through the C API and through onnxruntime's Python
    module (a user's SessionOptions), call after call. (The Python module's IOBinding lists
    outputs in the order first bound: the cache of a decode step came back as its logits.)"""
    options = {"session_options": onnxruntime.SessionOptions()} if session_options else None
    model = WrittenHalves()
    compiled = ortlite.compile(copy.deepcopy(model), (torch.randn(2, 6), torch.tensor([1, 2])), dynamic_shapes=({1: Dim("c", min=4)}, None))
    compiled.save(tmp_path / "m.onnx")
    _, lowered, saved = ortlite.saved.read(str(tmp_path / "m.onnx"), (tmp_path / "m.onnx").read_bytes())
    assert lowered.inplace and saved["unconfirmed"], "the file no longer has outputs of both kinds: the test tests nothing"
    loaded = ortlite.load(tmp_path / "m.onnx", options=options)
    for c, at in ((6, [1, 2]), (9, [0, 3]), (7, [2, 1])):
        x = torch.randn(2, c)
        assert_same(loaded(x, torch.tensor(at)), model(x, torch.tensor(at)))


class Outputs(torch.nn.Module):
    def forward(self, x):
        return x.sum(1, keepdim=True), x * 2, torch.relu(x).t()


def _output_dims(path, change_graph):
    model = onnx.load(path)
    change_graph(model.graph.output)
    onnx.save(model, path)


def _swap_dims(value):
    dims = value.type.tensor_type.shape.dim
    first, second = copy.deepcopy(dims[0]), copy.deepcopy(dims[1])
    dims[0].CopyFrom(second)
    dims[1].CopyFrom(first)


def _symbol(m):
    (name,) = m["symbols"]
    return name


@pytest.mark.parametrize(
    "change,change_graph,problem",
    [
        # graph and metadata both claim another static shape of the sum (the graph computes (r, 1))
        (lambda m: m["ort_outputs"][0]["shape"].__setitem__(1, 2), lambda outs: setattr(outs[0].type.tensor_type.shape.dim[1], "dim_value", 2), r"ort_outputs\[0\].shape\) is \[s\d+, 2\], but the graph computes \[s\d+, 1\]"),
        # a dynamic size the graph computes, lied about
        (lambda m: m["ort_outputs"][1]["shape"].__setitem__(0, ["Add", _symbol(m), 1]), None, r"ort_outputs\[1\].shape\) is \[s\d+ \+ 1, 4\], but the graph computes \[s\d+, 4\]"),
        (lambda m: m["ort_outputs"][2]["shape"].reverse(), lambda outs: _swap_dims(outs[2]), r"ort_outputs\[2\].shape\) is \[s\d+, 4\], but the graph computes \[4, s\d+\]"),
        (lambda m: m["ort_outputs"][1]["shape"].append(1), lambda outs: outs[1].type.tensor_type.shape.dim.add().__setattr__("dim_value", 1), r"is \[s\d+, 4, 1\], but the graph computes 2 dims"),
        # outputs mapped onto other graph outputs
        (lambda m: m["outputs"].reverse(), None, r"outputs\[0\] is graph output 2, but the graph's outputs come in order"),
        (lambda m: m["outputs"][1].update(index=0), None, r"outputs\[2\] is graph output 2, but the graph's outputs come in order \(1 next\)"),
    ],
    ids=["static_both", "dynamic", "transposed", "rank", "reversed", "remapped"],
)
def test_output_shapes_and_order_follow_from_the_graph(tmp_path, change, change_graph, problem):
    """The metadata's output shapes are checked against ONNX Runtime's shape inference of the
    graph, and the call's outputs against the graph's order, at load: a file that lies about
    them is refused there, naming the field (not a RunError at the first call)."""
    path = tmp_path / "outputs.onnx"
    ortlite.compile(Outputs(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("r")},)).save(path)
    _rewrite_metadata(path, change)
    if change_graph is not None:
        _output_dims(path, change_graph)
    with pytest.raises(ValueError, match=f"^ortlite.load: {path}: .*{problem}"):
        ortlite.load(path)


@pytest.mark.parametrize("reader", ["columns", "rows"])
def test_saved_ranges_are_right_in_plain_onnxruntime_with_default_options(tmp_path, reader):
    """Gathers by ranges built from a symbolic size: ONNX Runtime's GatherToSliceFusion (on by
    default) gets negative and backward ranges wrong; a saved file must not depend on a user
    turning it off."""
    from test_changing_shapes import RANGES

    wrong = []
    for name, make in RANGES.items():
        class Reader(torch.nn.Module):
            def forward(self, x):
                i = make(x.shape[1])
                return (x[:, i] if reader == "columns" else x[i]) * 1

        path = tmp_path / f"{name}.onnx"
        size = Dim("s", min=4)
        ortlite.compile(Reader(), (torch.randn(6, 6),), dynamic_shapes=({0: size, 1: size},)).save(path)
        so = onnxruntime.SessionOptions()
        so.log_severity_level = 3
        sess = onnxruntime.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for s in (6, 9, 5):
            x = torch.arange(float(s * s)).reshape(s, s)
            out = sess.run(None, {"x": x.numpy()})[0]  # (then the index checks' flags)
            if not torch.equal(torch.from_numpy(out), Reader()(x)):
                wrong.append(f"{name} at {s}")
    assert not wrong, wrong


def test_dynamic_models_keep_stderr_quiet_with_the_users_session_options(tmp_path, capfd):
    """A graph whose sizes vary has the runner's memory-pattern key input: with a user's
    SessionOptions (ORT's default log level) ortlite's session, ortlite.load's and plain
    onnxruntime's of the saved file write nothing to stderr (an initializer that is also an
    input made ONNX Runtime warn)."""
    so = onnxruntime.SessionOptions()
    compiled = ortlite.compile(ScaleBy(), (torch.randn(3, 4), 2), dynamic_shapes={"x": {0: Dim("b")}, "n": Dim.DYNAMIC}, options={"session_options": so})
    x = torch.randn(5, 4)
    expected = ScaleBy()(x, 3)
    assert_same(compiled(x, 3), expected)
    compiled.save(tmp_path / "scale.onnx")
    assert_same(ortlite.load(tmp_path / "scale.onnx", options={"session_options": so})(x, 3), expected)
    plain = onnxruntime.InferenceSession(str(tmp_path / "scale.onnx"), providers=["CPUExecutionProvider"])
    (out,) = plain.run(None, {"x": x.numpy(), "n": torch.tensor(3).numpy()})
    assert_same(torch.from_numpy(out), expected)
    assert "onnxruntime" not in capfd.readouterr().err
