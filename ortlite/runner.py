"""Builds the Cython Runner for a lowered graph and its session; error messages for it."""

from __future__ import annotations

import builtins
import dis
import math
import os
import threading

import numpy as np
import onnxruntime
import sympy
import torch
from onnxruntime.capi import onnxruntime_pybind11_state as C
from torch.utils._sympy.printers import PythonPrinter

from . import _fast
from .frozen import BoundWeights, FrozenWeights
from .lower import LoweredGraph, sizes_vary
from .lower.builder import FAILURE_ERRORS, TO_TORCH, TORCH_TO_ONNX, sym_expr
from .lower.ops.common import same_shape
from .lower.hoist import SHAPE, VALUE, WEIGHT
from .session import current_cuda_stream, disabled_optimizers_for, ort_device


def _device_index(device: torch.device | None) -> int:
    return -1 if device is None or device.type == "cpu" else (device.index or 0)


def output_template(dtype: torch.dtype, shape: tuple, device: torch.device) -> torch.Tensor:
    """A tensor whose empty_like is a fresh contiguous output buffer: an expanded scalar
    costs no memory; a real tensor only if empty_like would not give contiguous strides
    (an empty one's strides are 0, eager's are contiguous: view_as_complex refuses 0)."""
    template = torch.empty((), dtype=dtype, device=device).expand(shape)
    if template.numel() == 0 or not torch.empty_like(template).is_contiguous():
        template = torch.empty(shape, dtype=dtype, device=device)
    return template


def runner_for(
    name: str, lowered: LoweredGraph, gm, options, sessions, *, boxed: bool = False, cls=_fast.Runner, frozen=None, unfrozen=None
):
    """The rest of compiling a lowered graph, shared by torch.compile and ortlite.compile:
    model transforms and the dump, the weights policy (ortlite.frozen), the session (made or
    reused; errors propagate), the runner. frozen: argument index -> tensor, for weights
    that become initializers of the session; unfrozen() then gives the callable to use once
    they keep changing (the graph lowered anew: this one's size prelude may read the weights)."""
    for transform in options.model_transforms:
        transform(lowered.model)
    if options.dump_dir:
        dump(options.dump_dir, name, lowered.model, gm)
    devices = {spec.device for spec in lowered.inputs + lowered.ort_outputs if spec.device is not None}
    unplanned = unkeyed_varying_sizes(lowered)
    if frozen:
        assert unfrozen is not None
        weights = FrozenWeights(name, lowered, frozen, unfrozen, options, sessions, devices, unplanned)
    else:
        weights = BoundWeights(lowered, options, sessions, devices, unplanned)
    sess = weights.session_for_stream(current_cuda_stream(devices))
    runner = build_runner(name, lowered, sess, boxed=boxed, cls=cls, session_for_stream=weights.session_for_stream, frozen=set(weights.indices))
    weights.attach(runner)
    return runner


def unkeyed_varying_sizes(lowered: LoweredGraph) -> bool:
    """Sizes vary, and the graph has no memory-pattern key input (not a CPU graph): ONNX
    Runtime would key its plans by the XOR of the fed dims, one per size, and keep them all
    (each holds about a run's intermediates). Its sessions make no plans (ortlite.session
    create_session's `unplanned`), compiled or loaded."""
    return lowered.pattern_key is None and sizes_vary(lowered.inputs)


def dump(directory: str, name: str, model, gm) -> None:
    """Options.dump_dir: the ONNX model and the FX graph it came from, once per compile."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    with open(os.path.join(directory, f"{name}.fx.txt"), "w") as f:
        f.write(gm.print_readable(print_output=False))


def _is_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def build_runner(
    name: str, lowered: LoweredGraph, sess, *, boxed: bool = False, cls=_fast.Runner, session_for_stream=None, frozen=frozenset(), from_file=False,
    ort_allocated=frozenset(),
) -> _fast.Runner:
    """session_for_stream: for graphs on CUDA, cudaStream_t (int) -> a session computing on
    that stream; sess is then the one for the current stream. frozen: indices of arguments
    that are initializers of the session (checked for changes, not bound). from_file: the
    graph comes from a saved file (ortlite.load), whose size expressions are not trusted.
    ort_allocated: indices of ONNX outputs whose shape is not known for sure (a file's, which
    shape inference could not confirm): ONNX Runtime allocates them at each call."""
    inputs = []
    for index, spec in enumerate(lowered.inputs):
        kind = _fast.ARG_KINDS[spec.kind]
        if spec.kind == "unused" or index in frozen:
            inputs.append((_fast.ARG_KINDS["frozen"] if index in frozen else kind, None, None, 0, None, -1, None))
            continue
        device = spec.device or torch.device("cpu")
        shape = tuple(d if isinstance(d, int) else -1 for d in spec.shape)
        inputs.append((kind, spec.name, spec.dtype, TORCH_TO_ONNX[spec.dtype], ort_device(device), _device_index(device), shape))
    outputs = []
    for i, o in enumerate(lowered.ort_outputs):
        if _is_static(o.shape) and i not in ort_allocated:
            outputs.append((o.name, TORCH_TO_ONNX[o.dtype], ort_device(o.device), output_template(o.dtype, o.shape, o.device), o.shape))
        else:  # allocated per call from the shape sizes_fn computes; the template gives dtype and device
            outputs.append((o.name, TORCH_TO_ONNX[o.dtype], ort_device(o.device), torch.empty((), dtype=o.dtype, device=o.device), None))
    sym_outputs = [o.value for o in lowered.outputs if o.source == "sym"]
    plan = []
    for o in lowered.outputs:
        index = sym_outputs.index(o.value) if o.source == "sym" else o.index
        plan.append((_fast.OUTPUT_SOURCES[o.source], index, o.value, o.as_scalar))
    devices = [spec.device for spec in lowered.ort_outputs + lowered.inputs if spec.device is not None]
    cuda = next((d for d in devices if d.type == "cuda"), None)
    scratch = torch.empty(64, dtype=torch.uint8, device=cuda or (devices[0] if devices else "cpu"))
    stream_of = session_for = None
    run_options = C.RunOptions()
    run_options.log_severity_level = 4  # a failed run is reported by ortlite (the exception), not on stderr
    if cuda is not None and session_for_stream is not None:
        stream_of, session_for = _stream_switch(cuda, session_for_stream)
        if all(o.device.type == "cuda" for o in lowered.ort_outputs):
            # ORT computes on torch's stream: ordering with torch's kernels comes from the
            # stream itself, so the end-of-run stream synchronization is not needed.
            run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    return cls(
        name,
        sess,
        run_options,
        _binding_in_output_order([(name, device) for name, _, device, _, _ in outputs]),
        inputs,
        outputs,
        plan,
        scratch,
        _guard_factory([spec.shape for i, spec in enumerate(lowered.inputs) if spec.kind == "tensor" and i not in frozen]),
        lowered.returns_tuple,
        boxed,
        _recycle_outputs(lowered),
        sizes_function(name, lowered, sym_outputs, from_file=from_file, ort_allocated=ort_allocated),
        RECYCLE_MAX_BYTES,
        stream_of,
        session_for,
        [(i, message, None if kind == TO_TORCH else FAILURE_ERRORS[kind]) for i, message, kind in lowered.failures],
        (lowered.pattern_key, ort_device(torch.device("cpu"))) if lowered.pattern_key else None,
        _size_constants(name, lowered, frozen),
        inplace_pairs(lowered, frozen),
    )


def inplace_pairs(lowered: LoweredGraph, frozen=frozenset()) -> list[tuple[int, int]]:
    """(ORT output index, argument index) of each output written into an argument's memory
    (LoweredGraph.inplace): the same shape (the same expressions), dtype and device, a tensor
    argument that is not an initializer. A pair that is not so is a lowering's bug: raises."""
    outputs = {o.name: i for i, o in enumerate(lowered.ort_outputs)}
    arguments = {spec.name: i for i, spec in enumerate(lowered.inputs) if spec.name}
    pairs = []
    for output, argument in lowered.inplace:
        i, j = outputs.get(output), arguments.get(argument)
        o = lowered.ort_outputs[i] if i is not None else None
        a = lowered.inputs[j] if j is not None else None
        if o is None or a is None or a.kind != "tensor" or j in frozen or not same_shape(o.shape, a.shape) or o.dtype != a.dtype or o.device != a.device:
            raise ValueError(
                f"ortlite: output {output!r} cannot be written into input {argument!r} in place "
                f"({None if o is None else (o.dtype, tuple(o.shape), o.device)} into {None if a is None else (a.kind, a.dtype, tuple(a.shape), a.device)}{', an initializer' if j in frozen else ''})"
            )
        pairs.append((i, j))
    return pairs


def _size_constants(name: str, lowered: LoweredGraph, frozen):
    prelude = lowered.size_prelude
    if prelude is None:
        return None
    positions = {spec.name: i for i, spec in enumerate(lowered.inputs) if spec.name}
    sources = [(positions[n], kind) for n, kind in prelude.inputs]
    # the prelude keeps what it computes from weights: only frozen ones (watched for changes) may be read
    assert all(i in frozen for i, kind in sources if kind == WEIGHT)
    return SizeConstants(name, prelude, sources, lowered.disabled_optimizers), len(prelude.outputs)


class SizeConstants:
    """The size prelude of a graph (ortlite.lower.hoist), run once per set of values of the
    integer arguments and shapes it reads, its results kept for the next calls with those
    values. A call: args -> the tensors the main model takes after the arguments. sources:
    per prelude input, (argument index, VALUE, SHAPE or WEIGHT: a frozen weight, whose
    results are forgotten when the runner sees one change, weights_changed)."""

    MAX_ENTRIES = 8  # sets of sizes kept (the oldest goes first)
    MAX_BYTES = 16 << 20  # kept in all (the oldest go first); one set's results larger than this are computed per call
    # Sizes that change at nearly every call (generate's growing cache) make the prelude a
    # second run per call (about 0.1 ms in generate, where ORT runs it in 17 us alone, warm):
    # after this many misses, at least 3 in 4 calls, on_sizes_keep_changing() gives the
    # graph compiled without a prelude, and the runner calls it from then on.
    MISSES_BEFORE_REPLACING = 16

    def __init__(self, name: str, prelude, sources: list[tuple[int, str]], disabled_optimizers=()):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.log_severity_level = 4  # a failure reaches the caller as the exception
        self.session = onnxruntime.InferenceSession(
            prelude.model,
            options,
            providers=["CPUExecutionProvider"],
            # float math on weights: the main session's exactness switches (lower_graph) apply here too
            disabled_optimizers=disabled_optimizers_for(["CPUExecutionProvider"], disabled_optimizers),
        )
        self.name = name
        self.names = [i.name for i in self.session.get_inputs()]
        # the key lists values, then shapes: the prelude's inputs come in that order, then weights (lower.hoist)
        self.values = [i for i, kind in sources if kind == VALUE]
        self.shapes = [i for i, kind in sources if kind == SHAPE]
        self.weights = [i for i, kind in sources if kind == WEIGHT]
        assert [kind for _, kind in sources] == [VALUE] * len(self.values) + [SHAPE] * len(self.shapes) + [WEIGHT] * len(self.weights)
        self.cache: dict[tuple, tuple] = {}
        self.bytes = 0  # of the results kept
        self.misses = 0
        self.calls = 0
        self.on_sizes_keep_changing = None  # () -> the graph without a prelude, or None
        self.generation = 0  # weights_changed calls: a result computed before one is not kept
        self._lock = threading.Lock()

    def __call__(self, args: tuple) -> tuple:
        try:
            key = tuple([args[i] for i in self.values] + [args[i].shape for i in self.shapes])
        except AttributeError:  # not a tensor: placeholders, for the runner to name the bad argument
            return tuple(torch.empty(0) for _ in self.session.get_outputs())
        self.calls += 1
        tensors = self.cache.get(key)
        if tensors is None:
            tensors = self.compute(key, args)
        return tensors

    def weights_changed(self) -> None:
        with self._lock:
            self.generation += 1
            self.cache.clear()
            self.bytes = 0

    def compute(self, key: tuple, args: tuple) -> tuple:
        if self.on_sizes_keep_changing is not None and self.misses >= self.MISSES_BEFORE_REPLACING and self.misses * 4 >= self.calls * 3:
            replacement, self.on_sizes_keep_changing = self.on_sizes_keep_changing(), None
            if replacement is not None:
                raise _fast.SizesKeepChanging(replacement)
        for i, value in zip(self.values, key):
            if type(value) is not int:
                raise TypeError(f"ortlite graph {self.name}: argument {i} must be an int, got {type(value).__name__}")
        generation = self.generation
        feeds = [np.array(v, dtype=np.int64) for v in key] + [args[i].detach().numpy() for i in self.weights]
        outputs = self.session.run(None, dict(zip(self.names, feeds)))
        tensors = tuple(torch.from_numpy(o).contiguous() for o in outputs)
        with self._lock:
            self.misses += 1
            size = sum(t.nbytes for t in tensors)
            if generation == self.generation and size <= self.MAX_BYTES and key not in self.cache:
                while self.cache and (len(self.cache) >= self.MAX_ENTRIES or self.bytes + size > self.MAX_BYTES):
                    self.bytes -= sum(t.nbytes for t in self.cache.pop(next(iter(self.cache))))
                self.cache[key] = tensors
                self.bytes += size
        return tensors


def _stream_switch(device: torch.device, session_for_stream):
    """(stream_of, session_for) for the Runner: a cheap key of torch's current stream on
    `device`, and the session for a key (made with the stream's cudaStream_t)."""
    index = device.index or 0
    current = torch._C._cuda_getCurrentStream  # (stream id, device index, device type)

    def stream_of():
        return current(index)

    def session_for(key):
        return session_for_stream(torch.cuda.current_stream(index).cuda_stream)

    return stream_of, session_for


RECYCLE_MAX_BYTES = 256 * 1024


def _recycle_outputs(lowered: LoweredGraph) -> bool:
    """Recycle outputs (see Runner) where allocation is a real part of a call: small CPU
    outputs (symbolic ones are checked per call). On CUDA the caching allocator also orders
    reuse across streams, which recycling would bypass."""
    if not lowered.ort_outputs or any(o.device.type != "cpu" for o in lowered.ort_outputs):
        return False
    written = {output for output, _ in lowered.inplace}  # (into an argument: never allocated)
    static = [o for o in lowered.ort_outputs if _is_static(o.shape) and o.name not in written]
    return sum(math.prod(o.shape) * o.dtype.itemsize for o in static) <= RECYCLE_MAX_BYTES


def _guard_factory(shapes):
    """Builds torch's C++ TensorGuards (what Dynamo checks tensors with) from the first
    arguments that pass validation: it then checks type, dtype, device, requires_grad,
    static sizes and contiguous strides of all arguments in one call."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    sizes = [[d if isinstance(d, int) else None for d in shape] for shape in shapes]
    strides = [_contiguous_strides(s) for s in sizes]

    def make(args):
        try:
            return TensorGuards(*args, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
        except Exception:  # an API change in torch: validate argument by argument instead
            return None

    return make


def _contiguous_strides(sizes):
    """Contiguous strides where every later dim is static; None (unchecked) elsewhere."""
    strides, step = [], 1
    for d in reversed(sizes):
        strides.append(step)
        step = step * d if (step is not None and d is not None) else None
    return list(reversed(strides))


def _binding_in_output_order(outputs: list):
    """A factory of onnxruntime IOBindings (the pybind sessions') with every output bound once
    in the graph's order: an IOBinding lists its outputs in the order their names were first
    bound, and the runner binds outputs written in place after the rest, so get_outputs()[i]
    (an output ONNX Runtime allocated) is output i only so."""

    def binding(sess):
        iob = C.SessionIOBinding(sess)
        for name, device in outputs:
            iob.bind_output(name, device)
        return iob

    return binding


def sizes_function(name: str, lowered: LoweredGraph, sym_outputs: list, from_file: bool = False, ort_allocated=frozenset()):
    """For graphs with symbolic sizes: a function of the call's arguments that reads each
    symbol from the first argument size it is, checks the other sizes that must equal it
    and the exported ranges, and returns (shapes of the outputs, values of size outputs).
    from_file: the expressions come from a file (ortlite.load): output shapes are checked to be
    ones torch can allocate, and failures to evaluate them are errors naming the graph.
    ort_allocated: outputs whose shape is None (ONNX Runtime allocates them).
    Generated once as Python source: per call it is a few attribute reads and compares."""
    dynamic_outputs = [o for i, o in enumerate(lowered.ort_outputs) if not _is_static(o.shape) or i in ort_allocated]
    if not lowered.symbols and not dynamic_outputs and not sym_outputs:
        return None
    printer = PythonPrinter()
    read = lambda arg, dim: f"args[{arg}]" if dim is None else f"args[{arg}].shape[{dim}]"  # noqa: E731
    lines = ["def sizes(args):"]
    for symbol, sources in lowered.symbols.items():
        (arg, dim), others = sources[0], sources[1:]
        lines.append(f"    {symbol} = {read(arg, dim)}")
        for other_arg, other_dim in others:
            lines.append(
                f"    if {read(other_arg, other_dim)} != {symbol}: raise _unequal({name!r}, {str(symbol)!r}, {arg}, {dim}, {other_arg}, {other_dim}, args)"
            )
        low, high = lowered.symbol_ranges.get(symbol, (None, None))
        # (a minimum of 0 goes unchecked: sizes are never negative, and an int argument's 0 is
        # torch.export's default, which its own module does not enforce: its guards say where
        # a negative int matters, checked below)
        checks = ([f"{symbol} < {low}"] if low else []) + ([f"{symbol} > {high}"] if high is not None else [])
        if checks:
            lines.append(f"    if {' or '.join(checks)}: raise _out_of_range({name!r}, {str(symbol)!r}, {symbol}, {low}, {high}, {arg}, {dim})")
    for guard in lowered.guards:
        values = ", ".join(f"{symbol}={{{symbol}}}" for symbol in sorted(guard.free_symbols, key=str))
        lines.append(f"    if not ({printer.doprint(guard)}): raise _guard_failed({name!r}, {str(guard)!r}, f{values!r})")
    try:
        shapes = ", ".join("None" if i in ort_allocated else _shape_code(o.shape, lowered.symbols, printer) for i, o in enumerate(lowered.ort_outputs))
        values = ", ".join(printer.doprint(expr) for expr in sym_outputs)
    except NotImplementedError as e:  # a sympy function PythonPrinter cannot print
        raise ValueError(f"ortlite graph {name}: cannot compute sizes in Python: {e}") from None
    lines.append(f"    shapes = ({shapes}{',' if lowered.ort_outputs else ''})")
    if from_file:  # a file's expressions: each output must be one torch can allocate
        itemsizes = tuple(o.dtype.itemsize for o in lowered.ort_outputs)
        lines.append(f"    _check_shapes({name!r}, shapes, {itemsizes!r})")
    lines.append(f"    return shapes, ({values}{',' if sym_outputs else ''})")
    if from_file:  # arithmetic no compiled graph does (a division by a size that is 0, a math domain error) names the graph
        lines = [lines[0], "  try:", *("  " + line for line in lines[1:]), "  except SizesError: raise", f"  except _EVALUATION as e: raise _unevaluable({name!r}, e) from None"]
    namespace = {
        "_unequal": _unequal_sizes, "_out_of_range": _size_out_of_range, "_guard_failed": _guard_failed, "_check_shapes": _check_shapes,
        "_unevaluable": _unevaluable, "SizesError": SizesError, "_EVALUATION": (ArithmeticError, ValueError, TypeError, IndexError, AttributeError),
        "math": math, "torch": torch,
    }
    code = compile("\n".join(lines), f"<ortlite sizes of {name}>", "exec")
    unknown = _names(code) - set(namespace) - set(vars(builtins)) - {"sizes", "args"}
    if unknown:  # a sympy function PythonPrinter has no Python for (e.g. OpaqueUnaryFn_exp)
        raise ValueError(f"ortlite graph {name}: cannot compute sizes with {sorted(unknown)} in Python")
    exec(code, namespace)  # noqa: S102
    return namespace["sizes"]


def _names(code) -> set[str]:
    """Global names a code object and the functions in it read."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= _names(const)
    return names


def _shape_code(shape, symbols, printer) -> str:
    """Python for an output's shape, or "None" (ORT allocates it) when a size depends on a
    symbol no argument has whole, e.g. a graph whose input is (s0 - 1)//2 + 1 wide."""
    exprs = [sym_expr(d) for d in shape]
    # (a float in it, e.g. trunc(1.7 * s): sympy prints 15 digits, not the double the graph used)
    if any(not e.free_symbols <= set(symbols) or e.atoms(sympy.Float) for e in exprs):
        return "None"
    return "(" + "".join(f"{printer.doprint(e)}, " for e in exprs) + ")"


class SizesError(ValueError):
    """The call's argument sizes are not ones the graph was compiled for, or its size
    expressions cannot be evaluated for them."""


def _check_shapes(graph, shapes, itemsizes) -> None:
    for i, (shape, itemsize) in enumerate(zip(shapes, itemsizes)):
        if shape is not None and not (all(d >= 0 for d in shape) and math.prod(shape) * itemsize < 2**63):
            raise SizesError(f"ortlite graph {graph}: its output {i} would have the shape {shape} for these arguments (a saved file's metadata may be malformed)")


def _unevaluable(graph, error) -> Exception:
    return SizesError(
        f"ortlite graph {graph}: cannot compute its sizes for these arguments ({type(error).__name__}: {error}); "
        "a saved file's metadata may be malformed"
    )


def _unequal_sizes(graph, symbol, arg, dim, other_arg, other_dim, args) -> Exception:
    where = lambda a, d: f"argument {a}" + ("" if d is None else f" dim {d}")  # noqa: E731
    value = lambda a, d: args[a] if d is None else args[a].shape[d]  # noqa: E731
    return SizesError(
        f"ortlite graph {graph}: {where(other_arg, other_dim)} is {value(other_arg, other_dim)} but must equal "
        f"{where(arg, dim)}, which is {value(arg, dim)} (both are the size {symbol})"
    )


def _size_out_of_range(graph, symbol, value, low, high, arg, dim) -> Exception:
    where = f"argument {arg}" + ("" if dim is None else f" dim {dim}")
    empty = " (ortlite.compile runs a Dim from 1 even where the Dim allows 0: its lowerings assume inputs that are not empty)" if value == 0 else ""
    return SizesError(
        f"ortlite graph {graph}: {where} is {value}, outside the range [{low}, {'inf' if high is None else high}] "
        f"it was compiled for (size {symbol}){empty}"
    )


def _guard_failed(graph, guard, values) -> Exception:
    return SizesError(f"ortlite graph {graph}: its arguments' sizes break {guard}, which the exported program was traced under ({values})")


def describe_mismatch(graph, index, input_name, dtype, device_index, shape, got) -> Exception:
    """The error for an argument that does not match the compiled schema."""
    device = "cpu" if device_index == -1 else f"cuda:{device_index}"
    expected = f"a {dtype} tensor of shape {_shape_str(shape)} on {device}"
    where = f"ortlite graph {graph}: argument {index} ({input_name})"
    if not isinstance(got, torch.Tensor):
        return TypeError(f"{where}: expected {expected}, got {type(got).__name__}")
    if got.is_nested:
        return TypeError(f"{where}: expected {expected}, got a nested tensor (ortlite binds strided tensors' memory: pass its components)")
    actual = f"a {got.dtype} tensor of shape {tuple(got.shape)} on {got.device}"
    if got.dtype != dtype:
        return TypeError(f"{where}: expected {expected}, got {actual}")
    if got.layout != torch.strided:
        return TypeError(f"{where}: expected {expected}, got a {str(got.layout).removeprefix('torch.')} tensor (ortlite binds strided tensors' memory: pass .to_dense())")
    if _fast.overrides_torch_function(got):
        return TypeError(
            f"{where}: expected {expected}, got a {type(got).__name__}, a tensor subclass with a __torch_function__ of its own, "
            "which ortlite.compile cannot run (torch.compile(backend='ortlite') runs it; or pass x.as_subclass(torch.Tensor))"
        )
    return ValueError(f"{where}: expected {expected}, got {actual}")


def _shape_str(shape) -> str:
    return "(" + ", ".join("?" if d == -1 else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
