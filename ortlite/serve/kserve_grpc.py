"""KServe v2's gRPC service (inference.GRPCInferenceService) for ortlite.serve, without Ray.

The messages are Triton's (tritonclient.grpc's service_pb2: KServe's grpc_predict_v2 and more,
the same wire format), imported when first used, so that ortlite.serve without gRPC needs no
tritonclient. A request decodes to the same Inference as an HTTP body (ortlite.serve.http), with
the same checks and messages; answers carry raw little-endian outputs (raw_output_contents), as
Triton's do. Ray Serve's gRPC proxy calls the Replica's methods of the RPCs' names."""

from __future__ import annotations

import math
import sys

import numpy as np

from .http import BYTES, DATATYPES, BadRequest, Inference, _binary_tensor, _chosen, _json_tensor, _raw, _requested, _short

# Ray Serve's gRPCOptions.grpc_servicer_functions: what the proxy serves
SERVICER = "ortlite.serve.kserve_grpc.add_servicer"
GRPC = "grpc"  # Inference.media_type of a gRPC request

# InferTensorContents' field for each datatype sent typed (FP16 and BF16 travel raw only)
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", BYTES: "bytes_contents",
}


def options(port: int) -> dict:
    """Ray Serve's grpc_options for a gRPC proxy on port that speaks KServe v2's service:
    serve.start(grpc_options=ortlite.serve.grpc_options(9000))."""
    messages()  # here, not in the proxy, the error of a missing tritonclient
    return {"port": port, "grpc_servicer_functions": [SERVICER]}


def add_servicer(servicer, server):
    """Ray Serve's proxy adds the service with this (SERVICER): tritonclient's own, once the
    messages can be pickled (messages())."""
    messages()
    from tritonclient.grpc.service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server

    add_GRPCInferenceServiceServicer_to_server(servicer, server)


def messages():
    """tritonclient.grpc's service_pb2 module (ImportError naming the package where it is missing).

    Its classes name their module by the proto file's (grpc_service_pb2), which Ray's pickling
    of a request between the proxy and a replica must import: each process that imports the
    messages here registers them under that name too (Replica.__init__ does, in replicas)."""
    try:
        from tritonclient.grpc import model_config_pb2, service_pb2
    except ImportError as e:
        raise ImportError(f'ortlite.serve over gRPC takes KServe v2\'s messages from tritonclient: pip install tritonclient ({e})') from None
    for module in (service_pb2, model_config_pb2):
        sys.modules.setdefault(module.DESCRIPTOR.name.removesuffix(".proto") + "_pb2", module)
    return service_pb2


def decode(request, names: list[str], output_names: list[str]) -> Inference:
    """The Inference a ModelInferRequest holds: inputs raw (raw_input_contents, one per input,
    what tritonclient sends) or typed (contents); the outputs it asks for, all raw."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"the request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents: one for each input, or none")
    given = {}
    for i, entry in enumerate(request.inputs):
        name, datatype, shape = entry.name, entry.datatype, list(entry.shape)
        if name not in names:
            raise BadRequest(f"the model has no input named {_short(name)}; its inputs are {names}")
        if name in given:
            raise BadRequest(f"input {name!r} is given twice")
        if any(d < 0 for d in shape):
            raise BadRequest(f"input {name!r}: shape must be a list of sizes, got {shape}")
        if datatype not in DATATYPES and datatype != BYTES:
            raise BadRequest(f"input {name!r}: datatype {_short(datatype)} is not one of {sorted([*DATATYPES, BYTES])}")
        if "shared_memory_region" in entry.parameters:
            raise BadRequest(f"input {name!r}: shared memory (shared_memory_region) is not supported by this server; send the data in the request")
        if raw:
            given[name] = _binary_tensor(memoryview(raw[i]), shape, datatype, name)
            continue
        field = CONTENTS.get(datatype)
        if field is None:
            raise BadRequest(f"input {name!r}: {datatype} travels in raw_input_contents only")
        data = getattr(entry.contents, field)
        if datatype == BYTES:
            count = math.prod(shape)
            if len(data) != count:
                raise BadRequest(f"input {name!r}: shape {shape} holds {count} values, bytes_contents has {len(data)}")
            array = np.empty(count, dtype=object)
            array[:] = list(data)
            given[name] = array.reshape(shape)
        else:
            given[name] = _json_tensor(list(data), shape, datatype, name)  # Python numbers: out of range is an error, not a wrap
    missing = [n for n in names if n not in given]
    if missing:
        raise BadRequest(f"the request lacks input(s) {missing}; the model's inputs are {names}")
    asked = [{"name": o.name, "parameters": {k: _parameter(v) for k, v in o.parameters.items()}} for o in request.outputs]
    outputs = _requested(asked, output_names, True) if asked else None
    return Inference([given[n] for n in names], GRPC, request.id or None, [(n, True) for n, _ in outputs] if outputs else None, True)


def encode(names: list[str], values: list, inference: Inference, model_name: str, version: str):
    """The ModelInferResponse: the outputs asked for (all by default), raw."""
    response = messages().ModelInferResponse(model_name=model_name, model_version=version, id=inference.id or "")
    for name, value, _ in _chosen(names, values, inference):
        datatype, shape, raw = _raw(name, value)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(bytes(raw))
    return response


def _parameter(value):
    """An InferParameter's value (bool, int, string or double)."""
    which = value.WhichOneof(value.DESCRIPTOR.oneofs[0].name)
    return getattr(value, which) if which else None
