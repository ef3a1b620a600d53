"""Integer edge values (issue 33): every integer op whose ONNX Runtime kernel could round
(through double), saturate, or compare wrongly, on every integer dtype, at the edges of
int32/int64 and mixed with small values, on both paths (torch.compile with the default
options, ortlite.compile), against eager exactly (torch.equal, same dtype).

ONNX Runtime 1.31's CPU kernels that got these wrong (one-node models in plain onnxruntime):
int64 ReduceSum/ReduceProd go through double (not exact above 2**53) and saturate on
overflow where aten wraps, int32 ReduceSum/ReduceProd saturate, int64 Max/Min/Clip and
ReduceMax/ReduceMin (8 and more elements) compare values in [2**31, 2**32) (and
[-2**32, -2**31)) wrongly. A compiled op must give eager's values, or leave the node to
torch (on ortlite.compile: refuse to compile it), never a third thing.
"""


import operator

import pytest
import torch
import torch.nn.functional as F

import ortlite

DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
SHAPE = (6, 9)  # rows of 9 (vectorized kernels take 8 at a time, then a tail), columns of 6, 54 in all


def edge_values(dtype) -> list[int]:
    info = torch.iinfo(dtype)
    magnitudes = [0, 1, 2, 3, 2**7 - 1, 2**7, 2**8 - 1, 2**15 - 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 3037000500, 2**53, 2**53 + 1, 2**62, info.max]
    values = {v for m in magnitudes for v in (m, -m, m - 1, -m - 1)} | {info.min, info.max, info.min + 1}
    return sorted(v for v in values if info.min <= v <= info.max)


def inputs(dtype, count: int = 8, seed: int = 0) -> list[torch.Tensor]:
    """Same-shaped tensors: edge values mixed with small ones, all edges, and the ones
    whose sums and products overflow or pass 2**53."""
    gen = torch.Generator().manual_seed(seed)
    edges = torch.tensor(edge_values(dtype), dtype=torch.int64)
    info = torch.iinfo(dtype)
    small = torch.tensor([v for v in (-3, -2, -1, 0, 1, 2, 3, 5) if info.min <= v <= info.max])
    n = SHAPE[0] * SHAPE[1]

    def pick(values, k):
        return values[torch.randint(len(values), (k,), generator=gen)]

    made = []
    for i in range(count):
        mixed = torch.where(torch.rand(n, generator=gen) < 0.5, pick(edges, n), pick(small, n))
        made.append(mixed if i % 2 else pick(edges, n))
    for value in (info.max, info.min, 3, -3 if info.min < 0 else 2, 2**31, 2**53 + 1, 2**62, 3037000500):
        if info.min <= value <= info.max:
            made.append(torch.full((n,), value))
    if info.max >= 2**53 + 1:
        made.append(torch.tensor([2**53 + 1, 1] * (n // 2)))  # sums past 2**53 that double rounds
    return [m.view(SHAPE).to(dtype) for m in made]


def _ints(dtype, *values):
    info = torch.iinfo(dtype)
    return [v for v in values if info.min <= v <= info.max]


def _bounds(dtype):
    return _ints(dtype, -5, 0, 5, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, -(2**32))


def _ranges(dtype, inverted=False):
    """(low, high) bounds in the dtype; with an inverted one (low > high: aten gives high)."""
    pairs = [(0, 5), (-5, 5), (0, 2**31 - 1), (-(2**31), 2**32), (2**31, 2**32 - 1), (-(2**32), -(2**31)), (-(2**62), 2**62)]
    pairs += [(5, 0), (2**32 - 1, 2**31)] if inverted else []
    return [(lo, hi) for lo, hi in pairs if _ints(dtype, lo, hi) == [lo, hi]]


def _by_large(x):
    """Divisions by the largest divisors of the dtype (past 2**53 for int64)."""
    large = [v for v in _ints(x.dtype, 2**53 + 1, -(2**62) - 3, 3037000500, 2**31 + 7, 2**15 + 3, 100) if v][:2]
    return [op(x, v) for v in large for op in (operator.floordiv, operator.mod, torch.fmod)]


def _nonzero(y):
    """y with 0 and -1 made 2 (x // -1 of the dtype's minimum kills eager itself: SIGFPE)."""
    return torch.where((y == 0) | (y == -1), torch.full_like(y, 2), y)


# name -> fn(x, y); results compared as a tuple
OPS = {
    "sum": lambda x, y: (x.sum(1), x.sum(0), x.sum()),
    "sum_keep_dtype": lambda x, y: (x.sum(1, dtype=x.dtype), x.sum(dtype=x.dtype)),
    "prod": lambda x, y: (x.prod(1), x.prod(0), x.prod()),
    "prod_keep_dtype": lambda x, y: (x.prod(1, dtype=x.dtype), x.prod(dtype=x.dtype)),
    "mean": lambda x, y: (x.mean(), x.mean(1)),  # aten refuses integers: the compiled call must raise too
    "cumsum": lambda x, y: (x.cumsum(1), x.cumsum(0), x.cumsum(1, dtype=x.dtype)),
    "cumprod": lambda x, y: (x.cumprod(1), x.cumprod(0), x.cumprod(1, dtype=x.dtype)),
    "amax": lambda x, y: (x.amax(1), x.amax(0), x.amax(), x.amax(1, keepdim=True)),
    "amin": lambda x, y: (x.amin(1), x.amin(0), x.amin()),
    "max_dim": lambda x, y: (*x.max(1), *x.max(0, keepdim=True)),
    "min_dim": lambda x, y: (*x.min(1), *x.min(0)),
    "max_min_all": lambda x, y: (x.max(), x.min()),
    "argmax": lambda x, y: (x.argmax(1), x.argmax(0), x.argmax()),
    "argmin": lambda x, y: (x.argmin(1), x.argmin(0), x.argmin()),
    "cummax": lambda x, y: (*x.cummax(1), *x.cummax(0)),
    "cummin": lambda x, y: (*x.cummin(1), *x.cummin(0)),
    "sort_stable": lambda x, y: (*torch.sort(x, dim=1, stable=True), *torch.sort(x, dim=0, descending=True, stable=True)),
    "sort_values": lambda x, y: (torch.sort(x, 1).values, torch.sort(x, 1, descending=True).values),
    "topk": lambda x, y: (*x.topk(3, 1), *x.topk(2, 0, largest=False)),
    "median": lambda x, y: (*x.median(1), x.median()),
    "maximum": lambda x, y: (torch.maximum(x, y), torch.maximum(x, y[:1])),
    "minimum": lambda x, y: (torch.minimum(x, y), torch.minimum(x[:, :1], y)),
    "fmax_fmin": lambda x, y: (torch.fmax(x, y), torch.fmin(x, y)),
    "clamp": lambda x, y: tuple(torch.clamp(x, lo, hi) for lo, hi in _ranges(x.dtype, inverted=True)),
    "clamp_min_max": lambda x, y: (*(torch.clamp_min(x, v) for v in _bounds(x.dtype)), *(torch.clamp_max(x, v) for v in _bounds(x.dtype))),
    "clamp_tensor": lambda x, y: (torch.clamp(x, min=y), torch.clamp(x, max=y), torch.clamp(x, y[:1], y[1:2])),
    "relu": lambda x, y: torch.relu(x),
    "hardtanh": lambda x, y: tuple(F.hardtanh(x, lo, hi) for lo, hi in _ranges(x.dtype)),
    "abs_neg": lambda x, y: (x.abs(), -x),
    "add_sub_mul": lambda x, y: (x + y, x - y, x * y, x * 3, x + 2**62 if x.dtype == torch.int64 else x + 100),
    "square_cube": lambda x, y: (x * x, x**2, x**3),
    "div_mod": lambda x, y: (x // 7, x // -3, x % 7, x % -3, torch.fmod(x, 7), torch.div(x, 7, rounding_mode="trunc"), *_by_large(x)),
    "div_mod_tensor": lambda x, y: (x // _nonzero(y), x % _nonzero(y), torch.fmod(x, _nonzero(y)), torch.div(x, _nonzero(y), rounding_mode="trunc")),
    "compare": lambda x, y: (x < y, x <= y, x == y, x > y, x >= y, x != y, x > 2**31 if x.dtype == torch.int64 else x > 3),
    "where": lambda x, y: torch.where(x > y, x, y),
    "scatter_reduce": lambda x, y: tuple(
        x.scatter_reduce(1, torch.tensor([[0, 1, 0, 2, 1, 0, 2, 2, 1]] * SHAPE[0]), y, reduce, include_self=include)
        for reduce in ("amax", "amin", "sum", "prod") for include in (True, False)
    ),
    "max_pool": lambda x, y: (F.max_pool2d(x.view(1, 1, *SHAPE), 3, 1), *F.max_pool2d(x.view(1, 1, *SHAPE), (2, 4), 2, return_indices=True)),
    "avg_pool": lambda x, y: (F.avg_pool2d(x.view(1, 1, *SHAPE), 3, 1), F.avg_pool2d(x.view(1, 1, *SHAPE), (2, 4), 2, divisor_override=3)),
    "matmul": lambda x, y: (x @ y.T, torch.einsum("ij,kj->ik", x, y), torch.mv(x, y[0]), torch.dot(x[0], y[0])),
    "bmm_addbmm": lambda x, y: (torch.bmm(x.reshape(2, 3, 9), y.reshape(2, 9, 3)), torch.addbmm(x[:3, :3], x.reshape(2, 3, 9), y.reshape(2, 9, 3))),
    "bilinear": lambda x, y: F.bilinear(x[:, :3], y[:, :4], x.flatten()[:24].view(2, 3, 4)),
    "index_reduce": lambda x, y: tuple(x.index_reduce(0, torch.tensor([0, 1, 0, 2, 1, 0]), y, r) for r in ("amax", "amin", "prod")),
}
ARG_OPS = {"argmax", "argmin"}  # ties: aten takes the first; ONNX too (select_last_index=0)


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def _eager(fn, x, y):
    try:
        return fn(x.clone(), y.clone()), None
    except Exception as e:  # eager's error must be matched by an error
        return None, e


def _same(got, expected) -> str | None:
    """None when got is expected exactly (values, dtype, shape); else what differs."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    if len(got) != len(expected):
        return f"{len(got)} results, eager has {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        if g.dtype != e.dtype or g.shape != e.shape or not torch.equal(g, e):
            where = (g != e).nonzero()[:3].tolist() if g.shape == e.shape and g.dtype == e.dtype else ""
            return f"result {k}: got {g.dtype}{tuple(g.shape)} {g.flatten()[:6].tolist()}, eager {e.dtype}{tuple(e.shape)} {e.flatten()[:6].tolist()} (differ at {where})"
    return None


def sweep(name: str, dtype: torch.dtype, path: str) -> dict:
    """Runs OPS[name] for dtype on a path over every input; returns what happened:
    {"wrong": [...], "refused": reason or None, "in_torch": fallback ops, "cases": n}."""
    fn = OPS[name]
    xs = inputs(dtype)
    ys = [xs[(i + 3) % len(xs)].flip(0) for i in range(len(xs))]
    report = {"wrong": [], "refused": None, "in_torch": {}, "cases": len(xs)}
    if path == "compile":
        backend = ortlite.Backend()
        compiled = torch.compile(fn, backend=backend, dynamic=False)
    else:
        try:
            compiled = ortlite.compile(Fn(fn), (xs[0], ys[0]))
        except ortlite.CompileError as e:
            report["refused"] = str(e).splitlines()[1] if "\n" in str(e) else str(e)[:200]
            return report
        except Exception as e:  # torch.export raises as eager does (a meta function's check)
            if _eager(fn, xs[0], ys[0])[1] is None:
                raise
            report["refused"] = f"torch.export: {type(e).__name__}: {e}"
            return report
    for x, y in zip(xs, ys):
        expected, error = _eager(fn, x, y)
        try:
            got = compiled(x.clone(), y.clone())
        except ortlite.RunError as e:  # ortlite.compile: ONNX Runtime cannot give aten's result for these values
            if path == "aot" and "cannot give aten's result" in str(e):
                continue
            raise
        except Exception as e:
            if error is None:
                report["wrong"].append(f"raised {type(e).__name__}: {str(e)[:200]} where eager gives values; x={x.flatten()[:6].tolist()}")
            continue
        if error is not None:
            report["wrong"].append(f"values where eager raises {type(error).__name__}: {error}")
            continue
        diff = _same(got, expected)
        if diff:
            report["wrong"].append(f"{diff}; x={x.flatten()[:9].tolist()}")
    if path == "compile":
        report["in_torch"] = backend.stats.fallback_ops
    return report


@pytest.mark.parametrize("path", ["compile", "aot"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("name", OPS)
def test_integer_edges_match_eager(name, dtype, path):
    report = sweep(name, dtype, path)
    assert not report["wrong"], f"{name} {dtype} {path}: {len(report['wrong'])} of {report['cases']} inputs wrong:\n" + "\n".join(report["wrong"][:4])


# The ops whose ONNX Runtime kernels are wrong for int64 have exact lowerings: they run in
# ONNX Runtime (not left to torch), and ortlite.compile takes them.
EXACT_IN_ORT = [
    "sum", "sum_keep_dtype", "prod", "prod_keep_dtype", "cumsum", "cumprod", "amax", "amin", "max_dim", "min_dim",
    "max_min_all", "cummax", "cummin", "maximum", "minimum", "clamp", "clamp_min_max", "clamp_tensor", "relu", "hardtanh",
    "scatter_reduce", "index_reduce", "max_pool", "bmm_addbmm", "bilinear",
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("name", EXACT_IN_ORT)
def test_exact_integer_lowerings_run_in_onnx_runtime(name, dtype):
    fn = OPS[name]
    x, y = inputs(dtype)[:2]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    got = torch.compile(fn, backend=backend)(x, y)
    assert _same(got, fn(x, y)) is None
    assert backend.stats.fallback_ops == {} and backend.stats.runs >= 1, backend.stats
    compiled = ortlite.compile(Fn(fn), (x, y))
    for x, y in zip(inputs(dtype, seed=1), inputs(dtype, seed=2)):
        assert _same(compiled(x, y), fn(x, y)) is None


def test_the_sweep_sees_the_kernel_bugs():
    """The inputs reach the cases ONNX Runtime's kernels got wrong (so a lowering straight
    onto those kernels would fail the sweep)."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    def run_one(op_type, *xs, **attrs):
        names = [f"x{i}" for i in range(len(xs))]
        inits = []
        if op_type.startswith("Reduce"):
            inits, names = [numpy_helper.from_array(torch.tensor([1]).numpy(), "axes")], names + ["axes"]
        node = helper.make_node(op_type, names, ["y"], **attrs)
        info = [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in names[: len(xs)]]
        graph = helper.make_graph([node], "g", info, [helper.make_tensor_value_info("y", TensorProto.INT64, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 9
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(None, {n: x.numpy() for n, x in zip(names, xs)})[0])

    wrong = dict.fromkeys(["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "Max", "Min"], 0)
    xs = inputs(torch.int64)
    for x, y in zip(xs, xs[1:]):
        for op_type, expected in (("ReduceSum", x.sum(1)), ("ReduceProd", x.prod(1)), ("ReduceMax", x.amax(1)), ("ReduceMin", x.amin(1))):
            wrong[op_type] += not torch.equal(run_one(op_type, x, keepdims=0), expected)
        wrong["Max"] += not torch.equal(run_one("Max", x, y), torch.maximum(x, y))
        wrong["Min"] += not torch.equal(run_one("Min", x, y), torch.minimum(x, y))
    assert all(wrong.values()), wrong  # each broken kernel is caught by some input


DYNAMIC_OPS = {
    "sum": lambda x: (x.sum(1), x.sum(), x.sum((0, 1), keepdim=True), x.sum(0, dtype=torch.int32)),
    "prod": lambda x: (x.prod(1), x.prod(), x.prod(0, keepdim=True)),
    "amax_amin": lambda x: (x.amax((0, 1), keepdim=True), x.amin(0), x.amax(1)),
    "max_dim": lambda x: tuple(x.max(1)),
    "cumprod_cummax": lambda x: (x.cumprod(1), *x.cummax(1)),
}


@pytest.mark.parametrize("name", DYNAMIC_OPS)
def test_integer_reductions_with_symbolic_sizes(name):
    """Sizes known only at run time (running sums and products in a Loop, sums of nothing)."""
    fn = DYNAMIC_OPS[name]
    backend = ortlite.Backend(ortlite.Options(fallback="error"))
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    edges = torch.tensor(edge_values(torch.int64))
    gen = torch.Generator().manual_seed(3)
    for rows, columns in ((3, 5), (4, 9), (2, 1), (5, 17), (3, 0)):
        if columns == 0 and name in ("amax_amin", "max_dim"):
            continue  # aten raises for a max over nothing (and the check leaves it to torch)
        for _ in range(3):
            x = edges[torch.randint(len(edges), (rows, columns), generator=gen)]
            assert _same(compiled(x), fn(x)) is None, (rows, columns, x)
    assert backend.stats.fallback_ops == {}, backend.stats


# The ONNX nodes of these ops on float and bool inputs, as they were before the integer
# lowerings above: those change nothing for other dtypes.
FLOAT_GRAPHS = {
    ("sum", torch.float32): {"ReduceSum": 3},
    ("sum", torch.bool): {"Cast": 3, "ReduceSum": 3},
    ("prod", torch.float32): {"ReduceProd": 3},
    ("prod", torch.bool): {"Cast": 3, "ReduceProd": 3},
    ("cumsum", torch.float32): {"CumSum": 3},
    ("cumprod", torch.float32): {"ReduceProd": 3, "Unsqueeze": 3, "Where": 3},
    ("amax", torch.float32): {"Cast": 8, "IsNaN": 4, "ReduceMax": 8, "Where": 4},
    ("amax", torch.bool): {"ReduceMax": 4},
    ("max_dim", torch.float32): {"ArgMax": 4, "Cast": 8, "IsNaN": 4, "ReduceMax": 6, "Where": 4},
    ("min_dim", torch.bool): {"ArgMin": 2, "Cast": 2, "ReduceMin": 2},
    ("max_min_all", torch.float32): {"Cast": 4, "IsNaN": 2, "ReduceMax": 3, "ReduceMin": 1, "Where": 2},
    ("cummax", torch.float32): {"And": 8, "Cast": 4, "Equal": 2, "IsNaN": 2, "Not": 2, "Or": 2, "ReduceMax": 6, "Squeeze": 4, "Unsqueeze": 4, "Where": 6},
    ("cummin", torch.bool): {"And": 2, "Cast": 4, "Equal": 2, "ReduceMax": 2, "ReduceMin": 2, "Squeeze": 4, "Unsqueeze": 2, "Where": 4},
    ("maximum", torch.float32): {"Max": 2, "Slice": 1},
    ("minimum", torch.bool): {"And": 2, "Slice": 1},
    ("clamp_tensor", torch.float32): {"Max": 2, "Min": 2, "Slice": 2},
    ("relu", torch.float32): {"Relu": 1},
    ("clamp_float", torch.float32): {"Max": 2, "Min": 1},
    ("hardtanh_float", torch.float16): {"Max": 1, "Min": 1},
}  # fmt: skip
OPS_FLOAT = {**OPS, "clamp_float": lambda x, y: (torch.clamp_min(x, -0.5), torch.clamp(x, -1.5, 2.0)), "hardtanh_float": lambda x, y: F.hardtanh(x, -1.0, 1.0)}


@pytest.mark.parametrize("name,dtype", FLOAT_GRAPHS, ids=lambda v: str(v).replace("torch.", ""))
def test_float_and_bool_graphs_are_unchanged(name, dtype):
    import collections

    fn = OPS_FLOAT[name]
    x, y = (torch.randn(SHAPE).to(dtype) for _ in range(2))
    model = ortlite.compile(Fn(fn), (x, y)).onnx_model
    assert dict(collections.Counter(n.op_type for n in model.graph.node)) == FLOAT_GRAPHS[name, dtype]
