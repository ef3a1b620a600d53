"""GraphBuilder: makes an onnx.ModelProto directly with onnx.helper.

Lowerings see tensors as `Value`s: ONNX value names that also carry the torch dtype and
shape of what they hold (from the FX node's meta["val"]).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

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


class GraphBuilder:
    def __init__(self, name: str, opset: int):
        self.name = name
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.extra_domains: dict[str, int] = {}
        self._used: set[str] = set()
        self._constants: dict[tuple, Value] = {}
        self.current_origin = ""  # the FX node being lowered; ONNX node names start with it
        self.node_origin: dict[str, str] = {}  # ONNX node name -> FX node name

    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def op(self, op_type: str, *inputs: str | None, outputs: int = 1, domain: str = "", **attrs: Any):
        """Add a node; returns its output name (or a tuple of names when outputs > 1)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
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
        """An initializer holding `value` (a Python number, list, numpy array or torch tensor)."""
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu()
        else:
            tensor = torch.tensor(value, dtype=dtype)
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        tensor = tensor.contiguous()
        key = (tensor.dtype, tuple(tensor.shape), tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.view(torch.int16).numpy().tobytes())
        cached = self._constants.get(key)
        if cached is not None:
            return cached
        name = self.fresh("const")
        self.initializers.append(to_tensor_proto(tensor, name))
        result = Value(name, tensor.dtype, tensor.shape)
        self._constants[key] = result
        return result

    def weight(self, hint: str, tensor: torch.Tensor) -> Value:
        """An initializer for a model weight (not deduplicated by value: weights are big)."""
        tensor = tensor.detach().cpu().contiguous()
        name = self.fresh(hint)
        self.initializers.append(to_tensor_proto(tensor, name))
        return Value(name, tensor.dtype, tensor.shape)

    def ints(self, values: Sequence[int]) -> Value:
        """A 1-D int64 initializer: the shape, axes and index lists ONNX ops take as inputs."""
        return self.const(np.asarray(list(values), dtype=np.int64))

    def cast(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        return Value(self.op("Cast", x, to=TORCH_TO_ONNX[dtype]), dtype, x.shape)

    def add_input(self, name: str, dtype: torch.dtype, shape: Sequence) -> None:
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[dtype], [onnx_dim(d) for d in shape]))

    def add_output(self, name: str, dtype: torch.dtype, shape: Sequence) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[dtype], [onnx_dim(d) for d in shape]))

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in self.extra_domains.items()]
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="ortlite")


def to_tensor_proto(tensor: torch.Tensor, name: str) -> onnx.TensorProto:
    if tensor.dtype == torch.bfloat16:
        proto = onnx.TensorProto()
        proto.name = name
        proto.data_type = TensorProto.BFLOAT16
        proto.dims.extend(tensor.shape)
        proto.raw_data = tensor.contiguous().view(torch.int16).numpy().tobytes()
        return proto
    return numpy_helper.from_array(tensor.numpy(), name)
