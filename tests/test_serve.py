"""ortlite.serve on a real local Ray (2 CPUs), over HTTP on 127.0.0.1 and through a
DeploymentHandle: answers equal the loaded model's own, batched and unbatched; each kind of bad
input is a 4xx naming the problem and the next request is answered; an error inside a call is a
5xx; a replica killed under load is replaced, no request is lost. One Ray for the module, shut
down by its fixture (and every app deleted)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch
from torch.export import Dim

import ortlite
from conftest import free_port

# one worker runs this file's tests (pytest-xdist, --dist loadgroup): they share its module fixtures
pytestmark = pytest.mark.xdist_group("serve")

ray = pytest.importorskip("ray", reason="ortlite.serve needs the serve extra: pip install -e '.[serve]'")
from ray import serve  # noqa: E402

import ortlite.serve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPC_PORT = free_port()  # the module's Serve: KServe v2's gRPC service (where tritonclient is installed)


class Pair(torch.nn.Module):
    """Two arguments, a dict of two outputs."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, x, y):
        return {"sum": self.proj(x) + y, "norm": (x * y).sum(-1)}


class Lookup(torch.nn.Module):
    """No dynamic size; an id out of range fails inside the call (an IndexError, as aten's)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.embed(ids)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("serve")
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    ortlite.compile(mlp, (torch.randn(2, 16),), dynamic_shapes={"input": {0: Dim("batch", max=64)}}).save(folder / "mlp.onnx")
    batch = Dim("batch")
    ortlite.compile(Pair().eval(), (torch.randn(2, 6), torch.randn(2, 6)), dynamic_shapes={"x": {0: batch}, "y": {0: batch}}).save(folder / "pair.onnx")
    ortlite.compile(Lookup().eval(), (torch.randint(0, 10, (2, 3)),)).save(folder / "lookup.onnx")
    return {name: str(folder / f"{name}.onnx") for name in ("mlp", "pair", "lookup")}


@pytest.fixture(scope="module")
def direct(files):
    return {name: ortlite.load(path) for name, path in files.items()}


@pytest.fixture(scope="module")
def port(files):
    """Ray with 2 CPUs, Serve's HTTP on 127.0.0.1, three apps: mlp batched (64 rows at most, 2 replicas),
    pair unbatched (max_batch_size=1), lookup unbatched (no dynamic size)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        try:
            grpc = {"grpc_options": ortlite.serve.grpc_options(GRPC_PORT)}
        except ImportError:  # no tritonclient: test_tritonclient_grpc skips
            grpc = {}
        serve.start(http_options={"host": "127.0.0.1", "port": port}, **grpc)
        mlp = ortlite.serve.app(files["mlp"], num_replicas=2, num_cpus=0.5, max_body_bytes=1 << 16, batch_wait_timeout_s=0.01)
        serve.run(mlp, name="mlp", route_prefix="/mlp")
        serve.run(ortlite.serve.app(files["pair"], num_cpus=0.5, max_batch_size=1), name="pair", route_prefix="/pair")
        serve.run(ortlite.serve.app(files["lookup"], num_cpus=0.5), name="lookup", route_prefix="/lookup")
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


def request(port, route, body: bytes, method="POST", timeout=60, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, route, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("content-type")
    finally:
        conn.close()


def kserve(**tensors) -> bytes:
    inputs = [{"name": n, "shape": list(t.shape), "datatype": ortlite.serve.http.DATATYPE_OF[t.dtype], "data": t.reshape(-1).tolist()} for n, t in tensors.items()]
    return json.dumps({"inputs": inputs}).encode()


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def outputs(body: bytes) -> dict:
    answer = json.loads(body)
    return {o["name"]: torch.tensor(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}


def close(got, expected):
    # batching changes the products' blocking: equal within float32 rounding
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_this_file_runs_in_one_worker(request):
    """Its module fixtures (a Ray cluster) start once: pytest-xdist's group mark took effect
    (with pytest 9.2 and pytest-xdist 3.8 it silently did not)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not under pytest-xdist: one process runs every test")
    assert request.node.nodeid.endswith("@serve"), request.node.nodeid


def test_import_ortlite_imports_no_ray():
    code = "import sys, ortlite; assert not [m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'ortlite.serve'))], sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("ingress", ["proxy", "direct"])
def test_command_line_serves_and_stops(files, direct, ingress):
    """python -m ortlite.serve with a Ray of its own (run before the module's Ray starts):
    answers over HTTP, and over gRPC (--grpc-port) to tritonclient.grpc with its defaults; on
    SIGINT stops Serve and Ray, freeing the port. --direct-ingress: the replica itself listens
    on those ports (no proxy), with the same answers."""
    try:
        import tritonclient.grpc as triton_grpc
    except ImportError:
        triton_grpc = None
    port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "ortlite.serve", files["mlp"], "--port", str(port), "--num-cpus", "0.5"]
    command += ["--grpc-port", str(grpc_port)] if triton_grpc else []
    command += ["--direct-ingress"] if ingress == "direct" else []
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        x, deadline = torch.randn(3, 16), time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read() if process.poll() is not None else "not serving"
            try:
                status, body, _ = request(port, "/", kserve(input=x))
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        close(outputs(body)["output"], direct["mlp"](x))
        if triton_grpc:
            with triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:  # one app: no "application" metadata
                assert client.is_server_live() and client.is_model_ready("mlp")
                tensor = triton_grpc.InferInput("input", [3, 16], "FP32")
                tensor.set_data_from_numpy(x.numpy())
                close(torch.tensor(client.infer("mlp", [tensor]).as_numpy("output")), direct["mlp"](x))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        if ingress == "direct":  # the replica's own server had the port, not Serve's proxy (as Ray 2.60 logs it)
            output = process.stdout.read()
            assert f"Allocated port {port} for RequestProtocol.HTTP" in output and "Failed to start" not in output, output[-3000:]
        with pytest.raises(OSError):
            request(port, "/", kserve(input=x), timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_unbatched_is_said_once_at_start(files, caplog):
    with caplog.at_level(logging.WARNING, logger="ortlite"):
        ortlite.serve.app(files["lookup"])
        ortlite.serve.app(files["mlp"])
    said = [r.getMessage() for r in caplog.records if "serves unbatched" in r.getMessage()]
    assert len(said) == 1 and "lookup.onnx" in said[0] and "no dynamic first dimension" in said[0], said


def test_answers_equal_the_direct_call(port, direct):
    mlp, pair = direct["mlp"], direct["pair"]
    xs = [torch.randn(n, 16) for n in (1, 2, 5, 8, 3, 7, 1, 4)]

    def ask(x):
        return request(port, "/mlp", kserve(input=x))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # concurrent: stacked into batches
        answers = list(pool.map(ask, xs * 4))
    for x, (status, body, media) in zip(xs * 4, answers):
        assert status == 200 and media == "application/json", body
        close(outputs(body)["output"], mlp(x))
    handle = serve.get_app_handle("mlp")
    stats = [handle.stats.remote().result() for _ in range(8)]  # from either replica
    assert any(s["calls"] < s["requests"] for s in stats), stats  # some requests shared a call
    status, body, media = request(port, "/mlp", npy(xs[2].numpy()))
    assert status == 200 and media == "application/x-npy"
    close(torch.from_numpy(np.load(io.BytesIO(body))), mlp(xs[2]))
    status, body, media = request(port, "/mlp", kserve(input=xs[2]), headers={"Accept": "application/x-npy"})
    assert status == 200 and media == "application/x-npy"  # JSON in, .npy out
    close(torch.from_numpy(np.load(io.BytesIO(body))), mlp(xs[2]))

    x, y = torch.randn(3, 6), torch.randn(3, 6)
    status, body, _ = request(port, "/pair/v2/models/pair/infer", kserve(x=x, y=y))
    assert status == 200, body
    got, expected = outputs(body), pair(x, y)
    assert set(got) == {"sum", "norm"}
    close(got["sum"], expected["sum"])
    close(got["norm"], expected["norm"])
    archive = io.BytesIO()
    np.savez(archive, x=x.numpy(), y=y.numpy())
    status, body, media = request(port, "/pair", archive.getvalue())
    assert status == 200 and media == "application/x-npz"
    with np.load(io.BytesIO(body)) as answer:
        close(torch.from_numpy(answer["sum"]), expected["sum"])

    status, body, _ = request(port, "/pair", b"", method="GET")
    meta = json.loads(body)
    assert status == 200 and meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 6]}, {"name": "y", "datatype": "FP32", "shape": [-1, 6]}]
    assert meta["batched"] is False and json.loads(request(port, "/mlp", b"", method="GET")[1])["batched"] is True


def test_handle_takes_and_gives_tensors(port, direct):
    mlp = serve.get_app_handle("mlp")
    xs = [torch.randn(n, 16) for n in (1, 6, 2)]
    for x, answer in zip(xs, [mlp.remote(x) for x in xs]):
        close(answer.result(), direct["mlp"](x))
    x, y = torch.randn(2, 6), torch.randn(2, 6)
    got = serve.get_app_handle("pair").remote(x, y).result()
    close(got["sum"], direct["pair"](x, y)["sum"])
    with pytest.raises(TypeError, match=r"argument 0 \(input\): expected a torch.float32 tensor of shape \(\?, 16\).*got a torch.float64"):
        mlp.remote(torch.randn(2, 16, dtype=torch.float64)).result()
    close(mlp.remote(xs[0]).result(), direct["mlp"](xs[0]))


def _pickled_npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return out.getvalue()


def _big_npz() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:  # 4 MB of zeros in a few kB
        z.writestr("input.npy", npy(np.zeros((1 << 16, 16), np.float32)))
    return out.getvalue()


BAD = [
    ("wrong dtype", kserve(input=torch.randn(2, 16, dtype=torch.float64)), 400, "expected a torch.float32 tensor of shape (?, 16) on cpu, got a torch.float64"),
    ("wrong rank", kserve(input=torch.randn(16)), 400, "got a torch.float32 tensor of shape (16,)"),
    ("wrong size", kserve(input=torch.randn(2, 15)), 400, "got a torch.float32 tensor of shape (2, 15)"),
    ("batch over the Dim's max", npy(np.zeros((65, 16), np.float32)), 400, "dim 0 is 65, outside the range [1, 64]"),
    ("not JSON nor npy", b"hello", 400, "neither JSON (a KServe v2 inference request) nor a .npy/.npz file"),
    ("JSON not a request", b'{"x": [1, 2]}', 400, "must be a KServe v2 inference request"),
    ("unknown input name", json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode(), 400, "no input named 'x'; its inputs are ['input']"),
    ("data not numbers", json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": ["a"] * 16}]}).encode(), 400, "data is not a list of FP32 values"),
    ("shape against data", json.dumps({"inputs": [{"name": "input", "shape": [2, 16], "datatype": "FP32", "data": [1.0] * 16}]}).encode(), 400, "shape [2, 16] holds 32 values, data has 16"),
    ("unknown datatype", json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "FP8", "data": [1]}]}).encode(), 400, "datatype 'FP8' is not one of"),
    ("pickled npy", _pickled_npy(), 400, "not a readable .npy array of numbers"),
    ("payload over the limit", npy(np.zeros((64, 512), np.float32)), 413, "over this server's limit of 65536"),
    ("npz unpacking over the limit", _big_npz(), 413, "unpacks to more than this server's limit of 65536"),
]


@pytest.mark.parametrize("what, body, status, says", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_naming_it(port, direct, what, body, status, says):
    got, text, media = request(port, "/mlp", body)
    assert (got, media) == (status, "application/json") and says in json.loads(text)["error"], (got, text)
    x = torch.randn(3, 16)
    got, text, _ = request(port, "/mlp", kserve(input=x))
    assert got == 200
    close(outputs(text)["output"], direct["mlp"](x))


def test_error_inside_a_call_is_a_5xx(port, direct):
    status, body, _ = request(port, "/lookup", kserve(ids=torch.tensor([[1, 2, 30], [0, 0, 0]])))
    assert status == 500 and json.loads(body)["error"] == "IndexError: index out of range in self", body
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    status, body, _ = request(port, "/lookup", kserve(ids=ids))
    assert status == 200
    close(outputs(body)["output"], direct["lookup"](ids))


def _replicas(app: str) -> set:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"SERVE_REPLICA::{app}#")}


def test_replica_killed_under_load_is_replaced(port, direct):
    """Requests from 8 threads while one of mlp's 2 replicas is killed: each answer is right, or
    a 5xx (in flight on the dead replica) whose retry is answered; Ray starts a replacement."""
    mlp = direct["mlp"]
    xs = [torch.randn(1 + i % 8, 16) for i in range(240)]
    done, before = [], _replicas("mlp")

    def ask(x):
        status, body, _ = request(port, "/mlp", kserve(input=x))
        done.append(status)
        return status, body

    def kill_when_started():
        while len(done) < 60:
            time.sleep(0.01)
        name = sorted(before)[0]
        ray.kill(ray.get_actor(name, namespace="serve"))
        done.append("kill")
        return name

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        killer = pool.submit(kill_when_started)
        answers = list(pool.map(ask, xs))
        killed = killer.result()
    assert len(done) - done.index("kill") > 100, "the kill came after most of the load: nothing was tested"
    assert all(status == 200 or status >= 500 for status, _ in answers), [s for s, _ in answers]
    for x, (status, body) in zip(xs, answers):
        if status == 200:
            close(outputs(body)["output"], mlp(x))
    for x in [x for x, (status, _) in zip(xs, answers) if status != 200]:  # retried: the other replica answers
        status, body, _ = request(port, "/mlp", kserve(input=x))
        assert status == 200, body
        close(outputs(body)["output"], mlp(x))
    deadline = time.monotonic() + 120
    while len(now := _replicas("mlp")) < 2 or killed in now:
        assert time.monotonic() < deadline, f"no replacement for {killed}: {now}"
        time.sleep(0.5)
    ray.kill(ray.get_actor(sorted(before - {killed})[0], namespace="serve"))  # now the replacement answers
    for x in xs[:8]:
        while (answer := request(port, "/mlp", kserve(input=x)))[0] != 200:
            assert answer[0] >= 500 and time.monotonic() < deadline, answer
            time.sleep(0.2)
        close(outputs(answer[1])["output"], mlp(x))


def test_batch_loop_stacks_waiting_requests_and_never_hangs(files, direct):
    """The replica's batch loop, without Ray: requests waiting together are one call (within
    max_batch_size), each gets its own answer; a request alone runs at once; an error of the
    loop itself reaches every waiting request, and the next request is served."""
    replica = ortlite.serve.Replica(files["mlp"], 1, {"max_batch_size": 4, "batch_wait_timeout_s": 0.0, "max_body_bytes": 1 << 16, "name": "mlp"})
    xs = [torch.randn(1 + i % 3, 16) for i in range(10)]

    async def ask_all(inputs):
        return await asyncio.gather(*(replica(x) for x in inputs))

    for x, got in zip(xs, asyncio.run(ask_all(xs))):
        close(got, direct["mlp"](x))
    counts = lambda: {k: replica.stats()[k] for k in ("requests", "calls")}  # noqa: E731
    assert counts() == {"requests": 10, "calls": 3}  # 4 + 4 + 2
    stats = replica.stats()
    assert 0 < stats["call_s"] <= stats["request_s"], stats
    close(asyncio.run(ask_all(xs[:1]))[0], direct["mlp"](xs[0]))
    assert counts() == {"requests": 11, "calls": 4}

    def broken(calls):
        raise RuntimeError("broken loop")

    replica.served.run_many = broken
    with pytest.raises(RuntimeError, match="broken loop"):
        asyncio.run(ask_all(xs[:5]))
    del replica.served.run_many
    assert replica.waiting == [] and replica.draining is None
    close(asyncio.run(ask_all(xs[:2]))[1], direct["mlp"](xs[1]))


# ---------------------------------------------------------------- KServe v2 / Open Inference Protocol
# The codec without Ray first (fast), then the module's server with NVIDIA's tritonclient as the client.


def _triton_body(inputs, outputs=None, request_id="", parameters=None):
    """(body, Inference-Header-Content-Length or None) as tritonclient.http sends them."""
    from tritonclient.http._utils import _get_inference_request

    return _get_inference_request(inputs, request_id, outputs, 0, False, False, 0, None, parameters)


def _triton_input(name, array, binary=True, datatype=None):
    import tritonclient.http as triton
    from tritonclient.utils import np_to_triton_dtype

    entry = triton.InferInput(name, list(array.shape), datatype or np_to_triton_dtype(array.dtype))
    entry.set_data_from_numpy(array, binary_data=binary)
    return entry


def _codec_arrays():
    """An array of each KServe datatype (BF16 with values it holds exactly), BYTES included."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    arrays = {d: rng.integers(0, 100, (2, 3)).astype(ortlite.serve.http.NUMPY[d]) for d in ortlite.serve.http.DATATYPES if d not in ("BOOL", "BF16")}
    arrays["BOOL"] = np.array([[True, False, True], [False, False, True]])
    arrays["BF16"] = np.array([[0.5, -2.0, 3.0], [1.25, 0.0, -0.75]], dtype=ml_dtypes.bfloat16)
    arrays["BYTES"] = np.array([[b"", b"a\x00b", "é".encode()], [b"x" * 300, b"\xff", b"ok"]], dtype=object)
    return arrays


def _as_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    return value.view(torch.int16).numpy() if value.dtype == torch.bfloat16 else value.numpy()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_kserve_codec_round_trips_every_datatype(binary):
    """tritonclient's own request bodies decode to the tensors it was given, and the answers
    encode to what its InferResult reads back (binary or JSON), each datatype; no Ray."""
    pytest.importorskip("tritonclient.http")
    import ml_dtypes
    import tritonclient.http as triton

    from ortlite.serve.http import decode, encode

    arrays = _codec_arrays()
    if not binary:
        del arrays["BF16"]  # tritonclient sends BF16 in binary only, and BYTES in JSON as UTF-8
        arrays["BYTES"][1, 1] = b"z"
    names = list(arrays)
    inputs = [_triton_input(n, a, binary) for n, a in arrays.items()]
    body, header = _triton_body(inputs, request_id="r1")
    assert (header is not None) == binary
    inference = decode(bytearray(body), names, 1 << 20, None if header is None else str(header), names)
    assert inference.id == "r1" and inference.outputs is None and inference.binary is True  # tritonclient's default: binary_data_output
    asked = [triton.InferRequestedOutput(n, binary_data=binary) for n in reversed(names)]
    body, header = _triton_body(inputs, asked, request_id="r1")
    inference = decode(bytearray(body), names, 1 << 20, None if header is None else str(header), names)
    assert inference.outputs == [(n, binary) for n in reversed(names)]
    for name, value in zip(names, inference.flat):
        expected = arrays[name]
        if name == "BYTES":
            assert value.shape == expected.shape and value.tolist() == expected.tolist()
        else:
            assert value.dtype == ortlite.serve.http.DATATYPES[name] and tuple(value.shape) == expected.shape, name
            np.testing.assert_array_equal(_as_numpy(value), expected.view(np.int16) if name == "BF16" else expected)
    content, media, headers = encode(names, inference.flat, inference, "codec", version="1")
    assert media == ("application/octet-stream" if binary else "application/json")
    length = headers.get("Inference-Header-Content-Length")
    result = triton.InferResult.from_response_body(content, header_length=None if length is None else int(length))
    answer = result.get_response()
    assert answer["id"] == "r1" and answer["model_name"] == "codec" and [o["name"] for o in answer["outputs"]] == names[::-1]
    for name in names:
        got = result.as_numpy(name)
        expected = arrays[name]
        if name == "BF16":
            got, expected = got.astype(ml_dtypes.bfloat16).view(np.int16), expected.view(np.int16)
        if name == "BYTES" and not binary:  # tritonclient reads BYTES in JSON as str
            expected = np.vectorize(bytes.decode, otypes=[object])(expected)
        assert got.shape == expected.shape and got.tolist() == expected.tolist(), name


def test_kserve_codec_reads_binary_tensors_in_place():
    """Aligned tensors of a writable body are read in place (no copy of a large input); after
    a JSON header of odd length, copied to aligned memory; a read-only body, copied."""
    from ortlite.serve.http import decode

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for pad in range(4):
        header = json.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32", "parameters": {"binary_data_size": 48}}]}).encode() + b" " * pad
        body = bytearray(header + x.tobytes())
        (got,) = decode(body, ["x"], 1 << 20, str(len(header))).flat
        np.testing.assert_array_equal(got.numpy(), x)
        assert got.data_ptr() % 4 == 0
        start = np.frombuffer(body, np.uint8).ctypes.data
        assert (got.data_ptr() == start + len(header)) == ((start + len(header)) % 4 == 0)
        (again,) = decode(bytes(body), ["x"], 1 << 20, str(len(header))).flat
        np.testing.assert_array_equal(again.numpy(), x)


def _binary_request(inputs, tail: bytes, **request) -> tuple[bytes, str]:
    header = json.dumps({"inputs": inputs, **request}).encode()
    return header + tail, str(len(header))


F32 = {"name": "input", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
BAD_KSERVE = [
    ("header length not a number", b'{"inputs": []}', "x", "header must be the JSON header's length in bytes, 1 to the body's 14; got 'x'"),
    ("header length past the body", b'{"inputs": []}', "15", "1 to the body's 14; got '15'"),
    ("header not JSON", b"\x00" * 8, "4", "first 4 bytes (Inference-Header-Content-Length) are not a JSON inference request"),
    ("binary without the header", _binary_request([F32], bytes(8))[0], None, "the Inference-Header-Content-Length header must give the JSON's length"),
    ("binary size against shape", *_binary_request([dict(F32, shape=[1, 3])], bytes(8)), "shape [1, 3] of FP32 is 12 bytes, but its binary_data_size is 8"),
    ("binary size past the body", *_binary_request([F32], bytes(4)), "binary_data_size 8 at byte 0 runs past the 4 bytes after the JSON header"),
    ("bytes left over", *_binary_request([F32], bytes(12)), "12 bytes after the JSON header, but the inputs' binary_data_size add up to 8"),
    ("binary size not a number", *_binary_request([dict(F32, parameters={"binary_data_size": "8"})], bytes(8)), "binary_data_size must be a number of bytes"),
    ("both data and binary", *_binary_request([dict(F32, data=[1, 2])], bytes(8)), "has both data and a binary_data_size parameter"),
    ("binary size with no binary part", json.dumps({"inputs": [F32]}).encode(), None, "has a binary_data_size, but the request has no binary part"),
    ("neither data nor binary", json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32"}]}).encode(), None, "has neither data nor a binary_data_size"),
    ("BOOL byte not 0 or 1", *_binary_request([dict(F32, datatype="BOOL", parameters={"binary_data_size": 2})], b"\x01\x02"), "BOOL bytes must be 0 or 1"),
    ("BYTES cut prefix", *_binary_request([dict(F32, shape=[1], datatype="BYTES", parameters={"binary_data_size": 2})], b"\x01\x00"), "BYTES element 0 has a cut length prefix"),
    ("BYTES element too long", *_binary_request([dict(F32, shape=[1], datatype="BYTES", parameters={"binary_data_size": 5})], b"\x09\x00\x00\x00a"), "BYTES element 0 of 9 bytes runs past"),
    ("BYTES count against shape", *_binary_request([dict(F32, shape=[2], datatype="BYTES", parameters={"binary_data_size": 5})], b"\x01\x00\x00\x00a"), "shape [2] holds 2 BYTES elements, the binary data has 1"),
    ("BYTES in JSON not strings", json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [1]}]}).encode(), None, "BYTES data in JSON must be strings"),
    ("id not a string", kserve_json := json.dumps({"id": 7, "inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}).encode(), None, "the request's id must be a string, got 7"),
    ("unknown output", json.dumps({"inputs": [], "outputs": [{"name": "logits"}]}).encode(), None, "the model has no output named 'logits'; its outputs are ['output']"),
    ("output asked twice", json.dumps({"inputs": [], "outputs": [{"name": "output"}, {"name": "output"}]}).encode(), None, "output 'output' is asked for twice"),
    ("outputs not a list", json.dumps({"inputs": [], "outputs": "output"}).encode(), None, "the request's outputs must be a list"),
    ("binary_data not a bool", json.dumps({"inputs": [], "outputs": [{"name": "output", "parameters": {"binary_data": "yes"}}]}).encode(), None, "output 'output': binary_data must be true or false"),
    ("binary_data_output not a bool", json.dumps({"inputs": [], "parameters": {"binary_data_output": 1}}).encode(), None, "binary_data_output must be true or false, got 1"),
    ("classification", json.dumps({"inputs": [], "outputs": [{"name": "output", "parameters": {"classification": 3}}]}).encode(), None, "the classification extension is not supported"),
    ("shared memory", json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}]}).encode(), None, "shared memory (shared_memory_region) is not supported"),
    ("datatype not a string", json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": ["FP32"], "data": [1]}]}).encode(), None, "datatype ['FP32'] is not one of"),
    ("parameters not an object", json.dumps({"inputs": [], "parameters": [1]}).encode(), None, "the request: parameters must be an object"),
]


@pytest.mark.parametrize("what, body, header, says", BAD_KSERVE, ids=[b[0] for b in BAD_KSERVE])
def test_kserve_codec_names_what_is_wrong(what, body, header, says):
    from ortlite.serve.http import BadRequest, decode

    with pytest.raises(BadRequest) as e:
        decode(bytearray(body), ["input"], 1 << 20, header, ["output"])
    assert e.value.status == 400 and says in str(e.value), str(e.value)


def test_kserve_codec_inflates_within_the_limit():
    import gzip
    import zlib as zlib_

    from ortlite.serve.http import BadRequest, inflate

    body = kserve(input=torch.randn(2, 16))
    assert inflate(gzip.compress(body), "gzip", 1 << 16) == body and inflate(zlib_.compress(body), "deflate", 1 << 16) == body
    with pytest.raises(BadRequest) as e:
        inflate(gzip.compress(bytes(1 << 20)), "gzip", 1 << 16)  # 1 MB of zeros in 1 kB
    assert e.value.status == 413 and "unpacks to more than this server's limit of 65536" in str(e.value)
    for broken, says in [(b"hello", "not gzip data"), (gzip.compress(body)[:-20], "cut short")]:
        with pytest.raises(BadRequest, match=says):
            inflate(broken, "gzip", 1 << 16)


def test_kserve_paths_health_metadata_and_errors(port):
    """KServe v2's paths under each app's prefix; an unknown model, version or path is a 404 with
    KServe's error body, a method the path does not take a 405."""

    def get(route, method="GET", body=b""):
        status, text, media = request(port, route, body, method=method)
        return status, json.loads(text), media

    assert get("/mlp/v2/health/live")[:2] == (200, {"live": True})
    assert get("/mlp/v2/health/ready")[:2] == (200, {"ready": True})
    status, server, _ = get("/mlp/v2")
    assert status == 200 and server["name"] == "ortlite" and server["version"] == ortlite.__version__ and "binary_tensor_data" in server["extensions"]
    assert get("/mlp/v2/")[1] == server
    status, meta, _ = get("/pair/v2/models/pair")
    assert status == 200 and meta["name"] == "pair" and meta["versions"] == ["1"]
    assert meta["outputs"] == [{"name": "sum", "datatype": "FP32", "shape": [-1, 6]}, {"name": "norm", "datatype": "FP32", "shape": [-1]}]
    assert get("/pair/v2/models/pair/versions/1")[1] == meta == get("/pair")[1]
    assert get("/lookup/v2/models/lookup")[1]["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [2, 3]}]
    assert get("/pair/v2/models/pair/ready")[:2] == (200, {"name": "pair", "ready": True})
    assert get("/pair/v2/models/pair/versions/1/ready")[0] == 200
    x = torch.randn(2, 16)
    assert request(port, "/mlp/v2/models/mlp/versions/1/infer", kserve(input=x))[0] == 200
    missing = [
        ("/mlp/v2/models/nosuchmodel/infer", "POST", "unknown model 'nosuchmodel': this server serves 'mlp'"),
        ("/mlp/v2/models/nosuchmodel", "GET", "unknown model 'nosuchmodel'"),
        ("/mlp/v2/models/nosuchmodel/ready", "GET", "unknown model 'nosuchmodel'"),
        ("/mlp/v2/models/mlp/versions/2/infer", "POST", "model 'mlp' has no version '2': its one version is '1'"),
        ("/mlp/v2/models/mlp/versions/2", "GET", "has no version '2'"),
        ("/mlp/v2/models/mlp/predict", "POST", "no such path '/v2/models/mlp/predict'"),
        ("/mlp/v1/models/mlp", "GET", "no such path '/v1/models/mlp'"),
        ("/mlp/v2/health", "GET", "no such path"),
    ]
    for route, method, says in missing:
        status, error, media = get(route, method, kserve(input=x) if method == "POST" else b"")
        assert (status, media) == (404, "application/json") and says in error["error"], (route, status, error)
    for route, method, allowed in [("/mlp/v2/models/mlp/infer", "GET", "POST"), ("/mlp/v2/health/live", "POST", "GET"), ("/mlp/v2", "PUT", "GET")]:
        status, error, _ = get(route, method)
        assert status == 405 and error["error"].endswith(f"this path takes {allowed}"), (route, error)


def test_tritonclient_http_binary_and_json(port, direct):
    """NVIDIA's tritonclient.http, with its defaults (binary tensors both ways) and in JSON,
    against the module's server: answers equal the direct call; health, readiness, metadata and
    an unknown model as KServe says."""
    triton = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    pair, mlp = direct["pair"], direct["mlp"]
    x, y = torch.randn(3, 6), torch.randn(3, 6)
    expected = pair(x, y)
    with triton.InferenceServerClient(f"127.0.0.1:{port}/pair") as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("pair")
        assert client.is_model_ready("pair", "1") and not client.is_model_ready("nosuchmodel") and not client.is_model_ready("pair", "2")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        assert [i["name"] for i in client.get_model_metadata("pair")["inputs"]] == ["x", "y"]
        with pytest.raises(InferenceServerException) as e:
            client.get_model_metadata("nosuchmodel")
        assert e.value.status() == "404" and "unknown model 'nosuchmodel'" in e.value.message()
        for binary in (True, False):
            inputs = [_triton_input("x", x.numpy(), binary), _triton_input("y", y.numpy(), binary)]
            result = client.infer("pair", inputs) if binary else client.infer("pair", inputs, outputs=[triton.InferRequestedOutput(n, binary_data=False) for n in ("sum", "norm")])
            close(torch.tensor(result.as_numpy("sum")), expected["sum"])
            close(torch.tensor(result.as_numpy("norm")), expected["norm"])
            outputs = result.get_response()["outputs"]
            assert [("parameters" in o, "data" in o) for o in outputs] == [(binary, not binary)] * 2, outputs
            # one output asked for, in the other form than the inputs, and an id
            result = client.infer("pair", inputs, "1", outputs=[triton.InferRequestedOutput("norm", binary_data=not binary)], request_id=f"q{binary}")
            answer = result.get_response()
            assert answer["id"] == f"q{binary}" and answer["model_version"] == "1" and [o["name"] for o in answer["outputs"]] == ["norm"]
            assert result.as_numpy("sum") is None
            close(torch.tensor(result.as_numpy("norm")), expected["norm"])
        with pytest.raises(InferenceServerException) as e:
            client.infer("nosuchmodel", inputs)
        assert e.value.status() == "404" and "unknown model 'nosuchmodel'" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.infer("pair", inputs, outputs=[triton.InferRequestedOutput("logits")])
        assert e.value.status() == "400" and "no output named 'logits'; its outputs are ['sum', 'norm']" in e.value.message()
    with triton.InferenceServerClient(f"127.0.0.1:{port}/mlp") as client:
        for n, compression in [(1, None), (5, "gzip"), (8, "deflate")]:
            x = torch.randn(n, 16)
            result = client.infer("mlp", [_triton_input("input", x.numpy())], request_compression_algorithm=compression)
            close(torch.tensor(result.as_numpy("output")), mlp(x))
        with pytest.raises(InferenceServerException) as e:  # ortlite's own check of the argument
            client.infer("mlp", [_triton_input("input", np.zeros((2, 16), np.float64))])
        assert e.value.status() == "400" and "expected a torch.float32 tensor of shape (?, 16) on cpu, got a torch.float64" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", [_triton_input("input", np.array([b"text"], dtype=object))])
        assert e.value.status() == "400" and "input 'input' is BYTES, but the model takes a FP32 tensor" in e.value.message()


def test_unsupported_content_encoding_is_a_415(port):
    status, body, _ = request(port, "/mlp/v2/models/mlp/infer", kserve(input=torch.randn(1, 16)), headers={"Content-Encoding": "br"})
    assert status == 415 and "Content-Encoding 'br' is not supported" in json.loads(body)["error"]


# ---------------------------------------------------------------- KServe v2 over gRPC


def _grpc_request(inputs, outputs=None, request_id="", model="m"):
    from tritonclient.grpc._utils import _get_inference_request

    return _get_inference_request(model, inputs, "", request_id, outputs, 0, False, False, 0, None, None)


def test_kserve_grpc_codec_round_trips_every_datatype():
    """tritonclient.grpc's ModelInferRequest (raw inputs) decodes to the tensors it was given,
    typed contents too, and the answer is what its InferResult reads; no Ray."""
    pytest.importorskip("tritonclient.grpc")
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import np_to_triton_dtype

    from ortlite.serve import kserve_grpc

    arrays = _codec_arrays()
    names = list(arrays)
    inputs = []
    for name, array in arrays.items():
        entry = triton_grpc.InferInput(name, list(array.shape), "BF16" if name == "BF16" else np_to_triton_dtype(array.dtype))
        entry.set_data_from_numpy(array)
        inputs.append(entry)
    request = _grpc_request(inputs, [triton_grpc.InferRequestedOutput(n) for n in reversed(names)], "g1")
    inference = kserve_grpc.decode(request, names, names)
    assert inference.id == "g1" and inference.outputs == [(n, True) for n in reversed(names)]
    for name, value in zip(names, inference.flat):
        expected = arrays[name]
        if name == "BYTES":
            assert value.tolist() == expected.tolist()
        else:
            assert value.dtype == ortlite.serve.http.DATATYPES[name]
            np.testing.assert_array_equal(_as_numpy(value), expected.view(np.int16) if name == "BF16" else expected)
    result = triton_grpc.InferResult(kserve_grpc.encode(names, inference.flat, inference, "m", "1"))
    assert [o.name for o in result.get_response().outputs] == names[::-1] and result.get_response().id == "g1"
    for name in names:
        got, expected = result.as_numpy(name), arrays[name]
        if name == "BF16":
            got, expected = got.view(np.int16), expected.view(np.int16)
        assert got.shape == expected.shape and got.tolist() == expected.tolist(), name

    typed = kserve_grpc.messages().ModelInferRequest(model_name="m")
    for name, field, values in [("INT32", "int_contents", [1, -2]), ("BOOL", "bool_contents", [True, False]), ("BYTES", "bytes_contents", [b"a", b"bc"])]:
        entry = typed.inputs.add(name=name, datatype=name, shape=[2])
        getattr(entry.contents, field).extend(values)
    inference = kserve_grpc.decode(typed, ["INT32", "BOOL", "BYTES"], [])
    assert inference.flat[0].tolist() == [1, -2] and inference.flat[0].dtype == torch.int32
    assert inference.flat[1].tolist() == [True, False] and inference.flat[2].tolist() == [b"a", b"bc"]


def test_kserve_grpc_codec_names_what_is_wrong():
    pytest.importorskip("tritonclient.grpc")
    from ortlite.serve import kserve_grpc
    from ortlite.serve.http import BadRequest

    pb = kserve_grpc.messages()
    cases = [
        (pb.ModelInferRequest(inputs=[{"name": "x", "datatype": "FP32", "shape": [1]}]), "no input named 'x'; its inputs are ['input']"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP8", "shape": [1]}]), "datatype 'FP8' is not one of"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP32", "shape": [2]}], raw_input_contents=[bytes(4)]), "shape [2] of FP32 is 8 bytes, but its binary_data_size is 4"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP32", "shape": [1]}], raw_input_contents=[bytes(4)] * 2), "1 inputs but 2 raw_input_contents"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP16", "shape": [1]}]), "FP16 travels in raw_input_contents only"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP32", "shape": [2], "contents": {"fp32_contents": [1.0]}}]), "shape [2] holds 2 values, data has 1"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP32", "shape": [-1]}]), "shape must be a list of sizes, got [-1]"),
        (pb.ModelInferRequest(inputs=[{"name": "input", "datatype": "FP32", "shape": [0]}], outputs=[{"name": "logits"}]), "no output named 'logits'; its outputs are ['output']"),
        (pb.ModelInferRequest(), "the request lacks input(s) ['input']"),
    ]
    for request, says in cases:
        with pytest.raises(BadRequest) as e:
            kserve_grpc.decode(request, ["input"], ["output"])
        assert says in str(e.value), (str(e.value), says)


def test_tritonclient_grpc(port, direct):
    """NVIDIA's tritonclient.grpc through Ray Serve's gRPC proxy (the module's Serve runs one):
    answers equal the direct call; health, readiness, metadata, an unknown model (NOT_FOUND)
    and bad input (INVALID_ARGUMENT). Three apps here: the app is chosen by the "application"
    metadata, as Ray Serve routes gRPC (the command line's one app needs none)."""
    triton_grpc = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    pair = direct["pair"]
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    expected = pair(x, y)
    app = {"application": "pair"}

    def tensor(name, array):
        entry = triton_grpc.InferInput(name, list(array.shape), ortlite.serve.http.DATATYPE_OF[torch.from_numpy(array).dtype])
        entry.set_data_from_numpy(array)
        return entry

    with triton_grpc.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}") as client:
        assert client.is_server_live(headers=app) and client.is_server_ready(headers=app) and client.is_model_ready("pair", headers=app)
        assert not client.is_model_ready("nosuchmodel", headers=app) and not client.is_model_ready("pair", "2", headers=app)
        assert "binary_tensor_data" in client.get_server_metadata(headers=app).extensions
        meta = client.get_model_metadata("pair", headers=app, as_json=True)
        assert meta["versions"] == ["1"] and [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [("sum", "FP32", ["-1", "6"]), ("norm", "FP32", ["-1"])]
        inputs = [tensor("x", x.numpy()), tensor("y", y.numpy())]
        result = client.infer("pair", inputs, headers=app, request_id="g7")
        close(torch.tensor(result.as_numpy("sum")), expected["sum"])
        close(torch.tensor(result.as_numpy("norm")), expected["norm"])
        assert result.get_response().id == "g7" and result.get_response().model_version == "1"
        result = client.infer("pair", inputs, "1", outputs=[triton_grpc.InferRequestedOutput("norm")], headers=app)
        assert [o.name for o in result.get_response().outputs] == ["norm"]
        close(torch.tensor(result.as_numpy("norm")), expected["norm"])
        for call, code, says in [
            (lambda: client.infer("nosuchmodel", inputs, headers=app), "NOT_FOUND", "unknown model 'nosuchmodel': this server serves 'pair'"),
            (lambda: client.get_model_metadata("pair", "2", headers=app), "NOT_FOUND", "model 'pair' has no version '2'"),
            (lambda: client.infer("pair", [tensor("x", x.numpy()), tensor("y", y[:3].numpy())], headers=app), "INVALID_ARGUMENT", "argument 1 dim 0 is 3 but must equal argument 0 dim 0, which is 4"),
            (lambda: client.infer("pair", inputs[:1], headers=app), "INVALID_ARGUMENT", "the request lacks input(s) ['y']"),
        ]:
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == f"StatusCode.{code}" and says in e.value.message(), (e.value.status(), e.value.message())
        mlp = client.infer("mlp", [tensor("input", np.ones((2, 16), np.float32))], headers={"application": "mlp"})
        close(torch.tensor(mlp.as_numpy("output")), direct["mlp"](torch.ones(2, 16)))
        with pytest.raises(InferenceServerException) as e:  # mlp's max_body_bytes is 64 KiB
            client.infer("mlp", [tensor("input", np.ones((1100, 16), np.float32))], headers={"application": "mlp"})
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "over this server's limit of 65536 (max_body_bytes)" in e.value.message()
