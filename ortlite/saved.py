"""Saved models: CompiledModel.save writes one .onnx file that plain onnxruntime runs, with
what ortlite.load needs to rebuild the CompiledModel in its metadata_props (key "ortlite",
JSON: no pickle, nothing executable). ortlite.load reads it back without torch.export or
the model's code, checking the metadata against the graph.

The metadata: a format version; the runner's arguments (kind, ONNX name, dtype, device,
shape: ints, or size expressions as JSON trees over named symbols with their sympy
assumptions and ranges); where each output comes from; the pytree specs of the call
(torch's treespec_dumps, JSON); mutations; and the buffers the model mutates.

Beside it, key "min_onnxruntime": the oldest onnxruntime that runs the file ("1.18"), from
what the file holds (MIN_ORT_*), for plain onnxruntime and Triton users to read;
ortlite.load refuses the file on an older one, naming both versions;
save(..., target_onnxruntime="1.20") refuses a model that needs newer, naming what does.

Weights: initializers in the file. Weights bound by pointer (bind_weights=True) are written
with their current values and are constants of the loaded model; buffers the model mutates
stay graph inputs whose initializer is their default, and the loaded model owns a copy it
binds and updates, as the compiled one updates the module's buffers."""

from __future__ import annotations

import builtins
import collections
import json
import os
import re

import numpy as np
import onnx
import onnxruntime
import sympy
import torch
import torch.utils._sympy.functions as torch_sympy
from google.protobuf.message import Message
from onnx import external_data_helper, numpy_helper
from sympy.core.assumptions import _assume_defined
from torch.export.graph_signature import OutputKind
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils import _pytree as pytree

from .lower import SCALAR_DTYPES, InputSpec, LoweredGraph, OutputSpec
from .lower.builder import FAILURE_ERRORS, TO_TORCH, TORCH_TO_ONNX

KEY = "ortlite"
FORMAT = 1
PROTOBUF_LIMIT = 2**31 - 2**20  # a little under protobuf's 2 GB: the rest of the model needs room too

# The classes a size expression may be built from; anything else is refused (save) or an error (load).
FUNCTIONS = {
    cls.__name__: cls
    for cls in (
        sympy.Add, sympy.Mul, sympy.Pow, sympy.Mod, sympy.Max, sympy.Min, sympy.floor, sympy.ceiling, sympy.Abs,
        sympy.Equality, sympy.Unequality, sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan,
        sympy.GreaterThan, sympy.And, sympy.Or, sympy.Not,
    )
}
FUNCTIONS.update(
    (name, obj)
    for name, obj in vars(torch_sympy).items()
    if isinstance(obj, type) and issubclass(obj, sympy.Basic) and obj.__module__ == torch_sympy.__name__
)
SYMBOL_NAME = re.compile(r"[a-z]+[0-9]+")  # ShapeEnv's names (s0, u3); they become names in generated code
DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in TORCH_TO_ONNX}
MUTATION_KINDS = {kind.name: kind for kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)}
KINDS = ("tensor", "int", "float", "bool", "unused")
MAX_EXPONENT = 64  # of a size expression's powers and shifts (sizes are products of a few symbols)
POWERS = ("Pow", "PowByNatural", "FloatPow")
# functions whose second argument the sizes code spends time on (s**e, s << e, round(s, -e):
# a file could ask for e = 2**62): a literal int in these bounds
LITERAL_SECOND = {**{p: (-MAX_EXPONENT, MAX_EXPONENT) for p in POWERS}, "LShift": (0, MAX_EXPONENT), "RShift": (0, MAX_EXPONENT), "RoundDecimal": (-MAX_EXPONENT, MAX_EXPONENT)}
MAX_BITS = 4096  # of any value a size expression computes (sizes are products of a few int64s)
DIVISIONS = ("Mod", "PythonMod", "FloorDiv", "CeilDiv", "CleanDiv", "IntTrueDiv", "FloatTrueDiv", "ModularIndexing")


MIN_ORT_KEY = "min_onnxruntime"
# The oldest onnxruntime that runs a file holding each thing, as bench/ort_versions.py measured
# (2026-12-06, CPU, 1.15.1 to 1.32.0; its probes: one-node graphs of each row). The version
# before a row's refuses such a file at load: "Unsupported model IR version: 10, max supported
# IR version: 9"; "Current official support for domain ai.onnx is till opset 22";
# MatMulNBits "has input size 6 not in range [min=3, max=5]" (its bias, 1.19); "Could not find
# an implementation for GreaterOrEqual(16)" on uint64 (index checks: lower.ops.index, 1.21).
# A key below a table's first row takes the first row (1.15: the oldest measured); past its
# last row, the onnxruntime that saved the file (it ran it). GroupQueryAttention (7 inputs; 9,
# do_rotary), MatMulIntegerToFloat and SkipSimplifiedLayerNormalization run from 1.18, the
# first that reads IR 10, which every file ortlite writes is: no rows of their own. Kernels
# missing for other types in older versions are not known here unless measured: a row each.
MIN_ORT_IR = {9: (1, 15), 10: (1, 18), 11: (1, 23), 12: (1, 24), 13: (1, 24)}
MIN_ORT_OPSET = {19: (1, 15), 20: (1, 17), 21: (1, 18), 22: (1, 21), 23: (1, 23), 24: (1, 24), 25: (1, 24), 26: (1, 26)}
MIN_ORT_OPS = {("com.microsoft", "MatMulNBits", 6): (1, 19)}  # (domain, op, inputs at least, empty ones counted)
MIN_ORT_TYPED = {("", "GreaterOrEqual", onnx.TensorProto.UINT64): (1, 21)}  # (domain, op, its first input's type)
VERSION = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})(?:\.[0-9]{1,4})?")


class _Invalid(Exception):
    """What is wrong with a saved file; load turns it into a ValueError naming the file."""


# ---------------------------------------------------------------- save


def save(compiled, path, external_data: bool | None = None, target_onnxruntime: str | None = None) -> None:
    path = os.fspath(path)
    model = compiled.onnx_model_for_saving()
    if target_onnxruntime is not None:
        check_target(model, target_onnxruntime, path)
    for tensor in model.graph.initializer:
        if any(e.key == "location" and e.value == "ortlite-frozen-weight" for e in tensor.external_data):
            raise ValueError(f"ortlite: cannot save {path}: weight {tensor.name} is a frozen-weight stub, not data")
    metadata = _metadata(compiled)
    if external_data is None:
        external_data = model.ByteSize() > PROTOBUF_LIMIT
    key = compiled._lowered.pattern_key
    if key is not None:  # the runner's memory-pattern key, which no node reads: plain onnxruntime need not feed it
        if external_data:  # (ortlite.load reads such a file by path: the input stays, with a default)
            model.graph.initializer.append(numpy_helper.from_array(np.zeros((0, 0), np.uint8), key))
        else:  # (ortlite.load puts it back)
            kept = [i for i in model.graph.input if i.name != key]
            del model.graph.input[:]
            model.graph.input.extend(kept)
    if external_data:
        location = os.path.basename(path) + ".data"
        data_path = os.path.join(os.path.dirname(path) or ".", location)
        if os.path.exists(data_path):  # onnx appends to an existing file
            os.remove(data_path)
        external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=True, location=location)
        external_data_helper.write_external_data_tensors(model, os.path.dirname(path) or ".")
    # metadata_props is serialized after the graph: a file cut short anywhere loses it or
    # fails to parse (tested), so truncation needs no check of its own
    del model.metadata_props[:]  # [a loaded model's own entries]
    entry = model.metadata_props.add()
    entry.key, entry.value = KEY, json.dumps(metadata, allow_nan=False)
    entry = model.metadata_props.add()
    entry.key, entry.value = MIN_ORT_KEY, "%d.%d" % min_onnxruntime(model)[0]
    onnx.save_model(model, path)


def min_onnxruntime(model: onnx.ModelProto, here: tuple | None = None) -> tuple[tuple[int, int], str]:
    """(the oldest onnxruntime (major, minor) that runs the model by the MIN_ORT_* rules, what
    in the model needs it). here: the running onnxruntime's version (for keys past a table)."""
    return max(_needs(model, here), key=lambda n: n[0])


def check_target(model: onnx.ModelProto, target: str, path: str) -> None:
    """save(..., target_onnxruntime=target): refuses a model that needs a newer onnxruntime,
    naming each thing that does, and the opset that would stay within the target."""
    version = _version(target) if isinstance(target, str) and VERSION.fullmatch(target) else None
    if version is None:
        raise ValueError(f"ortlite: target_onnxruntime must be a version like '1.20', got {target!r}")
    over = sorted({(v, why) for v, why in _needs(model) if v > version})
    if not over:
        return
    what = "; ".join(f"{why} needs {v[0]}.{v[1]}" for v, why in over)
    opsets = [o for o, v in MIN_ORT_OPSET.items() if v <= version]
    hint = f" (Options(opset={max(opsets)}) lowers within it)" if opsets and any(why.startswith("ai.onnx opset") for _, why in over) else ""
    raise ValueError(f"ortlite: cannot save {path} for onnxruntime {target}: {what}{hint}")


def _needs(model: onnx.ModelProto, here: tuple | None = None) -> list:
    """[(version, what needs it)] for each MIN_ORT_* rule the model meets."""
    here = here or _version(onnxruntime.__version__) or (0, 0)

    def row(table, key):
        if key > max(table):
            return max(table[max(table)], here)
        return table[max((k for k in table if k <= key), default=min(table))]

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    needs = [(row(MIN_ORT_IR, model.ir_version), f"IR version {model.ir_version}"), (row(MIN_ORT_OPSET, opset), f"ai.onnx opset {opset}")]
    graphs = list(_graphs([model.graph, *(node.attribute for f in model.functions for node in f.node)]))
    types = {}  # value -> its element type, where the file says it
    for graph in graphs:
        types.update((v.name, v.type.tensor_type.elem_type) for v in (*graph.input, *graph.output, *graph.value_info))
        types.update((t.name, t.data_type) for t in graph.initializer)
        types.update((n.output[0], a.i) for n in graph.node if n.op_type == "Cast" and n.output for a in n.attribute if a.name == "to")
    nodes = [n for graph in graphs for n in graph.node] + [n for f in model.functions for n in f.node]
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        for (op_domain, op, inputs), version in MIN_ORT_OPS.items():
            if node.op_type == op and domain == op_domain and len(node.input) >= inputs:
                needs.append((version, f"{domain} {op} with {len(node.input)} inputs"))
        typed = (domain, node.op_type, types.get(node.input[0]) if node.input else None)
        if typed in MIN_ORT_TYPED:
            needs.append((MIN_ORT_TYPED[typed], f"{node.op_type} on {onnx.TensorProto.DataType.Name(typed[2]).lower()}"))
    return needs


def _graphs(items):
    """The graphs, and every subgraph in them (and in the attribute lists), at any depth."""
    stack = list(items)
    while stack:
        item = stack.pop()
        if isinstance(item, onnx.GraphProto):
            yield item
            stack.extend(a for n in item.node for a in n.attribute)
        elif isinstance(item, onnx.AttributeProto):
            stack.extend([item.g] * item.HasField("g") + list(item.graphs))
        else:  # a node's attributes
            stack.extend(item)


def _version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a version ("1.18", "1.31.1", "1.24.0.dev20251010"), else None."""
    match = VERSION.match(text) if isinstance(text, str) else None
    return (int(match[1]), int(match[2])) if match else None


def _check_onnxruntime(model: onnx.ModelProto) -> None:
    """The running onnxruntime is no older than the file needs: its MIN_ORT_KEY entry, or what
    its contents need (a file saved before the entry, or edited since)."""
    here = _version(onnxruntime.__version__)
    if here is None:  # (a build whose version says nothing: onnxruntime's own checks decide)
        return
    needed, why = min_onnxruntime(model, here)
    recorded = [p.value for p in model.metadata_props if p.key == MIN_ORT_KEY]
    if recorded:
        version = _version(recorded[0]) if VERSION.fullmatch(recorded[0]) else None
        if version is None:
            raise _Invalid(f"its {MIN_ORT_KEY} entry {recorded[0][:40]!r} is not a version like 1.18")
        if version > needed:
            needed, why = version, f"its {MIN_ORT_KEY} entry"
    if needed > here:
        raise _Invalid(f"it needs onnxruntime {needed[0]}.{needed[1]} or newer ({why}), and this is onnxruntime {onnxruntime.__version__}")


def _metadata(compiled) -> dict:
    lowered: LoweredGraph = compiled._lowered
    n_weights = len(compiled._weights)
    mutated_buffers = {target for kind, target in compiled._mutations if kind == OutputKind.BUFFER_MUTATION}
    kept = [i for i in range(n_weights) if compiled._weight_targets[i] in mutated_buffers]
    for i in kept:
        if lowered.inputs[i].name is None:
            raise ValueError(f"ortlite: cannot save a model that mutates buffer {compiled._weight_targets[i]} without reading it")
    arguments = kept + list(range(n_weights, len(lowered.inputs)))
    index = {old: new for new, old in enumerate(arguments)}  # the loaded runner's argument positions
    symbols: dict[str, sympy.Symbol] = {}
    expr = lambda e: _encode(e, symbols)  # noqa: E731

    def moved(i):
        if i not in index:
            raise ValueError("ortlite: cannot save a model that returns one of its bound weights (bind_weights=True)")
        return index[i]

    outputs = []
    for o in lowered.outputs:
        entry = {"source": o.source, "as_scalar": o.as_scalar}
        if o.source == "sym":
            entry["value"] = expr(o.value)
        elif o.source == "const":
            if not (o.value is None or isinstance(o.value, (bool, int, float))):
                raise ValueError(f"ortlite: cannot save a model with the constant output {o.value!r}")
            entry["value"] = o.value
        else:
            entry["index"] = moved(o.index) if o.source == "input" else o.index
        outputs.append(entry)
    ranges = dict(lowered.symbol_ranges)
    metadata = {
        "format": FORMAT,
        "inputs": [_spec(lowered.inputs[i], expr) for i in arguments],
        "ort_outputs": [_spec(o, expr) for o in lowered.ort_outputs],
        "outputs": outputs,
        "sizes": [{"symbol": expr(s), "sources": [[moved(a), d] for a, d in sources]} for s, sources in lowered.symbols.items()],
        "failures": [[i, message, kind] for i, message, kind in lowered.failures],
        "guards": [expr(g) for g in lowered.guards],
        "disabled_optimizers": list(lowered.disabled_optimizers),
        "pattern_key": lowered.pattern_key,
        "bound": [{"input": lowered.inputs[i].name, "buffer": compiled._weight_targets[i]} for i in kept],
        "mutations": [[kind.name, target] for kind, target in compiled._mutations],
        "input_views": [[position, source, chain] for position, (source, chain) in lowered.input_views.items()],
        "io_dtype": DTYPES_BY_VALUE[lowered.io_dtype] if lowered.io_dtype is not None else None,
        "inplace": [[output, argument] for output, argument in lowered.inplace],
        "in_spec": pytree.treespec_dumps(compiled._in_spec),
        "out_spec": pytree.treespec_dumps(compiled._out_spec),
    }
    # symbols last: the expressions above collected them
    metadata["symbols"] = {
        name: {"assumptions": _assumptions(s), "range": list(ranges.get(s, (None, None)))} for name, s in symbols.items()
    }
    return metadata


def _spec(spec: InputSpec, expr) -> dict:
    if spec.kind == "unused":
        return {"kind": "unused"}
    device = str(spec.device) if spec.device is not None else None
    return {"kind": spec.kind, "name": spec.name, "dtype": DTYPES_BY_VALUE[spec.dtype], "shape": [expr(d) for d in spec.shape], "device": device}


DTYPES_BY_VALUE = {dtype: name for name, dtype in DTYPES.items()}


def _assumptions(symbol: sympy.Symbol) -> dict:
    return dict(getattr(symbol, "_assumptions_orig", None) or symbol.assumptions0)


def _encode(e, symbols: dict):
    """A size expression as JSON: ints, symbol names, [class name, *args]."""
    if isinstance(e, torch.SymInt):
        e = e.node.expr
    if isinstance(e, bool) or e is sympy.true or e is sympy.false:
        return bool(e)
    if isinstance(e, (int, sympy.Integer)):
        return int(e)
    if isinstance(e, sympy.Symbol):
        if not SYMBOL_NAME.fullmatch(e.name):
            raise ValueError(f"ortlite: cannot save the size symbol {e.name!r}")
        symbols[e.name] = e
        return e.name
    if isinstance(e, sympy.Rational):
        return ["Rational", int(e.p), int(e.q)]
    if isinstance(e, sympy.Float):
        return ["Float", str(e)]
    name = type(e).__name__
    if FUNCTIONS.get(name) is not type(e):
        raise ValueError(f"ortlite: cannot save the size expression {e} ({name} is not a function ortlite.load knows)")
    return [name, *(_encode(a, symbols) for a in e.args)]


# ---------------------------------------------------------------- reading (ortlite.loading)


def read(path: str, data: bytes):
    """(model, LoweredGraph, the rest) from a file's bytes, checked; a ValueError naming the
    file says what is wrong."""
    try:
        return _read(path, data)
    except _Invalid as e:
        raise ValueError(f"ortlite.load: {path}: {e}") from None


def _read(path: str, data: bytes):
    try:
        model = onnx.ModelProto.FromString(data)
    except Exception as e:  # protobuf's DecodeError
        raise _Invalid(f"not a readable ONNX model: truncated or corrupted ({len(data)} bytes; {e})") from None
    entry = next((p.value for p in model.metadata_props if p.key == KEY), None)
    if entry is None:
        raise _Invalid("it has no ortlite metadata: truncated, or not written by CompiledModel.save")
    try:
        metadata = json.loads(entry)
        version = metadata["format"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise _Invalid(f"its ortlite metadata is not valid JSON with a format version: {e}") from None
    if type(version) is not int or not 1 <= version <= FORMAT:
        raise _Invalid(f"it was written in ortlite format {version!r}; this ortlite reads format {FORMAT} and older")
    _check_onnxruntime(model)
    external = _external_initializers(model)
    if external:
        try:
            external_data_helper.load_external_data_for_model(model, os.path.dirname(path) or ".")
        except Exception as e:
            raise _Invalid(f"cannot read its external data: {type(e).__name__}: {e}") from None
    try:
        lowered, saved = _decode(model, metadata)
    except _Invalid:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, RecursionError, MemoryError) as e:
        # torch.device("?") is a RuntimeError; nesting past Python's limits a RecursionError
        raise _Invalid(f"malformed ortlite metadata ({type(e).__name__}: {e})") from None
    saved["external"] = external
    return model, lowered, saved


def _external_initializers(model: onnx.ModelProto) -> bool:
    """Whether the graph's initializers keep their data in files; their locations are checked
    when they are read (onnx refuses paths that leave the model's folder). Data kept outside
    anywhere else (a Constant node's value, a subgraph's initializer, a sparse tensor, a
    function) is refused: ONNX Runtime resolves such paths against the working directory."""
    for tensor in _tensors(model, skip=("onnx.ModelProto.graph", "onnx.GraphProto.initializer")):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            raise _Invalid(f"tensor {tensor.name!r} keeps its data in a file, and only the graph's initializers may")
    return any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)


def _tensors(message, skip=()):
    """Every TensorProto inside a protobuf message, at any depth, but those at the path of
    fields `skip` (full names, from the message down)."""
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        on_path = bool(skip) and field.full_name == skip[0]
        if on_path and len(skip) == 1:
            continue
        for item in (value,) if isinstance(value, Message) else value:
            if isinstance(item, onnx.TensorProto):
                yield item
            else:
                yield from _tensors(item, skip[1:] if on_path else ())


def _decode(model: onnx.ModelProto, m: dict):
    symbols, ranges = {}, {}
    for name, entry in m["symbols"].items():
        assumptions = entry["assumptions"]
        if not SYMBOL_NAME.fullmatch(name) or not all(
            k in _assume_defined and isinstance(v, bool) for k, v in assumptions.items()
        ):
            raise _Invalid(f"malformed ortlite metadata: size symbol {name!r} {assumptions!r}")
        symbols[name] = sympy.Symbol(name, **assumptions)
        low, high = entry["range"]
        if not all(b is None or (type(b) is int and -(2**63) <= b < 2**63) for b in (low, high)) or (None not in (low, high) and low > high):
            raise _Invalid(f"malformed ortlite metadata: range {entry['range']!r} of {name}")
        ranges[symbols[name]] = (low, high)
    expr = lambda j: _bounded(_decode_expr(j, symbols), j)  # noqa: E731
    inputs = [_input_spec(j, expr) for j in m["inputs"]]
    ort_outputs = [_input_spec(j, expr) for j in m["ort_outputs"]]
    if any(o.kind != "tensor" for o in ort_outputs):
        raise _Invalid("malformed ortlite metadata: an ONNX output that is not a tensor")
    outputs = []
    for j in m["outputs"]:
        source = j["source"]
        if type(j["as_scalar"]) is not bool or (j["as_scalar"] and source == "ort" and not _is_scalar_output(j.get("index"), ort_outputs)):
            raise _Invalid(f"malformed ortlite metadata: output {j!r} as a Python number")
        if source == "sym":
            outputs.append(OutputSpec("sym", value=expr(j["value"]), as_scalar=j["as_scalar"]))
        elif source == "const":
            if not (j["value"] is None or isinstance(j["value"], (bool, int, float))):
                raise _Invalid(f"malformed ortlite metadata: constant output {j['value']!r}")
            outputs.append(OutputSpec("const", value=j["value"], as_scalar=j["as_scalar"]))
        elif source in ("ort", "input"):
            limit = len(ort_outputs) if source == "ort" else len(inputs)
            if type(j["index"]) is not int or not 0 <= j["index"] < limit:
                raise _Invalid(f"malformed ortlite metadata: output from {source} {j['index']!r} of {limit}")
            outputs.append(OutputSpec(source, index=j["index"], as_scalar=j["as_scalar"]))
        else:
            raise _Invalid(f"malformed ortlite metadata: output source {source!r}")
    sizes = {}
    for entry in m["sizes"]:
        symbol = expr(entry["symbol"])
        if not isinstance(symbol, sympy.Symbol):
            raise _Invalid(f"malformed ortlite metadata: size {entry['symbol']!r} is not a symbol")
        for arg, dim in entry["sources"]:
            spec = inputs[arg] if type(arg) is int and 0 <= arg < len(inputs) else None
            size = (spec.shape[dim] if spec.kind == "tensor" and type(dim) is int and 0 <= dim < len(spec.shape) else None) if spec else None
            if spec is None or not (size == symbol or (dim is None and spec.kind == "int")):
                raise _Invalid(f"malformed ortlite metadata: size {symbol} read from argument {arg} dim {dim}")
        sizes[symbol] = [tuple(s) for s in entry["sources"]]
    failures = []
    for i, message, kind in m["failures"]:
        flag = ort_outputs[i] if type(i) is int and 0 <= i < len(ort_outputs) else None
        # the runner reads each flag's one byte on the host: a 0-d CPU bool, nothing else
        if flag is None or flag.dtype != torch.bool or flag.shape != () or flag.device not in (None, torch.device("cpu")) or not isinstance(message, str):
            raise _Invalid(f"malformed ortlite metadata: failure output {i!r}")
        if type(kind) is bool:  # files written before failures had kinds: true for to torch
            kind = TO_TORCH if kind else "RuntimeError"
        if kind != TO_TORCH and kind not in FAILURE_ERRORS:
            raise _Invalid(f"malformed ortlite metadata: failure kind {kind!r}")
        failures.append((i, message, kind))
    disabled = tuple(m["disabled_optimizers"])
    if not all(isinstance(d, str) for d in disabled):
        raise _Invalid(f"malformed ortlite metadata: disabled optimizers {disabled!r}")

    pattern_key = m.get("pattern_key")  # absent in files written before it existed
    key_added = isinstance(pattern_key, str) and all(i.name != pattern_key for i in model.graph.input)
    if key_added:  # saved without it (no node reads it): the runner's input again
        model.graph.input.append(onnx.helper.make_tensor_value_info(pattern_key, onnx.TensorProto.UINT8, [pattern_key, 0]))
    _check_graph(model, inputs, ort_outputs, pattern_key)
    _check_output_order(outputs, ort_outputs, failures)
    bound, weights = m["bound"], []
    initializers = {t.name: t for t in model.graph.initializer}
    for position, b in enumerate(bound):
        spec = inputs[position]
        tensor = initializers.get(b["input"])
        if spec.name != b["input"] or tensor is None or not isinstance(b["buffer"], str):
            raise _Invalid(f"the mutated buffer {b.get('buffer')!r} has no initializer {b['input']!r} for argument {position}")
        weights.append(_to_torch(tensor, spec))

    in_spec, out_spec = _treespec(m["in_spec"], "arguments"), _treespec(m["out_spec"], "outputs")
    mutations = []
    buffers = {b["buffer"]: position for position, b in enumerate(bound)}
    n_user = len(inputs) - len(bound)
    for kind, target in m["mutations"]:
        kind = MUTATION_KINDS[kind]
        # the model copies its output number len(mutations) into the target: the same tensor type
        value = outputs[len(mutations)] if len(mutations) < len(outputs) else None
        value = {"ort": ort_outputs, "input": inputs}.get(value.source, [])[value.index] if value is not None else None
        if kind == OutputKind.BUFFER_MUTATION:
            destination = inputs[buffers[target]] if isinstance(target, str) and target in buffers else None
        else:
            destination = inputs[len(bound) + target] if type(target) is int and 0 <= target < n_user else None
        if destination is None or value is None or (value.kind, value.dtype, value.shape) != ("tensor", destination.dtype, destination.shape):
            raise _Invalid(f"malformed ortlite metadata: mutation of {target!r} from output {len(mutations)}")
        mutations.append((kind, target))
    if in_spec.num_leaves != n_user:
        raise _Invalid(f"its argument spec has {in_spec.num_leaves} leaves, but the graph takes {n_user} arguments")
    if out_spec.num_leaves != len(outputs) - len(mutations):
        raise _Invalid(f"its output spec has {out_spec.num_leaves} leaves, but the graph returns {len(outputs) - len(mutations)}")
    inplace = _inplace(m.get("inplace", []), inputs, ort_outputs)
    input_views = _input_views(m.get("input_views", []), out_spec.num_leaves, n_user)
    _check_returned_mutations(outputs, mutations, input_views)
    # outputs whose shape must be exact: flags read on the host, numbers, values copied into
    # buffers, outputs written into an argument's memory
    exact = {i for i, _, _ in failures} | {o.index for o in outputs if o.source == "ort" and o.as_scalar}
    exact |= {o.index for o in outputs[: len(mutations)] if o.source == "ort"}
    exact |= {i for i, spec in enumerate(ort_outputs) if spec.name in {output for output, _ in inplace}}
    unconfirmed = _check_output_shapes(model, inputs, ort_outputs, exact)
    lowered = LoweredGraph(
        model, inputs, outputs, ort_outputs, symbols=sizes, symbol_ranges=ranges, disabled_optimizers=disabled, failures=failures, pattern_key=pattern_key,
        guards=[expr(j) for j in m.get("guards", [])], input_views=input_views,
        io_dtype=_io_dtype(m.get("io_dtype")), inplace=inplace,
    )
    saved = {"bound": bound, "weights": weights, "mutations": mutations, "in_spec": in_spec, "out_spec": out_spec, "key_added": key_added}
    return lowered, saved | {"unconfirmed": unconfirmed}


def _check_output_order(outputs: list[OutputSpec], ort_outputs: list[InputSpec], failures: list) -> None:
    """The graph's outputs in the order ortlite writes them: those the call returns, each at
    its first use (a later use may repeat one), then the failure flags. A file that maps the
    call's outputs onto other graph outputs is refused (one that repeats an earlier output
    elsewhere cannot be told from one whose model returned it twice)."""
    seen = 0
    for position, o in enumerate(outputs):
        if o.source != "ort":
            continue
        if o.index > seen:
            raise _Invalid(f"malformed ortlite metadata: outputs[{position}] is graph output {o.index}, but the graph's outputs come in order ({seen} next)")
        seen += o.index == seen
    flags = [i for i, _, _ in failures]
    if seen == 0 and not flags and len(ort_outputs) == 1:
        return  # the output a graph with nothing to compute has for ONNX Runtime, read by no one (ortlite.aot)
    if flags != list(range(seen, len(ort_outputs))):
        raise _Invalid(f"malformed ortlite metadata: failures are graph outputs {flags}, but the graph's outputs after those returned are {list(range(seen, len(ort_outputs)))}")


def _check_returned_mutations(outputs: list[OutputSpec], mutations: list, input_views: dict) -> None:
    """A returned input the model mutates (`return y.add_(1)`: a view of y with no view ops)
    that the graph computes is the mutation's value, the graph output that writes y."""
    written = {target: position for position, (kind, target) in enumerate(mutations) if kind == OutputKind.USER_INPUT_MUTATION}
    for position, (source, chain) in input_views.items():
        o, m = outputs[len(mutations) + position], written.get(source)
        if not chain and m is not None and o.source == "ort" and (outputs[m].source, outputs[m].index) != ("ort", o.index):
            raise _Invalid(
                f"malformed ortlite metadata: outputs[{len(mutations) + position}] returns input {source}, which the model mutates, "
                f"as graph output {o.index}, but its new value is outputs[{m}]"
            )


def _check_output_shapes(model, inputs, ort_outputs, exact: set) -> set:
    """The metadata's output shapes against ONNX Runtime's shape inference of the graph: a
    size the inference computes must be the metadata's (else the file is refused); returns
    the outputs with a size it leaves unknown (ONNX Runtime allocates those at each call, so
    that a wrong size cannot fail the run). Outputs in `exact` must be known whole."""
    try:
        inferred = graph_output_shapes(model, inputs)
    except Exception as e:  # ONNX Runtime's checks of the graph
        raise _Invalid(f"ONNX Runtime cannot infer its output shapes: {type(e).__name__}: {str(e)[:300]}") from None
    unconfirmed = set()
    for i, (spec, shape) in enumerate(zip(ort_outputs, inferred)):
        if shape is not None and len(shape) != len(spec.shape):
            raise _Invalid(f"its metadata says output {spec.name} (ort_outputs[{i}].shape) is {list(spec.shape)}, but the graph computes {len(shape)} dims {_dims(shape)}")
        for k, want in enumerate(spec.shape if shape is not None else ()):
            got = shape[k]
            if got is not None and got != want:
                raise _Invalid(f"its metadata says output {spec.name} (ort_outputs[{i}].shape) is {list(spec.shape)}, but the graph computes {_dims(shape)}")
        if shape is None or None in shape:
            if i in exact:
                raise _Invalid(f"the shape of output {spec.name} (ort_outputs[{i}].shape, {list(spec.shape)}) must be exact, and the graph's shape inference leaves it {_dims(shape)}")
            unconfirmed.add(i)
    return unconfirmed


def _dims(shape) -> str:
    return "unknown" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _inplace(entries, inputs, ort_outputs) -> list:
    """LoweredGraph.inplace from the file: pairs of an ONNX output and a tensor argument of the
    same shape, dtype and device, each output once (absent in older files)."""
    by_name = {spec.name: spec for spec in inputs if spec.kind == "tensor"}
    outputs = {spec.name: spec for spec in ort_outputs}
    pairs, seen = [], set()
    if not isinstance(entries, list):
        raise _Invalid(f"malformed ortlite metadata: inplace {str(entries)[:50]!r}")
    for entry in entries:
        ok = isinstance(entry, list) and len(entry) == 2 and all(isinstance(n, str) for n in entry)
        o, a = (outputs.get(entry[0]), by_name.get(entry[1])) if ok else (None, None)
        if o is None or a is None or entry[0] in seen or (o.dtype, tuple(o.shape), o.device) != (a.dtype, tuple(a.shape), a.device):
            raise _Invalid(f"malformed ortlite metadata: output written in place {str(entry)[:80]!r}")
        seen.add(entry[0])
        pairs.append((entry[0], entry[1]))
    return pairs


VIEW_OP = re.compile(r"[a-z][a-z0-9_]*\.[a-zA-Z0-9_]+")


def _input_views(entries, n_outputs: int, n_inputs: int) -> dict:
    """LoweredGraph.input_views from the file: aten view ops (looked up, nothing imported)
    with int, bool and None arguments, on user inputs, for user outputs."""
    views = {}
    for position, source, chain in entries:
        ok = type(position) is int and 0 <= position < n_outputs and position not in views and type(source) is int and 0 <= source < n_inputs
        for name, args in chain if ok else ():
            packet = getattr(torch.ops.aten, name.split(".")[0], None) if isinstance(name, str) and VIEW_OP.fullmatch(name) else None
            op = getattr(packet, name.split(".")[1], None) if packet is not None else None
            leaves = pytree.tree_leaves(args) if isinstance(args, list) else [object()]
            ok = isinstance(op, torch._ops.OpOverload) and op.is_view and all(a is None or type(a) in (int, bool) for a in leaves)
            if not ok:
                break
        if not ok:
            raise _Invalid(f"malformed ortlite metadata: output view {str([position, source, chain])[:200]}")
        views[position] = (source, [tuple(step) for step in chain])
    return views


def _io_dtype(name) -> torch.dtype | None:
    """LoweredGraph.io_dtype from the file: None, bfloat16 or float16."""
    if name is None:
        return None
    if name not in ("bfloat16", "float16"):
        raise _Invalid(f"malformed ortlite metadata: io_dtype {str(name)[:50]!r}")
    return DTYPES[name]


def _is_scalar_output(index, ort_outputs) -> bool:
    return type(index) is int and 0 <= index < len(ort_outputs) and ort_outputs[index].shape == ()


def _input_spec(j: dict, expr) -> InputSpec:
    kind = j["kind"]
    if kind not in KINDS:
        raise _Invalid(f"malformed ortlite metadata: argument kind {kind!r}")
    if kind == "unused":
        return InputSpec("unused")
    dtype = DTYPES[j["dtype"]]
    device = torch.device(j["device"]) if j["device"] is not None else None
    if not isinstance(j["name"], str) or (device is not None and device.type not in ("cpu", "cuda")):
        raise _Invalid(f"malformed ortlite metadata: argument {j!r}")
    shape = tuple(_dim(expr(d)) for d in j["shape"])
    if kind in SCALAR_DTYPES and (dtype != SCALAR_DTYPES[kind] or shape != () or device not in (None, torch.device("cpu"))):
        # the runner writes a Python scalar as 8 bytes on the host: only the dtype it expects
        raise _Invalid(f"malformed ortlite metadata: {kind} argument {j['name']!r} as {dtype}{list(shape)} on {device}")
    if device is not None and device.type == "cuda" and not (device.index or 0) < torch.cuda.device_count():
        raise _Invalid(f"its argument {j['name']!r} is on {device}, which this machine does not have")
    return InputSpec(kind, j["name"], dtype, shape, device)


def _dim(e):
    if isinstance(e, sympy.Integer):
        return int(e)
    if not isinstance(e, sympy.Expr):
        raise _Invalid(f"malformed ortlite metadata: size {e!r}")
    return e


def _decode_expr(j, symbols: dict):
    if isinstance(j, bool):
        return sympy.true if j else sympy.false
    if isinstance(j, int) and -(2**63) <= j < 2**63:
        return sympy.Integer(j)
    if isinstance(j, str):
        if j not in symbols:
            raise _Invalid(f"malformed ortlite metadata: unknown size symbol {j!r}")
        return symbols[j]
    if isinstance(j, list) and j and isinstance(j[0], str):
        head, args = j[0], j[1:]
        if head == "Rational" and len(args) == 2 and all(type(a) is int for a in args):
            return sympy.Rational(*args)
        if head == "Float" and len(args) == 1 and isinstance(args[0], str):
            float(args[0])  # a number, else ValueError
            return sympy.Float(args[0])
        if head in LITERAL_SECOND:
            low, high = LITERAL_SECOND[head]
            if not (len(args) == 2 and type(args[1]) is int and low <= args[1] <= high):
                raise _Invalid(f"malformed ortlite metadata: size expression {j!r} (its second argument must be an int in [{low}, {high}])")
        if head in DIVISIONS and len(args) > 1 and any(a == 0 and type(a) is int for a in args[1:]):
            raise _Invalid(f"malformed ortlite metadata: size expression {j!r} divides by 0")
        if head in FUNCTIONS:  # as saved, already simplified: not evaluated again (a file could ask for 10**10**9)
            cls, decoded = FUNCTIONS[head], [_decode_expr(a, symbols) for a in args]
            # logic takes truth values; Where a truth value and two numbers; the rest numbers
            logic = issubclass(cls, (sympy.And, sympy.Or, sympy.Not))
            wanted = [sympy.logic.boolalg.Boolean if logic or (head == "Where" and i == 0) else sympy.Expr for i in range(len(decoded))]
            if not all(isinstance(a, w) for a, w in zip(decoded, wanted)):
                raise _Invalid(f"malformed ortlite metadata: size expression {j!r} mixes numbers and truth values")
            return cls(*decoded, evaluate=False)
    raise _Invalid(f"malformed ortlite metadata: size expression {j!r}")


def _bounded(e, j):
    """e, if every value in it fits in MAX_BITS for sizes that fit in int64 (nested powers
    of a file's expressions could ask for numbers that take hours to compute)."""
    if _bits(e) > MAX_BITS:
        raise _Invalid(f"malformed ortlite metadata: size expression {str(j)[:200]} (values past {MAX_BITS} bits)")
    return e


def _bits(e) -> int:
    """An upper bound on the bits of e's value and of every value computed on the way."""
    if isinstance(e, sympy.Integer):
        return max(1, abs(int(e)).bit_length())
    if isinstance(e, sympy.Rational):
        return _bits(sympy.Integer(e.p)) + _bits(sympy.Integer(e.q))
    if isinstance(e, (sympy.Symbol, sympy.Float)) or not e.args:
        return 64 if isinstance(e, sympy.Symbol) else 1100  # a size; a double's integer part
    bits = [_bits(a) for a in e.args]
    if max(bits) > MAX_BITS:
        return max(bits)
    name = type(e).__name__
    if name in POWERS:  # the exponent: an int of at most MAX_EXPONENT (checked when decoded)
        return bits[0] * max(1, abs(int(e.args[1])))
    if name == "LShift":
        return bits[0] + int(e.args[1])
    if name == "Mul":
        return sum(bits)
    return max(bits) + len(bits)  # sums, quotients, minima, comparisons: no larger than this


def _check_graph(model: onnx.ModelProto, inputs: list[InputSpec], ort_outputs: list[InputSpec], pattern_key) -> None:
    """The metadata's arguments and outputs are the graph's, with the same types and sizes."""
    graph_inputs = {i.name: i for i in model.graph.input}
    named = [spec for spec in inputs if spec.kind != "unused"]
    if pattern_key is not None:  # the runner's (N, 0) uint8 input (ortlite.lower._sizes_vary)
        key = graph_inputs.pop(pattern_key, None) if isinstance(pattern_key, str) else None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in key.type.tensor_type.shape.dim] if key is not None else None
        if dims != [None, 0] or key.type.tensor_type.elem_type != onnx.TensorProto.UINT8:
            raise _Invalid(f"malformed ortlite metadata: pattern key {pattern_key!r} is not a (N, 0) uint8 input of the graph")
    if sorted(graph_inputs) != sorted(spec.name for spec in named):
        raise _Invalid(f"its metadata names the inputs {sorted(s.name for s in named)}, but the graph has {sorted(graph_inputs)}")
    for spec in named:
        _check_value(graph_inputs[spec.name], spec, "input")
    names = [o.name for o in model.graph.output]
    if names != [o.name for o in ort_outputs]:
        raise _Invalid(f"its metadata names the outputs {[o.name for o in ort_outputs]}, but the graph has {names}")
    for value, spec in zip(model.graph.output, ort_outputs):
        _check_value(value, spec, "output")


SMALL_INITIALIZER = 1024  # elements: an initializer this small may feed a size (a Reshape's shape, Resize's scales)


def graph_output_shapes(model: onnx.ModelProto, inputs: list[InputSpec]) -> list:
    """Per graph output, its shape as ONNX Runtime's own shape inference computes it from the
    graph alone, for the argument sizes `inputs` gives: None where its rank is unknown, else a
    list of dims, each an int, the size expression of an argument's dim it equals, or None
    (unknown). The shapes the file declares (outputs, value_info, subgraphs) are not read:
    inference starts from the arguments. Weights become inputs of their shape (no data)."""
    probe = onnx.ModelProto(ir_version=model.ir_version, producer_name="ortlite shape probe")
    probe.opset_import.extend(model.opset_import)
    probe.functions.extend(model.functions)
    graph = probe.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    _forget_subgraph_shapes(graph.node)
    sizes = {}  # dim_param -> the size expression it stands for
    specs = {spec.name: spec for spec in inputs if spec.kind != "unused"}
    for value in model.graph.input:
        spec = specs.get(value.name)
        if spec is None:  # (the pattern key: no node reads it)
            graph.input.append(value)
            continue
        dims = []
        for d in spec.shape:
            if isinstance(d, int):
                dims.append(d)
            else:
                name = d.name if isinstance(d, sympy.Symbol) else f"ortlite_size_{len(sizes)}"
                sizes[name] = d
                dims.append(name)
        graph.input.append(onnx.helper.make_tensor_value_info(value.name, TORCH_TO_ONNX[spec.dtype], dims))
    inputs_now = {value.name for value in graph.input}
    for tensor in model.graph.initializer:
        if np.prod(tensor.dims, dtype=np.float64) <= SMALL_INITIALIZER:
            graph.initializer.append(tensor)
        elif tensor.name not in inputs_now:  # (an input's default: the input is there)
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for i, value in enumerate(model.graph.output):
        graph.output.append(onnx.helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, None))
        graph.node.append(onnx.helper.make_node("Shape", [value.name], [f"ortlite_rank_{i}"]))
        graph.output.append(onnx.helper.make_tensor_value_info(f"ortlite_rank_{i}", onnx.TensorProto.INT64, None))
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    found = [o.shape for o in session.get_outputs()]
    shapes = []
    for dims, rank in zip(found[::2], found[1::2]):
        if not (len(rank) == 1 and isinstance(rank[0], int) and rank[0] == len(dims)):
            shapes.append(None)
            continue
        shapes.append([d if isinstance(d, int) else sizes.get(d) if isinstance(d, str) else None for d in dims])
    return shapes


def _forget_subgraph_shapes(nodes) -> None:
    """The declared shapes (of outputs and values) of the nodes' subgraphs dropped, at any depth."""
    for node in nodes:
        for attribute in node.attribute:
            for sub in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
                del sub.value_info[:]
                for value in sub.output:
                    value.type.tensor_type.ClearField("shape")
                _forget_subgraph_shapes(sub.node)


def _check_value(value: onnx.ValueInfoProto, spec: InputSpec, what: str) -> None:
    tensor = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    expected = [d if isinstance(d, int) else None for d in spec.shape]
    # (a static size where the metadata has an expression is a contradiction too: ONNX Runtime
    # would refuse the sizes the expression allows, at a call)
    if tensor.elem_type != TORCH_TO_ONNX[spec.dtype] or dims != expected:
        got = f"{onnx.TensorProto.DataType.Name(tensor.elem_type)} {dims}"
        raise _Invalid(f"its metadata says {what} {spec.name} is {spec.dtype} {list(spec.shape)}, but the graph says {got}")


def _to_torch(tensor: onnx.TensorProto, spec: InputSpec) -> torch.Tensor:
    """A buffer's value from its initializer: a tensor of its own, on its argument's device."""
    array = numpy_helper.to_array(tensor)
    if tensor.data_type != TORCH_TO_ONNX[spec.dtype] or list(array.shape) != list(spec.shape):
        raise _Invalid(f"initializer {tensor.name} is not a {spec.dtype} of shape {list(spec.shape)}")
    return torch.from_numpy(np.array(array)).to(spec.device or "cpu")


# defaultdict factories a file may name: builtins only (torch's own decoder imports any module)
DEFAULT_FACTORIES = {name: getattr(builtins, name) for name in ("list", "dict", "set", "int", "float", "str", "tuple", "bool")}
_leaf = getattr(pytree, "treespec_leaf", pytree.LeafSpec)  # (LeafSpec is deprecated from torch 2.10)
KEYED = {dict, collections.OrderedDict, collections.defaultdict, immutable_dict}  # context: the keys, one per child
UNKEYED = {tuple, list, torch.Size, immutable_list}  # context: null


def _treespec(text, what: str):
    """A pytree spec from torch's treespec_dumps JSON, decoded here rather than by torch's
    treespec_loads, which imports modules the text names (enum keys, defaultdict factories).
    Node types must already be registered with pytree in this process; nothing is imported."""
    try:
        protocol, node = json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise _Invalid(f"its {what} structure cannot be read ({type(e).__name__}: {e})") from None
    if protocol != 1:
        raise _Invalid(f"its {what} structure is in pytree protocol {protocol!r}; ortlite reads protocol 1")
    spec = _tree_node(node, what)
    if what == "arguments" and not (spec.type is tuple and spec.num_children == 2):
        raise _Invalid(f"its {what} structure {spec} is not (args, kwargs)")
    return spec


def _tree_node(node, what: str):
    if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"} or not isinstance(node["children_spec"], list):
        raise _Invalid(f"malformed {what} structure: {str(node)[:200]}")
    name, context, children = node["type"], node["context"], node["children_spec"]
    if name is None:
        if context is not None or children:
            raise _Invalid(f"malformed {what} structure: a leaf with a context or children")
        return _leaf()
    typ = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name) if isinstance(name, str) else None
    if typ is None or name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
        raise _Invalid(
            f"its {what} structure names the type {str(name)[:200]!r}, which is not registered with pytree; if it is a "
            "pytree type (e.g. a transformers ModelOutput), import the module that registers it before ortlite.load"
        )
    n = len(children)
    if typ is collections.defaultdict:
        if not isinstance(context, dict) or set(context) != {"default_factory_module", "default_factory_name", "dict_context"}:
            raise _Invalid(f"malformed {what} structure: defaultdict context {str(context)[:200]}")
        factory = DEFAULT_FACTORIES.get(context["default_factory_name"]) if context["default_factory_module"] == "builtins" else None
        if factory is None:
            raise _Invalid(
                f"its {what} structure asks for a defaultdict of {context['default_factory_module']!r}.{context['default_factory_name']!r}: "
                f"ortlite.load makes only builtin factories ({', '.join(DEFAULT_FACTORIES)})"
            )
        keys = context["dict_context"]
        context = [factory, keys]
    elif typ is pytree.namedtuple:  # the class is named, and must be registered here
        keys = None
        fields = getattr(pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(context) if isinstance(context, str) else None, "_fields", None)
        if fields is None or len(fields) != n:
            raise _Invalid(f"its {what} structure names the namedtuple {str(context)[:200]!r}, not registered here with {n} fields")
        context = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[context]
    elif pytree.SUPPORTED_SERIALIZED_TYPES[typ].from_dumpable_context is not None:
        raise _Invalid(f"its {what} structure needs {name!r}'s own decoder, which ortlite.load does not run")
    else:
        try:
            if not isinstance(context, str):
                raise TypeError(f"a context is JSON text, not {type(context).__name__}")
            context = keys = json.loads(context)
        except (ValueError, TypeError, RecursionError) as e:
            raise _Invalid(f"malformed {what} structure: the context of {name} ({type(e).__name__}: {e})") from None
        if "__enum__" in json.dumps(context):  # an enum member: torch decodes it by importing its module
            raise _Invalid(f"its {what} structure has an enum in the context of {name}: ortlite.load does not import its module")
    if typ in KEYED:
        scalar = (str, int, float, bool, type(None))
        if not (isinstance(keys, list) and len(keys) == n and all(isinstance(k, scalar) for k in keys) and len(set(map(repr, keys))) == n):
            raise _Invalid(f"malformed {what} structure: {name} keys {str(keys)[:200]} for {n} values")
    elif typ in UNKEYED and context is not None:
        raise _Invalid(f"malformed {what} structure: {name} with the context {str(context)[:200]}")
    elif typ is collections.deque and not (context is None or (type(context) is int and context >= n)):
        raise _Invalid(f"malformed {what} structure: a deque of {n} with maxlen {context!r}")
    return pytree.TreeSpec(typ, context, [_tree_node(c, what) for c in children])
