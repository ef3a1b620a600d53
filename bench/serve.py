"""Serving over HTTP on loopback: a closed-loop load generator against ortlite.serve and its peers.

    python bench/serve.py [--models mlp,bert16,bert128,resnet18] [--concurrency 1,8,32] [--requests N]
        [--rounds 3] [--servers batched,unbatched,batched-2,ort,fastapi,noop,wait] [--fault N]
        [--bodies binary,json,npy]

Servers, on one local Ray, all deployed at once per model (idle ones cost memory, not CPU;
Ray's CPU count is raised to fit them, the machine's cores are what they share), with the same
knobs (ortlite.serve's defaults; num_cpus=1 a replica, so one ONNX Runtime thread each); rounds
in which each cell runs in turn, medians over rounds. Ray's workers run at nice 0 as the
FastAPI process does (RAY_worker_niceness=0; Ray's default, 15, gives them a fraction of a CPU
shared with other work: set RAY_worker_niceness=15 to see it):
  batched     ortlite.serve.app(path), 1 replica
  unbatched   the same with max_batch_size=1
  batched-2   2 replicas
  ort         the same deployment (HTTP, batching) with plain onnxruntime as the engine:
              InferenceSession.run on numpy, 1 intra-op thread: the peer a user hand-writes
  fastapi     one uvicorn process, no Ray: FastAPI calling ortlite.load's model (1 thread),
              the same body codec, no batching
  noop        a Ray Serve deployment that reads the body and answers a constant as large as the
              model's answer to 4 rows (the mix's mean): the engine's own ceiling for these
              request and answer sizes
  wait        the no-op, waiting before it answers as long as the direct call takes, in a thread
              as the replica's calls run (a sleep: no CPU, no cache): the engine's latency for a
              request that takes as long as the model, with no model; against it, one client's
              p50 shows what running the model inside the engine costs beyond the call itself
Requests: mixed batch sizes 1-8 (a fixed sequence), KServe v2 JSON bodies (ResNet: .npy, its
JSON would be 25 MB at batch 8); BERT and ResNet ask for .npy answers (Accept), their outputs
being large (BERT 16 tokens: 4,096 floats a row; as JSON 2-18 ms to encode at 1-8 rows here,
as .npy 0.07 ms). Clients: processes of their own (spawned), each a few threads
with one keep-alive http.client connection each; a request with no answer in --timeout is
lost. The client's CPU time is printed beside each row (it shares the 2 cores). For the servers
of one ortlite.serve replica (batched, unbatched, ort), Replica.stats() before and after each
cell gives the mean ms a request spent in the replica's handler and its share of model calls:
what of the client's latency is the replica's, and what is the engine's (the proxy, routing).

--bodies binary,json,npy: one 1 MiB input (1024 x 256 float32, an MLP with a 1024-float answer)
to ortlite.serve's defaults, in each body form: Triton's binary tensors (the answer in binary
too, binary_data_output), KServe v2 JSON (JSON answer), .npy (.npy answer); the same rounds and
clients as above, and the codec's own time in this process (decode of the body, encode of the
answer, medians of 20): what each form costs the server, apart from Ray's moving of the bytes.

--fault N: N requests from 32 clients to 2 batched replicas of the MLP, one replica killed
(ray.kill) after N/2 answers; every 2xx checked against ortlite.load(path)(x) (rtol 1e-5),
every failure retried until answered; prints lost (must be 0) and the failures' statuses and
start times against the kill.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import io
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BATCH_SIZES = [1, 5, 2, 8, 3, 7, 4, 6, 1, 2]  # mixed, mean 3.9, repeated in this order


# ---------------------------------------------------------------- client (spawned processes)


def _client(port, path, bodies, schedule, threads, timeout, done, keep_bodies, headers):
    """Run schedule (request ids) over `threads` connections: ([(id, status, start, end, body)],
    CPU seconds); status 0 is lost (no answer within timeout, or the connection failed)."""
    cpu = time.process_time()
    out, lock, queue = [], threading.Lock(), list(schedule)
    queue.reverse()

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        while True:
            with lock:
                if not queue:
                    break
                rid = queue.pop()
            body = bodies[BATCH_SIZES[rid % len(BATCH_SIZES)]]
            start = time.time()
            try:
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                status, reply = response.status, response.read()
            except (OSError, http.client.HTTPException):
                status, reply = 0, b""
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            end = time.time()
            with lock:
                out.append((rid, status, start, end, reply if keep_bodies or status >= 400 else None))
            if done is not None:
                with done.get_lock():
                    done.value += 1
        conn.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return out, time.process_time() - cpu


def load(port, path, bodies, n, concurrency, timeout=30.0, done=None, keep_bodies=False, headers=None):
    """n requests from `concurrency` closed-loop clients: (results by id, wall s from the first
    request to the last answer, the clients' CPU s in that time)."""
    processes = min(concurrency, 4)
    per = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    schedules = [[] for _ in range(processes)]
    for rid in range(n):
        schedules[rid % processes].append(rid)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init_done, initargs=(done,)) as pool:
        list(pool.map(time.sleep, [0.01] * processes))  # started before the clock
        futures = [pool.submit(_client_in_process, port, path, bodies, s, t, timeout, keep_bodies, headers or {}) for s, t in zip(schedules, per)]
        answers = [f.result() for f in futures]
    results = [r for out, _ in answers for r in out]
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    return {r[0]: r for r in results}, wall, sum(cpu for _, cpu in answers)


_DONE = None


def _init_done(done):
    global _DONE
    _DONE = done


def _client_in_process(port, path, bodies, schedule, threads, timeout, keep_bodies, headers):
    return _client(port, path, bodies, schedule, threads, timeout, _DONE, keep_bodies, headers)


# ---------------------------------------------------------------- models and bodies


def build(name: str, folder: str):
    """(path of the saved ortlite file, {batch size: input tensor}, request body form) for a model name."""
    import torch
    from torch.export import Dim

    import ortlite

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import first_output

    class First(torch.nn.Module):  # the model's main tensor, from one argument x
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return first_output(self.model(x))

    torch.manual_seed(0)
    if name == "mlp":  # README's
        model, example = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)), lambda b: torch.randn(b, 64)
    elif name.startswith("bert"):  # bench/models.py's BERT h256 L4, 16 or 128 tokens
        from transformers import BertConfig, BertModel

        tokens = int(name[4:])
        config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=30522)
        model, example = First(BertModel(config)), lambda b: torch.randint(0, 30522, (b, tokens))
    elif name == "mlp1mb":  # --bodies: a 1 MiB input (1024 rows of 256 floats), a small answer
        model, example = torch.nn.Sequential(torch.nn.Linear(256, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)), lambda b: torch.randn(b, 256)
    elif name == "resnet18":  # ResNet-18's layout (basic blocks 2-2-2-2, 64-512 channels), 1000 classes
        from transformers import ResNetConfig, ResNetForImageClassification

        config = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic", num_labels=1000)
        model, example = First(ResNetForImageClassification(config)), lambda b: torch.randn(b, 3, 224, 224)
    else:
        raise SystemExit(f"unknown model {name!r}")
    model.eval()
    argument = "input" if name.startswith("mlp") else "x"
    compiled = ortlite.compile(model, (example(2),), dynamic_shapes={argument: {0: Dim("batch")}})
    path = os.path.join(folder, f"{name}.onnx")
    compiled.save(path)
    return path, {b: example(b) for b in sorted(set(BATCH_SIZES))}, "npy" if name == "resnet18" else "json"


def bodies_for(path, inputs, media):
    import numpy as np

    from ortlite.serve.http import DATATYPE_OF
    from ortlite.serve.model import ServedModel

    name = ServedModel.signature(path).input_names[0]
    out = {}
    for b, x in inputs.items():
        if media == "npy":
            f = io.BytesIO()
            np.save(f, x.numpy())
            out[b] = f.getvalue()
        else:
            out[b] = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": DATATYPE_OF[x.dtype], "data": x.reshape(-1).tolist()}]}).encode()
    return out


# ---------------------------------------------------------------- servers


def _peer_classes():
    """The plain-onnxruntime peer: ortlite.serve's deployment with InferenceSession.run as the engine."""
    import onnxruntime
    import torch

    from ortlite.serve import Replica
    from ortlite.serve.model import ServedModel
    from ortlite.session import disabled_optimizers_for

    class OrtServed(ServedModel):
        def __init__(self, path, threads):
            s = ServedModel.signature(path)
            self.__dict__.update(s.__dict__)
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
            self.session = onnxruntime.InferenceSession(
                path, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers_for(["CPUExecutionProvider"])
            )

        def run_one(self, flat):
            try:
                return [torch.from_numpy(o) for o in self.session.run(None, {n: t.numpy() for n, t in zip(self.input_names, flat)})]
            except Exception as e:
                return e

    class OrtReplica(Replica):
        def load(self, path):
            return OrtServed(path, torch.get_num_threads())

    return OrtReplica


def _noop():
    """The no-op deployment; bound with seconds > 0, the wait peer."""
    import asyncio

    from ray import serve
    from starlette.responses import Response

    class Noop:
        def __init__(self, reply: bytes, media_type: str, seconds: float = 0.0):
            self.reply, self.media_type, self.seconds = reply, media_type, seconds
            self.pool = concurrent.futures.ThreadPoolExecutor(1) if seconds else None  # the wait peer's

        async def __call__(self, request):
            await request.body()
            if self.seconds:
                await asyncio.get_running_loop().run_in_executor(self.pool, time.sleep, self.seconds)
            return Response(self.reply, media_type=self.media_type)

    return serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)(Noop)


def noop_reply(path, inputs, headers) -> tuple[bytes, str]:
    """The model's answer to a 4-row request (the batch mix's mean is 3.9), encoded as the
    servers answer: what the no-op deployment answers every request, so that it moves as many
    bytes as they do, computing nothing."""
    import torch

    import ortlite
    from ortlite.serve.http import JSON, Inference, encode
    from ortlite.serve.model import ServedModel

    names = ServedModel.signature(path).output_names
    with torch.no_grad():
        outputs = ortlite.load(path)(inputs[4])
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    body, media_type, _ = encode(names, outputs, Inference([], JSON), "noop", headers.get("Accept", ""))
    return body, media_type


def deploy(kind, path, port, reply=None, direct_s=0.0):
    """Start the server kind; (route, stop()). reply: the no-op's (bytes, media type); direct_s:
    how long the wait peer waits."""
    from ray import serve

    import ortlite.serve

    if kind == "fastapi":
        process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--fastapi-server", path, str(port)])
        _wait_ready(port, "/", process)
        return "/", lambda: (process.terminate(), process.wait())
    if kind in ("noop", "wait"):
        app = _noop().bind(*reply, direct_s if kind == "wait" else 0.0)
    else:
        options = {"batched": {}, "unbatched": {"max_batch_size": 1}, "batched-2": {"num_replicas": 2}, "ort": {"replica": _peer_classes()}}[kind]
        app = ortlite.serve.app(path, **options)
    serve.run(app, name=kind, route_prefix=f"/{kind}")
    return f"/{kind}", lambda: serve.delete(kind)


def _wait_ready(port, route, process, deadline_s=120):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit("the FastAPI server exited")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", route)
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit("the FastAPI server did not start")


def fastapi_server(path, port):
    import torch
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from starlette.concurrency import run_in_threadpool

    from ortlite.serve.http import HEADER_LENGTH, BadRequest, decode, encode, error_body
    from ortlite.serve.model import ServedModel

    torch.set_num_threads(1)
    served = ServedModel.load(path)
    app = FastAPI()
    lock = threading.Lock()  # one call at a time, as a replica runs them

    def run(flat):
        with lock:
            return served.run_one(flat)

    @app.get("/")
    async def ready():
        return {"ready": True}

    async def infer(request):
        try:
            inference = decode(await request.body(), served.input_names, 64 << 20, request.headers.get(HEADER_LENGTH), served.output_names)
        except BadRequest as e:
            return Response(error_body(str(e)), status_code=e.status, media_type="application/json")
        answer = await run_in_threadpool(run, inference.flat)
        if isinstance(answer, Exception):
            return Response(error_body(str(answer)), status_code=400 if isinstance(answer, (TypeError, ValueError)) else 500, media_type="application/json")
        body, media, headers = encode(served.output_names, answer, inference, "fastapi", request.headers.get("accept", ""))
        return Response(body, media_type=media, headers=headers)

    infer.__annotations__["request"] = Request  # (this module's annotations are strings)
    app.post("/")(infer)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------- runs


def summarize(results, wall, cpu, n):
    statuses = [r[1] for r in results.values()]
    latencies = sorted((r[3] - r[2]) * 1e3 for r in results.values() if 200 <= r[1] < 300)
    ok = len(latencies)
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")  # noqa: E731
    return {
        "req/s": ok / wall, "p50 ms": statistics.median(latencies) if latencies else float("nan"), "p99 ms": p(0.99),
        "2xx": ok, "4xx": sum(400 <= s < 500 for s in statuses), "5xx": sum(s >= 500 for s in statuses),
        "lost": n - ok - sum(400 <= s for s in statuses), "client cores": cpu / wall,
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPLICA_CPUS = {"batched": 1, "unbatched": 1, "batched-2": 2, "ort": 1, "noop": 1, "wait": 1, "fastapi": 0}
REQUESTS = {"mlp": 600, "bert16": 150, "bert128": 48, "resnet18": 24}


ONE_REPLICA = ("batched", "unbatched", "ort")  # ortlite.serve's Replica, alone: its stats are the server's


def replica_stats(kind):
    """Replica.stats() of the server kind's one replica, or None for the other kinds."""
    from ray import serve

    return serve.get_app_handle(kind).stats.remote().result() if kind in ONE_REPLICA else None


def inside(before, after) -> dict:
    """Mean ms a request spent in its replica's handler, and in model calls, between two stats."""
    if before is None:
        return {"in replica ms": float("nan"), "in calls ms": float("nan")}
    n = max(after["requests"] - before["requests"], 1)
    return {"in replica ms": (after["request_s"] - before["request_s"]) / n * 1e3, "in calls ms": (after["call_s"] - before["call_s"]) / n * 1e3}


def direct_ms(path, inputs) -> float:
    """ortlite.load(path)'s call, one thread, mean over the batch-size mix (ms a request)."""
    import torch

    import ortlite

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, xs = ortlite.load(path), [inputs[b] for b in BATCH_SIZES]
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for x in xs:
                model(x)
            times.append((time.perf_counter() - start) / len(xs) * 1e3)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def run_bench(args, port):
    """Per model: every server deployed at once (idle ones cost memory, not CPU), then rounds
    in which each (clients, server) cell runs in turn; medians over rounds, counts summed."""
    folder = tempfile.mkdtemp(prefix="ortlite-serve-bench-")
    header = "| model | server | clients | requests | req/s | p50 ms | p99 ms | in replica ms | in calls ms | 2xx | 4xx | 5xx | lost | client cores |"
    kinds, concurrencies = args.servers.split(","), [int(c) for c in args.concurrency.split(",")]
    for model in args.models.split(","):
        path, inputs, media = build(model, folder)
        bodies = bodies_for(path, inputs, media)
        n = args.requests or REQUESTS[model]
        headers = {} if model == "mlp" else {"Accept": "application/x-npy"}  # hidden states, logits: large answers
        direct = direct_ms(path, inputs)
        reply = noop_reply(path, inputs, headers) if {"noop", "wait"} & set(kinds) else None
        servers = {}
        try:
            for kind in kinds:
                fport = free_port() if kind == "fastapi" else port
                route, stop = deploy(kind, path, fport, reply, direct / 1e3)
                servers[kind] = (fport, route, stop)
                load(fport, route, bodies, min(n, 16), 4, headers=headers)  # warm-up
            cells = {}
            for r in range(args.rounds):
                for concurrency in concurrencies:
                    for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                        fport, route, _ = servers[kind]
                        before = replica_stats(kind)
                        cell = summarize(*load(fport, route, bodies, n, concurrency, args.timeout, headers=headers), n)
                        cells.setdefault((kind, concurrency), []).append(cell | inside(before, replica_stats(kind)))
        finally:
            for _, _, stop in servers.values():
                stop()
        print(f"\n{model}: direct call {direct:.3f} ms a request (one thread, batch mix {BATCH_SIZES}); {args.rounds} rounds of {n} requests a cell")
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        med = {}
        for concurrency in concurrencies:
            for kind in kinds:
                runs = cells[(kind, concurrency)]
                m = {k: statistics.median(run[k] for run in runs) for k in ("req/s", "p50 ms", "p99 ms", "in replica ms", "in calls ms", "client cores")}
                c = {k: sum(run[k] for run in runs) for k in ("2xx", "4xx", "5xx", "lost")}
                med[(kind, concurrency)] = m
                print(
                    f"| {model} | {kind} | {concurrency} | {n * len(runs)} | {m['req/s']:.1f} | {m['p50 ms']:.2f} | {m['p99 ms']:.2f} | "
                    f"{m['in replica ms']:.2f} | {m['in calls ms']:.2f} | "
                    f"{c['2xx']} | {c['4xx']} | {c['5xx']} | {c['lost']} | {m['client cores']:.2f} |",
                    flush=True,
                )
        checks(model, med, direct, concurrencies)


def checks(model, med, direct, concurrencies):
    """The issue's ratios, where this run has both sides."""
    get = lambda kind, c, k="req/s": med[(kind, c)][k] if (kind, c) in med else float("nan")  # noqa: E731
    hi, lo = max(concurrencies), min(concurrencies)
    print(
        f"{model} at {hi} clients: batched/unbatched {get('batched', hi) / get('unbatched', hi):.2f}x, batched/noop {get('batched', hi) / get('noop', hi):.2f}x, "
        f"batched/ort {get('batched', hi) / get('ort', hi):.2f}x; at {lo}: batched/ort {get('batched', lo) / get('ort', lo):.2f}x, "
        f"p50 batched {get('batched', lo, 'p50 ms'):.2f} ms against noop + direct + 1 ms = {get('noop', lo, 'p50 ms') + direct + 1:.2f} ms, "
        f"wait + 1 ms = {get('wait', lo, 'p50 ms') + 1:.2f} ms"
    )


def body_forms(path, x, forms) -> dict:
    """{form: (body, headers)} of one request for x: binary (Triton's tensors, the answer asked in
    binary), json (KServe v2), npy."""
    import numpy as np

    from ortlite.serve.http import DATATYPE_OF, HEADER_LENGTH
    from ortlite.serve.model import ServedModel

    name = ServedModel.signature(path).input_names[0]
    entry = {"name": name, "shape": list(x.shape), "datatype": DATATYPE_OF[x.dtype]}
    out = {}
    for form in forms:
        if form == "binary":
            raw = x.numpy().tobytes()
            header = json.dumps({"inputs": [entry | {"parameters": {"binary_data_size": len(raw)}}], "parameters": {"binary_data_output": True}}).encode()
            out[form] = (header + raw, {HEADER_LENGTH: str(len(header))})
        elif form == "json":
            out[form] = (json.dumps({"inputs": [entry | {"data": x.reshape(-1).tolist()}]}).encode(), {})
        elif form == "npy":
            f = io.BytesIO()
            np.save(f, x.numpy())
            out[form] = (f.getvalue(), {})
        else:
            raise SystemExit(f"unknown body form {form!r} (binary, json, npy)")
    return out


def codec_ms(path, forms: dict) -> dict:
    """{form: (decode ms, encode ms)} in this process, medians of 20: the body read into the
    model's arguments, and the answer written in the same form."""
    import ortlite
    from ortlite.serve.http import HEADER_LENGTH, decode, encode
    from ortlite.serve.model import ServedModel

    served, model = ServedModel.signature(path), ortlite.load(path)
    out = {}
    for form, (body, headers) in forms.items():
        decodes, encodes = [], []
        for _ in range(20):
            start = time.perf_counter()
            inference = decode(bytearray(body), served.input_names, 64 << 20, headers.get(HEADER_LENGTH), served.output_names)
            middle = time.perf_counter()
            answer = [model(*inference.flat)]
            end = time.perf_counter()
            encode(served.output_names, answer, inference, "codec")
            decodes.append(middle - start)
            encodes.append(time.perf_counter() - end)
        out[form] = (statistics.median(decodes) * 1e3, statistics.median(encodes) * 1e3)
    return out


def ortlite_load(path):
    import ortlite

    return ortlite.load(path)


def answer_of(form, reply: bytes, count: int):
    """The float32 answer in a reply of the form (binary: its last count * 4 bytes)."""
    import numpy as np
    import torch

    if form == "binary":
        return torch.from_numpy(np.frombuffer(reply[-count * 4 :], np.float32).copy())
    if form == "npy":
        return torch.from_numpy(np.load(io.BytesIO(reply)))
    return torch.tensor(json.loads(reply)["outputs"][0]["data"])


def run_bodies(args, port):
    """One 1 MiB input in each body form to ortlite.serve's defaults (one replica), in rounds."""
    import torch

    folder = tempfile.mkdtemp(prefix="ortlite-serve-bodies-")
    path, _, _ = build("mlp1mb", folder)
    torch.manual_seed(1)
    x = torch.randn(1024, 256)
    forms = body_forms(path, x, args.bodies.split(","))
    n, concurrencies = args.requests or 60, [int(c) for c in args.concurrency.split(",")]
    codec = codec_ms(path, forms)
    route, stop = deploy("batched", path, port)
    cells = {}
    try:
        expected = ortlite_load(path)(x)
        for form, (body, headers) in forms.items():  # warm-up, and each answer checked against the direct call
            results, _, _ = load(port, route, {b: body for b in set(BATCH_SIZES)}, 4, 1, keep_bodies=True, headers=headers)
            for _, status, _, _, reply in results.values():
                got = answer_of(form, reply, expected.numel()) if status == 200 else None
                if got is None or not torch.allclose(got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6):
                    raise SystemExit(f"{form}: a wrong answer ({status}): {reply[:200]!r}")
        for r in range(args.rounds):
            for concurrency in concurrencies:
                for form in list(forms)[r % len(forms):] + list(forms)[: r % len(forms)]:
                    body, headers = forms[form]
                    before = replica_stats("batched")
                    cell = summarize(*load(port, route, {b: body for b in set(BATCH_SIZES)}, n, concurrency, args.timeout, headers=headers), n)
                    cells.setdefault((form, concurrency), []).append(cell | inside(before, replica_stats("batched")))
    finally:
        stop()
    print(f"\nmlp1mb: one input of {x.numel() * 4:,} bytes (1024 x 256 float32), the answer 1024 floats; {args.rounds} rounds of {n} requests a cell")
    print("| body | bytes | clients | req/s | p50 ms | p99 ms | in replica ms | decode ms | encode ms | 2xx | 4xx | 5xx | lost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for concurrency in concurrencies:
        for form in forms:
            runs = cells[(form, concurrency)]
            m = {k: statistics.median(run[k] for run in runs) for k in ("req/s", "p50 ms", "p99 ms", "in replica ms")}
            c = {k: sum(run[k] for run in runs) for k in ("2xx", "4xx", "5xx", "lost")}
            print(
                f"| {form} | {len(forms[form][0]):,} | {concurrency} | {m['req/s']:.1f} | {m['p50 ms']:.2f} | {m['p99 ms']:.2f} | {m['in replica ms']:.2f} | "
                f"{codec[form][0]:.2f} | {codec[form][1]:.2f} | {c['2xx']} | {c['4xx']} | {c['5xx']} | {c['lost']} |",
                flush=True,
            )


def run_fault(args, port):
    import ray
    import torch

    import ortlite
    from ray import serve

    import ortlite.serve

    folder = tempfile.mkdtemp(prefix="ortlite-serve-fault-")
    path, inputs, media = build("mlp", folder)
    bodies = bodies_for(path, inputs, media)
    direct = ortlite.load(path)
    expected = {b: direct(x) for b, x in inputs.items()}
    serve.run(ortlite.serve.app(path, num_replicas=2), name="fault", route_prefix="/fault")
    n, done = args.fault, multiprocessing.get_context("spawn").Value("l", 0)
    killed = {}

    def killer():
        while done.value < n // 2:
            time.sleep(0.005)
        replica = next(a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("SERVE_REPLICA::fault#"))
        killed["t"] = time.time()
        ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]))
        killed["done_then"] = done.value

    thread = threading.Thread(target=killer)
    thread.start()
    results, wall, cpu = load(port, "/fault", bodies, n, 32, args.timeout, done=done, keep_bodies=True)
    thread.join()
    wrong = 0
    for rid, status, start, end, reply in results.values():
        if 200 <= status < 300:
            b = BATCH_SIZES[rid % len(BATCH_SIZES)]
            got = torch.tensor(json.loads(reply)["outputs"][0]["data"]).reshape(expected[b].shape)
            wrong += not torch.allclose(got, expected[b], rtol=1e-5, atol=1e-6)
    failures = [(rid, status, start - killed["t"], end - killed["t"]) for rid, status, start, end, _ in results.values() if not 200 <= status < 300]
    retried = 0
    for rid, *_ in failures:
        for _ in range(100):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=args.timeout)
            conn.request("POST", "/fault", body=bodies[BATCH_SIZES[rid % len(BATCH_SIZES)]])
            response = conn.getresponse()
            reply = response.read()
            if response.status == 200:
                b = BATCH_SIZES[rid % len(BATCH_SIZES)]
                got = torch.tensor(json.loads(reply)["outputs"][0]["data"]).reshape(expected[b].shape)
                retried += torch.allclose(got, expected[b], rtol=1e-5, atol=1e-6)
                break
            time.sleep(0.1)
    s = summarize(results, wall, cpu, n)
    print(f"fault run: {n} requests, 32 clients, 2 batched replicas of the MLP, one killed after {killed['done_then']} answers")
    print(f"  {s['req/s']:.1f} req/s, p50 {s['p50 ms']:.2f} ms, p99 {s['p99 ms']:.2f} ms; 2xx {s['2xx']}, 4xx {s['4xx']}, 5xx {s['5xx']}, lost {s['lost']}")
    print(f"  2xx answers unequal to the direct call: {wrong}")
    texts = sorted({(r[1], (r[4] or b"")[:120]) for r in results.values() if not 200 <= r[1] < 300})
    print(f"  failures: {len(failures)}, statuses {sorted({f[1] for f in failures})}, all started before the kill: {all(f[2] < 0 for f in failures)}, "
          f"starts {min((f[2] for f in failures), default=0):.3f} to {max((f[2] for f in failures), default=0):.3f} s, ends up to {max((f[3] for f in failures), default=0):.3f} s after it")
    print(f"  their bodies: {texts[:3]}")
    print(f"  failures retried and answered correctly: {retried} of {len(failures)}")
    serve.delete("fault")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,bert16,bert128,resnet18")
    parser.add_argument("--servers", default="batched,unbatched,batched-2,ort,fastapi,noop,wait")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--requests", type=int, default=0, help="per cell and round (default: by model, REQUESTS)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--fault", type=int, default=0, help="the fault run with this many requests instead")
    parser.add_argument("--bodies", default="", help="binary,json,npy: a 1 MiB input in these body forms instead")
    parser.add_argument("--fastapi-server", nargs=2, metavar=("PATH", "PORT"))
    args = parser.parse_args(argv)
    if args.fastapi_server:
        return fastapi_server(args.fastapi_server[0], int(args.fastapi_server[1]))

    import ray
    from ray import serve

    # Ray's CPUs are a logical count: the bench keeps all its servers deployed at once (the
    # machine's cores are what they share); the fault run has the 2
    cpus = 2 if args.fault or args.bodies else max(2, sum(REPLICA_CPUS[k] for k in args.servers.split(",")))
    # Ray starts its workers (proxy, replicas) at nice 15 (its worker_niceness): on a machine
    # shared with other work they then get a fraction of the CPU the FastAPI process (nice 0)
    # gets. The bench runs them at 0 unless told otherwise.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        print(f"# {time.strftime('%Y-%m-%d %H:%M')}, ray {ray.__version__}, ray.init(num_cpus={cpus}), RAY_worker_niceness={os.environ['RAY_worker_niceness']}, {os.cpu_count()} cores shared with other work, load average {os.getloadavg()[0]:.1f}")
        print("# " + " ".join(sys.argv))
        if args.fault:
            run_fault(args, port)
        elif args.bodies:
            run_bodies(args, port)
        else:
            run_bench(args, port)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
