"""ortlite.serve: a file CompiledModel.save wrote, served by Ray Serve (pip install "ortlite[serve]").

    from ray import serve
    import ortlite.serve
    serve.run(ortlite.serve.app("model.onnx", num_replicas=2))   # HTTP, and a DeploymentHandle
    python -m ortlite.serve model.onnx --replicas 2 --port 8000  # the same from the shell

Each replica loads the file once, with as many intra-op threads as its num_cpus, and runs one
call at a time. Requests that differ only in the model's dynamic batch dimension are stacked
into one call (ServedModel.run_many). HTTP: KServe v2's paths (health, metadata, inference; a
request in JSON or with Triton's binary tensors), or a .npy/.npz body (ortlite.serve.http);
Python callers pass torch tensors to handle.remote and get the model's outputs back. See docs/serving.md. `import ortlite` never imports this package (nor Ray).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import time

try:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response
except ImportError as e:  # pragma: no cover (the serve extra is installed where tested)
    raise ImportError(f'ortlite.serve needs Ray Serve: pip install "ortlite[serve]" ({e})') from None

import torch

from .http import DATATYPE_OF, EXTENSIONS, HEADER_LENGTH, JSON, BadRequest, decode, encode, error_body, inflate
from . import kserve_grpc
from .kserve_grpc import options as grpc_options
from .model import ServedModel

log = logging.getLogger("ortlite")

# Defaults for a small machine (docs/serving.md): Ray's max_ongoing_requests of 5 queued
# concurrency 32 at the proxy (12 requests/s, p50 2.9 s on 2 cores), and batches need requests
# waiting at the replica; no batch wait: the proxy hands requests over in bursts, so waiting
# made no larger batches (MLP, 32 clients: 177 calls for 1,020 requests at 2 ms, 179 at 0),
# only a longer wait for a request alone.
MAX_BATCH_SIZE = 16
BATCH_WAIT_TIMEOUT_S = 0.0
MAX_ONGOING_REQUESTS = 64
MAX_BODY_BYTES = 64 << 20
VERSION = "1"  # a served file is its model's one version (KServe's /versions/{v} paths)
_INFER = object()  # the route's answer is an inference


def app(
    path,
    *,
    max_batch_size: int = MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = BATCH_WAIT_TIMEOUT_S,
    num_replicas: int | str = 1,
    num_cpus: float = 1,
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
    max_body_bytes: int = MAX_BODY_BYTES,
    name: str | None = None,
    replica: type | None = None,
):
    """A Ray Serve application serving the saved model at path (serve.run(app) starts it).

    max_batch_size: requests stacked into one call at most (1: no batching); their rows stay
        within the batch dimension's upper bound. batch_wait_timeout_s: how long a batch waits
        for more requests after its first. num_replicas: an int, or "auto" (Ray's autoscaling).
    num_cpus: Ray CPUs per replica; its ONNX Runtime intra-op threads (at least 1).
    max_ongoing_requests: per replica, before Ray queues at the caller (at least max_batch_size).
    max_body_bytes: the largest request body (and unpacked .npz) accepted; larger is a 413.
    name: the deployment's name (KServe's model name); the file's name by default.
    replica: a subclass of Replica (bench/serve.py's peer serves the file in plain onnxruntime).
    The path must be readable at the same place on every node that runs a replica.
    """
    path = os.path.abspath(os.fspath(path))
    signature = ServedModel.signature(path)  # the file's problems here, before any replica starts
    if max_batch_size > 1 and not signature.batches:
        log.warning(f"ortlite.serve: {path} serves unbatched: {signature.unbatched_reason}")
    name = name or os.path.splitext(os.path.basename(path))[0]
    config = {"max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s, "max_body_bytes": max_body_bytes, "name": name}
    deployment = serve.deployment(replica or Replica).options(
        name=name,
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": num_cpus},
        max_ongoing_requests=max(max_ongoing_requests, max_batch_size),
    )
    return deployment.bind(path, max(1, int(num_cpus)), config)


class Replica:
    """One replica: the loaded model, an executor of one thread that runs its calls (the event
    loop keeps taking requests meanwhile), the HTTP and Python entry points."""

    def __init__(self, path: str, threads: int, config: dict):
        torch.set_num_threads(threads)  # ortlite's sessions take their intra-op threads from it
        self.served = self.load(path)
        self.config = config
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ortlite-serve")
        self.batched = self.served.batches and config["max_batch_size"] > 1
        self.waiting: list = []  # (flat arguments, future) of requests not yet in a call
        self.draining = None  # the task that runs the waiting requests' calls, while there are any
        self.requests = self.calls = 0
        self.call_seconds = self.request_seconds = 0.0
        served = self.served
        scalars = {"int": torch.int64, "float": torch.float64, "bool": torch.bool}  # Python numbers: 0-d
        self.input_types = [_datatype(s.dtype or scalars.get(s.kind), s.shape, served.io_dtype) for s in served.inputs]
        self.output_types = [_datatype(d, s) for d, s in served.output_specs]
        self.routes = self._routes()
        try:  # the gRPC messages, where tritonclient is installed: Ray unpickles requests before a method runs
            kserve_grpc.messages()
        except ImportError:
            pass

    def load(self, path: str) -> ServedModel:
        return ServedModel.load(path)

    async def __call__(self, *args, **kwargs):
        """HTTP: a starlette Request. A DeploymentHandle: the model's own arguments (tensors),
        answered with its outputs; a bad argument raises ortlite's TypeError or ValueError."""
        start = time.perf_counter()
        try:
            if len(args) == 1 and not kwargs and isinstance(args[0], Request):
                return await self._http(args[0])
            answer = await self._run(self.served.flatten(args, kwargs))
            if isinstance(answer, Exception):
                raise answer
            return self.served.unflatten(answer)
        finally:
            self.request_seconds += time.perf_counter() - start

    def stats(self) -> dict:
        """This replica's requests and model calls (fewer calls: batches), and the seconds spent
        in calls and in requests (from the handler's start to its answer: the body, the wait
        for a call, the call, the answer's encoding); the rest of a client's latency is the
        engine's (the proxy, Ray's routing)."""
        return {"requests": self.requests, "calls": self.calls, "call_s": self.call_seconds, "request_s": self.request_seconds}

    def _timed(self, call, argument):  # (on the executor's thread)
        start = time.perf_counter()
        try:
            return call(argument)
        finally:
            self.call_seconds += time.perf_counter() - start

    async def _run(self, flat: list):
        self.requests += 1
        loop = asyncio.get_running_loop()
        if not self.batched:
            self.calls += 1
            return await loop.run_in_executor(self.pool, self._timed, self.served.run_one, flat)
        future = loop.create_future()
        self.waiting.append((flat, future))
        if self.draining is None:
            self.draining = loop.create_task(self._drain())
        return await future

    async def _drain(self):
        """Batching: the requests waiting when a call starts (at most max_batch_size) are that
        call; those that arrive during it, the next. No timer unless batch_wait_timeout_s: a
        request alone runs at once. (Ray's @serve.batch does the same with a timer, metrics and
        three tasks a batch; no slower here, within noise: docs/serving.md.)"""
        loop, wait, most = asyncio.get_running_loop(), self.config["batch_wait_timeout_s"], self.config["max_batch_size"]
        batch = []
        try:
            while self.waiting:
                if wait > 0:
                    await asyncio.sleep(wait)
                batch = [(flat, f) for flat, f in self.waiting[:most] if not f.done()]  # done: cancelled
                del self.waiting[:most]
                if batch:
                    self.calls += 1
                    answers = await loop.run_in_executor(self.pool, self._timed, self.served.run_many, [flat for flat, _ in batch])
                    for (_, f), answer in zip(batch, answers):
                        if not f.done():
                            f.set_result(answer)
                batch = []
        except BaseException as e:  # not the model's errors (run_many answers those per request): nothing may hang
            error = e if isinstance(e, Exception) else RuntimeError(f"ortlite.serve: the replica's batch loop stopped ({e!r})")
            for _, f in batch + self.waiting:
                if not f.done():
                    f.set_result(error)
            self.waiting.clear()
            if not isinstance(e, Exception):
                raise
        finally:
            self.draining = None

    async def _http(self, request: Request) -> Response:
        """KServe v2's paths under the app's route prefix (and its root: POST infers, GET gives
        the model's metadata); any other path, model name or version is a 404, a method a path
        does not take a 405."""
        path, root = request.scope["path"], request.scope.get("root_path", "")
        path = path[len(root) :] if root and path.startswith(root) else path
        path = path[:-1] if path.endswith("/") else path
        route = self.routes.get(path)
        if route is None:
            return _error(self._not_found(path), 404)
        answer = route.get(request.method)
        if answer is None:
            allowed = ", ".join(route)
            return _error(f"{request.method} {path or '/'}: this path takes {allowed}", 405, {"Allow": allowed})
        if answer is not _INFER:
            return Response(answer, media_type=JSON)
        return await self._infer(request)

    async def _infer(self, request: Request) -> Response:
        served, limit, headers = self.served, self.config["max_body_bytes"], request.headers
        try:
            declared = int(headers.get("content-length") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            return _error(f"the body is {declared} bytes, over this server's limit of {limit} (max_body_bytes)", 413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return _error(f"the body is over this server's limit of {limit} bytes (max_body_bytes)", 413)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        try:
            if encoding in ("gzip", "deflate"):
                body = inflate(body, encoding, limit)
            elif encoding != "identity":
                return _error(f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or none", 415)
            inference = decode(body, served.input_names, limit, headers.get(HEADER_LENGTH), served.output_names)
        except BadRequest as e:
            return _error(str(e), e.status)
        strings = self._strings(inference.flat)
        if strings:
            return _error(strings, 400)
        answer = await self._run(inference.flat)
        if isinstance(answer, (TypeError, ValueError)):  # ortlite's checks of the arguments
            return _error(str(answer), 400)
        if isinstance(answer, Exception):
            return _error(f"{type(answer).__name__}: {answer}", 500)
        try:
            content, media_type, extra = encode(served.output_names, answer, inference, self.config["name"], headers.get("accept", ""), VERSION)
        except TypeError as e:
            return _error(str(e), 500)
        return Response(content, media_type=media_type, headers=extra)

    def _strings(self, flat: list) -> str | None:
        """What is wrong with a request's BYTES inputs, if it has any."""
        for name, value, (datatype, _) in zip(self.served.input_names, flat, self.input_types):
            if not isinstance(value, torch.Tensor):
                return f"input {name!r} is BYTES, but the model takes a {datatype} tensor there (no ortlite model takes strings)"
        return None

    # KServe v2 over gRPC: Ray Serve's gRPC proxy (serve.start(grpc_options=grpc_options(port)))
    # calls the methods of the RPCs' names, with the request message; errors set the status.

    async def ServerLive(self, request, grpc_context=None):
        return kserve_grpc.messages().ServerLiveResponse(live=True)

    async def ServerReady(self, request, grpc_context=None):
        return kserve_grpc.messages().ServerReadyResponse(ready=True)

    async def ModelReady(self, request, grpc_context=None):
        return kserve_grpc.messages().ModelReadyResponse(ready=self._unknown(request.name, request.version) is None)

    async def ServerMetadata(self, request, grpc_context=None):
        import ortlite

        return kserve_grpc.messages().ServerMetadataResponse(name="ortlite", version=ortlite.__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request, grpc_context=None):
        pb = kserve_grpc.messages()
        unknown = self._unknown(request.name, request.version)
        if unknown:
            return _grpc_error(grpc_context, "NOT_FOUND", unknown, pb.ModelMetadataResponse())
        tensors = lambda names, types: [{"name": n, "datatype": d or "", "shape": s} for n, (d, s) in zip(names, types)]  # noqa: E731
        return pb.ModelMetadataResponse(
            name=self.config["name"], versions=[VERSION], platform="ortlite",
            inputs=tensors(self.served.input_names, self.input_types), outputs=tensors(self.served.output_names, self.output_types),
        )

    async def ModelInfer(self, request, grpc_context=None):
        start = time.perf_counter()
        try:
            return await self._grpc_infer(request, grpc_context)
        finally:
            self.request_seconds += time.perf_counter() - start

    async def _grpc_infer(self, request, grpc_context):
        served, pb = self.served, kserve_grpc.messages()
        unknown = self._unknown(request.model_name, request.model_version)
        if unknown:
            return _grpc_error(grpc_context, "NOT_FOUND", unknown, pb.ModelInferResponse())
        size, limit = request.ByteSize(), self.config["max_body_bytes"]
        if size > limit:  # (Ray's proxy takes up to RAY_SERVE_GRPC_MAX_MESSAGE_SIZE, 2 GiB)
            return _grpc_error(grpc_context, "RESOURCE_EXHAUSTED", f"the request is {size} bytes, over this server's limit of {limit} (max_body_bytes)", pb.ModelInferResponse())
        try:
            inference = kserve_grpc.decode(request, served.input_names, served.output_names)
        except BadRequest as e:
            return _grpc_error(grpc_context, "RESOURCE_EXHAUSTED" if e.status == 413 else "INVALID_ARGUMENT", str(e), pb.ModelInferResponse())
        strings = self._strings(inference.flat)
        if strings:
            return _grpc_error(grpc_context, "INVALID_ARGUMENT", strings, pb.ModelInferResponse())
        answer = await self._run(inference.flat)
        if isinstance(answer, (TypeError, ValueError)):
            return _grpc_error(grpc_context, "INVALID_ARGUMENT", str(answer), pb.ModelInferResponse())
        if isinstance(answer, Exception):
            return _grpc_error(grpc_context, "INTERNAL", f"{type(answer).__name__}: {answer}", pb.ModelInferResponse())
        try:
            return kserve_grpc.encode(served.output_names, answer, inference, self.config["name"], VERSION)
        except TypeError as e:
            return _grpc_error(grpc_context, "INTERNAL", str(e), pb.ModelInferResponse())

    def _unknown(self, name: str, version: str) -> str | None:
        """Why a model name and version (empty: its one version) are not this replica's, or None."""
        if name != self.config["name"]:
            return f"unknown model {name!r}: this server serves {self.config['name']!r}"
        if version not in ("", VERSION):
            return f"model {name!r} has no version {version!r}: its one version is {VERSION!r}"
        return None

    def _not_found(self, path: str) -> str:
        name, parts = self.config["name"], path.split("/")
        if parts[1:3] == ["v2", "models"] and len(parts) > 3:
            if parts[3] != name:
                return f"unknown model {parts[3]!r}: this server serves {name!r}"
            if len(parts) > 5 and parts[4] == "versions" and parts[5] != VERSION:
                return f"model {name!r} has no version {parts[5]!r}: its one version is {VERSION!r}"
        return f"no such path {path!r}: this server answers KServe v2's /v2, /v2/health/live, /v2/health/ready and /v2/models/{name}[/versions/{VERSION}][/ready|/infer]"

    def _routes(self) -> dict:
        """path under the route prefix -> {method: the answer's body, or _INFER}."""
        import ortlite

        name, metadata = self.config["name"], self.metadata()
        server = json.dumps({"name": "ortlite", "version": ortlite.__version__, "extensions": EXTENSIONS}).encode()
        ready = json.dumps({"name": name, "ready": True}).encode()
        routes = {
            "": {"POST": _INFER, "GET": metadata},  # ortlite's own: the app's one model at its root
            "/v2": {"GET": server},
            "/v2/health/live": {"GET": b'{"live": true}'},
            "/v2/health/ready": {"GET": b'{"ready": true}'},
        }
        for model in (f"/v2/models/{name}", f"/v2/models/{name}/versions/{VERSION}"):
            routes.update({model: {"GET": metadata}, f"{model}/ready": {"GET": ready}, f"{model}/infer": {"POST": _INFER}})
        return routes

    def metadata(self) -> bytes:
        """KServe v2 model metadata: inputs and outputs with datatype and shape (-1: a dynamic size)."""
        outputs = [{"name": n, "datatype": d, "shape": s} if d else {"name": n} for n, (d, s) in zip(self.served.output_names, self.output_types)]
        inputs = [{"name": n, "datatype": d, "shape": s} for n, (d, s) in zip(self.served.input_names, self.input_types)]
        return json.dumps(
            {"name": self.config["name"], "versions": [VERSION], "platform": "ortlite", "inputs": inputs, "outputs": outputs, "batched": self.batched}
        ).encode()


def _error(message: str, status: int, headers: dict | None = None) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON, headers=headers)


def _grpc_error(grpc_context, code: str, message: str, empty):
    """An error's status and details on the call's context; empty: the answer, with nothing in it."""
    import grpc

    if grpc_context is not None:
        grpc_context.set_code(getattr(grpc.StatusCode, code))
        grpc_context.set_details(message)
    return empty


def _datatype(dtype, shape, io_dtype=None) -> tuple:
    """(KServe datatype, shape with -1 for a dynamic size) of a model's argument or output."""
    if dtype == torch.float32 and io_dtype is not None:
        dtype = io_dtype
    return DATATYPE_OF.get(dtype, str(dtype) if dtype is not None else None), [d if isinstance(d, int) else -1 for d in shape]


__all__ = ["Replica", "ServedModel", "app", "grpc_options"]
