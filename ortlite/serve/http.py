"""HTTP bodies, without Ray: a KServe v2 inference request in JSON, or a .npy (one argument) or
.npz (arguments by name) file, into the model's flat arguments; its outputs back in the form
asked. Everything wrong with a body is a BadRequest naming the problem."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import torch

# KServe v2 datatypes (also Triton's); BF16 travels as float numbers in JSON
DATATYPES = {
    "BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16, "INT32": torch.int32,
    "INT64": torch.int64, "FP16": torch.float16, "BF16": torch.bfloat16, "FP32": torch.float32, "FP64": torch.float64,
}
DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}
NPY_MAGIC, NPZ_MAGIC = b"\x93NUMPY", b"PK\x03\x04"
JSON, NPY, NPZ = "application/json", "application/x-npy", "application/x-npz"


class BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def decode(body: bytes, names: list[str], max_bytes: int) -> tuple[list, str]:
    """(the model's flat arguments, the reply's media type) from a request body."""
    if len(body) > max_bytes:
        raise BadRequest(f"the body is {len(body)} bytes, over this server's limit of {max_bytes} (max_body_bytes)", 413)
    if body.startswith(NPY_MAGIC):
        if len(names) != 1:
            raise BadRequest(f"a .npy body is one tensor, but this model takes {len(names)} arguments {names}: send a .npz of them by name, or JSON")
        return [_tensor(_npy(io.BytesIO(body), names[0]), names[0])], NPY
    if body.startswith(NPZ_MAGIC):
        return _npz(body, names, max_bytes), NPZ
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("the body is neither JSON (a KServe v2 inference request) nor a .npy/.npz file") from None
    return _kserve(request, names), JSON


def encode(names: list[str], outputs: list, media_type: str, model_name: str) -> tuple[bytes, str]:
    """(body, media type) of the answer: JSON where media_type is JSON, else .npy for one
    output of a .npy request (or one asking for it), else .npz by output name."""
    if media_type == JSON:
        return json.dumps({"model_name": model_name, "outputs": [_kserve_output(n, o) for n, o in zip(names, outputs)]}).encode(), JSON
    out = io.BytesIO()
    arrays = {n: _numpy(o) for n, o in zip(names, outputs)}
    if len(arrays) == 1 and media_type == NPY:
        np.save(out, next(iter(arrays.values())), allow_pickle=False)
        return out.getvalue(), NPY
    np.savez(out, **arrays)
    return out.getvalue(), NPZ


def reply_type(media_type: str, accept: str) -> str:
    """The answer's form: what the Accept header asks for (a JSON request may ask for .npy),
    else the request's."""
    if NPY in accept or NPZ in accept:
        return NPY
    return JSON if JSON in accept else media_type


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()  # KServe v2's error response


def _kserve(request, names: list[str]) -> list:
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest('a JSON body must be a KServe v2 inference request: {"inputs": [{"name", "shape", "datatype", "data"}, ...]}')
    given = {}
    for entry in request["inputs"]:
        if not isinstance(entry, dict) or not all(k in entry for k in ("name", "shape", "datatype", "data")):
            raise BadRequest(f"each of the request's inputs needs name, shape, datatype and data, got {_short(entry)}")
        name = entry["name"]
        if name not in names:
            raise BadRequest(f"the model has no input named {_short(name)}; its inputs are {names}")
        if name in given:
            raise BadRequest(f"input {name!r} is given twice")
        given[name] = _kserve_tensor(entry, name)
    missing = [n for n in names if n not in given]
    if missing:
        raise BadRequest(f"the request lacks input(s) {missing}; the model's inputs are {names}")
    return [given[n] for n in names]


def _kserve_tensor(entry: dict, name: str) -> torch.Tensor:
    shape, datatype, data = entry["shape"], entry["datatype"], entry["data"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: shape must be a list of sizes, got {_short(shape)}")
    if datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: datatype {_short(datatype)} is not one of {sorted(DATATYPES)}")
    dtype = DATATYPES[datatype]
    try:
        values = np.asarray(data, dtype=np.float32 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise BadRequest(f"input {name!r}: data is not a list of {datatype} values ({e})") from None
    if values.size != int(np.prod(shape)):
        raise BadRequest(f"input {name!r}: shape {shape} holds {int(np.prod(shape))} values, data has {values.size}")
    return torch.from_numpy(values.reshape(shape)).to(dtype)


def _kserve_output(name: str, value) -> dict:
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    datatype = DATATYPE_OF.get(tensor.dtype)
    if datatype is None:
        raise TypeError(f"output {name!r} is a {tensor.dtype} tensor, which KServe v2 JSON has no datatype for")
    flat = tensor.detach().reshape(-1)
    return {"name": name, "datatype": datatype, "shape": list(tensor.shape), "data": (flat.float() if datatype == "BF16" else flat).tolist()}


def _npz(body: bytes, names: list[str], max_bytes: int) -> list:
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
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).detach().cpu().numpy()


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
