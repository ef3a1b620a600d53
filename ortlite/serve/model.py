"""What serving needs of a saved model, without Ray: its arguments' and outputs' names, how to
call it with a flat list of tensors, and its dynamic batch dimension, along which the calls of
several requests are stacked into one and the answers split back (ServedModel.run_many)."""

from __future__ import annotations

import sympy
import torch
from torch.utils import _pytree as pytree

from ..saved import read


class ServedModel:
    """A loaded CompiledModel (or, with model=None, a file's signature alone: app() reads it to
    say at start-up whether it batches, without an ONNX Runtime session)."""

    def __init__(self, model, lowered, n_weights: int, in_spec, out_spec, mutations):
        self.model = model
        self.in_spec, self.out_spec = in_spec, out_spec
        self.inputs = lowered.inputs[n_weights:]
        self.input_names = [spec.name or f"input_{i}" for i, spec in enumerate(self.inputs)]
        self.output_names = _leaf_names(out_spec)
        self.io_dtype = lowered.io_dtype
        self.output_specs = _output_specs(lowered, len(mutations), len(self.output_names))
        self.batch_symbol, self.max_rows, self.unbatched_reason = _batch_dim(lowered, self.inputs, mutations)

    @classmethod
    def load(cls, path: str):
        import ortlite

        model = ortlite.load(path)
        return cls(model, model._lowered, len(model._weights), model._in_spec, model._out_spec, model._mutations)

    @classmethod
    def signature(cls, path: str):
        with open(path, "rb") as f:
            _, lowered, saved = read(path, f.read())
        return cls(None, lowered, len(saved["weights"]), saved["in_spec"], saved["out_spec"], saved["mutations"])

    @property
    def batches(self) -> bool:
        return self.batch_symbol is not None

    def flatten(self, args: tuple, kwargs: dict) -> list:
        """A Python caller's arguments as the flat list run_one takes (TypeError: another structure)."""
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            raise TypeError(f"ortlite.serve: the call's arguments are structured as {spec}, but the model takes {self.in_spec}")
        return flat

    def unflatten(self, outputs: list):
        return pytree.tree_unflatten(outputs, self.out_spec)

    def run_one(self, flat: list):
        """The model's flat outputs for one request's flat arguments, or the exception the call raised."""
        try:
            args, kwargs = pytree.tree_unflatten(flat, self.in_spec)
            return pytree.tree_leaves(self.model(*args, **kwargs))
        except Exception as e:  # the request's answer: a 4xx or 5xx, the replica keeps serving
            return e

    def run_many(self, calls: list) -> list:
        """run_one of each call, where calls whose arguments differ only in the batch dimension
        run stacked into one call (at most max_rows rows) whose outputs are split back. Where a
        stacked call fails, its requests run one by one, so each gets its own answer or error."""
        results = [None] * len(calls)
        groups: dict = {}
        for i, flat in enumerate(calls):
            groups.setdefault(_group_key(flat, i), []).append(i)
        for members in groups.values():
            for chunk in _chunks(members, calls, self.max_rows):
                outputs = self._stacked([calls[i] for i in chunk]) if len(chunk) > 1 else None
                for i, answer in zip(chunk, outputs or [self.run_one(calls[i]) for i in chunk]):
                    results[i] = answer
        return results

    def _stacked(self, group: list):
        """The split outputs of one call on the group's stacked arguments; None where it fails."""
        sizes = [flat[0].shape[0] for flat in group]
        outputs = self.run_one([torch.cat(column) for column in zip(*group)])
        if isinstance(outputs, Exception) or any(not isinstance(o, torch.Tensor) or o.dim() == 0 or o.shape[0] != sum(sizes) for o in outputs):
            return None
        # clones: a view would take the whole batch's storage along when pickled for a handle
        split = [[part.clone() for part in o.split(sizes)] for o in outputs]
        return [list(parts) for parts in zip(*split)]


def _batch_dim(lowered, inputs, mutations):
    """(symbol, its upper bound or None, None) where every argument is a tensor whose dim 0 is
    the same dynamic size, found nowhere else in the arguments' shapes or the export's guards,
    and every output a tensor the graph computes with that dim 0; else (None, None, why not)."""
    if mutations:
        return None, None, "the model mutates its buffers or arguments"
    if not inputs:
        return None, None, "it takes no arguments"
    first = inputs[0].shape[0] if inputs[0].kind == "tensor" and inputs[0].shape else None
    if not isinstance(first, sympy.Symbol):
        return None, None, f"its argument {inputs[0].name!r} has no dynamic first dimension"
    for spec in inputs:
        if spec.kind != "tensor" or not spec.shape or spec.shape[0] != first:
            return None, None, f"its argument {spec.name!r} is not a tensor whose first dimension is the batch ({first})"
        if any(isinstance(d, sympy.Expr) and first in d.free_symbols for d in spec.shape[1:]):
            return None, None, f"its argument {spec.name!r} has the batch size ({first}) in another dimension"
    if any(first in g.free_symbols for g in lowered.guards):
        return None, None, f"the export's guards constrain the batch size ({first})"
    for o in lowered.outputs:
        shape = lowered.ort_outputs[o.index].shape if o.source == "ort" else ()
        if o.source != "ort" or not shape or shape[0] != first:
            return None, None, f"an output does not have the batch size ({first}) as its first dimension"
    return first, lowered.symbol_ranges.get(first, (None, None))[1], None


def _group_key(flat: list, i: int):
    """Calls with the same key stack: tensors alike but for dim 0 (anything else runs alone)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 and t.layout == torch.strided for t in flat):
        return i
    sizes = {t.shape[0] for t in flat}
    if len(sizes) != 1:
        return i
    return tuple((t.dtype, t.device, tuple(t.shape[1:])) for t in flat)


def _chunks(members: list, calls: list, max_rows):
    """A group's members in runs of at most max_rows rows (a request over it alone: its call says why)."""
    chunk, rows = [], 0
    for i in members:
        n = calls[i][0].shape[0] if len(members) > 1 else 0
        if chunk and max_rows is not None and rows + n > max_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(i)
        rows += n
    if chunk:
        yield chunk


def _output_specs(lowered, n_mutations: int, n_outputs: int) -> list:
    """(dtype or None, shape with -1 for a dynamic size) of each output the caller gets (the
    graph's outputs after its mutations), as a KServe v2 model's metadata states them."""
    specs = []
    for o in lowered.outputs[n_mutations:]:
        if o.source == "ort":
            spec = lowered.ort_outputs[o.index]
            dtype, shape = spec.dtype, () if o.as_scalar else spec.shape
        elif o.source == "input":
            spec = lowered.inputs[o.index]
            dtype, shape = (spec.dtype, spec.shape) if spec.kind == "tensor" else (None, ())
        elif o.source == "sym" or isinstance(o.value, bool | int | float):
            dtype, shape = {bool: torch.bool, int: torch.int64, float: torch.float64}.get(type(o.value), torch.int64), ()
        else:
            dtype, shape = None, ()
        if dtype == torch.float32 and lowered.io_dtype is not None:
            dtype = lowered.io_dtype  # the call casts float32 results back to the model's dtype
        specs.append((dtype, [d if isinstance(d, int) else -1 for d in shape]))
    return specs if len(specs) == n_outputs else [(None, [])] * n_outputs


def _leaf_names(spec) -> list[str]:
    """A name per output leaf: "output" for a single tensor, else its path ("0", "logits", "hidden.1")."""
    if spec.is_leaf():
        return ["output"]
    dummy = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    paths, _ = pytree.tree_flatten_with_path(dummy)
    return [".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path) for path, _ in paths]

