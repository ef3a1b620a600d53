"""The oldest onnxruntime a saved file runs on: written into the file (metadata_props
"min_onnxruntime") from ortlite.saved's MIN_ORT_* rules; the rules against what
bench/ort_versions.py measured in onnxruntime 1.15-1.32 (bench/ort_versions.json); ortlite.load
refusing a file on an older onnxruntime with both versions named."""

import importlib.util
import json
import re
import os

import onnx
import onnxruntime
import pytest
import torch
from torch.export import Dim

import ortlite
from ortlite.saved import MIN_ORT_IR, MIN_ORT_KEY, MIN_ORT_OPS, MIN_ORT_OPSET, MIN_ORT_TYPED, min_onnxruntime

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_ort_versions", os.path.join(BENCH, "ort_versions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _measured() -> dict:
    with open(os.path.join(BENCH, "ort_versions.json")) as f:
        return json.load(f)


def _minor(version: str) -> tuple:
    return tuple(int(p) for p in version.split(".")[:2])


def _check_against(minimum: str, results: dict, what: str) -> None:
    """Every measured version at or past `minimum` ran the case, and none before it did."""
    tested = {v: r for v, r in results.items() if not r.startswith(("no venv", "runner failed"))}
    assert any(_minor(v) < _minor(minimum) for v in tested) or minimum == "1.15", f"{what}: nothing older than {minimum} was measured"
    for version, result in tested.items():
        if _minor(version) >= _minor(minimum):
            assert result == "ok", f"{what}: the minimum is {minimum}, but onnxruntime {version} gave: {result}"
        else:
            assert result != "ok", f"{what}: the minimum is {minimum}, but onnxruntime {version} runs it"


def _recorded(path) -> str:
    entries = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    assert set(entries) == {"ortlite", MIN_ORT_KEY}
    # what a Triton or plain onnxruntime user reads
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map[MIN_ORT_KEY] == entries[MIN_ORT_KEY]
    return entries[MIN_ORT_KEY]


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()


def _saved(kind: str, folder) -> tuple:
    """(path, args) of a file of the kind, compiled and saved."""
    if kind == "opset 23":
        model, args, options = Attention().eval(), (torch.randn(2, 5, 32),), ortlite.Options(opset=23)
    elif kind == "index check":  # an embedding's indices checked (lower.ops.index): an unsigned comparison
        torch.manual_seed(0)
        model, args, options = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 4)).eval(), (torch.randint(0, 100, (2, 5)),), None
    else:
        model, args = _mlp(), (torch.randn(4 if kind == "float32" else 1, 64),)  # one row: int4's own kernel
        options = ortlite.Options(quantize=None if kind == "float32" else kind)
    dynamic = {"input": {0: Dim("batch")}} if kind == "float32" else None
    path = os.path.join(folder, f"{kind.replace(' ', '')}.onnx")
    ortlite.compile(model, args, dynamic_shapes=dynamic, options=options).save(path)
    return path, args


# kind: (what the rules give, the bench's case of that kind, what in the file needs it)
KINDS = {
    "float32": ("1.18", "float32 MLP", "IR version 10"),
    "int8": ("1.18", "int8 MLP", "IR version 10"),
    "int4": ("1.19", "int4 MLP", "com.microsoft MatMulNBits with 6 inputs"),
    "opset 23": ("1.23", "float32 BERT", "ai.onnx opset 23"),
    "index check": ("1.21", "float32 BERT, opset 21", "GreaterOrEqual on uint64"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_saved_file_records_its_minimum(kind, tmp_path):
    expected, case, why = KINDS[kind]
    path, args = _saved(kind, tmp_path)
    assert _recorded(path) == expected
    model = onnx.load(path)
    assert min_onnxruntime(model) == (_minor(expected), why)
    # the bench's file of this kind ran from that version and in no older one
    _check_against(expected, _measured()["cases"][case]["results"], f"{kind} ({case})")
    loaded = ortlite.load(path)  # loads here, and saved again records the same, once
    again = os.path.join(tmp_path, "again.onnx")
    loaded.save(again)
    assert _recorded(again) == expected
    torch.testing.assert_close(ortlite.load(again)(*args), loaded(*args))


def test_rules_match_the_measured_versions():
    """Each probe (a one-node graph per rule row, as the bench ran it) needs what the rules say,
    and every saved kind the bench measured recorded its measured minimum."""
    measured = _measured()["cases"]
    probes = _bench().probe_models()
    assert set(probes) == {n for n, c in measured.items() if c["kind"] == "probe"}, "probes changed: run bench/ort_versions.py --record"
    for name, (model, _) in probes.items():
        _check_against("%d.%d" % min_onnxruntime(model)[0], measured[name]["results"], name)
    for name, case in measured.items():
        if case["kind"] == "saved":
            _check_against(case["min"], case["results"], name)
    # every row of the rules has a probe
    models = [m for m, _ in probes.values()]
    assert {m.ir_version for m in models} >= set(MIN_ORT_IR)
    assert {o.version for m in models for o in m.opset_import if o.domain == ""} >= set(MIN_ORT_OPSET)
    for domain, op, inputs in MIN_ORT_OPS:
        assert any(n.domain == domain and n.op_type == op and len(n.input) >= inputs for m in models for n in m.graph.node)
    for (domain, op, _), version in MIN_ORT_TYPED.items():
        assert any(min_onnxruntime(m)[0] == version and any(n.op_type == op and n.domain == domain for n in m.graph.node) for m in models)


def _edited(path, folder, entry=None, drop=False, opset=None) -> str:
    model = onnx.load(path)
    kept = [p for p in model.metadata_props if not (drop and p.key == MIN_ORT_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for p in model.metadata_props:
        if p.key == MIN_ORT_KEY and entry is not None:
            p.value = entry
    for o in model.opset_import:
        if o.domain == "" and opset is not None:
            o.version = opset
    out = os.path.join(folder, "edited.onnx")
    onnx.save(model, out)
    return out


def test_load_refuses_a_file_for_a_newer_onnxruntime(tmp_path):
    path, args = _saved("float32", tmp_path)
    with pytest.raises(ValueError, match=rf"needs onnxruntime 99\.0 or newer \(its min_onnxruntime entry\), and this is onnxruntime {onnxruntime.__version__}"):
        ortlite.load(_edited(path, tmp_path, entry="99.0"))
    with pytest.raises(ValueError, match=r"needs onnxruntime 1\.40 or newer"):
        ortlite.load(_edited(path, tmp_path, entry="1.40.2"))
    for bad in ("1.x", "", "99", "1.18; import os", "1.18.0.0", "123456.0"):
        with pytest.raises(ValueError, match="min_onnxruntime entry .* is not a version"):
            ortlite.load(_edited(path, tmp_path, entry=bad))
    # an older minimum than its contents need (edited) is overruled by the contents; a file
    # without the entry (saved before it) is checked from its contents alone
    torch.testing.assert_close(ortlite.load(_edited(path, tmp_path, entry="1.2"))(*args), _mlp()(*args))
    torch.testing.assert_close(ortlite.load(_edited(path, tmp_path, drop=True))(*args), _mlp()(*args))


@pytest.mark.parametrize("kind, running", [("float32", "1.17.3"), ("int4", "1.18.1"), ("index check", "1.20.1"), ("opset 23", "1.22.1")])
def test_load_names_what_needs_a_newer_onnxruntime(kind, running, tmp_path, monkeypatch):
    """On an older onnxruntime (simulated: its version string), a file is refused by ortlite
    before ONNX Runtime sees it, naming what in the file needs the newer one, with or without
    the file's entry (a file saved before it)."""
    expected, _, why = KINDS[kind]
    path, _ = _saved(kind, tmp_path)
    message = rf"needs onnxruntime {expected} or newer \({why}\), and this is onnxruntime {running}"
    monkeypatch.setattr(onnxruntime, "__version__", running)
    with pytest.raises(ValueError, match=message):
        ortlite.load(path)
    with pytest.raises(ValueError, match=message):
        ortlite.load(_edited(path, tmp_path, drop=True))
    monkeypatch.setattr(onnxruntime, "__version__", expected + ".0")
    ortlite.load(path)  # the minimum itself passes ortlite's check


@pytest.mark.parametrize(
    "kind, target, refused",
    [
        ("float32", "1.18", None),
        ("float32", "1.17", "IR version 10 needs 1.18"),
        ("int4", "1.18", "com.microsoft MatMulNBits with 6 inputs needs 1.19"),
        ("int4", "1.19", None),
        ("opset 23", "1.20", "ai.onnx opset 23 needs 1.23 (Options(opset=21) lowers within it)"),
        ("opset 23", "1.23", None),
    ],
)
def test_save_for_an_older_onnxruntime_refuses_what_it_cannot_run(kind, target, refused, tmp_path):
    model, args = (Attention().eval(), (torch.randn(2, 5, 32),)) if kind == "opset 23" else (_mlp(), (torch.randn(1, 64),))
    options = ortlite.Options(opset=23) if kind == "opset 23" else ortlite.Options(quantize=None if kind == "float32" else kind)
    compiled = ortlite.compile(model, args, options=options)
    path = tmp_path / "target.onnx"
    if refused is None:
        compiled.save(path, target_onnxruntime=target)
        assert _minor(_recorded(path)) <= _minor(target)
        return
    with pytest.raises(ValueError, match=re.escape(f"for onnxruntime {target}: {refused}")):
        compiled.save(path, target_onnxruntime=target)
    assert not path.exists()
    if kind == "opset 23":  # the opset the message names lowers within the target
        ortlite.compile(model, args, options=ortlite.Options(opset=21)).save(path, target_onnxruntime=target)
        assert _minor(_recorded(path)) <= _minor(target)


@pytest.mark.parametrize("target", ["1", "latest", 1.2, "1.20; rm"])
def test_save_target_must_be_a_version(target, tmp_path):
    compiled = ortlite.compile(_mlp(), (torch.randn(1, 64),))
    with pytest.raises(ValueError, match="target_onnxruntime must be a version"):
        compiled.save(tmp_path / "x.onnx", target_onnxruntime=target)
