"""Backend: the torch.compile entry point. aot_autograd hands it forward and backward
aten graphs; each becomes one ONNX Runtime runner, or a torch graph calling runners for
the parts ortlite lowers."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .decomp import decomposition_table
from .logs import warn_once
from .lower import LoweringError, lower_graph
from .options import Options
from .partition import fallback_counts, partition, unsupported_nodes
from .runner import build_runner
from .session import SessionCache

_graph_ids = itertools.count()


class UnsupportedError(RuntimeError):
    """Raised under Options(fallback="error") for work ortlite cannot run in ONNX Runtime."""


@dataclasses.dataclass
class Stats:
    graphs: int = 0  # FX graphs compiled into ONNX Runtime (forward and backward apart)
    sessions: int = 0  # InferenceSessions created
    runs: int = 0  # session runs
    fallback_ops: dict = dataclasses.field(default_factory=dict)  # aten op -> nodes left to torch


class Backend:
    """A torch.compile backend running graphs in ONNX Runtime; owns its caches and stats."""

    def __init__(self, options: Options | dict | None = None):
        self.options = Options.coerce(options)
        self._sessions = SessionCache()
        self._by_options: dict[Options, Backend] = {}
        self.reset()

    def reset(self) -> None:
        """Forget compiled sessions and zero the stats."""
        self._sessions.clear()
        self._runners: list = []
        self._graphs = 0
        self._fallback_ops: collections.Counter = collections.Counter()
        for other in self._by_options.values():
            other.reset()

    @property
    def stats(self) -> Stats:
        return Stats(
            graphs=self._graphs,
            sessions=self._sessions.created,
            runs=sum(r.runs for r in self._runners),
            fallback_ops=dict(self._fallback_ops),
        )

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **kwargs):
        options = kwargs.pop("options", None)
        kwargs.pop("mode", None)
        if kwargs:
            raise TypeError(f"ortlite backend: unexpected arguments {sorted(kwargs)}")
        if options:
            return self.for_options(options)(gm, example_inputs)
        return aot_autograd(
            fw_compiler=self._compile_forward,
            bw_compiler=self._compile_backward,
            decompositions=decomposition_table(),
            partition_fn=min_cut_rematerialization_partition,
        )(gm, example_inputs)

    def for_options(self, options: Options | dict) -> "Backend":
        """The Backend (cached) for options passed through torch.compile(options=...)."""
        options = Options.coerce(options)
        if options == self.options:
            return self
        if options not in self._by_options:
            self._by_options[options] = Backend(options)
        return self._by_options[options]

    def _compile_forward(self, gm, example_inputs):
        return self.compile_graph(gm, "forward")

    def _compile_backward(self, gm, example_inputs):
        return self.compile_graph(gm, "backward")

    def compile_graph(self, gm: torch.fx.GraphModule, kind: str):
        """One aten graph -> a boxed callable (aot_autograd's convention): a runner when ORT
        runs all of it, else the graph with its supported parts replaced by runners."""
        name = f"{kind}_{next(_graph_ids)}"
        unsupported = unsupported_nodes(gm)
        if unsupported:
            self._left_to_torch(unsupported)
        if not unsupported:
            runner = self._runner_or_none(gm, name, boxed=True)
            return runner if runner is not None else make_boxed_func(gm)
        fused, submodule_names = partition(gm)
        for sub_name in submodule_names:
            runner = self._runner_or_none(getattr(fused, sub_name), f"{name}_{sub_name}")
            if runner is not None:
                delattr(fused, sub_name)
                setattr(fused, sub_name, runner)
        return make_boxed_func(fused)

    def _left_to_torch(self, unsupported: dict) -> None:
        counts = fallback_counts(unsupported)
        if self.options.fallback == "error":
            details = sorted({f"{n.target} ({reason})" for n, reason in unsupported.items()})
            raise UnsupportedError(f"ortlite cannot run these ops in ONNX Runtime: {', '.join(details)}")
        self._fallback_ops.update(counts)
        for node, reason in unsupported.items():
            warn_once(f"ortlite: {node.target} runs in torch ({reason})")

    def _runner_or_none(self, gm: torch.fx.GraphModule, name: str, boxed: bool = False):
        try:
            runner = self._build_runner(gm, name, boxed and not self.options.check_baseline)
        except Exception as e:
            if self.options.fallback == "error":
                raise
            ops = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            warn_once(f"ortlite: graph with {ops} runs in torch: {type(e).__name__}: {e}")
            self._fallback_ops.update(fallback_counts([n for n in gm.graph.nodes if n.op == "call_function"]))
            return None
        self._graphs += 1
        self._runners.append(runner)
        if self.options.check_baseline:
            checked = _BaselineChecked(runner, gm, name)
            return make_boxed_func(checked) if boxed else checked
        return runner

    def _build_runner(self, gm: torch.fx.GraphModule, name: str, boxed: bool):
        # Compilers run inside aot_autograd's fake mode; constants and buffers must be real.
        with unset_fake_temporarily():
            return self._build_runner_real(gm, name, boxed)

    def _build_runner_real(self, gm: torch.fx.GraphModule, name: str, boxed: bool):
        lowered = lower_graph(gm, name, self.options.opset)
        for transform in self.options.model_transforms:
            transform(lowered.model)
        if self.options.dump_dir:
            dump(self.options.dump_dir, name, lowered.model, gm)
        devices = {spec.device for spec in lowered.inputs + lowered.ort_outputs if spec.device is not None}
        sess = self._sessions.get(lowered.model.SerializeToString(), self.options, devices)
        return build_runner(name, lowered, sess, boxed=boxed)


def dump(directory: str, name: str, model, gm: torch.fx.GraphModule) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    with open(os.path.join(directory, f"{name}.fx.txt"), "w") as f:
        f.write(gm.print_readable(print_output=False))


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


__all__ = ["Backend", "Stats", "UnsupportedError", "LoweringError"]
