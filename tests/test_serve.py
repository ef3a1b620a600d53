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

ray = pytest.importorskip("ray", reason="ortlite.serve needs the serve extra: pip install -e '.[serve]'")
from ray import serve  # noqa: E402

import ortlite.serve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        serve.start(http_options={"host": "127.0.0.1", "port": port})
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


def test_import_ortlite_imports_no_ray():
    code = "import sys, ortlite; assert not [m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'ortlite.serve'))], sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_command_line_serves_and_stops(files, direct):
    """python -m ortlite.serve with a Ray of its own (run before the module's Ray starts):
    answers over HTTP, and on SIGINT stops Serve and Ray, freeing the port."""
    port = free_port()
    command = [sys.executable, "-m", "ortlite.serve", files["mlp"], "--port", str(port), "--num-cpus", "0.5"]
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
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
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
