"""CompiledModel: what ortlite.compile and ortlite.load return, a Cython runner with what a
call needs beside it (pytree structure, bound weights, mutations, views of inputs, the
model's dtype)."""

from __future__ import annotations

import copy

import onnx
import torch
from torch.export.graph_signature import OutputKind
from torch.utils import _pytree as pytree

from . import _fast
from .saved import save


class CompiledModel(_fast.Runner):
    """A model compiled ahead of time. Calling it goes straight into the Cython runner.

    onnx_model: the onnx.ModelProto; providers: the session's execution providers;
    save(path): a self-contained .onnx file that plain onnxruntime runs and ortlite.load
    turns back into a CompiledModel.
    """

    def save(self, path, external_data: bool | None = None, target_onnxruntime: str | None = None) -> None:
        """Write the model, with what ortlite.load needs to rebuild this CompiledModel, as one
        .onnx file (see ortlite.saved). external_data: weights in a file beside it
        (`<name>.data`); None: only when the model is over protobuf's 2 GB limit.
        target_onnxruntime ("1.20"): the oldest onnxruntime the file must run on; a model
        that needs a newer one is refused (ValueError), naming what needs it and the opset
        to compile with (Options(opset=...)). The file always records the oldest it needs
        (metadata "min_onnxruntime")."""
        save(self, path, external_data, target_onnxruntime)

    def onnx_model_for_saving(self) -> onnx.ModelProto:
        """The model with its current weights as initializers: weights bound by pointer stop
        being inputs, except buffers the model mutates, which stay inputs whose initializer
        is their default (plain onnxruntime uses it; ortlite.load binds them again)."""
        from .lower.builder import to_tensor_proto

        model = copy.deepcopy(self.onnx_model)
        mutated = self._mutated_weight_names()
        bound = {name: tensor for name, tensor in zip(self._weight_input_names, self._weights) if name}
        if bound:
            kept = [i for i in model.graph.input if i.name not in bound or i.name in mutated]
            del model.graph.input[:]
            model.graph.input.extend(kept)
            others = [t for t in model.graph.initializer if t.name not in bound]
            del model.graph.initializer[:]
            model.graph.initializer.extend(others)
            model.graph.initializer.extend(to_tensor_proto(t.detach().cpu().contiguous(), n) for n, t in bound.items())
        return model

    def _mutated_weight_names(self) -> set:
        """ONNX input names of the bound weights that are buffers the model mutates."""
        buffers = {target for kind, target in self._mutations if kind == OutputKind.BUFFER_MUTATION}
        return {name for name, target in zip(self._weight_input_names, self._weight_targets) if target in buffers}


_BUFFER_MUTATION = OutputKind.BUFFER_MUTATION


class _StructuredCompiledModel(CompiledModel):
    """For programs whose calls need more than `runner(*tensors)`: kwargs or nested inputs,
    weights bound by pointer, nested outputs, or buffer and input mutations."""

    def __call__(self, *args, **kwargs):
        flat = self._flat_tensors(args, kwargs)
        if flat is None:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if spec != self._in_spec:
                raise TypeError(
                    f"ortlite.compile: the call's arguments are structured as {spec}, but the model was "
                    f"exported with {self._in_spec}"
                )
        reduced = self._lowered.io_dtype
        if reduced is not None:
            flat = _cast(flat, reduced, torch.float32)
        results = _fast.Runner.__call__(self, *self._weights, *flat)
        if not isinstance(results, tuple):
            results = (results,)
        if self._mutations:
            buffers = self._buffers
            pending = [
                (destination, value)
                for (kind, target), value in zip(self._mutations, results)
                # (an output ONNX Runtime wrote in place is the buffer itself)
                if value is not (destination := buffers[target] if kind is _BUFFER_MUTATION else flat[target])
            ]
            if pending:
                with torch.no_grad():
                    for destination, value in pending:
                        destination.copy_(value)
        user = list(results[len(self._mutations) :])
        if reduced is not None:
            user = _cast(user, torch.float32, reduced)
        for position, (source, chain) in self._lowered.input_views.items():
            user[position] = view_of(flat[source], chain, position)
        return pytree.tree_unflatten(user, self._out_spec)

    def _flat_tensors(self, args, kwargs):
        """The call's tensors in the exported order, where the call is tensors alone, by
        position or by the exported keywords (what tree_flatten gives, without its ~20 µs);
        None otherwise (tree_flatten decides)."""
        plan = self._flat_plan
        if plan is None:
            return None
        n_args, names = plan
        if len(args) != n_args or len(kwargs) != len(names):
            return None
        flat = list(args)
        for name in names:
            value = kwargs.get(name)
            if value is None:
                return None
            flat.append(value)
        for value in flat:
            if type(value) is not torch.Tensor and type(value) is not torch.nn.Parameter:
                return None
        return flat


def model_class(lowered, has_weights: bool, mutations: list, in_spec, out_spec) -> type:
    """CompiledModel, or _StructuredCompiledModel when calls need more than runner(*tensors);
    sets lowered.returns_tuple to match (a single output comes back bare)."""
    simple = not has_weights and not mutations and not lowered.input_views and lowered.io_dtype is None and _is_plain_tuple_call(in_spec) and _is_plain_output(out_spec)
    lowered.returns_tuple = not (simple and out_spec.is_leaf())
    return CompiledModel if simple else _StructuredCompiledModel


def attach(compiled, lowered, weights, weight_targets, in_spec, out_spec, mutations, buffers) -> CompiledModel:
    """What a CompiledModel keeps beside its runner (ortlite.compile and ortlite.load).
    weights: tensors bound by pointer, ahead of the call's arguments; weight_targets: their
    names in the model's state; buffers: name -> tensor that buffer mutations write to."""
    compiled.onnx_model = lowered.model
    compiled._lowered = lowered
    compiled._weights = tuple(weights)
    compiled._weight_input_names = [spec.name for spec in lowered.inputs[: len(weights)]]
    compiled._weight_targets = list(weight_targets)
    compiled._in_spec, compiled._out_spec = in_spec, out_spec
    compiled._flat_plan = _flat_plan(in_spec)
    compiled._mutations = mutations
    compiled._buffers = buffers
    compiled.plain_tensors = True
    return compiled


def view_of(tensor: torch.Tensor, chain: list, position: int) -> torch.Tensor:
    """tensor viewed through a chain of aten view ops (names and their other arguments)."""
    try:
        for name, args in chain:
            packet, overload = name.split(".")
            tensor = getattr(getattr(torch.ops.aten, packet), overload)(tensor, *args)
    except (RuntimeError, IndexError, TypeError) as e:  # (a saved file's malformed chain)
        raise ValueError(f"ortlite.compile: output {position} cannot be made the view of its input that eager returns ({name}: {e})") from None
    return tensor


def _cast(tree, source: torch.dtype, target: torch.dtype):
    """tree with its tensors of dtype source cast to target."""
    return pytree.tree_map(lambda t: t.to(target) if isinstance(t, torch.Tensor) and t.dtype == source else t, tree)


def _flat_plan(in_spec):
    """(number of positional arguments, keyword names in order) where the exported call is
    leaves alone (tensors by position, then by keyword), else None."""
    try:
        args_spec, kwargs_spec = _children(in_spec)
        if args_spec.type is not tuple or kwargs_spec.type is not dict:
            return None
        if not all(c.is_leaf() for c in _children(args_spec)) or not all(c.is_leaf() for c in _children(kwargs_spec)):
            return None
        names = tuple(kwargs_spec.context)
    except (AttributeError, TypeError, ValueError):
        return None
    return (len(_children(args_spec)), names) if all(isinstance(n, str) for n in names) else None


def _children(spec) -> list:
    return spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs


def _is_plain_tuple_call(in_spec) -> bool:
    """(args, kwargs) where args is a flat tuple and kwargs is empty."""
    args_spec, kwargs_spec = _children(in_spec)
    return args_spec.type is tuple and all(c.is_leaf() for c in _children(args_spec)) and kwargs_spec.num_leaves == 0


def _is_plain_output(out_spec) -> bool:
    return out_spec.is_leaf() or (out_spec.type is tuple and all(c.is_leaf() for c in _children(out_spec)))
