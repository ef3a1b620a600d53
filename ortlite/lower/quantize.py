"""Options(quantize=...): matrix products with a constant float32 weight run in ONNX
Runtime's integer kernels (a rewrite of the lowered graph, the last one).

What is quantized: each MatMul, and each Gemm with alpha = beta = 1 and no transA, whose
right operand is a 2-D float32 weight (an initializer, or a frozen weight: see below),
directly or through a Transpose (aten's linear is t(W) then mm/addmm: the Transpose is
folded into the quantized layout), whose left operand is a float32 value of rank >= 2 and
whose bias (Gemm's C) is absent or 1-D of the output's size (added by the kernel, after
the product). And each Gather along axis 0 of such a weight (an embedding): its rows int8,
symmetric, one scale per row (max|row| / 127), read as Gather + Cast + Mul by the row's
scale, in both modes (a lookup costs about the same; the file's largest table shrinks 4x).
Nothing else: attention's products (no constant operand), norms and the rest stay float.
A product that does not fit exactly stays float.

The kernels (com.microsoft domain; measured with bench/quant_kernels.py, 1 thread, ONNX
Runtime 1.31 on an AMX / AVX512-VNNI Xeon; ms ratios to float32 MatMul):
- "int8": DynamicQuantizeLinear + MatMulIntegerToFloat. Weights int8, symmetric (scale =
  max|w| / 127 per output channel, no zero point); the left operand quantized per call by
  DynamicQuantizeLinear (uint8, asymmetric, per tensor, round half to even, saturating),
  once for all the products that read it (attention's q, k, v; an MLP's gate and up); an
  int32 product scaled back to float32, the bias added by the kernel. Single products:
  0.13-0.20x float32 at 128 rows on 512x512, 512x2048, 2048x512, 0.13-0.6x at 1 row;
  DynamicQuantizeMatMul (the same math in one node, its activations quantized per product)
  and MatMulInteger + Cast + Mul within 20% of it; the shared quantization made BERT h512
  and a 1-token LLaMA 3-5% faster than DynamicQuantizeMatMul, with identical results.
  MatMulNBits 8-bit ran 0.7-1.3x float32 at 128 rows.
- "int4": MatMulNBits, bits 4, blocks of INT4_BLOCK along K (a block's scale from its
  largest |w|: w = (q - 8) * scale, q in 0..15, K padded with zeros to whole blocks),
  accuracy_level 4 (the left operand quantized to int8 per block inside the kernel;
  level 1, float32 math, ran 3-5x slower at 1 row). Faster than int8 only at 1-2 rows
  (512x32000 at 1 row: 0.15-0.20x float32 vs int8's 0.30x); from 4 rows on it is 2-7x
  slower than int8 (about float32's speed at 128 rows). So a product whose row count is
  static and more than INT4_MAX_ROWS runs int8's kernel (int8 weights); a symbolic row
  count gets both, chosen per call by an If on the row count (measured cost of the If:
  1-3 us a product; the file then holds the int4 and the int8 weights).

Exactness on every CPU: MLAS's u8 x s8 kernels without AVX512-VNNI/AVX-VNNI/AMX (plain
AVX2, e.g. AMD Zen 2/3) sum pairs of products in int16 with saturation: results off by 10-30%
of a value. So the int8 codes (-127..127) are stored as uint8 (code + 128) with zero point
128, which runs MLAS's u8 x u8 kernels, exact everywhere (the products widened to int16 first):
the same scheme, the same results, and a saved file exact on any CPU. On an AVX2 EPYC
(`python bench/quant_kernels.py --rounds 3 --only "MatMulIntegerToFloat,MatMulIntegerToFloat
u8u8"`, 2026-12-07): u8 x u8 0.63-0.79x float32 MatMul's time at 1 and 128 rows on the three
shapes, u8 x s8 (wrong there) 0.39-0.58x.
tests/test_quantize.py checks the results against the scheme's own math.

Weights: initializers are quantized here and replaced (the float one is dropped where
nothing else reads it). A frozen weight (torch.compile; its values come only when the
session is built, ortlite.frozen) is read by the rewritten graph through stub initializers
for its quantized forms: `derived` maps each stub to (weight, form, transposed), and the
runner computes them with derive() from the weight's current values at every session build.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .builder import Names
from .fusions import _only_user, _reads, drop_unread_initializers, live_nodes

MS_DOMAIN = "com.microsoft"
INT4_BLOCK = 32
INT4_ACCURACY = 4
INT4_MAX_ROWS = 1  # the most rows (product of the left operand's leading sizes) given int4's kernel
INT8_WEIGHT_ZERO = 128  # int8 codes are stored as uint8 with this zero point: see "Exactness" above
FROZEN_STUB = "ortlite-frozen-weight"  # the external-data location of values bound at session build (ortlite.frozen)


@dataclasses.dataclass(frozen=True)
class QuantizedProduct:
    node: str  # the ONNX node's name (its FX origin: LoweredGraph.node_origin)
    weight: str  # the float weight's name (initializer or frozen graph input)
    kernel: str  # "int8", "int4", or "int4 at <= 1 row(s), else int8" (symbolic rows)
    k: int
    n: int
    origin: str = ""  # the FX node it was lowered from


def derive(form: str, weight: np.ndarray, transposed: bool) -> np.ndarray:
    """A quantized form of a weight: "int8" (K, N) uint8 (the code + INT8_WEIGHT_ZERO), "int8_scale" (N,) float32,
    "int4" (N, K blocks, INT4_BLOCK / 2) uint8, "int4_scale" (N, K blocks) float32.
    weight: (K, N) as the product reads it, or (N, K) where transposed (a Linear's).
    An embedding's (N, D) weight: "rows_int8" (N, D) int8, "rows_scale" (N, 1) float32."""
    w = np.asarray(weight, dtype=np.float64)
    if form.startswith("rows"):  # an embedding's (N, D): per row, symmetric int8
        scale = (np.abs(w).max(axis=1, keepdims=True) / 127).astype(np.float32)
        if form == "rows_scale":
            return scale
        return np.clip(np.rint(w / np.where(scale == 0, 1, scale).astype(np.float64)), -127, 127).astype(np.int8)
    w = w.T if transposed else w  # (K, N)
    if form.startswith("int8"):
        scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
        if form == "int8_scale":
            return scale
        safe = np.where(scale == 0, 1, scale).astype(np.float64)
        return (np.clip(np.rint(w / safe), -127, 127) + INT8_WEIGHT_ZERO).astype(np.uint8)
    k, n = w.shape
    blocks = -(-k // INT4_BLOCK)
    padded = np.zeros((n, blocks * INT4_BLOCK))
    padded[:, :k] = w.T
    padded = padded.reshape(n, blocks, INT4_BLOCK)
    # the value of largest magnitude, with its sign, becomes -8 (all 16 codes in use)
    extreme = np.take_along_axis(padded, np.abs(padded).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    scale = (extreme / -8).astype(np.float32)
    if form == "int4_scale":
        return scale
    safe = np.where(scale == 0, 1, scale).astype(np.float64)[..., None]
    codes = (np.clip(np.rint(padded / safe), -8, 7) + 8).astype(np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def derived_values(derived: dict, weights: dict) -> dict:
    """stub name -> CPU tensor of each quantized form in derived (quantize_products'), from
    weights (frozen input name -> tensor)."""
    import torch

    return {
        name: torch.from_numpy(np.ascontiguousarray(derive(form, weights[weight].detach().cpu().float().numpy(), transposed)))
        for name, (weight, form, transposed) in derived.items()
    }


def quantize_products(graph: onnx.GraphProto, mode: str, known: dict, frozen: set[str] = frozenset(), origin: dict | None = None, ranges: dict | None = None):
    """Rewrites graph in place (see the module docstring). known: value name -> (torch dtype,
    shape) of the values lowering made; frozen: names of graph inputs that are frozen weights;
    origin: ONNX node name -> FX node name.
    Returns (what was quantized: [QuantizedProduct], derived: stub name -> (weight, form,
    transposed) for frozen weights)."""
    import torch

    initializers = {t.name: t for t in graph.initializer}
    input_dims = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim] for i in graph.input}
    input_types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    producer = {o: n for n in graph.node for o in n.output}
    taken = Names({o for n in graph.node for o in n.output} | set(initializers) | set(input_dims))
    outputs = {o.name for o in graph.output}
    only_user = _only_user(graph)

    def float_matrix(name):  # (K or N, ...) dims of a 2-D float32 constant, or None
        if name in initializers and not _is_stub(initializers[name]):
            t = initializers[name]
            return list(t.dims) if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2 else None
        if name in frozen and input_types.get(name) == onnx.TensorProto.FLOAT and len(input_dims[name]) == 2 and None not in input_dims[name]:
            return input_dims[name]
        return None

    def widened(name):  # a frozen bfloat16 or float16 weight cast to float32 (ortlite.widen): its name
        cast = producer.get(name)
        while cast is not None and cast.op_type == "Identity" and cast.domain in ("", "ai.onnx"):
            cast = producer.get(cast.input[0])
        if cast is None or cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx") or _to(cast) != onnx.TensorProto.FLOAT:
            return name
        source = cast.input[0]
        if source in frozen and input_types.get(source) in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16):
            return source
        return name

    def reduced_matrix(name):  # dims of a frozen bfloat16 or float16 2-D weight, or None
        if input_types.get(name) in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16) and len(input_dims[name]) == 2 and None not in input_dims[name]:
            return input_dims[name]
        return None

    def constant(name):  # (weight name, its dims) of a 2-D float32 constant, or a widened one
        if (dims := float_matrix(name)) is not None:
            return name, dims
        source = widened(name)
        if source != name and (dims := reduced_matrix(source)) is not None:
            return source, dims
        return None, None

    def weight_of(b: str, trans_b: bool):
        """(weight name, transposed, K, N) where the product's right operand is a constant."""
        weight, dims = constant(b)
        if weight is not None:
            return (weight, True, dims[1], dims[0]) if trans_b else (weight, False, dims[0], dims[1])
        t = producer.get(b)
        if not trans_b and t is not None and t.op_type == "Transpose" and t.domain in ("", "ai.onnx") and _perm(t) in (None, [1, 0]):
            weight, dims = constant(t.input[0])
            if weight is not None:
                return weight, True, dims[1], dims[0]
        return None

    made: dict = {}  # (weight, form) -> value name
    derived: dict = {}
    quantized: list = []
    conditions: dict = {}  # left operand -> its "one row" condition
    activations: dict = {}  # left operand -> its DynamicQuantizeLinear's outputs
    pending: list = []  # nodes to place before the next rewritten product
    weight_zero: list = []  # the name of the uint8 scalar INT8_WEIGHT_ZERO, once made

    def value(weight, form, transposed):
        key = (weight, form)
        if key not in made:
            made[key] = name = taken.fresh(f"{weight}_{form}")
            if weight in initializers:
                graph.initializer.append(numpy_helper.from_array(derive(form, numpy_helper.to_array(initializers[weight]), transposed), name))
            else:
                graph.initializer.append(_stub(name, form, input_dims[weight], transposed))
                derived[name] = (weight, form, transposed)
        return made[key]

    replaced = {}
    for node in graph.node:
        if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and _axis(node) == 0:
            weight, dims = constant(node.input[0])
            if weight is not None:  # an embedding: its rows int8, each scaled back as it is read
                replaced[id(node)] = _embedding(node, value(weight, "rows_int8", False), value(weight, "rows_scale", False), taken)
                quantized.append(QuantizedProduct(node.name, weight, "int8 rows", dims[1], dims[0], (origin or {}).get(node.name, "")))
            continue
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm"):
            continue
        a, b = node.input[0], node.input[1]
        trans_b, bias = False, ""
        if node.op_type == "Gemm":
            attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
                continue
            trans_b, bias = bool(attrs.get("transB", 0)), (node.input[2] if len(node.input) > 2 else "")
        found = weight_of(b, trans_b)
        if found is None or a not in known or known[a][0] != torch.float32 or len(known[a][1]) < 2:
            continue
        weight, transposed, k, n = found
        a_shape = known[a][1]
        if not (type(a_shape[-1]) is int and a_shape[-1] == k) or (bias and not _is_vector(bias, n, known, initializers)):
            continue
        rows = _rows(a_shape)
        out, removed = node.output[0], None
        if node.op_type == "MatMul" and (add := only_user(out, "Add")) is not None:  # a linear's bias, after fold_flattening_reshapes
            other = add.input[1] if add.input[0] == out else add.input[0]
            # an initializer or graph input (frozen weights are), or one cast to float32 where the graph
            # starts (ortlite.widen): a value made later would be read too early
            if (other in initializers or other in input_dims or widened(other) != other) and _is_vector(other, n, known, initializers):
                bias, out, removed = other, add.output[0], add
        def int8(out, a=a, weight=weight, transposed=transposed, bias=bias, node=node):
            if a not in activations:
                activations[a] = [taken.fresh(f"{a}_{x}") for x in ("uint8", "scale", "zero")]
                pending.append(helper.make_node("DynamicQuantizeLinear", [a], activations[a], name=taken.fresh(f"{node.name}_quantize")))
            if not weight_zero:
                weight_zero.append(taken.fresh("int8_weight_zero"))
                graph.initializer.append(numpy_helper.from_array(np.array(INT8_WEIGHT_ZERO, np.uint8), weight_zero[0]))
            q, scale, zero = activations[a]
            return _node("MatMulIntegerToFloat", [q, value(weight, "int8", transposed), scale, value(weight, "int8_scale", transposed), zero, weight_zero[0], bias], out, node.name)

        int4 = lambda out: _node(  # noqa: E731
            "MatMulNBits", [a, value(weight, "int4", transposed), value(weight, "int4_scale", transposed), "", "", bias], out, node.name,
            K=k, N=n, bits=4, block_size=INT4_BLOCK, accuracy_level=INT4_ACCURACY,
        )
        if mode == "int8" or (rows is not None and rows > INT4_MAX_ROWS) or _least_rows(a_shape, ranges or {}) > INT4_MAX_ROWS:
            new, kernel = [int8(out)], "int8"
        elif rows is not None:
            new, kernel = [int4(out)], "int4"
        else:
            if a not in conditions:
                conditions[a] = taken.fresh(f"{a}_few_rows")
                new = _few_rows(a, conditions[a], taken)
            else:
                new = []
            branches = [
                helper.make_graph([make(branch_out)], taken.fresh(f"{node.name}_{label}"), [], [helper.make_tensor_value_info(branch_out, onnx.TensorProto.FLOAT, None)])
                for make, label in ((int4, "int4"), (int8, "int8"))
                for branch_out in [taken.fresh(f"{out}_{label}")]
            ]
            new.append(helper.make_node("If", [conditions[a]], [out], name=node.name, then_branch=branches[0], else_branch=branches[1]))
            kernel = f"int4 at <= {INT4_MAX_ROWS} row(s), else int8"
        replaced[id(node)] = pending + new
        pending = []
        if removed is not None:
            replaced[id(removed)] = []
        quantized.append(QuantizedProduct(node.name, weight, kernel, k, n, (origin or {}).get(node.name, "")))
    if not replaced:
        return [], {}
    nodes = live_nodes([m for n in graph.node for m in replaced.get(id(n), [n])], outputs)
    del graph.node[:]
    graph.node.extend(nodes)
    read = set().union(*(_reads(n) for n in graph.node)) | outputs
    kept_inputs = [i for i in graph.input if i.name not in frozen or i.name in read]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    drop_unread_initializers(graph)  # the float weights replaced
    return quantized, derived


def add_domain(model: onnx.ModelProto) -> None:
    """The com.microsoft opset import the rewritten graph needs."""
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def _node(op_type: str, inputs: list, output: str, name: str, **attributes) -> onnx.NodeProto:
    while inputs and inputs[-1] == "":  # optional inputs left out at the end
        inputs = inputs[:-1]
    return helper.make_node(op_type, inputs, [output], name=name, domain=MS_DOMAIN, **attributes)


def _embedding(node, rows: str, scales: str, taken: Names) -> list:
    """node (a Gather of a weight's rows) reading int8 rows and their (N, 1) scales instead."""
    index, out = node.input[1], node.output[0]
    q, scale, widened = (taken.fresh(f"{out}_{s}") for s in ("int8", "scale", "float"))
    return [
        helper.make_node("Gather", [rows, index], [q], name=node.name, axis=0),
        helper.make_node("Gather", [scales, index], [scale], axis=0),
        helper.make_node("Cast", [q], [widened], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", [widened, scale], [out]),
    ]


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _few_rows(a: str, condition: str, taken: Names) -> list:
    """Nodes computing condition = (product of a's leading sizes) <= INT4_MAX_ROWS."""
    shape, rows, limit = (taken.fresh(f"{a}_{s}") for s in ("leading", "rows", "row_limit"))
    return [
        helper.make_node("Shape", [a], [shape], end=-1),
        helper.make_node("ReduceProd", [shape], [rows], keepdims=0),
        helper.make_node("Constant", [], [limit], value=numpy_helper.from_array(np.array(INT4_MAX_ROWS, np.int64))),
        helper.make_node("LessOrEqual", [rows, limit], [condition]),
    ]


def _rows(shape) -> int | None:
    rows = 1
    for d in shape[:-1]:
        if type(d) is not int:
            return None
        rows *= d
    return rows


def _least_rows(shape, ranges: dict) -> int:
    """The fewest rows a product of this left operand's shape can have: its leading sizes
    at the low ends of their ranges (symbol -> (low, high)); 0 where a size has no known
    low end (a symbolic row count of at least 2, e.g. a prefill graph's, needs no If)."""
    from .builder import sym_expr

    rows = 1
    for d in shape[:-1]:
        if type(d) is int:
            rows *= d
            continue
        expr = sym_expr(d)
        low = ranges.get(expr, (None, None))[0] if getattr(expr, "is_Symbol", False) else None
        if low is None:
            return 0
        rows *= low
    return rows


def _is_vector(name: str, n: int, known: dict, initializers: dict) -> bool:
    import torch

    if name in initializers:
        t = initializers[name]
        return t.data_type == onnx.TensorProto.FLOAT and list(t.dims) == [n]
    return name in known and known[name][0] == torch.float32 and tuple(known[name][1]) == (n,)


def _to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _perm(node) -> list | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _is_stub(tensor: onnx.TensorProto) -> bool:
    return any(e.key == "location" and e.value == FROZEN_STUB for e in tensor.external_data)


def _stub(name: str, form: str, weight_dims: list, transposed: bool) -> onnx.TensorProto:
    """An empty external-data initializer for a derived value (bound at session build)."""
    k, n = (weight_dims[1], weight_dims[0]) if transposed else weight_dims
    blocks = -(-k // INT4_BLOCK)
    dtype, dims = {
        "rows_int8": (onnx.TensorProto.INT8, list(weight_dims)),
        "rows_scale": (onnx.TensorProto.FLOAT, [weight_dims[0], 1]),
        "int8": (onnx.TensorProto.UINT8, [k, n]),
        "int8_scale": (onnx.TensorProto.FLOAT, [n]),
        "int4": (onnx.TensorProto.UINT8, [n, blocks, INT4_BLOCK // 2]),
        "int4_scale": (onnx.TensorProto.FLOAT, [n, blocks]),
    }[form]
    stub = onnx.TensorProto(name=name, data_type=dtype, dims=dims, data_location=onnx.TensorProto.EXTERNAL)
    entry = stub.external_data.add()
    entry.key, entry.value = "location", FROZEN_STUB
    return stub
