"""python -m ortlite.serve model.onnx [--replicas N] [--port 8000] [--host 127.0.0.1] [--grpc-port N] ...

Serves a saved model over HTTP (and KServe v2's gRPC with --grpc-port) until interrupted
(Ctrl-C, SIGTERM). Without --address it starts a local Ray of its own, and stops it on exit;
with one (a running cluster, or "auto") it deploys there and deletes only its own app on exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
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
    args = parser.parse_args(argv)
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
    grpc = {} if args.grpc_port is None else {"grpc_options": ortlite.serve.grpc_options(args.grpc_port)}
    own = args.address is None
    ray.init(address=args.address, include_dashboard=False if own else None)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port}, **grpc)
        serve.run(app, name=name, route_prefix=args.route_prefix)
        grpc_at = "" if args.grpc_port is None else f", gRPC on port {args.grpc_port}"
        print(f"ortlite.serve: {args.path} at http://{args.host}:{args.port}{args.route_prefix}{grpc_at}", flush=True)
        stop.wait()
    finally:
        if own:
            serve.shutdown()
            ray.shutdown()
        else:
            serve.delete(name)


if __name__ == "__main__":
    main()
