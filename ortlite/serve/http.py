"""HTTP bodies, without Ray: a KServe v2 inference request (JSON, or Triton's binary tensor
extension: a JSON header of Inference-Header-Content-Length bytes, then raw tensors), or a .npy
(one argument) or .npz (arguments by name) file, into the model's flat arguments; its outputs
back in the form asked. Everything wrong with a body is a BadRequest naming the problem.

Binary tensors are little-endian, row-major, without padding (the host's order: every platform
torch ships wheels for is little-endian); BOOL one byte (0 or 1), BF16 two; BYTES elements each
a 4-byte little-endian length, then the bytes. A BYTES input decodes to a numpy object array of
bytes (torch has no string tensors: no ortlite model takes one, and the server says so)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import struct
import zipfile
import zlib

import numpy as np
import torch

# KServe v2 datatypes (also Triton's); BF16 travels as float numbers in JSON, raw bfloat16 in binary
DATATYPES = {
    "BOOL": torch.bool, "UINT8": torch.uint8, "UINT16": torch.uint16, "UINT32": torch.uint32, "UINT64": torch.uint64,
    "INT8": torch.int8, "INT16": torch.int16, "INT32": torch.int32, "INT64": torch.int64,
    "FP16": torch.float16, "BF16": torch.bfloat16, "FP32": torch.float32, "FP64": torch.float64,
}
DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}
BYTES = "BYTES"
ITEMSIZE = {name: torch.empty(0, dtype=dtype).element_size() for name, dtype in DATATYPES.items()}
NUMPY = {name: np.float32 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype for name, dtype in DATATYPES.items()}
NPY_MAGIC, NPZ_MAGIC = b"\x93NUMPY", b"PK\x03\x04"
JSON, NPY, NPZ, OCTET = "application/json", "application/x-npy", "application/x-npz", "application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"  # Triton's binary tensor extension: the JSON header's bytes
EXTENSIONS = ["binary_tensor_data"]  # the KServe v2 extensions this server speaks (its /v2 metadata)
_LENGTH = struct.Struct("<I")


class BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Inference:
    """A decoded request: the model's flat arguments, the body's kind (JSON for a KServe request,
    binary tensors or not; NPY or NPZ), and what a KServe request asks of the answer."""

    flat: list
    media_type: str
    id: str | None = None  # echoed in the answer
    outputs: list | None = None  # [(name, binary)] asked for, in their order; None: every output
    binary: bool = False  # binary_data_output: the outputs' form where `outputs` does not say


def decode(body, names: list[str], max_bytes: int, header_length: str | None = None, output_names: list[str] | None = None) -> Inference:
    """The Inference a request body holds (bytes, or a bytearray whose binary tensors are then
    read in place). header_length: the Inference-Header-Content-Length header, where given;
    output_names: the model's, which a request's `outputs` must name."""
    if len(body) > max_bytes:
        raise BadRequest(f"the body is {len(body)} bytes, over this server's limit of {max_bytes} (max_body_bytes)", 413)
    binary = None
    if header_length is None:
        if body[:6] == NPY_MAGIC:
            if len(names) != 1:
                raise BadRequest(f"a .npy body is one tensor, but this model takes {len(names)} arguments {names}: send a .npz of them by name, or JSON")
            return Inference([_tensor(_npy(io.BytesIO(body), names[0]), names[0])], NPY)
        if body[:4] == NPZ_MAGIC:
            return Inference(_npz(body, names, max_bytes), NPZ)
        text = body
    else:
        try:
            size = int(header_length)
        except ValueError:
            size = -1
        if not 0 < size <= len(body):
            raise BadRequest(f"the {HEADER_LENGTH} header must be the JSON header's length in bytes, 1 to the body's {len(body)}; got {_short(header_length)}")
        view = memoryview(body)
        text, binary = bytes(view[:size]), view[size:]
    try:
        request = json.loads(text)
    except (ValueError, RecursionError):
        if header_length is not None:
            raise BadRequest(f"the body's first {header_length} bytes ({HEADER_LENGTH}) are not a JSON inference request") from None
        hint = f"; where binary tensors follow the JSON, the {HEADER_LENGTH} header must give the JSON's length" if body[:1] == b"{" else ""
        raise BadRequest(f"the body is neither JSON (a KServe v2 inference request) nor a .npy/.npz file{hint}") from None
    return _kserve(request, names, binary, output_names)


def encode(names: list[str], values: list, request: Inference, model_name: str, accept: str = "", version: str | None = None) -> tuple[bytes, str, dict]:
    """(body, media type, headers) of the answer to request: the outputs it asks for (all by
    default), as a KServe v2 response (JSON, with the outputs asked for in binary after it),
    or as .npy/.npz where the request was one or Accept asks for one (reply_type)."""
    chosen = _chosen(names, values, request)
    media_type = reply_type(request.media_type, accept)
    if media_type != JSON:
        out = io.BytesIO()
        arrays = {n: _numpy(v) for n, v, _ in chosen}
        if len(arrays) == 1 and media_type == NPY:
            np.save(out, next(iter(arrays.values())), allow_pickle=False)
            return out.getvalue(), NPY, {}
        np.savez(out, **arrays)
        return out.getvalue(), NPZ, {}
    answer = {"model_name": model_name}
    if version is not None:
        answer["model_version"] = version
    if request.id is not None:
        answer["id"] = request.id
    entries, buffers = [], []
    for name, value, binary in chosen:
        if binary:
            datatype, shape, raw = _raw(name, value)
            entries.append({"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(raw)}})
            buffers.append(raw)
        else:
            entries.append(_kserve_output(name, value))
    answer["outputs"] = entries
    header = json.dumps(answer).encode()
    if not buffers:
        return header, JSON, {}
    return b"".join([header, *buffers]), OCTET, {HEADER_LENGTH: str(len(header))}


def reply_type(media_type: str, accept: str) -> str:
    """The answer's form: what the Accept header asks for (a JSON request may ask for .npy),
    else the request's."""
    if NPY in accept or NPZ in accept:
        return NPY
    return JSON if JSON in accept else media_type


def inflate(body, encoding: str, max_bytes: int) -> bytes:
    """A body sent with Content-Encoding gzip or deflate (tritonclient's request compression),
    unpacked to at most max_bytes (more is a 413, before it is all unpacked)."""
    unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = unpacker.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise BadRequest(f"the body is not {encoding} data (Content-Encoding: {encoding}): {e}") from None
    if len(out) > max_bytes or unpacker.unconsumed_tail:
        raise BadRequest(f"the body unpacks to more than this server's limit of {max_bytes} bytes (max_body_bytes)", 413)
    if not unpacker.eof:
        raise BadRequest(f"the body's {encoding} data is cut short")
    return out


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()  # KServe v2's error response


def _kserve(request, names: list[str], binary, output_names) -> Inference:
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest('a JSON body must be a KServe v2 inference request: {"inputs": [{"name", "shape", "datatype", "data"}, ...]}')
    rid = request.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest(f"the request's id must be a string, got {_short(rid)}")
    parameters = _parameters(request, "the request")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadRequest(f"the request's parameter binary_data_output must be true or false, got {_short(binary_output)}")
    outputs = _requested(request["outputs"], output_names, binary_output) if request.get("outputs") else None  # none or []: every output
    given, offset = {}, 0
    for entry in request["inputs"]:
        if not isinstance(entry, dict) or not all(k in entry for k in ("name", "shape", "datatype")):
            raise BadRequest(f"each of the request's inputs needs name, shape, datatype and data (or binary_data_size), got {_short(entry)}")
        name = entry["name"]
        if name not in names:
            raise BadRequest(f"the model has no input named {_short(name)}; its inputs are {names}")
        if name in given:
            raise BadRequest(f"input {name!r} is given twice")
        shape, datatype = entry["shape"], entry["datatype"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise BadRequest(f"input {name!r}: shape must be a list of sizes, got {_short(shape)}")
        if not isinstance(datatype, str) or (datatype not in DATATYPES and datatype != BYTES):
            raise BadRequest(f"input {name!r}: datatype {_short(datatype)} is not one of {sorted([*DATATYPES, BYTES])}")
        size = _parameters(entry, f"input {name!r}").get("binary_data_size")
        if size is None:
            if "data" not in entry:
                raise BadRequest(f"input {name!r} has neither data nor a binary_data_size parameter")
            given[name] = _json_tensor(entry["data"], shape, datatype, name)
            continue
        if type(size) is not int or size < 0:
            raise BadRequest(f"input {name!r}: binary_data_size must be a number of bytes, got {_short(size)}")
        if "data" in entry:
            raise BadRequest(f"input {name!r} has both data and a binary_data_size parameter")
        if binary is None:
            raise BadRequest(f"input {name!r} has a binary_data_size, but the request has no binary part: send the {HEADER_LENGTH} header, the JSON's length")
        if offset + size > len(binary):
            raise BadRequest(f"input {name!r}: binary_data_size {size} at byte {offset} runs past the {len(binary)} bytes after the JSON header")
        given[name] = _binary_tensor(binary[offset : offset + size], shape, datatype, name)
        offset += size
    if binary is not None and offset != len(binary):
        raise BadRequest(f"the body has {len(binary)} bytes after the JSON header, but the inputs' binary_data_size add up to {offset}")
    missing = [n for n in names if n not in given]
    if missing:
        raise BadRequest(f"the request lacks input(s) {missing}; the model's inputs are {names}")
    return Inference([given[n] for n in names], JSON, rid, outputs, binary_output)


def _parameters(entry: dict, what: str) -> dict:
    parameters = entry.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise BadRequest(f"{what}: parameters must be an object, got {_short(parameters)}")
    if "shared_memory_region" in parameters:
        raise BadRequest(f"{what}: shared memory (shared_memory_region) is not supported by this server; send the data in the body")
    return parameters


def _requested(outputs, output_names, binary_output: bool) -> list:
    """[(name, binary)] from a request's outputs: each names one of the model's, once."""
    if not isinstance(outputs, list):
        raise BadRequest(f"the request's outputs must be a list of {{name, parameters}}, got {_short(outputs)}")
    chosen, seen = [], set()
    for entry in outputs:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest(f"each of the request's outputs needs a name, got {_short(entry)}")
        name = entry["name"]
        if output_names is not None and name not in output_names:
            raise BadRequest(f"the model has no output named {_short(name)}; its outputs are {output_names}")
        if name in seen:
            raise BadRequest(f"output {name!r} is asked for twice")
        seen.add(name)
        parameters = _parameters(entry, f"output {name!r}")
        if parameters.get("classification"):
            raise BadRequest(f"output {name!r}: the classification extension is not supported by this server")
        binary = parameters.get("binary_data", binary_output)
        if not isinstance(binary, bool):
            raise BadRequest(f"output {name!r}: binary_data must be true or false, got {_short(binary)}")
        chosen.append((name, binary))
    return chosen


def _chosen(names: list[str], values: list, request: Inference) -> list:
    """[(name, value, binary)] of the outputs the request asks for, in its order."""
    if request.outputs is None:
        return [(n, v, request.binary) for n, v in zip(names, values)]
    by_name = dict(zip(names, values))
    return [(n, by_name[n], binary) for n, binary in request.outputs]


def _json_tensor(data, shape: list, datatype: str, name: str):
    count = math.prod(shape)
    if datatype == BYTES:
        values = np.asarray(data, dtype=object).reshape(-1) if isinstance(data, list) else np.asarray([data], dtype=object)
        if not all(isinstance(v, str) for v in values):
            raise BadRequest(f"input {name!r}: BYTES data in JSON must be strings")
        if values.size != count:
            raise BadRequest(f"input {name!r}: shape {shape} holds {count} values, data has {values.size}")
        return np.array([v.encode() for v in values] if count else [], dtype=object).reshape(shape)
    try:
        values = np.asarray(data, dtype=NUMPY[datatype])
    except (ValueError, TypeError, OverflowError) as e:
        raise BadRequest(f"input {name!r}: data is not a list of {datatype} values ({e})") from None
    if values.size != count:
        raise BadRequest(f"input {name!r}: shape {shape} holds {count} values, data has {values.size}")
    return torch.from_numpy(values.reshape(shape)).to(DATATYPES[datatype])


def _binary_tensor(chunk: memoryview, shape: list, datatype: str, name: str):
    """The tensor in chunk, read in place where the body is writable and the data aligned."""
    count = math.prod(shape)
    if datatype == BYTES:
        return _bytes_elements(chunk, shape, count, name)
    size = count * ITEMSIZE[datatype]
    if len(chunk) != size:
        raise BadRequest(f"input {name!r}: shape {shape} of {datatype} is {size} bytes, but its binary_data_size is {len(chunk)}")
    dtype = DATATYPES[datatype]
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    tensor = None if chunk.readonly else torch.frombuffer(chunk, dtype=dtype)
    if tensor is None or tensor.data_ptr() % ITEMSIZE[datatype]:  # misaligned: after a JSON header of odd length
        tensor = torch.frombuffer(bytearray(chunk), dtype=dtype)  # a copy, aligned (torch's clone of misaligned data is 40x slower)
    if dtype == torch.bool and tensor.view(torch.uint8).max() > 1:
        raise BadRequest(f"input {name!r}: BOOL bytes must be 0 or 1")
    return tensor.reshape(shape)


def _bytes_elements(chunk: memoryview, shape: list, count: int, name: str) -> np.ndarray:
    out, at, end = [], 0, len(chunk)
    while at < end:
        if at + 4 > end:
            raise BadRequest(f"input {name!r}: BYTES element {len(out)} has a cut length prefix (4 bytes each)")
        (n,) = _LENGTH.unpack_from(chunk, at)
        if at + 4 + n > end:
            raise BadRequest(f"input {name!r}: BYTES element {len(out)} of {n} bytes runs past the input's binary_data_size {end}")
        out.append(bytes(chunk[at + 4 : at + 4 + n]))
        at += 4 + n
        if len(out) > count:
            break
    if len(out) != count:
        raise BadRequest(f"input {name!r}: shape {shape} holds {count} BYTES elements, the binary data has {len(out)}{' or more' if len(out) > count else ''}")
    array = np.empty(count, dtype=object)
    array[:] = out
    return array.reshape(shape)


def _raw(name: str, value) -> tuple[str, list, bytes]:
    """(datatype, shape, little-endian bytes) of an output in binary."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        flat = [v.encode() if isinstance(v, str) else bytes(v) for v in value.reshape(-1)]
        return BYTES, list(value.shape), b"".join(_LENGTH.pack(len(v)) + v for v in flat)
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    datatype = DATATYPE_OF.get(tensor.dtype)
    if datatype is None:
        raise TypeError(f"output {name!r} is a {tensor.dtype} tensor, which KServe v2 has no datatype for")
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return datatype, list(tensor.shape), memoryview(flat.view(torch.uint8).numpy())


def _kserve_output(name: str, value) -> dict:
    if isinstance(value, np.ndarray) and value.dtype == object:
        try:
            data = [v.decode() if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]
        except UnicodeDecodeError:
            raise TypeError(f"output {name!r} holds bytes that are not UTF-8, which JSON cannot carry: ask for it in binary") from None
        return {"name": name, "datatype": BYTES, "shape": list(value.shape), "data": data}
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    datatype = DATATYPE_OF.get(tensor.dtype)
    if datatype is None:
        raise TypeError(f"output {name!r} is a {tensor.dtype} tensor, which KServe v2 JSON has no datatype for")
    flat = tensor.detach().reshape(-1)
    return {"name": name, "datatype": datatype, "shape": list(tensor.shape), "data": (flat.float() if datatype == "BF16" else flat).tolist()}


def _npz(body, names: list[str], max_bytes: int) -> list:
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise BadRequest(f"the body is not a readable .npz file ({e})") from None
    # sizes as the archive declares them; zipfile reads no more than that (compressed members)
    if sum(m.file_size for m in members) > max_bytes:
        raise BadRequest(f"the .npz unpacks to more than this server's limit of {max_bytes} bytes (max_body_bytes)", 413)
    arrays = {m.filename.removesuffix(".npy"): m for m in members}
    unknown, missing = sorted(set(arrays) - set(names)), [n for n in names if n not in arrays]
    if unknown or missing:
        raise BadRequest(f"the .npz holds arrays {sorted(arrays)}; the model's inputs are {names}")
    out = []
    for name in names:
        try:
            with archive.open(arrays[name]) as f:
                out.append(_tensor(_npy(f, name), name))
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise BadRequest(f"input {name!r}: its .npz member cannot be read ({e})") from None
    return out


def _npy(f, name: str) -> np.ndarray:
    try:
        return np.load(f, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # pickled objects among them
        raise BadRequest(f"input {name!r}: not a readable .npy array of numbers ({e})") from None


def _tensor(array: np.ndarray, name: str) -> torch.Tensor:
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        return torch.from_numpy(np.ascontiguousarray(array))
    except TypeError:
        raise BadRequest(f"input {name!r}: numpy dtype {array.dtype} has no torch dtype") from None


def _numpy(value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).detach().cpu().numpy()


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
