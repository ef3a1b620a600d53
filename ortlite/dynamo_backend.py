"""Backend: the torch.compile entry point. aot_autograd hands it forward and backward
aten graphs; each becomes one ONNX Runtime runner, or a torch graph calling runners for
the parts ortlite lowers."""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import operator
import re

import torch
import torch.fx
import torch.fx.experimental._config
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .decomp import decomposition_table
from .frozen import frozen_inputs, sub_frozen, weight_indices
from .logs import log, warn_once
from .calibrate import dynamo_graph_inputs, lower_calibrated
from .lower import LoweringError, NodeNotLowered, lower_graph
from .lower.registry import module_path
from .lower.tie_order import mark_tie_orders, sort_verdicts
from .options import CALIBRATION_SAMPLES, Options
from .partition import (
    alias_views_to_torch,
    fallback_counts,
    is_fallback,
    op_name,
    partition,
    source_line,
    storage_readers_see_eager_storage,
    unsupported_nodes,
)
from .runner import runner_for
from .session import SessionCache
from .widen import WIDENED_FROM, reduced_dtype, widen
from .specialize import MAX_FLOAT_VARIANTS, Specializing, as_tensors, attribute_floats, pass_as_numbers, scalar_arguments, with_constants, with_values

_graph_ids = itertools.count()


class UnsupportedError(RuntimeError):
    """Raised under Options(fallback="error") for work ortlite cannot run in ONNX Runtime."""


@dataclasses.dataclass
class Stats:
    graphs: int = 0  # FX graphs compiled into ONNX Runtime (forward and backward apart)
    sessions: int = 0  # InferenceSessions created
    runs: int = 0  # session runs
    fallback_ops: dict = dataclasses.field(default_factory=dict)  # aten op -> nodes left to torch
    frozen: int = 0  # weights that are ONNX Runtime initializers now (Options.freeze_weights)


@dataclasses.dataclass
class GraphReport:
    """What became of one compiled aten graph (kept per compile, for ortlite.explain)."""

    name: str  # e.g. forward_0; a retry after an ONNX Runtime failure or a variant is a graph of its own
    ort_ops: dict  # aten op -> nodes that run in ONNX Runtime
    torch_ops: list  # (aten op, why, the user's source line or "") per node left to torch
    sessions: list  # names of the runners (one ONNX Runtime session each)
    providers: list  # their execution providers
    quantized: list = dataclasses.field(default_factory=list)  # Options.quantize: (module path, lower.quantize.QuantizedProduct) per product
    widened_from: torch.dtype | None = None  # computed in float32 instead of this dtype (ortlite.widen)
    static_convs: list = dataclasses.field(default_factory=list)  # Options.calibration: (module path, lower.qdq.StaticConv)
    calibration_samples: int = 0
    sorts: list = dataclasses.field(default_factory=list)  # (node, module, lower.tie_order.TieOrder) per sort and topk

    @classmethod
    def of(cls, name: str, gm: torch.fx.GraphModule, runners: list, unsupported: dict) -> "GraphReport":
        calls = [n for n in _calls(gm) if n.target is not operator.getitem]
        ort = collections.Counter(op_name(n) for n in calls if n not in unsupported)
        left = [(op_name(n), reason, source_line(n)) for n, reason in unsupported.items() if n.target is not operator.getitem]
        providers = sorted({p for r in runners for p in r.providers})
        quantized = [q for r in runners for q in getattr(r, "quantized", ())]
        static = [c for r in runners for c in getattr(r, "static_convs", ())]
        modules = {n.name: module_path(n) for n in calls} if quantized or static else {}
        quantized = [(modules.get(q.origin) or q.origin or q.weight, q) for q in quantized]
        static = [(modules.get(c.origin) or c.origin or c.node, c) for c in static]
        samples = max((getattr(r, "calibration_samples", 0) for r in runners), default=0)
        return cls(name, dict(ort), left, [r.name for r in runners], providers, quantized, gm.meta.get(WIDENED_FROM), static, samples, sort_verdicts(gm.graph))


# A symbolic size whose expression tree has at least NESTED_SIZE_NODES nodes, NESTED_SIZE_RATIO
# times its distinct sub-expressions or more, was built by torch's fake views nesting floor
# divisions block after block (window partitions under dynamic=True: the tree triples per
# partition round trip; Twins-SVT-S: 153 nodes over 28); torch's compile time grows with it
# (docs/dynamic-shapes.md). Convolution nets' sizes stay under 20 nodes, ratios under 1.5.
NESTED_SIZE_NODES = 120
NESTED_SIZE_RATIO = 4
NESTED_SIZE_WARNING = (
    "this graph's symbolic sizes are nested floor divisions that repeat themselves (window partitions "
    "under dynamic=True?): torch's compile time grows about 3x per partition round trip; "
    "torch.fx.experimental._config.backed_size_oblivious = True keeps them small "
    "(docs/dynamic-shapes.md, 'Symbolic image sizes')"
)


def nested_size(gm: torch.fx.GraphModule, bound: int = 100_000) -> tuple[int, int] | None:
    """(tree nodes, distinct sub-expressions) of the first symbolic size of gm's tensors past
    NESTED_SIZE_NODES and NESTED_SIZE_RATIO, or None. At compile time only; a tree is walked
    at most `bound` nodes."""
    import sympy

    seen = set()
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if not isinstance(value, torch.Tensor):
            continue
        for size in value.shape:
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            if expr in seen or not isinstance(expr, sympy.Basic) or not expr.args:
                continue
            seen.add(expr)
            nodes, distinct = 0, set()
            for sub in sympy.preorder_traversal(expr):
                nodes += 1
                distinct.add(sub)
                if nodes >= bound:
                    break
            if nodes >= NESTED_SIZE_NODES and nodes >= NESTED_SIZE_RATIO * len(distinct):
                return nodes, len(distinct)
    return None


MUTATED_KEY = "ortlite_mutated"


def mutated_outputs(gm: torch.fx.GraphModule) -> dict:
    """Output position -> placeholder name, for the inputs an inference graph mutates, from
    aot_autograd's metadata: it returns their new values first, in input order, and copies
    them into the inputs after the call. Empty where the metadata says otherwise (mutations
    kept in the graph, of metadata, or a count that does not match)."""
    metadata = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if metadata is None or len(placeholders) != len(metadata.input_info):
        return {}
    mutated = [i for i, info in enumerate(metadata.input_info) if info.mutates_data or info.mutates_metadata]
    try:
        from torch._functorch._aot_autograd.schemas import MutationType

        out_of_graph = MutationType.MUTATED_OUT_GRAPH
    except (ImportError, AttributeError):  # another torch: no mutation is written in place
        return {}
    if any(metadata.input_info[i].mutates_metadata or metadata.input_info[i].mutation_type != out_of_graph for i in mutated):
        return {}
    if list(getattr(metadata, "mutated_inp_runtime_indices", [])) != mutated:
        return {}
    return {position: placeholders[i].name for position, i in enumerate(mutated)}


class Backend:
    """A torch.compile backend running graphs in ONNX Runtime; owns its caches and stats."""

    def __init__(self, options: Options | dict | None = None):
        self.options = Options.coerce(options)
        # (taken once: a generator's samples serve every graph)
        self._calibration = None if self.options.calibration is None else list(itertools.islice(self.options.calibration, CALIBRATION_SAMPLES))
        self._sessions = SessionCache()
        self._by_options: dict[Options, Backend] = {}
        self.reset()

    def reset(self) -> None:
        """Forget compiled sessions and zero the stats."""
        self._sessions.clear()
        self._runners: list = []
        self._graphs = 0
        self._fallback_ops: collections.Counter = collections.Counter()
        self._reports: list[GraphReport] = []
        self._failing: dict[tuple, str] = {}  # op signature -> why ONNX Runtime failed running it
        for other in self._by_options.values():
            other.reset()

    @property
    def stats(self) -> Stats:
        return Stats(
            graphs=self._graphs,
            sessions=self._sessions.created,
            runs=sum(r.runs for r in self._runners),
            fallback_ops=dict(self._fallback_ops),
            frozen=sum(len(r.frozen_tensors()) for r in self._runners),
        )

    @property
    def graph_reports(self) -> list[GraphReport]:
        """Per compiled graph: ops in ONNX Runtime, ops left to torch and why (see ortlite.explain)."""
        return list(self._reports)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **kwargs):
        options = kwargs.pop("options", None)
        kwargs.pop("mode", None)
        if kwargs:
            raise TypeError(f"ortlite backend: unexpected arguments {sorted(kwargs)}")
        if options:
            return self.for_options(options)(gm, example_inputs)
        unbound = unbindable(example_inputs)
        if unbound:  # (Dynamo guards on the dispatch keys and type: the calls get the same kinds)
            if self.options.fallback == "error":
                raise UnsupportedError(f"ortlite cannot bind {unbound} arguments")
            warn_once(f"ortlite: graphs with {unbound} arguments run in torch (ortlite binds strided CPU and CUDA tensors)")
            return gm
        subclassed = [i for i, x in enumerate(example_inputs) if _torch_function_subclass(x)]
        if subclassed:  # aot_autograd cannot trace them; the graph Dynamo traced holds what their __torch_function__ does
            plain = [x.as_subclass(torch.Tensor) if i in subclassed else x for i, x in enumerate(example_inputs)]
            return _PlainArguments(self(gm, plain), subclassed)
        if not torch.fx.experimental._config.backed_size_oblivious:
            self._warn_if_sizes_nest(gm)
        # Dynamo's example inputs are the real tensors (parameters included): the inference
        # compiler freezes weights from them, and reads from gm which floats are attributes.
        # Held only while aot_autograd compiles.
        dynamo_graph = {"gm": gm, "inputs": list(example_inputs)}
        if self._calibration is not None:  # each sample as this graph's inputs (or why not)
            dynamo_graph["samples"] = dynamo_graph_inputs(gm, list(example_inputs), self._calibration)
        try:
            return aot_autograd(
                fw_compiler=self._compile_forward,
                bw_compiler=self._compile_backward,
                inference_compiler=functools.partial(self._compile_inference, dynamo_graph),
                decompositions=decomposition_table(self.options.random),
                partition_fn=_partition_joint,
            )(gm, example_inputs)
        finally:
            dynamo_graph.clear()

    @staticmethod
    def _warn_if_sizes_nest(gm: torch.fx.GraphModule) -> None:
        try:
            found = nested_size(gm)
        except Exception:  # a diagnostic: never the reason a compile fails
            log.debug("nested_size failed", exc_info=True)
            return
        if found:
            log.debug("a symbolic size of %d nodes over %d distinct sub-expressions", *found)
            warn_once(NESTED_SIZE_WARNING)

    def for_options(self, options: Options | dict) -> "Backend":
        """The Backend (cached) for options passed through torch.compile(options=...)."""
        options = Options.coerce(options)
        if options == self.options:
            return self
        if options not in self._by_options:
            self._by_options[options] = Backend(options)
        return self._by_options[options]

    def _compile_forward(self, gm, example_inputs):
        mark_tie_orders(gm.graph)  # (a training step's forward was marked whole, in its joint graph)
        return self.compile_graph(gm, "forward")

    def _compile_backward(self, gm, example_inputs):
        mark_tie_orders(gm.graph)
        return self.compile_graph(gm, "backward")

    def _compile_inference(self, dynamo_graph: dict, gm, example_inputs):
        """A forward graph no output of which needs grad: its weights can be frozen, and
        floats read from attributes become constants (checked per call)."""
        frozen = {}
        mark_tie_orders(gm.graph)
        lifted = list(getattr(torch._guards.TracingContext.try_get(), "params_flat", None) or ())
        if self.options.quantize is not None and (reduced := reduced_dtype(gm)) is not None:
            widen(gm, reduced)  # float32 inside: ORT's CPU provider has little bfloat16 and float16 arithmetic
        if self.options.freeze_weights:
            weights = weight_indices(dynamo_graph["gm"], len(lifted))
            frozen = frozen_inputs(gm, lifted + dynamo_graph["inputs"], weights)
        floats = attribute_floats(dynamo_graph["gm"], len(lifted), gm)
        numbers = bool(floats) and pass_as_numbers(dynamo_graph["gm"], len(lifted), floats)
        mutated = mutated_outputs(gm)
        if mutated:  # (read by _build_runner for this graph whole: not a part, not a variant)
            gm.meta[MUTATED_KEY] = mutated
        if "samples" in dynamo_graph:
            static = self._static_int8(gm, frozen, lifted, dynamo_graph["samples"], floats or mutated)
            if static is not None:
                return static
        return self.compile_graph(gm, "forward", frozen, floats, numbers)

    def _static_int8(self, gm, frozen: dict, lifted: list, samples, special):
        """Options.calibration: gm with its frozen weights as constants, calibrated on the
        samples (each the graph's inputs: lifted weights, then Dynamo's), its convolutions
        quantized statically (lower.qdq). The weights are baked in: one that changes sends the
        graph to the float path, with a warning. None (with a warning) where gm cannot be:
        it is not whole in ONNX Runtime, or the samples do not reach it."""
        why = samples if isinstance(samples, str) else None
        if why is None and (not frozen or special):
            why = "its weights are not frozen, or it takes float attributes or mutates its inputs"
        if why is None and unsupported_nodes(gm, {}):
            why = "part of it runs in torch"
        name = f"forward_{next(_graph_ids)}"
        if why is None:
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            constants = {placeholders[i].name: t for i, t in frozen.items()}
            kept = [i for i in range(len(placeholders)) if i not in frozen]
            lower = functools.partial(lower_graph, gm, self.options.opset, constants, stable_ties=self.options.sort_ties == "stable")
            try:
                with unset_fake_temporarily():
                    lowered = lower_calibrated(lower, gm, self.options, ([(lifted + inputs)[i] for i in kept] for inputs in samples))
                    runner = runner_for(name, lowered, gm, self.options, self._sessions)
            except Exception as e:
                if self.options.fallback == "error":
                    raise
                why = f"{type(e).__name__}: {e}"
        if why is not None:
            warn_once(f"ortlite: Options.calibration: a graph's convolutions stay float (products quantized per call): {why}")
            return None
        runner.quantized, runner.static_convs, runner.calibration_samples = lowered.quantized, lowered.static_convs, lowered.calibration_samples
        self._adopt(name, gm, [runner], {})
        weights = list(frozen.values())
        versions = [t._version for t in weights]
        unquantized = []

        def call(*args):
            if not unquantized:
                if all(t._version == v for t, v in zip(weights, versions)):
                    return runner(*[args[i] for i in kept])
                warn_once(f"ortlite: graph {name}: a weight changed after static quantization baked it in: the graph runs unquantized from now on")
                unquantized.append(self._compile(gm, f"{name}_unquantized", boxed=False))
            return unquantized[0](*args)

        return make_boxed_func(call)

    def compile_graph(self, gm: torch.fx.GraphModule, kind: str, frozen: dict | None = None, floats: dict | None = None, numbers: bool = False):
        """One aten graph -> a boxed callable (aot_autograd's convention): a runner when ORT
        runs all of it, else the graph with its supported parts replaced by runners.
        frozen: placeholder index -> tensor, weights to make initializers (ortlite.frozen).
        floats: placeholder -> index, 0-d float arguments to make constants (specialize.py);
        numbers: Dynamo passes them as Python floats (pass_as_numbers)."""
        if kind == "forward":
            alias_views_to_torch(gm)
        name = f"{kind}_{next(_graph_ids)}"
        if not storage_readers_see_eager_storage(gm):
            why = "a graph with an as_strided of a layout it cannot reproduce runs in torch"
            warn_once(f"ortlite: {why}")
            self._fallback_ops.update(op_name(n) for n in _calls(gm))
            self._reports.append(GraphReport.of(name, gm, [], {n: why for n in _calls(gm)}))
            return make_boxed_func(gm if not numbers else as_tensors(gm, list(floats.values())))
        if floats:  # compiled per set of their values, the first at the first call
            return make_boxed_func(self._constant_floats(gm, name, floats, frozen, numbers))
        return self._compile(gm, name, boxed=True, frozen=frozen)

    def _constant_floats(self, gm, name, floats, frozen, numbers: bool) -> Specializing:
        """gm with the float arguments at `floats` as constants, per set of their values (see
        specialize.py); past the variant limit, gm with them as inputs (made tensors again
        where Dynamo passes them as numbers)."""
        variants = itertools.count()

        def compile_variant(values):
            return self._compile(with_constants(gm, values), f"{name}_f{next(variants)}", boxed=False, frozen=frozen), True

        def generic():
            run = self._compile(gm, name, boxed=False, frozen=frozen)
            return as_tensors(run, list(floats.values())) if numbers else run

        return Specializing(floats, compile_variant, generic, name, "are graph inputs", MAX_FLOAT_VARIANTS)

    def _compile(self, gm: torch.fx.GraphModule, name: str, boxed: bool, specialize: bool = True, frozen: dict | None = None):
        """frozen: placeholder index -> tensor, weights to make initializers (ortlite.frozen)."""
        # under fallback="error", refused only once no variant could run what is left to torch
        compiled, runners, unsupported = self._compile_parts(gm, name, boxed, refuse=not specialize, frozen=frozen)
        blocked = {n: reason for n, reason in unsupported.items() if is_fallback(n, reason)}
        positions = scalar_arguments(gm, blocked) if specialize else {}
        if positions:  # nodes left to torch for want of numbers that arguments hold
            generic_run = compiled if not boxed else lambda *args: compiled(list(args))
            specializing = self._specializing(gm, name, blocked, positions, frozen, generic_run, runners, unsupported)
            return make_boxed_func(specializing) if boxed else specializing
        self._refuse(unsupported)
        self._adopt(name, gm, runners, unsupported)
        return compiled

    def _specializing(self, gm, name, blocked, positions, frozen, generic_run, generic_runners, generic_unsupported) -> Specializing:
        """gm compiled per set of values of the arguments at `positions` (see specialize.py);
        the generic compile serves past the variant limit."""
        variants = itertools.count()

        def compile_variant(values):
            variant = with_values(gm, blocked, values)
            variant_name = f"{name}_v{next(variants)}"
            run, runners, unsupported = self._compile_parts(variant, variant_name, boxed=False, frozen=frozen)
            self._adopt(variant_name, variant, runners, unsupported)
            still_blocked = {n.name for n, reason in unsupported.items() if is_fallback(n, reason)}
            return run, not still_blocked & {n.name for n in blocked}

        def generic():
            self._refuse(generic_unsupported)
            self._adopt(name, gm, generic_runners, generic_unsupported)
            return generic_run

        return Specializing(positions, compile_variant, generic, name)

    def _compile_parts(self, gm: torch.fx.GraphModule, name: str, boxed: bool, refuse: bool = True, frozen: dict | None = None):
        """(callable, its runners, nodes left to torch with why) for gm."""
        # nodes found unrunnable while building sessions or running them, by op and dtypes
        excluded = {n.name: self._failing[op_signature(n)] for n in _calls(gm) if op_signature(n) in self._failing}
        # Compilers run inside aot_autograd's fake mode; constants and buffers must be real.
        with unset_fake_temporarily():
            while True:
                try:
                    return self._compile_once(gm, name, excluded, boxed, refuse, frozen)
                except (MissingKernel, NodeNotLowered) as e:
                    if e.node in excluded:
                        raise
                    # leave out every node of the same op and dtypes: one retry per kind
                    culprit = next(n for n in gm.graph.nodes if n.name == e.node)
                    for n in gm.graph.nodes:
                        if n.op == "call_function" and op_signature(n) == op_signature(culprit):
                            excluded[n.name] = e.reason

    def _adopt(self, name: str, gm: torch.fx.GraphModule, runners: list, unsupported: dict) -> None:
        """Count a compiled graph's runners, warn about what it leaves to torch, report it."""
        self._left_to_torch(unsupported)
        self._graphs += len(runners)
        self._runners.extend(runners)
        self._reports.append(GraphReport.of(name, gm, runners, unsupported))

    def _after_run_failure(self, gm, name, node_origin, runner, error):
        """A runner's ORT run failed: from now on its graph runs as compiled again without
        the failing node's kind (op and dtypes), or all in torch when the error names no
        node. Returns that callable, taking (*args); this call's result comes from it.
        Its weights stay frozen (the runner's frozen tensors are the call's: just checked)."""
        if self.options.fallback == "error":
            raise error
        match = _FAILED_NODE.search(str(error))
        culprit = next((n for n in _calls(gm) if match and n.name == node_origin.get(match.group(1))), None)
        message = " ".join(str(error).split("\n")[0].split())
        reason = message.split("Status Message: ", 1)[-1]
        if culprit is None:
            warn_once(f"ortlite: graph {name} runs in torch from now on: {message}")
            compiled = gm
        else:  # the warning comes from _left_to_torch, with the op and reason
            why = reason if "FallbackCheck node" in message else f"ONNX Runtime failed running it: {reason}"
            self._failing[op_signature(culprit)] = why
            frozen = {i: t for i, t in runner.frozen_tensors().items() if t is not None}
            compiled = self._compile(gm, f"{name}_retry", boxed=False, specialize=False, frozen=frozen)
        return compiled

    def _refuse(self, unsupported: dict) -> None:
        """Under fallback="error": raise for work left to torch."""
        if self.options.fallback == "error" and any(is_fallback(n, r) for n, r in unsupported.items()):
            details = sorted({f"{n.target} ({reason})" for n, reason in unsupported.items() if is_fallback(n, reason)})
            raise UnsupportedError(f"ortlite cannot run these ops in ONNX Runtime: {', '.join(details)}")

    def _compile_once(self, gm, name, excluded, boxed, refuse=True, frozen=None):
        unsupported = unsupported_nodes(gm, excluded)
        if refuse:
            self._refuse(unsupported)
        box = make_boxed_func if boxed else (lambda f: f)
        if not any(_makes_tensors(n) for n in _calls(gm)):
            # nothing for ONNX Runtime (results all arguments, sizes or none: a graph Dynamo
            # cut between a check and a graph break), which refuses a model without nodes
            return box(gm), [], unsupported
        if not unsupported:
            runner = self._runner_or_none(gm, name, boxed=boxed, frozen=frozen)
            if runner is None:
                return box(gm), [], {n: "graph failed to compile" for n in _calls(gm)}
            return self._checked(runner, gm, name, boxed=boxed), [runner], {}
        fused, submodule_names = partition(gm, excluded)
        runners = []
        calls = {n.target: n for n in fused.graph.nodes if n.op == "call_module"}
        for sub_name in submodule_names:
            sub = getattr(fused, sub_name)
            sub_weights = sub_frozen(frozen, fused, calls[sub_name]) if frozen else None
            runner = self._runner_or_none(sub, f"{name}_{sub_name}", frozen=sub_weights)
            if runner is None:
                unsupported.update({n: "graph failed to compile" for n in _calls(sub)})
                continue
            runners.append(runner)
            delattr(fused, sub_name)
            setattr(fused, sub_name, self._checked(runner, sub, f"{name}_{sub_name}"))
        return box(fused), runners, unsupported

    def _left_to_torch(self, unsupported: dict) -> None:
        self._fallback_ops.update(fallback_counts(unsupported))
        for node, reason in unsupported.items():
            if is_fallback(node, reason):
                warn_once(f"ortlite: {node.target} runs in torch ({reason})")

    def _runner_or_none(self, gm: torch.fx.GraphModule, name: str, boxed: bool = False, frozen: dict | None = None):
        """A runner for all of gm, or None (with a warning) if lowering or the session
        fails; a missing ORT kernel (MissingKernel) or a node that did not lower
        (NodeNotLowered) propagates, so that the node can be left out."""
        try:
            return self._build_runner(gm, name, boxed and not self.options.check_baseline, frozen)
        except (MissingKernel, NodeNotLowered):  # compiled again without the node
            raise
        except Exception as e:
            if self.options.fallback == "error":
                raise
            ops = sorted({str(n.target) for n in _calls(gm)})
            warn_once(f"ortlite: graph with {ops} runs in torch: {type(e).__name__}: {e}")
            return None

    def _without_size_constants(self, gm, name, runner):
        """gm compiled again without a size prelude (unboxed, its weights as frozen as the
        runner's), for a runner whose sizes change at nearly every call; None if that fails."""
        frozen = {i: t for i, t in runner.frozen_tensors().items() if t is not None}
        try:
            replacement = self._build_runner(gm, f"{name}_unhoisted", False, frozen or None, hoist=False)
        except Exception as e:  # keep the prelude
            log.info("ortlite: graph %s keeps its size constants: compiling it without failed: %s", name, e)
            return None
        log.info("ortlite: graph %s: its sizes changed at nearly every call, compiled again without size constants", name)
        self._runners.append(replacement)
        return self._checked(replacement, gm, name)

    def _checked(self, runner, gm, name, boxed=False):
        if not self.options.check_baseline:
            return runner
        checked = _BaselineChecked(runner, gm, name)
        return make_boxed_func(checked) if boxed else checked

    def _build_runner(self, gm: torch.fx.GraphModule, name: str, boxed: bool, frozen: dict | None = None, hoist: bool = True):
        lowered = lower_graph(
            gm,
            self.options.opset,
            stable_ties=self.options.sort_ties == "stable",
            hoist_sizes=self.options.size_constants and hoist,
            frozen=frozenset(frozen or ()),
            quantize=self.options.quantize if frozen else None,  # (inference graphs: their weights' values are known at session build)
            mutated=getattr(gm, "meta", {}).get(MUTATED_KEY),
        )
        # once frozen weights keep changing: the same graph compiled with them bound
        unfrozen = functools.partial(self._compile, gm, f"{name}_bound", False) if frozen else None
        try:
            runner = runner_for(name, lowered, gm, self.options, self._sessions, boxed=boxed, frozen=frozen, unfrozen=unfrozen)
            runner.on_run_failure = functools.partial(self._after_run_failure, gm, name, lowered.node_origin, runner)
            # for ortlite.explain's fusions: the session as ortlite made it
            runner.disabled_optimizers = lowered.disabled_optimizers
            if frozen:  # which ONNX inputs became initializers
                runner.frozen_names = {i: lowered.inputs[i].name for i in frozen}
                runner.quantized, runner.derived_weights = lowered.quantized, lowered.derived_weights
            if runner.size_constants is not None:
                runner.size_constants.on_sizes_keep_changing = functools.partial(self._without_size_constants, gm, name, runner)
            return runner
        except Exception as e:
            origin = missing_kernel_origin(e, lowered.node_origin)
            if origin is None or self.options.fallback == "error":
                raise
            raise MissingKernel(origin, missing_kernel_reason(e, gm, origin)) from e


def _partition_joint(joint: torch.fx.GraphModule, joint_inputs, **kwargs):
    """aot_autograd's partition, after the sorts of the joint forward-backward graph got their
    tie-order verdicts (lower.tie_order): the forward alone would see each value it saves for
    the backward as an output."""
    mark_tie_orders(joint.graph)
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def unbindable(example_inputs) -> str | None:
    """The kind of a graph's arguments (Dynamo's example inputs: real tensors) that ortlite
    cannot bind, e.g. "mkldnn", or None. Subclasses aot_autograd flattens into their inner
    tensors (nested jagged tensors, DTensor) are bound as those."""
    for x in example_inputs:
        if not isinstance(x, torch.Tensor) or is_traceable_wrapper_subclass(x):
            continue
        # (DDPOptimizer compiles each bucket's graph with fake example inputs)
        if type(x).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__ and not isinstance(x, FakeTensor):
            return f"tensor subclass {type(x).__name__} (a __torch_dispatch__ of its own)"
        if x.is_nested:
            return "nested"
        if x.layout is not torch.strided:
            return str(x.layout).removeprefix("torch.").lstrip("_")
        if x.is_quantized:
            return "quantized"
        if x.device.type not in ("cpu", "cuda"):
            return f"{x.device.type} device"
    return None


def _torch_function_subclass(x) -> bool:
    """A tensor subclass that only Dynamo handles (what its __torch_function__ does is in the
    graph it traced): aot_autograd and the graph's torch parts take it as a plain tensor."""
    return isinstance(x, torch.Tensor) and type(x) not in (torch.Tensor, torch.nn.Parameter, FakeTensor) and not is_traceable_wrapper_subclass(x)


class _PlainArguments:
    """A compiled graph called with its tensor-subclass arguments as plain tensors (the same
    memory and autograd history); Dynamo makes the results the subclass again."""

    def __init__(self, compiled, positions: list[int]):
        self.compiled, self.positions = compiled, positions

    def __call__(self, *args):
        args = list(args)
        for i in self.positions:
            args[i] = args[i].as_subclass(torch.Tensor)
        return self.compiled(*args)


class MissingKernel(Exception):
    """ONNX Runtime has no kernel for a node (e.g. for its dtype on this provider)."""

    def __init__(self, node: str, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


_FAILED_NODE = re.compile(r"while running \w+ node\. Name:'([^']+)'")
_NODE_IN_ERROR = re.compile(
    r"Could not find an implementation for .* node with name '([^']+)'"  # no kernel for these types
    r"|Type Error: Type .* of operator \(\w+\) in node \(([^)]+)\) is invalid"  # types the ONNX op does not take
)


def missing_kernel_origin(error: Exception, node_origin: dict[str, str]) -> str | None:
    """The FX node behind an ORT session error that names one ONNX node as unrunnable (a
    name its optimizer extended, 'addmm__Gemm/GemmTransposeFusion/', is the node's)."""
    match = _NODE_IN_ERROR.search(str(error))
    return node_origin.get((match.group(1) or match.group(2)).split("/")[0]) if match else None


def missing_kernel_reason(error: Exception, gm: torch.fx.GraphModule, origin: str) -> str:
    """Why a node left to torch, in ortlite's words (not ONNX Runtime's error text)."""
    op = re.search(r"implementation for (\w+)\(|of operator \((\w+)\)", str(error))
    op = (op.group(1) or op.group(2)) if op else "its ONNX op"
    node = next((n for n in gm.graph.nodes if n.name == origin), None)
    dtypes = sorted({str(d).removeprefix("torch.") for d in op_signature(node)[1] if d is not None}) if node is not None else []
    return f"ONNX Runtime has no kernel for {op} in {', '.join(dtypes) or 'these dtypes'} on this provider"


def op_signature(node: torch.fx.Node) -> tuple:
    dtypes = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: dtypes.append(getattr(n.meta.get("val"), "dtype", None)))
    return (node.target, tuple(dtypes))


def _calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _makes_tensors(node: torch.fx.Node) -> bool:
    return any(isinstance(v, torch.Tensor) for v in torch.utils._pytree.tree_leaves(node.meta.get("val")))


class _BaselineChecked:
    """Runs torch beside ONNX Runtime and asserts the results match (Options.check_baseline)."""

    def __init__(self, runner, gm, name):
        self.runner, self.gm, self.name = runner, gm, name

    def __call__(self, *args):
        got = self.runner(*args)
        expected = self.gm(*args)
        try:
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
        except AssertionError as e:
            raise AssertionError(f"ortlite graph {self.name} differs from torch: {e}") from None
        return got


__all__ = ["Backend", "GraphReport", "Stats", "UnsupportedError", "LoweringError"]
