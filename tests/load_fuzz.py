"""Fuzzing ortlite.load with mutated saved files: the file is hostile input.

    python tests/load_fuzz.py [--cases 10000] [--seed 0]

Each case mutates one saved model (its ortlite metadata, its ONNX structure, or what its
outputs are: their shapes, alone or with the graph's declared ones, and which graph output
each returned value is), writes it into a folder of its own, loads it and calls it with the
calls the original file ran. What may happen: load raises ValueError; or the model loads and
a call returns, or raises ValueError or TypeError naming the problem. A loaded file whose
change touched only what the outputs are (their sources, constants, structure) or the graph
may give other results: that is another program. Any other change that loads must give the
original results. What may not happen: any other exception (ZeroDivisionError, IndexError,
KeyError, ...), a crash, a hang, a module imported, a file outside the folder read; a late
error (a file whose metadata alone changed loads, then fails in ONNX Runtime or in its size
expressions at a call the original ran); a file that returns other graph outputs than the
original where its metadata alone changed. tests/test_deploy.py runs this in a subprocess,
so a crash or a hang fails the test with the case that caused it.

Reads outside the folder: the mutations point external data at canary files beside and above
the folder (and at the working directory); a load that accepts one of them fails the case.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import os
import random
import sys
import tempfile
import time
import traceback

import onnx
import torch
from torch.export import Dim

import ortlite
import ortlite._fast
import ortlite.saved
from test_deploy import Structured  # kwargs, nested inputs and outputs, a mutated buffer, a size output

ALLOWED_LOAD = (ValueError,)
ALLOWED_CALL = (ValueError, TypeError, ortlite._fast.RunError)  # RunError: a graph ONNX Runtime fails to run, named
CANARY = b"ortlite canary: never read me\n" * 64
OUTSIDE = ("../canary.bin", "/tmp/ortlite-canary.bin", "canary-cwd.bin", "sub/../../canary.bin", "./../canary.bin")
# names an attacker would put where torch's own treespec_loads imports them
IMPORTABLE = ("antigravity", "this", "ortlite_fuzz_never_imported", "http.server", "pdb")


class ScaleBy(torch.nn.Module):
    def forward(self, x, n: int):
        return x * n + x.shape[0], x.shape[0] // 3 + n, x[::2] * 2


class Halves(torch.nn.Module):
    def forward(self, x):
        return x[:, ::2] * 2, torch.cat([x, x], 1).sum(0)


class Views(torch.nn.Module):
    def forward(self, x, y):
        return x[1:], x.t(), y.add_(1), x * 2


class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x))


def models(folder: str) -> list[dict]:
    """Saved files to mutate: (name, the file's bytes, its external data, the calls to make)."""
    torch.manual_seed(0)
    made = []

    def save(name, compiled, calls, external=False):
        path = os.path.join(folder, name + ".onnx")
        limit = ortlite.saved.PROTOBUF_LIMIT
        if external:
            ortlite.saved.PROTOBUF_LIMIT = 1000  # as if it were over 2 GB
        try:
            compiled.save(path)
        finally:
            ortlite.saved.PROTOBUF_LIMIT = limit
        data = open(path + ".data", "rb").read() if external else None
        expected = [compiled(*copy.deepcopy(args), **copy.deepcopy(kwargs)) for args, kwargs in calls]
        made.append({"name": name, "bytes": open(path, "rb").read(), "data": data, "calls": calls, "expected": expected})

    x, pair, scale = torch.randn(3, 8), (torch.randn(5, 2), torch.randn(5, 2)), torch.tensor(2.0)
    shapes = {"x": {0: Dim("b")}, "pair": ({0: Dim("n")}, {0: Dim("n")}), "scale": None}
    save(
        "structured",
        ortlite.compile(Structured(), (x, pair), {"scale": scale}, dynamic_shapes=shapes),
        [((torch.randn(6, 8), (torch.randn(4, 2), torch.randn(4, 2))), {"scale": scale})],
    )
    save(
        "scale",
        ortlite.compile(ScaleBy(), (torch.randn(3, 4), 2), dynamic_shapes={"x": {0: Dim("r", min=3)}, "n": Dim.DYNAMIC}),
        [((torch.randn(5, 4), 3), {}), ((torch.randn(4, 4), -1), {})],
    )
    save("views", ortlite.compile(Views(), (torch.randn(4, 3), torch.randn(3))), [((torch.randn(4, 3), torch.randn(3)), {})])
    save("halves", ortlite.compile(Halves(), (torch.randn(2, 6),), dynamic_shapes=({1: Dim("c", min=3)},)), [((torch.randn(2, 7),), {})])
    save("wide", ortlite.compile(Wide(), (torch.randn(2, 16),)), [((torch.randn(2, 16),), {})], external=True)
    # quantized: com.microsoft kernels, and an If on the row count whose branches read the weights
    quantized = ortlite.compile(Wide(), (torch.randn(2, 16),), dynamic_shapes=({0: Dim("rows")},), options={"quantize": "int4"})
    save("quantized", quantized, [((torch.randn(1, 16),), {}), ((torch.randn(3, 16),), {})])
    return made


# ---------------------------------------------------------------- mutations


def _paths(value, prefix=()):
    """Every place in a JSON value, as key paths."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _get(value, path):
    for k in path:
        value = value[k]
    return value


def _random_expression(rng, symbols, depth=0):
    if depth > 2 or rng.random() < 0.4:
        return rng.choice([0, 1, -1, 2, 3, 2**31, 2**62, -(2**63), *symbols] or [1])
    head = rng.choice(sorted(ortlite.saved.FUNCTIONS) + ["Rational", "Float", "Pow", "Mod", "FloorDiv", "PowByNatural", "LShift"])
    if head == "Rational":
        return ["Rational", rng.choice([1, 0, -3]), rng.choice([0, 2, 1])]
    if head == "Float":
        return ["Float", rng.choice(["1.5", "1e308", "nan", "inf", "-0.0"])]
    return [head, *(_random_expression(rng, symbols, depth + 1) for _ in range(rng.choice([0, 1, 2, 2, 3])))]


def _random_spec(rng):
    leaf = {"type": None, "context": None, "children_spec": []}
    module = rng.choice(IMPORTABLE)
    return rng.choice(
        [
            [1, {"type": "collections.defaultdict", "context": {"default_factory_module": module, "default_factory_name": "main", "dict_context": ["a"]}, "children_spec": [leaf]}],
            [1, {"type": "builtins.dict", "context": json.dumps([{"__enum__": True, "fqn": module + ":X", "name": "A"}]), "children_spec": [leaf]}],
            [1, {"type": "collections.namedtuple", "context": module + ".Point", "children_spec": [leaf, leaf]}],
            [1, {"type": module + ".Output", "context": "null", "children_spec": [leaf]}],
            [1, {"type": "builtins.dict", "context": '["a", "a"]', "children_spec": [leaf, leaf]}],
            [1, {"type": "collections.deque", "context": "0", "children_spec": [leaf, leaf]}],
            [2, leaf],
            [1, {"type": "builtins.tuple", "context": "null", "children_spec": [leaf] * rng.choice([0, 1, 3])}],
        ]
    )


def _random_value(rng, metadata, symbols):
    pool = [
        0, -1, 1, 2, 7, 2**31, 2**63, -(2**63) - 1, 10**30, 1.5, float("nan"), float("inf"), "", "x", "s0", "u1",
        "cpu", "cuda:0", "meta", "float64", "int8", "bool", "tensor", "int", "unused", "BUFFER_MUTATION",
        None, True, False, [], {}, [0], [[0, 0]], {"a": 1},
    ]
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(pool)
    if roll < 0.6:
        return _random_expression(rng, symbols)
    if roll < 0.75:
        return json.dumps(_random_spec(rng))
    other = _get(metadata, rng.choice(list(_paths(metadata))))  # a value from elsewhere in the file
    return copy.deepcopy(other)


def _tweak(rng, value, strings):
    """A value near the one there: what a subtle edit would write."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, 0, -value, value * 2**20, 1])
    if isinstance(value, str):
        return rng.choice(strings)
    return value


def mutate_metadata(rng, metadata) -> tuple[str, set]:
    """The metadata mutated, as JSON, and the top-level keys it touched."""
    symbols = list(metadata.get("symbols", {}))
    paths = [p for p in _paths(metadata) if p]
    strings = [v for v in (_get(metadata, p) for p in paths) if isinstance(v, str)] or [""]
    touched = set()
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        path = rng.choice(paths)
        try:
            parent, key = _get(metadata, path[:-1]), path[-1]
            if not isinstance(parent, (dict, list)):
                continue
            parent[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation moved it
        touched.add(path[0])
        action = rng.random()
        if action < 0.4:
            parent[key] = _tweak(rng, parent[key], strings)
        elif action < 0.45 and isinstance(parent, dict):
            parent.pop(key, None)
        elif action < 0.5 and isinstance(parent, list) and parent:
            parent.append(copy.deepcopy(parent[-1]))
        elif action < 0.55 and isinstance(parent, list) and len(parent) > 1:
            parent.reverse()
        else:
            try:
                parent[key] = _random_value(rng, metadata, symbols)
            except (IndexError, TypeError):
                pass
    return json.dumps(metadata), touched


def mutate_graph(rng, model: onnx.ModelProto) -> str:
    """One structural change; returns what it did."""
    graph = model.graph
    choice = rng.randrange(9)
    if choice == 0 and graph.node:  # a Constant node whose value lives in a file
        tensor = onnx.helper.make_tensor("c", onnx.TensorProto.FLOAT, [4], bytes(16), raw=True)
        onnx.external_data_helper.set_external_data(tensor, rng.choice(OUTSIDE + ("inside.bin",)))
        tensor.ClearField("raw_data")
        graph.node.insert(0, onnx.helper.make_node("Constant", [], ["fuzz_constant"], value=tensor))
        node = rng.choice(graph.node[1:])
        if node.input:
            node.input[0] = "fuzz_constant"
        return "constant external"
    if choice == 1 and graph.initializer:  # an initializer read from elsewhere
        tensor = rng.choice(graph.initializer)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", rng.choice(OUTSIDE)), ("offset", str(rng.choice([0, 8, 10**12])))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.ClearField("raw_data")
        return "initializer external"
    if choice == 2 and graph.node:
        del graph.node[rng.randrange(len(graph.node))]
        return "node removed"
    if choice == 3 and graph.node:
        node = rng.choice(graph.node)
        node.op_type = rng.choice(["Add", "Loop", "If", "Identity", "Relu", "Bogus", "Gemm"])
        return "op changed"
    if choice == 4 and graph.input:
        dims = rng.choice(graph.input).type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 3, 2**40])
        return "input dim"
    if choice == 5 and graph.output:
        rng.choice(graph.output).type.tensor_type.elem_type = rng.choice([onnx.TensorProto.DOUBLE, onnx.TensorProto.BOOL, onnx.TensorProto.INT64])
        return "output dtype"
    if choice == 6 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        if tensor.dims:
            tensor.dims[0] = rng.choice([0, 1, 2**40])
        return "initializer dims"
    if choice == 7:  # a subgraph whose initializer lives in a file
        inner = onnx.helper.make_tensor("inner", onnx.TensorProto.FLOAT, [1], bytes(4), raw=True)
        onnx.external_data_helper.set_external_data(inner, rng.choice(OUTSIDE))
        inner.ClearField("raw_data")
        branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["inner"], ["o"])], "b", [], [onnx.helper.make_tensor_value_info("o", 1, [1])], [inner])
        cond = onnx.helper.make_tensor("cond", onnx.TensorProto.BOOL, [], [True])
        graph.node.insert(0, onnx.helper.make_node("Constant", [], ["fuzz_cond"], value=cond))
        graph.node.insert(1, onnx.helper.make_node("If", ["fuzz_cond"], ["fuzz_if"], then_branch=branch, else_branch=branch))
        return "subgraph external"
    if graph.node:
        node = rng.choice(graph.node)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.INT:
                attribute.i = rng.choice([-1, 0, 2**40])
        return "attribute"
    return "nothing"


def mutate_outputs(rng, metadata, model: onnx.ModelProto) -> str:
    """A lie about the outputs: a shape in the metadata (a size, a rank), the same other static
    size in the metadata and the graph's declared output, or a returned value mapped onto
    another graph output. Returns what it did."""
    ort_outputs, plan = metadata["ort_outputs"], metadata["outputs"]
    symbols = list(metadata.get("symbols", {}))
    choice = rng.randrange(4)
    i = rng.randrange(len(ort_outputs))
    shape = ort_outputs[i]["shape"]
    if choice == 0 and shape:  # one size
        k = rng.randrange(len(shape))
        size = shape[k]
        others = [s for s in symbols if s != size]
        shape[k] = rng.choice(
            ([size + 1, size - 1, 2 * size, 1] if isinstance(size, int) else [["Add", size, 1], ["Mul", 2, size], ["FloorDiv", size, 2], 1, 7])
            + others
        )
        return "output size"
    if choice == 1:  # the rank
        if shape and rng.random() < 0.5:
            del shape[rng.randrange(len(shape))]
        else:
            shape.insert(rng.randrange(len(shape) + 1), rng.choice([1, 2] + symbols))
        return "output rank"
    if choice == 2:  # graph and metadata both: another static size
        static = [k for k, d in enumerate(shape) if isinstance(d, int)]
        if not static:
            return "nothing"
        k = rng.choice(static)
        shape[k] = rng.choice([shape[k] + 1, 2 * shape[k] + 1, max(shape[k] - 1, 0)])
        (value,) = [o for o in model.graph.output if o.name == ort_outputs[i]["name"]]
        value.type.tensor_type.shape.dim[k].dim_value = shape[k]
        return "output size, graph too"
    returned = [j for j, o in enumerate(plan) if o["source"] == "ort"]
    if len(returned) > 1 and rng.random() < 0.5:  # two returned values swapped
        a, b = rng.sample(returned, 2)
        plan[a]["index"], plan[b]["index"] = plan[b]["index"], plan[a]["index"]
    elif returned:
        plan[rng.choice(returned)]["index"] = rng.randrange(len(ort_outputs))
    elif metadata["failures"]:
        metadata["failures"][0][0] = rng.randrange(len(ort_outputs))
    return "output remap"


def _graph_outputs(plan) -> list:
    """Per returned value, the graph output it is (None: not one)."""
    if not isinstance(plan, list):
        return None
    return [o.get("index") if isinstance(o, dict) and o.get("source") == "ort" else None for o in plan]


# ---------------------------------------------------------------- running


def _same(a, b) -> bool:
    la, sa = torch.utils._pytree.tree_flatten(a)
    lb, sb = torch.utils._pytree.tree_flatten(b)
    def equal(x, y):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        return type(x) is type(y) and x == y

    return sa == sb and all(equal(x, y) for x, y in zip(la, lb))


def run_case(case: int, seed: int, bases: list[dict], root: str) -> str:
    """One mutation: 'refused', 'ran', 'same', 'call error' (a call refused, naming what is
    wrong), 'run error' (ONNX Runtime failed running a changed graph); raises on a forbidden
    outcome."""
    rng = random.Random(seed * 1_000_003 + case)
    base = rng.choice(bases)
    folder = os.path.join(root, f"case{case % 4}", "model")  # canary.bin lies in the folder above
    os.makedirs(folder, exist_ok=True)
    for stale in os.listdir(folder):
        os.remove(os.path.join(folder, stale))
    path = os.path.join(folder, base["name"] + ".onnx")
    model = onnx.ModelProto.FromString(base["bytes"])
    (entry,) = [p for p in model.metadata_props if p.key == "ortlite"]
    outside, touched = False, {"graph"}
    original = json.loads(entry.value)
    roll = rng.random()
    if roll < 0.55:
        entry.value, touched = mutate_metadata(rng, json.loads(entry.value))
        what = f"metadata {sorted(touched)}"
    elif roll < 0.75:
        metadata = json.loads(entry.value)
        what = mutate_outputs(rng, metadata, model)
        entry.value = json.dumps(metadata)
        touched = {"ort_outputs", "outputs", "failures"} | ({"graph"} if what.endswith("graph too") else set())
    else:
        what = mutate_graph(rng, model)
        outside = "external" in what
    # what the file declares changed, not what its graph computes (its declared output shapes may)
    metadata_only = "graph" not in touched or what == "output size, graph too"
    mutated = json.loads(entry.value)
    remapped = metadata_only and _graph_outputs(original["outputs"]) != _graph_outputs(mutated.get("outputs") if isinstance(mutated, dict) else None)
    if base["data"] is not None:
        with open(path + ".data", "wb") as f:
            f.write(base["data"])
        if rng.random() < 0.3:  # also a reference to data outside, through the initializers
            tensor = model.graph.initializer[0]
            for e in tensor.external_data:
                if e.key == "location":
                    e.value = rng.choice(OUTSIDE)
            outside = True
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    try:
        loaded = ortlite.load(path)
    except ALLOWED_LOAD:
        return "refused"
    if outside and _references_outside(model, folder):
        raise AssertionError(f"case {case} ({what}): a file that reads data outside its folder loaded")
    outcome = "same"
    for (args, kwargs), expected in zip(base["calls"], base["expected"]):
        try:
            got = loaded(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except ALLOWED_CALL as e:
            # the original ran this call: a file whose metadata alone changed fails it late
            late = isinstance(e, ortlite._fast.RunError) or "metadata may be malformed" in str(e)
            if late and metadata_only:
                raise LateError(f"case {case} ({what}): loaded, then failed at a call the original ran: {type(e).__name__}: {str(e)[:300]}")
            if os.environ.get("ORTLITE_FUZZ_TRACE"):
                print(f"case {case} ({what}): {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
            return "run error" if late else "call error"
        except RuntimeError as e:
            # asked for more memory than the machine has, as any graph can ask (an Expand
            # to a huge shape): torch's allocator says so, as in eager
            if "can't allocate memory" not in str(e):
                raise
            return "call error"
        if not _same(got, expected):
            if remapped:
                raise OtherOutputs(f"case {case} ({what}): loaded, and returns other graph outputs than the file before the change")
            # what the outputs are (their sources, constants, structure) is the program, as the graph is
            if not touched & {"outputs", "out_spec", "input_views", "graph"}:
                raise AssertionError(f"case {case} ({what}): loaded, and its results differ from the file's before the change")
            outcome = "ran"
    return outcome


class LateError(AssertionError):
    """A file that loaded failed at a call its original ran, for what its metadata said."""


class OtherOutputs(AssertionError):
    """A file whose metadata alone changed returns other graph outputs than the original."""


def _references_outside(model, folder) -> bool:
    for tensor in ortlite.saved._tensors(model):
        for e in tensor.external_data:
            if e.key == "location":
                target = os.path.realpath(os.path.join(folder, e.value))
                if os.path.dirname(target) != os.path.realpath(folder):
                    return True
    return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=2.0, help="longest a case may take")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import logging

    logging.getLogger("ortlite").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as root:
        bases = models(root)
        for i in range(4):
            os.makedirs(os.path.join(root, f"case{i}", "model"))
            with open(os.path.join(root, f"case{i}", "canary.bin"), "wb") as f:
                f.write(CANARY)
        with open("/tmp/ortlite-canary.bin", "wb") as f:
            f.write(CANARY)
        cwd = os.getcwd()
        os.chdir(os.path.join(root, "case0"))  # canary-cwd.bin: a path ONNX Runtime would resolve here
        with open("canary-cwd.bin", "wb") as f:
            f.write(CANARY)
        before = set(sys.modules)
        counts: dict[str, int] = {}
        slowest, forbidden = (0.0, -1), 0
        try:
            for case in range(args.cases):
                start = time.perf_counter()
                # a hang: print where each thread is, and exit (the test names this case)
                faulthandler.dump_traceback_later(args.budget_s * 10, exit=True)
                print(f"case {case}", file=sys.stderr, flush=True) if os.environ.get("ORTLITE_FUZZ_TRACE") else None
                try:
                    outcome = run_case(case, args.seed, bases, root)
                except (LateError, OtherOutputs) as e:  # counted, and the run fails at the end
                    print(f"FORBIDDEN {e}", flush=True)
                    outcome = "late error" if isinstance(e, LateError) else "other outputs"
                    forbidden += 1
                except AssertionError:
                    raise
                except Exception as e:  # a forbidden exception type
                    traceback.print_exc()
                    print(f"FORBIDDEN case {case} seed {args.seed}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    return 1
                seconds = time.perf_counter() - start
                slowest = max(slowest, (seconds, case))
                if seconds > args.budget_s:
                    print(f"SLOW case {case} seed {args.seed}: {seconds:.1f} s", flush=True)
                    return 1
                counts[outcome] = counts.get(outcome, 0) + 1
        finally:
            os.chdir(cwd)
        imported = {m for m in set(sys.modules) - before if m.split(".")[0] in {i.split(".")[0] for i in IMPORTABLE}}
        if imported:
            print(f"IMPORTED {sorted(imported)}", flush=True)
            return 1
    verdict = "FAILED" if forbidden else "ok"
    print(f"{verdict} {args.cases} cases: {counts}; slowest case {slowest[1]} {slowest[0] * 1000:.0f} ms", flush=True)
    return 1 if forbidden else 0


if __name__ == "__main__":
    sys.exit(main())
