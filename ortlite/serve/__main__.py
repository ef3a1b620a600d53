"""python -m ortlite.serve model.onnx [--replicas N] [--port 8000] [--host 127.0.0.1] [--grpc-port N] [--direct-ingress] ...

Serves a saved model over HTTP (and KServe v2's gRPC with --grpc-port) until interrupted
(Ctrl-C, SIGTERM). Without --address it starts a local Ray of its own, and stops it on exit;
with one (a running cluster, or "auto") it deploys there and deletes only its own app on exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading

from . import BATCH_WAIT_TIMEOUT_S, MAX_BATCH_SIZE, MAX_BODY_BYTES, MAX_ONGOING_REQUESTS


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ortlite.serve", description="Serve a file CompiledModel.save wrote with Ray Serve.")
    parser.add_argument("path")
    parser.add_argument("--replicas", default="1", help='a number, or "auto" (Ray Serve autoscaling)')
    parser.add_argument("--num-cpus", type=float, default=1, help="Ray CPUs per replica, its ONNX Runtime threads")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen beyond this machine")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=None, help="KServe v2's gRPC service on this port (off unless given; Ray listens on every interface)")
    parser.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE, help="1: no batching")
    parser.add_argument("--batch-wait-timeout-s", type=float, default=BATCH_WAIT_TIMEOUT_S)
    parser.add_argument("--max-ongoing-requests", type=int, default=MAX_ONGOING_REQUESTS)
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    parser.add_argument("--name", default=None, help="the app's and deployment's name (default: the file's)")
    parser.add_argument("--route-prefix", default="/")
    parser.add_argument("--address", default=None, help="a running Ray cluster to deploy to")
    parser.add_argument(
        "--direct-ingress", action="store_true",
        help="no proxy: each replica answers on a port of its own, --port and the ports after it (--grpc-port likewise); "
        "several replicas then need a load balancer in front (Ray Serve's direct ingress, experimental; a Ray of this command's own)",
    )
    args = parser.parse_args(argv)
    if args.direct_ingress:
        if args.address is not None:
            parser.error("--direct-ingress starts a Ray of its own; on a running cluster set RAY_SERVE_ENABLE_DIRECT_INGRESS=1 where it starts")
        os.environ.update(direct_ingress_environment(args.port, args.grpc_port, args.replicas))
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    import ray
    from ray import serve

    import ortlite.serve

    replicas = args.replicas if args.replicas == "auto" else int(args.replicas)
    app = ortlite.serve.app(
        args.path, max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_timeout_s, num_replicas=replicas,
        num_cpus=args.num_cpus, max_ongoing_requests=args.max_ongoing_requests, max_body_bytes=args.max_body_bytes, name=args.name,
    )
    name = args.name or os.path.splitext(os.path.basename(args.path))[0]
    # with direct ingress Ray Serve 2.60 still starts its proxy: it gets free ports, the replicas the given ones
    http_port, grpc_port = (_free_port(), args.grpc_port and _free_port()) if args.direct_ingress else (args.port, args.grpc_port)
    grpc = {} if grpc_port is None else {"grpc_options": ortlite.serve.grpc_options(grpc_port)}
    own = args.address is None
    ray.init(address=args.address, include_dashboard=False if own else None)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": http_port}, **grpc)
        serve.run(app, name=name, route_prefix=args.route_prefix)
        grpc_at = "" if args.grpc_port is None else f", gRPC on port {args.grpc_port}"
        direct = ", each replica on a port of its own from there (direct ingress)" if args.direct_ingress else ""
        print(f"ortlite.serve: {args.path} at http://{args.host}:{args.port}{args.route_prefix}{grpc_at}{direct}", flush=True)
        stop.wait()
    finally:
        if own:
            serve.shutdown()
            ray.shutdown()
        else:
            serve.delete(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def direct_ingress_environment(port: int, grpc_port: int | None, replicas: str) -> dict:
    """Ray Serve's direct ingress, read by its processes at start: replicas listen on the ports
    from `port` on (as many as replicas, and as many again for replacements of dead ones)."""
    spare = 2 * (64 if replicas == "auto" else max(int(replicas), 1))
    environment = {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + spare),
        # a stopping replica waits this long for a load balancer to stop sending it requests
        # (Ray's default 30 s); requests in flight are answered whatever it is
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    }
    if grpc_port is not None:
        environment["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"] = str(grpc_port)
        environment["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"] = str(grpc_port + spare)
    return environment


if __name__ == "__main__":
    main()
