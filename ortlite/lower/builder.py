"""GraphBuilder: makes an onnx.ModelProto directly with onnx.helper.

Lowerings see tensors as `Value`s: ONNX value names that also carry the torch dtype and
shape of what they hold (from the FX node's meta["val"]).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import sympy
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, Mod, PythonMod

TORCH_TO_ONNX = {
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.int64: TensorProto.INT64,
    torch.int32: TensorProto.INT32,
    torch.int16: TensorProto.INT16,
    torch.int8: TensorProto.INT8,
    torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}
ONNX_TO_TORCH = {v: k for k, v in TORCH_TO_ONNX.items()}

# ONNX Runtime's IR version ceiling moves slower than the onnx package's default.
IR_VERSION = 10


class Value(str):
    """An ONNX value name with the torch dtype and shape of the tensor it holds."""

    dtype: torch.dtype
    shape: tuple

    def __new__(cls, name: str, dtype: torch.dtype, shape: Sequence):
        self = super().__new__(cls, name)
        self.dtype = dtype
        self.shape = tuple(shape)
        return self

    @property
    def rank(self) -> int:
        return len(self.shape)


def onnx_dim(d) -> int | str:
    return d if isinstance(d, int) else str(d)


class SymbolicShapeError(ValueError):
    """A symbolic size the graph cannot compute from its inputs."""


def sym_expr(value) -> sympy.Expr:
    """The sympy expression of an int or SymInt (in the ShapeEnv's canonical symbols)."""
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if isinstance(value, sympy.Expr):
        return value
    raise SymbolicShapeError(f"not an integer size: {value!r}")


def _exact_quotient(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    """a / b where it is a polynomial in the sizes and in the size functions they contain
    (e.g. (s**2) // s is s, ((s // 2)**2) // (s // 2) is s // 2), else None."""
    if b.is_Integer:
        return None
    atoms = {f: sympy.Dummy(integer=True) for f in (a + b).atoms(sympy.Function)}
    quotient = sympy.cancel(a.xreplace(atoms) / b.xreplace(atoms))
    if quotient.is_Integer:
        return quotient
    if not quotient.is_polynomial() or not quotient.free_symbols:
        return None
    if not all(c.is_Integer for c in sympy.Poly(quotient).coeffs()):
        return None
    return quotient.xreplace({d: f for f, d in atoms.items()})


def _canonical(expr: sympy.Expr) -> sympy.Expr:
    """expr with exact polynomial quotients divided out ((s**2) // s is s), and Y + (n - Y %
    n) % n, Y padded up to a multiple of n (a windowed model's pad), as n * ((Y + n - 1) //
    n): equal for every integer Y, and a form whose lower bound the range analysis sees (a
    divisor ((Y + pad) // n) is then known positive for Y >= 1)."""

    def rewrite(add: sympy.Add) -> sympy.Expr:
        for term in add.args:
            if not (isinstance(term, (sympy.Mod, Mod, PythonMod)) and term.args[1].is_Integer and term.args[1] > 0):
                continue
            n, rest = term.args[1], add - term
            if any(sympy.expand(term.args[0] - form) == 0 for form in (n - mod(rest, n) for mod in (Mod, PythonMod, sympy.Mod))):
                return n * FloorDiv(rest + n - 1, n)
        return add

    def divided_out(floordiv: FloorDiv) -> sympy.Expr:
        quotient = _exact_quotient(*floordiv.args)
        return floordiv if quotient is None else quotient

    expr = expr.replace(lambda e: isinstance(e, FloorDiv), divided_out)  # (s**2) // s: s first
    return expr.replace(lambda e: isinstance(e, sympy.Add), rewrite)


def _holds_graph_value(attr) -> bool:
    if isinstance(attr, (Value, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(attr, (list, tuple)) and any(_holds_graph_value(a) for a in attr)


# What a true failure condition (GraphBuilder.fail_if, fallback_if) makes a call do, by the
# kind named in LoweredGraph.failures (and saved files): raise aten's error of this type
# with the message, or (TO_TORCH) fail the run so that the node runs in torch.
FAILURE_ERRORS = {"RuntimeError": RuntimeError, "IndexError": IndexError}
TO_TORCH = "torch"


class Names(set):
    """Value names in use. fresh(base): base, or base_<k> with the first k not in use after
    those fresh gave for base before (a counter per base: n names of one base cost n steps,
    not n**2, e.g. a graph's thousand Adds)."""

    def __init__(self, names=()):
        super().__init__(names)
        self._next: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        k = self._next.get(base, 0)
        name = base if k == 0 else f"{base}_{k}"
        while name in self:
            k += 1
            name = f"{base}_{k}"
        self._next[base] = k + 1
        self.add(name)
        return name


class GraphBuilder:
    def __init__(self, name: str, opset: int):
        self.name = name
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        # built in the model's own graph, once: a weight's bytes are not copied again by model()
        self._model = onnx.ModelProto()
        self.initializers = self._model.graph.initializer
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.extra_domains: dict[str, int] = {}
        self._used = Names()
        self._constants: dict[tuple, Value] = {}
        self.current_origin = ""  # the FX node being lowered; ONNX node names start with it
        self.node_origin: dict[str, str] = {}  # ONNX node name -> FX node name
        # symbol -> (graph input name, dim), dim None for an int input: where its value is
        self.symbol_sources: dict[sympy.Symbol, tuple[str, int | None]] = {}
        self.deferred_inputs: dict[sympy.Symbol, Any] = {}  # symbol -> () -> name of an input added for it
        self.shape_env = None  # the ShapeEnv of the graph's symbols (value ranges, simplification)
        self.stable_ties = False  # Options.sort_ties == "stable": tied sort keys ordered by index
        self._sym_values: dict[sympy.Expr, Value] = {}
        self.dtypes: set[torch.dtype] = set()  # of inputs, outputs, constants and casts
        self.failures: list[tuple[str, str, str]] = []  # (0-d bool value, message, kind): fail_if, fallback_if
        self.values_now: dict[str, np.ndarray] = {}  # value name -> its value, known at lowering (constant masks)

    def fail_if(self, condition: str, message: str, error: type = RuntimeError) -> None:
        """Make the call raise error(message) when the 0-d bool `condition` is true at run
        time, as aten raises (e.g. integer division by zero; error: aten's type, one of
        FAILURE_ERRORS). The runner reads each condition after the run, before any result
        is handed back."""
        assert FAILURE_ERRORS.get(error.__name__) is error, error
        self.failures.append((condition, message, error.__name__))

    def fallback_if(self, condition: str, reason: str) -> None:
        """When the 0-d bool `condition` is true at run time, the node being lowered cannot
        give aten's result for these inputs (e.g. a NaN its matrix form would spread): the
        run counts as failed at that node, which runs in torch from then on, this call
        included (see Backend._after_run_failure; ortlite.compile raises RunError)."""
        check = self.fresh(f"{self.current_origin}__FallbackCheck")
        self.node_origin[check] = self.current_origin
        self.failures.append((condition, f"while running FallbackCheck node. Name:'{check}' Status Message: {reason}", TO_TORCH))

    def fresh(self, hint: str) -> str:
        return self._used.fresh("".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v")

    def op(self, op_type: str, *inputs: str | None, outputs: int = 1, domain: str = "", **attrs: Any):
        """Add a node; returns its output name (or a tuple of names when outputs > 1)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        for key, value in attrs.items():
            if _holds_graph_value(value):  # a value known only at run time: ONNX wants a number
                raise SymbolicShapeError(f"{op_type} needs its {key} as a number, got the run-time value {value!r}")
        inputs = list(inputs)
        while inputs and inputs[-1] is None:  # trailing optional inputs are left out, not ""
            inputs.pop()
        node_name = self.fresh(f"{self.current_origin}__{op_type}")
        self.node_origin[node_name] = self.current_origin
        node = helper.make_node(op_type, ["" if i is None else i for i in inputs], names, name=node_name, domain=domain, **attrs)
        if domain:
            self.extra_domains.setdefault(domain, 1)
        self.nodes.append(node)
        return names[0] if outputs == 1 else tuple(names)

    def const(self, value: Any, dtype: torch.dtype | None = None) -> Value:
        """An initializer holding `value` (a Python number, list, numpy array or torch tensor);
        a size that is a SymInt (or a list with some) is computed in the graph instead."""
        if isinstance(value, torch.SymInt) or (isinstance(value, (list, tuple)) and any(isinstance(v, torch.SymInt) for v in value)):
            sizes = self.sym(value) if isinstance(value, torch.SymInt) else self.shape(value)
            return sizes if dtype in (None, torch.int64) else self.cast(sizes, dtype)
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu()
        else:
            tensor = torch.tensor(value, dtype=dtype)
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        tensor = tensor.contiguous()
        self.dtypes.add(tensor.dtype)
        key = (tensor.dtype, tuple(tensor.shape), tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.view(torch.int16).numpy().tobytes())
        cached = self._constants.get(key)
        if cached is not None:
            return cached
        name = self.fresh("const")
        fill_tensor_proto(self.initializers.add(), tensor, name)
        result = Value(name, tensor.dtype, tensor.shape)
        self._constants[key] = result
        return result

    def weight(self, hint: str, tensor: torch.Tensor) -> Value:
        """An initializer for a model weight (not deduplicated by value: weights are big)."""
        tensor = tensor.detach().cpu().contiguous()
        self.dtypes.add(tensor.dtype)
        name = self.fresh(hint)
        fill_tensor_proto(self.initializers.add(), tensor, name)
        return Value(name, tensor.dtype, tensor.shape)

    def ints(self, values: Sequence[int]) -> Value:
        """A 1-D int64 value: the shape, axes and index lists ONNX ops take as inputs. An
        initializer when every value is an int; sizes that are SymInts are computed (shape())."""
        values = list(values)
        if not all(isinstance(v, int) for v in values):
            return self.shape(values)
        return self.const(np.asarray(values, dtype=np.int64))

    def shape(self, dims: Sequence) -> Value:
        """A 1-D int64 value holding these sizes; symbolic ones are computed in the graph
        from the inputs they come from."""
        if all(isinstance(d, int) for d in dims):
            return self.ints(dims)
        parts = [self.ints([d]) if isinstance(d, int) else self.op("Reshape", self._size(d), self.ints([1])) for d in dims]
        return Value(self.op("Concat", *parts, axis=0), torch.int64, (len(dims),))

    def expand(self, x: Value, shape: Sequence) -> str:
        """Expand x to shape (aten's sizes, x's broadcasting to them). Where a symbolic size is
        x's own aligned size, the target says 1 (ONNX broadcasting then keeps x's size, 0
        included), so the target is a constant when every other size is static: no shape
        arithmetic per call."""
        offset = len(shape) - len(x.shape)
        target = []
        for i, d in enumerate(shape):
            if isinstance(d, int):
                target.append(d)
            elif i >= offset and sym_expr(x.shape[i - offset]) == sym_expr(d):
                target.append(1)
            else:
                return self.op("Expand", x, self.shape(shape))
        return self.op("Expand", x, self.ints(target))

    def arange(self, n) -> str:
        """0, 1, ..., n - 1 (int64); n an int, a SymInt, or a 0-d int64 value."""
        end = n if isinstance(n, str) else self.sym(n)
        return self.op("Range", self.const(0, torch.int64), end, self.const(1, torch.int64))

    def _size(self, d) -> Value:
        return d if isinstance(d, Value) else self.sym(d)  # a Value: an FX size node, already lowered

    def sym(self, value) -> Value:
        """A 0-d int64 value equal to an int or SymInt at run time."""
        return self._sym(sym_expr(value))

    def remember_size(self, expr: sympy.Expr, value: Value) -> None:
        """A size computed by a node (e.g. trunc(1.7 * float(s)), which size arithmetic in
        sympy cannot spell in ONNX): sizes with the same expression use it."""
        self._sym_values.setdefault(expr, value)

    def _sym(self, expr: sympy.Expr) -> Value:
        cached = self._sym_values.get(expr)
        if cached is not None:
            return cached
        canonical = _canonical(expr)
        if canonical != expr:
            value = self._sym_values[expr] = self._sym(canonical)
            return value
        if expr.is_Integer:
            result = self.const(int(expr), torch.int64)
        elif expr.is_Symbol:
            result = self._symbol(expr)
        elif isinstance(expr, (sympy.Add, sympy.Mul, Max, Min)):
            op_type = {sympy.Add: "Add", sympy.Mul: "Mul", Max: "Max", Min: "Min"}[type(expr)]
            terms = [self._sym(a) for a in expr.args]
            result = terms[0]
            for term in terms[1:]:
                result = self.op(op_type, result, term)
        elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) >= 1:
            base = self._sym(expr.base)
            result = base
            for _ in range(int(expr.exp) - 1):
                result = self.op("Mul", result, base)
        elif isinstance(expr, FloorDiv) and _exact_quotient(*expr.args) is not None:
            result = self._sym(_exact_quotient(*expr.args))
        elif isinstance(expr, (FloorDiv, CeilDiv, PythonMod, Mod)):
            a, b = self._sym(expr.args[0]), self._sym(expr.args[1])
            if not self._positive(expr.args[1]):
                # an int argument, say, of either sign: integer division by zero would crash
                # ONNX Runtime, so 0 is replaced, and the call raises as Python would
                zero = self.op("Equal", b, self.const(0, torch.int64))
                self.fail_if(zero, f"integer division by zero computing the size {expr}")
                b = self.op("Where", zero, self.const(1, torch.int64), b)
            if isinstance(expr, CeilDiv):  # ceil(a / b) = -floor(-a / b)
                a = self.op("Neg", a)
            mod = self.op("Mod", a, b, fmod=0)  # Python's sign convention
            result = mod if isinstance(expr, (PythonMod, Mod)) else self.op("Div", self.op("Sub", a, mod), b)
            if isinstance(expr, CeilDiv):
                result = self.op("Neg", result)
        elif isinstance(expr, sympy.Mul) and any(a.is_Rational and not a.is_Integer for a in expr.args):
            # c * rest with a fraction c = p/q: ShapeEnv writes this only where it knows q
            # divides p * rest (an integer size), so (p * rest) // q is exact
            c = next(a for a in expr.args if a.is_Rational and not a.is_Integer)
            numerator = self._sym(sympy.Mul(c.p, *[a for a in expr.args if a is not c]))
            result = self.op("Div", numerator, self.const(int(c.q), torch.int64))
        else:
            raise SymbolicShapeError(f"cannot compute the size {expr} in ONNX")
        value = Value(result, torch.int64, ())
        self._sym_values[expr] = value
        return value

    def _positive(self, divisor: sympy.Expr) -> bool:
        """Is a divisor at least 1 for every size the graph serves?"""
        if divisor.is_Integer:
            return int(divisor) > 0
        if self.shape_env is None:
            return False
        try:
            return bool(self.shape_env.bound_sympy(divisor).lower >= 1)
        except Exception:  # noqa: BLE001 (no range known)
            return False

    def _symbol(self, symbol: sympy.Symbol) -> str:
        if symbol not in self.symbol_sources and symbol in self.deferred_inputs:
            self.symbol_sources[symbol] = (self.deferred_inputs.pop(symbol)(), None)
        if symbol not in self.symbol_sources:
            raise SymbolicShapeError(f"size {symbol} does not come from any graph input (a data-dependent size?)")
        name, dim = self.symbol_sources[symbol]
        if dim is None:
            return name
        return self.op("Gather", self.op("Shape", name), self.const(dim, torch.int64), axis=0)

    def cast(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        self.dtypes.add(dtype)
        return Value(self.op("Cast", x, to=TORCH_TO_ONNX[dtype]), dtype, x.shape)

    def loop(self, max_trips: str | None, condition: str | None, carried: Sequence[Value], body) -> tuple[Value, ...]:
        """ONNX Loop: while `condition` (a 0-d bool; None: always) holds and fewer than
        `max_trips` (a 0-d int64; None: no bound) iterations ran,
        carried = body(b, i, *carried)[1:], with the continue condition as body's first
        result; b is a builder for the body graph, i the 0-d int64 iteration number.
        Returns the final carried values (same dtypes; shapes may change)."""
        b = _BodyBuilder(self)
        i = Value(self.fresh("iteration"), torch.int64, ())
        cond_in = self.fresh("cond_in")
        carried_in = [Value(self.fresh("carried_in"), v.dtype, v.shape) for v in carried]
        cond_out, *carried_out = body(b, i, *carried_in)
        cond_out = b.op("Identity", cond_out)  # a body output must be a value of its own
        carried_out = [b.op("Identity", v) if v in carried_in or v not in b.produced else v for v in carried_out]
        info = lambda name, v: helper.make_tensor_value_info(name, TORCH_TO_ONNX[v.dtype], None)  # noqa: E731
        graph = helper.make_graph(
            b.nodes,
            self.fresh("loop_body"),
            [helper.make_tensor_value_info(i, TensorProto.INT64, []), helper.make_tensor_value_info(cond_in, TensorProto.BOOL, [])]
            + [info(n, v) for n, v in zip(carried_in, carried)],
            [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, [])] + [info(n, v) for n, v in zip(carried_out, carried)],
        )
        names = self.op("Loop", max_trips or "", condition or "", *carried, outputs=len(carried), body=graph)
        names = names if isinstance(names, tuple) else (names,)
        return tuple(Value(n, v.dtype, v.shape) for n, v in zip(names, carried))

    def if_(self, condition: str, then_body, else_body, like: Sequence[Value]) -> tuple[str, ...]:
        """ONNX If on a 0-d bool: each body(b) returns values of the dtypes of `like`, built
        with b (a builder for the branch graph, reading the outer graph's values). Only the
        branch taken runs; ONNX Runtime optimizes each branch (and the outer graph, whose
        values a branch reads stay in the outer graph's layout)."""
        branches = []
        for body in (then_body, else_body):
            b = _BodyBuilder(self)
            outs = [b.op("Identity", v) if v not in b.produced else v for v in body(b)]
            info = [helper.make_tensor_value_info(n, TORCH_TO_ONNX[v.dtype], None) for n, v in zip(outs, like)]
            branches.append(helper.make_graph(b.nodes, self.fresh("branch"), [], info))
        names = self.op("If", condition, outputs=len(like), then_branch=branches[0], else_branch=branches[1])
        return names if isinstance(names, tuple) else (names,)

    def add_input(self, name: str, dtype: torch.dtype, shape: Sequence) -> None:
        self._used.add(name)
        self.dtypes.add(dtype)
        self.inputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[dtype], [onnx_dim(d) for d in shape]))

    def add_output(self, name: str, dtype: torch.dtype, shape: Sequence) -> None:
        self.dtypes.add(dtype)
        self.outputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[dtype], [onnx_dim(d) for d in shape]))

    def model(self) -> onnx.ModelProto:
        """The model (once: its graph holds the initializers as built, not a copy of them)."""
        model, graph = self._model, self._model.graph
        graph.name = self.name
        graph.node.extend(self.nodes)
        graph.input.extend(self.inputs)
        graph.output.extend(self.outputs)
        model.ir_version, model.producer_name = IR_VERSION, "ortlite"
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in self.extra_domains.items()]
        model.opset_import.extend(opsets)
        return model


class _BodyBuilder(GraphBuilder):
    """Builds a Loop body: nodes of its own; names, constants and sizes from the graph
    around it (the body reads those from the outer scope)."""

    def __init__(self, outer: GraphBuilder):
        super().__init__(outer.name, outer.opset)
        self.outer = outer
        self._used = outer._used
        self.node_origin = outer.node_origin
        self.current_origin = outer.current_origin
        self.dtypes = outer.dtypes
        self.produced: set[str] = set()

    def op(self, op_type: str, *inputs, outputs: int = 1, domain: str = "", **attrs):
        names = super().op(op_type, *inputs, outputs=outputs, domain=domain, **attrs)
        self.produced.update(names if isinstance(names, tuple) else (names,))
        if domain:
            self.outer.extra_domains.setdefault(domain, 1)
        return names

    def const(self, value, dtype=None):
        return self.outer.const(value, dtype)

    def weight(self, hint, tensor):
        return self.outer.weight(hint, tensor)

    def _sym(self, expr):
        return self.outer._sym(expr)

    def fail_if(self, condition, message):
        raise NotImplementedError("fail_if inside a loop body")

    def fallback_if(self, condition, reason):
        raise NotImplementedError("fallback_if inside a loop body")


def to_tensor_proto(tensor: torch.Tensor, name: str) -> onnx.TensorProto:
    return fill_tensor_proto(onnx.TensorProto(), tensor, name)


def fill_tensor_proto(proto: onnx.TensorProto, tensor: torch.Tensor, name: str) -> onnx.TensorProto:
    """proto (empty, or a slot of a graph's initializers) holding a CPU tensor's values."""
    if tensor.dtype not in TORCH_TO_ONNX:  # numpy's dtypes beyond the table (uint16, uint32, uint64)
        proto.CopyFrom(numpy_helper.from_array(tensor.numpy(), name))
        return proto
    proto.name = name
    proto.data_type = TORCH_TO_ONNX[tensor.dtype]
    proto.dims.extend(tensor.shape)
    data = tensor.contiguous().view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor.contiguous()
    proto.raw_data = data.numpy().tobytes()
    return proto
