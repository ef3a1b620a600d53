"""ortlite.explain: compile a function once with a fresh Backend and say what runs where."""

from __future__ import annotations

import collections
import os
import tempfile

import onnx
import onnxruntime
import torch

from .dynamo_backend import Backend, GraphReport
from .options import Options
from .session import disabled_optimizers_for


def explain(fn_or_module, *args, options: Options | dict | None = None, **kwargs) -> "Explanation":
    """Call torch.compile(fn_or_module, backend=<a fresh ortlite Backend>)(*args, **kwargs) once
    and report, per compiled graph, the aten ops that run in ONNX Runtime, those left to torch
    with the reason and the user's source line, the sessions and their providers, and with
    Options(quantize=...) the products quantized and their kernels. options: the Backend's
    (its dump_dir is explain's own). str() of the result is a table; .table(fusions=True) adds
    what ONNX Runtime's graph optimizations made of each session's model (e.g. MatMul+Add -> Gemm).
    explain(compiled) of a CompiledModel (ortlite.compile, ortlite.load): its graph's ops, the
    products quantized, and the convolutions quantized statically with their calibrated ranges."""
    from .compiled import CompiledModel

    if isinstance(fn_or_module, CompiledModel):
        if args or kwargs:
            raise TypeError("ortlite.explain(compiled): a CompiledModel is explained as compiled, without arguments")
        return CompiledExplanation(fn_or_module)
    workdir = tempfile.TemporaryDirectory(prefix="ortlite-explain-")
    backend = Backend(Options.coerce(options).with_changes(dump_dir=workdir.name))  # the models, for fusions
    torch.compile(fn_or_module, backend=backend)(*args, **kwargs)
    return Explanation(backend, workdir)


class Explanation:
    """graphs: a GraphReport per compiled aten graph (forward and backward apart)."""

    def __init__(self, backend: Backend, workdir: tempfile.TemporaryDirectory):
        self.graphs: list[GraphReport] = backend.graph_reports
        self.backend = backend
        self._workdir = workdir  # deleted with this object
        self._fusions: dict | None = None

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<ortlite.Explanation of {len(self.graphs)} graph(s)>\n{self.table()}"

    def table(self, fusions: bool = False) -> str:
        if not self.graphs:
            return "ortlite.explain: no graph was compiled (Dynamo captured nothing)"
        lines = []
        for g in self.graphs:
            in_ort = sum(g.ort_ops.values())
            lines.append(
                f"graph {g.name}: {in_ort} node(s) in ONNX Runtime, {len(g.torch_ops)} left to torch; "
                f"{len(g.sessions)} session(s) on {', '.join(g.providers) or 'no provider'}"
            )
            if g.ort_ops:
                lines.append("  in ONNX Runtime:")
                lines += _columns([(op, str(n)) for op, n in sorted(g.ort_ops.items())], indent=4)
            if g.torch_ops:
                lines.append("  left to torch (op | why | from):")
                lines += _columns(g.torch_ops, indent=4)
            if g.widened_from is not None:
                lines.append(f"  computed in float32, called in {str(g.widened_from).removeprefix('torch.')} (Options.quantize on CPU: ortlite.widen)")
            if g.quantized:
                lines.append(f"  quantized ({len(g.quantized)} product(s); module | K x N | kernel):")
                lines += _columns([(where, f"{q.k} x {q.n}", q.kernel) for where, q in g.quantized], indent=4)
            if g.static_convs:
                lines += _static_rows(g.static_convs, g.calibration_samples)
            lines += _sort_rows(g.sorts)
            if fusions:
                for session in g.sessions:
                    made = self.fusions().get(session)
                    if made is None:
                        lines.append(f"  session {session}: its model was not kept")
                        continue
                    lines.append(f"  session {session}, ONNX Runtime's optimized graph (op: before -> after):")
                    changed = [(op, f"{before} -> {after}") for op, (before, after) in sorted(made.items()) if before != after]
                    lines += _columns(changed, indent=4) if changed else ["    (no change)"]
        return "\n".join(lines)

    def fusions(self) -> dict:
        """session name -> {ONNX op type: (nodes before, nodes after ONNX Runtime optimized the
        graph)}: a new op type (Gemm, FusedMatMul, SkipLayerNormalization, ...) is a fusion
        that fired. Each session's model is built again with the weights it froze as
        initializers, so fusions that need constant weights (Conv+BatchNorm) show."""
        if self._fusions is None:
            runners = {r.name: r for r in self.backend._runners}
            self._fusions = {}
            for g in self.graphs:
                for session in g.sessions:
                    path = os.path.join(self._workdir.name, f"{session}.onnx")
                    if os.path.exists(path):
                        self._fusions[session] = _optimized_ops(path, runners.get(session))
        return self._fusions


class CompiledExplanation:
    """What ortlite.compile made: str() is a table."""

    def __init__(self, compiled):
        self.lowered = compiled._lowered
        self.providers = list(getattr(compiled, "providers", []) or [])

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<ortlite.CompiledExplanation>\n{self.table()}"

    def table(self) -> str:
        lowered = self.lowered
        ops = collections.Counter(n.op_type for n in lowered.model.graph.node)
        lines = [f"compiled graph: {sum(ops.values())} ONNX node(s), all in ONNX Runtime on {', '.join(self.providers) or 'CPUExecutionProvider'}"]
        lines += _columns(sorted(ops.items()), indent=2)
        if lowered.quantized:
            lines.append(f"  quantized per call ({len(lowered.quantized)} product(s); node | K x N | kernel):")
            lines += _columns([(q.origin or q.node, f"{q.k} x {q.n}", q.kernel) for q in lowered.quantized], indent=4)
        if lowered.static_convs:
            lines += _static_rows([(c.origin or c.node, c) for c in lowered.static_convs], lowered.calibration_samples)
        lines += _sort_rows(lowered.sorts)
        return "\n".join(lines)


def _static_rows(convs: list, samples: int) -> list[str]:
    """convs: (where, lower.qdq.StaticConv)."""
    lines = [
        f"  quantized statically ({len(convs)} convolution(s), uint8 activations, int8 weights per channel; "
        f"ranges: min/max over {samples} sample(s) of Options.calibration):"
    ]
    rows = [("module or node", "out channels / groups", "input range", "output range")]
    rows += [(where, f"{c.channels} / {c.groups}", _span(c.input_range), _span(c.output_range)) for where, c in convs]
    return lines + _columns(rows, indent=4)


def _sort_rows(sorts: list) -> list[str]:
    """sorts: (node, module, lower.tie_order.TieOrder). Whether equal keys are checked per call
    (the call then runs the sort in torch) and why (docs/coverage.md, "Sorts with ties")."""
    if not sorts:
        return []
    lines = [f"  sorts and topks ({len(sorts)}; node | module | ties | why):"]
    rows = [(node, module or "-", "checked per call" if v.checked else f"unchecked: {v.kind}", v.why) for node, module, v in sorts]
    return lines + _columns(rows, indent=4)


def _span(bounds) -> str:
    return f"[{bounds[0]:.4g}, {bounds[1]:.4g}]" if bounds else "?"


def _optimized_ops(path: str, runner) -> dict:
    model = onnx.load(path, load_external_data=False)  # (stubs of quantized frozen weights: bound below)
    frozen = getattr(runner, "frozen_names", {}) if runner is not None else {}
    tensors = runner.frozen_tensors() if frozen else {}
    weights = {frozen[i]: t for i, t in tensors.items() if t is not None and i in frozen}
    if weights:  # as the session had them: initializers
        from .lower.builder import to_tensor_proto

        kept = [i for i in model.graph.input if i.name not in weights]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.graph.initializer.extend(to_tensor_proto(t.detach().cpu(), name) for name, t in weights.items())
    derived = getattr(runner, "derived_weights", None)
    if weights and derived:  # Options.quantize: the quantized forms of frozen weights, as the session had them
        from .lower.builder import to_tensor_proto
        from .lower.quantize import derived_values

        values = derived_values(derived, weights)
        kept = [t for t in model.graph.initializer if t.name not in values]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept + [to_tensor_proto(t, name) for name, t in values.items()])
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 4
    so.optimized_model_filepath = path + ".optimized.onnx"
    providers = runner.providers if runner is not None else ["CPUExecutionProvider"]
    disabled = disabled_optimizers_for(providers, tuple(getattr(runner, "disabled_optimizers", ())))  # as the real session
    onnxruntime.InferenceSession(model.SerializeToString(), so, providers=providers, disabled_optimizers=disabled)
    before = collections.Counter(n.op_type for n in model.graph.node)
    after = collections.Counter(n.op_type for n in onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)
    return {op: (before[op], after[op]) for op in before.keys() | after.keys()}


def _columns(rows, indent: int) -> list[str]:
    rows = [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    pad = " " * indent
    return [pad + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
