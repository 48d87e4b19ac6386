"""`gebackend serve`: run Triton on a model repository until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from gebackend.config.options import parse_backend_config_args
from gebackend.errors import GeBackendError
from gebackend.server.launcher import ServerSettings, TritonServer, format_model_table, load_failure_reason


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a Triton model repository with the ge backend",
        description="Serve MODEL_REPO on a real tritonserver. Arguments after `--` go to tritonserver unchanged.",
    )
    p.add_argument("model_repository", metavar="MODEL_REPO", type=Path)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument(
        "--backend-config", action="append", default=[], metavar="ge,KEY=VALUE",
        help="a backend option for every model (ge,KEY=VALUE or npu_ge,KEY=VALUE); other backends' values go to tritonserver",
    )
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for the server to come up")
    p.add_argument("--exit-timeout", type=int, default=30, help="seconds to let in-flight requests finish on shutdown")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        ours, others = parse_backend_config_args(args.backend_config)
    except GeBackendError as exc:
        print(f"gebackend: {exc}", file=sys.stderr)
        return 2
    settings = ServerSettings(
        model_repository=args.model_repository.resolve(),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        backend_options=ours,
        triton_backend_configs=others,
        extra_args=extra,
        startup_timeout=args.startup_timeout,
        exit_timeout=args.exit_timeout,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = TritonServer(settings)
    try:
        server.start()
        index = server.wait_ready()
    except GeBackendError as exc:
        server.stop(timeout=10)
        print(f"gebackend: cannot serve {settings.model_repository}: {exc}", file=sys.stderr)
        return 1
    _announce(settings, index)
    while not stop.is_set():
        if server.process.poll() is not None:
            code = server.stop()
            print(f"gebackend: tritonserver exited unexpectedly with code {code}", file=sys.stderr)
            return code or 1
        stop.wait(0.5)
    print("gebackend: stopping (waiting for in-flight requests)", flush=True)
    code = server.stop()
    print(f"gebackend: stopped (tritonserver exit code {code})", flush=True)
    return 0 if code in (0, -signal.SIGTERM) else code


def _announce(settings: ServerSettings, index: list[dict]) -> None:
    failed = [e for e in index if e.get("state") != "READY"]
    lines = [
        f"gebackend: serving {settings.model_repository}",
        f"  HTTP     http://127.0.0.1:{settings.http_port}",
        f"  gRPC     127.0.0.1:{settings.grpc_port}",
        f"  metrics  http://127.0.0.1:{settings.metrics_port}/metrics",
        f"gebackend: {len(index) - len(failed)} of {len(index)} models ready",
        *format_model_table(index),
    ]
    for entry in failed:
        lines.append(f"gebackend: model '{entry.get('name')}' failed to load: {load_failure_reason(entry)}")
    lines.append("gebackend: ready; Ctrl-C to stop")
    print("\n".join(lines), flush=True)
