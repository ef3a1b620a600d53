"""Conformance sweep over PyTorch's OpInfo database: each op's sample inputs run eagerly and
through torch.compile(backend=ortlite.Backend()); the op lands in one bucket:

    ort       every sample matches eager and nothing ran in torch
    fallback  every sample matches eager, something ran in torch (an op ortlite left out,
              or a Dynamo graph break)
    wrong     a result differs from eager (value, dtype or shape)
    crash     ortlite or ONNX Runtime raised where eager did not (a process crash is found
              by bench/coverage.py, which runs the sweep in subprocesses)
    skipped   no sample could be compared (eager raises on all of them, or no dtype swept)

Used by tests/test_opinfo.py (a few samples per op) and bench/coverage.py (the full sweep).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings

import torch
import torch.utils._pytree as pytree

# Ops whose results are random or uninitialized memory: no eager result to compare with.
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "uniform",
    "rand_like", "randint", "randint_like", "randn", "randn_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
}  # fmt: skip

DTYPES = (torch.float32, torch.int64, torch.bool)
BUCKETS = ("ort", "fallback", "wrong", "crash", "skipped")

# float32 tolerances: ONNX Runtime's kernels (vectorized exp/tanh, blocked sums and
# matmuls) round differently from aten's.
RTOL, ATOL = 1e-4, 1e-5
# Half precision: results that differ from eager by more than these are wrong unless they
# are as accurate as eager's against the same op computed in float64 (see _as_accurate).
HALF_TOLERANCE = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3)}
# Ops whose float32 results legitimately differ more, with why.
TOLERANCE = {}


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def all_ops():
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def excluded_reason(op, dtypes=DTYPES) -> str | None:
    if op.name in RANDOM_OPS:
        return "random or uninitialized results"
    if not set(dtypes) & set(op.supported_dtypes("cpu")):
        return f"none of {[str(d).removeprefix('torch.') for d in dtypes]} on CPU"
    return None


@dataclasses.dataclass
class OpResult:
    op: str
    bucket: str
    samples: int = 0  # samples compared
    fallback_ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reasons: dict = dataclasses.field(default_factory=dict)  # fallback op -> reasons
    detail: str = ""  # first wrong/crash: which sample and what

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "fallback_ops": dict(self.fallback_ops), "reasons": {k: sorted(v) for k, v in self.reasons.items()}}


def recording_backend(name: str = "ortlite"):
    """A fresh backend that records, per aten op left to torch, why (`.reasons`), beside
    `.stats.fallback_ops`. "onnxrt" is torch <= 2.8's removed ONNX Runtime backend (DORT),
    swept by `bench/coverage.py --backend onnxrt` for comparison."""
    if name == "onnxrt":
        return _RecordingDort()
    import ortlite
    from ortlite.partition import op_name

    class RecordingBackend(ortlite.Backend):
        def reset(self):
            super().reset()
            self.reasons = collections.defaultdict(set)

        def _left_to_torch(self, unsupported):
            super()._left_to_torch(unsupported)
            for node, reason in unsupported.items():
                self.reasons[op_name(node)].add(reason)

    return RecordingBackend()


class _RecordingDort:
    """DORT (torch.onnx._internal.onnxruntime.OrtBackend) with its fallbacks recorded: the
    call_function nodes its partitioner left outside the fused ONNX submodules."""

    def __init__(self):
        import operator

        from torch.onnx._internal.onnxruntime import OrtBackend, OrtBackendOptions

        outer = self
        self.stats = type("Stats", (), {})()
        self.stats.fallback_ops = collections.Counter()
        self.reasons = collections.defaultdict(set)

        class Recording(OrtBackend):
            def compile(self, graph_module, args):
                fused = super().compile(graph_module, args)
                for node in fused.graph.nodes:
                    if node.op == "call_function" and node.target is not operator.getitem:
                        outer.stats.fallback_ops[str(node.target)] += 1
                        outer.reasons[str(node.target)].add("not supported by DORT")
                return fused

        # preallocated outputs: without them DORT needs the onnxruntime-training wheel
        self._backend = Recording(OrtBackendOptions(preallocate_output=True))

    def __call__(self, gm, example_inputs):
        return self._backend(gm, example_inputs)


def _pick(samples: list, limit: int | None) -> list:
    """`limit` samples spread over the list (later samples are often the odd ones)."""
    if limit is None or len(samples) <= limit:
        return samples
    if limit == 1:
        return samples[:1]
    step = (len(samples) - 1) / (limit - 1)
    return [samples[round(i * step)] for i in range(limit)]


def _clone(tree):
    """Fresh copies of the tensors; one that requires grad becomes a fresh leaf that does."""
    return pytree.tree_map(lambda x: x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x, tree)


def _with_grads(fn, arguments):
    """fn(*arguments), and in grad mode the gradients of its float outputs (each against a
    fixed random cotangent) for every argument that requires grad: (outputs, grads)."""
    result = fn(*arguments)
    outputs = [o for o in pytree.tree_leaves(result) if isinstance(o, torch.Tensor) and o.requires_grad]
    inputs = [a for a in arguments if isinstance(a, torch.Tensor) and a.requires_grad]
    if not outputs or not inputs:
        return result
    generator = torch.Generator().manual_seed(0)
    cotangents = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in outputs]
    grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
    return result, list(grads)


def _compare(got, expected, rtol, atol) -> str | None:
    """None when got equals eager's result; else what differs."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    if len(got_leaves) != len(exp_leaves):
        return f"structure {got_spec} != eager's {exp_spec}"
    for i, (g, e) in enumerate(zip(got_leaves, exp_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"output {i}: {type(g).__name__} where eager gives a tensor"
            if g.dtype != e.dtype or g.shape != e.shape:
                return f"output {i}: {g.dtype}{list(g.shape)} != eager's {e.dtype}{list(e.shape)}"
            try:
                torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, check_device=False)
            except AssertionError as err:
                return f"output {i}: " + " ".join(str(err).split())[:300]
        elif isinstance(e, float) and isinstance(g, float):
            if not (math.isclose(g, e, rel_tol=rtol, abs_tol=atol) or (g != g and e != e)):
                return f"output {i}: {g} != eager's {e}"
        elif g != e:
            return f"output {i}: {g!r} != eager's {e!r}"
    return None


def _describe(sample) -> str:
    def show(x):
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" + ("" if x.layout != torch.strided or x.is_contiguous() else "nc")
        return repr(x)

    args = [show(a) for a in pytree.tree_leaves((sample.input, sample.args))]
    kwargs = {k: pytree.tree_map(show, v) for k, v in sample.kwargs.items()}
    return f"({', '.join(args)}{', ' if kwargs else ''}{', '.join(f'{k}={v}' for k, v in kwargs.items())})"


MODES = ("static", "dynamic", "automatic", "grad")


def _is_argument(leaf) -> bool:
    """Leaves passed to the compiled function as arguments (so that Dynamo may make them
    symbolic); the rest are constants of it. Bools stay constants: flags, not sizes."""
    return isinstance(leaf, torch.Tensor) or (isinstance(leaf, int) and not isinstance(leaf, bool))


def _sample_function(op, sample):
    """(fn, arguments): fn(*arguments) is op.op on the sample, its tensors and ints as arguments."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    at = [i for i, leaf in enumerate(leaves) if _is_argument(leaf)]

    def fn(*arguments):
        filled = list(leaves)
        for i, a in zip(at, arguments):
            filled[i] = a
        x, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op.op(x, *args, **kwargs)

    return fn, [leaves[i] for i in at]


def _signature(sample) -> tuple:
    """What must agree for a second sample to be a call of the same compiled function with
    other sizes or ints: the structure, the constants, and each tensor's dtype and rank."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    kinds = tuple(
        ("t", x.dtype, x.dim(), x.layout, x.layout == torch.strided and x.is_contiguous()) if isinstance(x, torch.Tensor) else ("i",) if _is_argument(x) else ("c", repr(x))
        for x in leaves
    )
    return str(spec), kinds


def partner(sample, samples: list):
    """Another sample the same compiled function can take (other sizes or ints), or None."""
    key = _signature(sample)
    for other in samples:
        if other is not sample and _signature(other) == key and _describe(other) != _describe(sample):
            return other
    return None


def run_sample(op, sample, rtol=RTOL, atol=ATOL, backend_name="ortlite", mode="static", second=None):
    """Runs one sample eagerly and compiled. Returns (status, backend, detail) with status in
    'ok', 'wrong', 'crash', 'eager-error'; backend is None unless compiled.

    mode "static": dynamic=False; "dynamic": dynamic=True; "automatic": Dynamo's default,
    called with `sample` and then `second` (other sizes or ints, same structure): the
    second call recompiles with what changed symbolic, as in a user's loop; "grad": static,
    and the gradients (the backward graph in ONNX Runtime) are compared too."""
    calls = [_sample_function(op, sample)] + ([_sample_function(op, second)] if second is not None else [])
    expected = []
    for fn, arguments in calls:
        try:
            expected.append(_with_grads(fn, _clone(arguments)))
        except Exception as e:
            return "eager-error", None, f"{type(e).__name__}: {e}"
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend = recording_backend(backend_name)
    dynamic = {"static": False, "grad": False, "dynamic": True, "automatic": None}[mode]
    compiled = torch.compile(calls[0][0], backend=backend, dynamic=dynamic, fullgraph=False)
    try:
        got = []
        for _, arguments in calls:  # the same compiled function: calls[0][0] reads its arguments only
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got.append(_with_grads(compiled, _clone(arguments)))
    except Exception as e:
        if _fails_with_aot_eager(calls, dynamic):
            return "eager-error", None, f"Dynamo fails on it with aot_eager too: {type(e).__name__}"
        return "crash", backend, f"call {len(got)}: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
    finally:
        # torch._dynamo.reset() resets the backend too: keep what it saw first
        backend.seen = (backend.stats, dict(backend.reasons))
        backend.graph_breaks = dict(torch._dynamo.utils.counters["graph_break"])
        backend.captured = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        torch._dynamo.reset()
    for k, (g, e) in enumerate(zip(got, expected)):
        half = _half_dtype(calls[k][1])
        problem = _compare(g, e, *HALF_TOLERANCE.get(half, (rtol, atol)))
        if problem and (half is not None or mode == "grad"):
            problem = _as_accurate(g, e, calls[k], problem)
        if problem:
            return "wrong", backend, f"call {k}: {problem}" if len(calls) > 1 else problem
    return "ok", backend, ""


def _fails_with_aot_eager(calls, dynamic) -> bool:
    """Does torch.compile fail on these calls with aot_eager, PyTorch's own reference
    backend? Then it is not ortlite's crash (e.g. Dynamo cannot trace the op)."""
    torch._dynamo.reset()
    try:
        compiled = torch.compile(calls[0][0], backend="aot_eager", dynamic=dynamic)
        for _, arguments in calls:
            _with_grads(compiled, _clone(arguments))
    except Exception:
        return True
    finally:
        torch._dynamo.reset()
    return False


def _half_dtype(arguments):
    return next((a.dtype for a in arguments if isinstance(a, torch.Tensor) and a.dtype in HALF_TOLERANCE), None)


def _as_accurate(got, expected, call, problem: str) -> str | None:
    """None when ortlite's result is as accurate as eager's against the op computed in
    float64 on the same (exactly widened) inputs; else what differs. For half precision,
    and for gradients (where eager's float32 rounding noise can be all a value is: the
    gradient of a layer norm over one element is 0 exactly, eager's 1e-4)."""
    fn, arguments = call
    wide = [a.detach().double().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in arguments]
    try:
        reference = _with_grads(fn, wide)
    except Exception:
        return problem
    for g, e, r in zip(*(pytree.tree_leaves(x) for x in (got, expected, reference))):
        if not (isinstance(g, torch.Tensor) and g.is_floating_point() and isinstance(r, torch.Tensor) and r.shape == g.shape):
            continue
        r = r.to(torch.float64)
        ours, eagers = (g.double() - r).abs(), (e.double() - r).abs()
        finite = torch.isfinite(r)
        # per element: at most eager's error plus one half-precision step of the value
        step = r.abs() * torch.finfo(g.dtype).eps + torch.finfo(g.dtype).tiny
        same = lambda a, b: (a == b) | (a.isnan() & b.isnan())  # noqa: E731
        worse = (finite & ~(ours <= eagers + step)) | (~finite & ~same(g.double(), r) & ~same(g, e))
        if worse.any():
            return f"{problem} (and less accurate than eager against float64 at {int(worse.sum())} elements)"
    return None


def sweep_op(
    op, dtypes=DTYPES, max_samples: int | None = None, seed: int = 0, backend_name: str = "ortlite", mode: str = "static"
) -> OpResult:
    """mode: see run_sample; in "automatic" mode a sample without a partner (the same
    structure with other sizes or ints) is not swept."""
    name = op_id(op)
    reason = excluded_reason(op, dtypes)
    if mode == "grad":
        dtypes = [d for d in dtypes if d.is_floating_point]
        if not op.supports_autograd or not dtypes:
            reason = reason or "no gradient: not differentiable, or no float dtype swept"
    if reason:
        return OpResult(name, "skipped", detail=reason)
    result = OpResult(name, "ort")
    rtol, atol = TOLERANCE.get(name, (RTOL, ATOL))
    supported = op.supported_dtypes("cpu")
    for dtype in dtypes:
        if dtype not in supported:
            continue
        torch.manual_seed(seed)
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=mode == "grad"))
        except Exception as e:  # some OpInfos cannot make samples for some dtypes
            result.detail = result.detail or f"{dtype}: sample_inputs raised {type(e).__name__}"
            continue
        for sample in _pick(samples, max_samples):
            second = partner(sample, samples) if mode == "automatic" else None
            if mode == "automatic" and second is None:
                continue
            status, backend, detail = run_sample(op, sample, rtol, atol, backend_name, mode, second)
            if status == "eager-error":
                continue
            result.samples += 1
            if status in ("wrong", "crash"):
                result.bucket = status
                then = f" then {_describe(second)}" if second is not None else ""
                result.detail = f"{str(dtype).removeprefix('torch.')} {_describe(sample)}{then}: {detail}"
                return result
            stats, reasons = backend.seen
            for fallback_op, count in stats.fallback_ops.items():
                result.fallback_ops[fallback_op] += count
                result.reasons.setdefault(fallback_op, set()).update(reasons.get(fallback_op, ()))
            if backend.graph_breaks:
                for cause in backend.graph_breaks:
                    key = "dynamo graph break"
                    result.fallback_ops[key] += 1
                    result.reasons.setdefault(key, set()).add(" ".join(str(cause).split())[:120])
            elif not backend.captured:
                result.fallback_ops["dynamo captured no graph"] += 1
                result.reasons.setdefault("dynamo captured no graph", set())
    if result.samples == 0:
        result.bucket = "skipped"
        result.detail = result.detail or ("no sample with a partner" if mode == "automatic" else "eager raised on every sample")
    elif result.fallback_ops:
        result.bucket = "fallback"
    return result
