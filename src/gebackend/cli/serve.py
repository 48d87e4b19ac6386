"""`gebackend serve`: run Triton on a model repository until Ctrl-C or SIGTERM; SIGHUP reloads what changed on disk.

This module parses the arguments, checks what a container imposes (server/container.py), installs the signal
handlers and prints; keeping the server running (restarts, reloads, the watchdog, the ordered stop) is
server/supervisor.py's.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gebackend.config.options import parse_backend_config_args
from gebackend.errors import GeBackendError
from gebackend.server.container import preflight
from gebackend.server.log_format import LOG_FORMATS, apply_log_format, log_format_default
from gebackend.server.launcher import ServerSettings, Shutdown, TritonServer
from gebackend.server.layout import extra_backends_from_env, peer_config_note
from gebackend.server.repository_client import failure_reason, flag_values, format_model_table
from gebackend.server.response_cache import cache_note
from gebackend.server.supervisor import SignalFlag, Supervisor


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
    p.add_argument(
        "--allow-model-control", action="store_true",
        help="let clients load and unload models through Triton's model-repository API (off: only this CLI may)",
    )
    p.add_argument(
        "--no-self-healing", action="store_true",
        help="do not reload a model whose backend process died or hung, nor start tritonserver again if it crashes "
             "(by default each is noticed within seconds and restored)",
    )
    p.add_argument(
        "--log-format", choices=LOG_FORMATS, default=log_format_default(),
        help="iso8601: every event one line, stamped as tritonserver's ISO8601 lines, ours too (default: $GE_LOG_FORMAT "
             "or default)",
    )
    p.add_argument("--no-shm-check", action="store_true",
                   help="start even when /dev/shm is smaller than the model repository needs (see docs/deploy.md)")
    p.add_argument("--watch-interval", type=float, default=0.5, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        ours, others = parse_backend_config_args(args.backend_config)
    except GeBackendError as exc:
        print(f"gebackend: {exc}", file=sys.stderr)
        return 2
    extra = apply_log_format(args.log_format, extra)
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
        allow_model_control=args.allow_model_control,
    )
    if not preflight(settings.model_repository, ours, others + flag_values(extra, "--backend-config"),
                     lambda line: print(f"gebackend: cannot serve {settings.model_repository}: {line}", file=sys.stderr),
                     say_ok=_say, shm=not args.no_shm_check):
        return 1
    for note in (cache_note(settings.model_repository, extra),  # response_cache asked for, no cache given
                 peer_config_note(others, extra_backends_from_env())):  # the onnxruntime backend's own keys
        if note:
            _say(note)
    stop, reload = SignalFlag(), SignalFlag()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    supervisor = Supervisor(settings, self_healing=not args.no_self_healing, watch_interval=args.watch_interval,
                            say=_say, complain=_complain)
    outcome = supervisor.serve(stop, reload, lambda server, index: _announce(settings, index, _control_line(server, args)),
                               restarted=lambda index: _say(f"tritonserver restarted: {_ready_line(index)}"))
    return outcome if isinstance(outcome, int) else _report_shutdown(outcome, settings.exit_timeout)


def _control_line(server: TritonServer, args: argparse.Namespace) -> str:
    who = "clients too (--allow-model-control)" if args.allow_model_control else "this CLI only (clients get 403)"
    if not server.control.can_reload:
        return f"--model-control-mode={server.control.mode}; no self-healing, no reload on SIGHUP"
    healing = "off (--no-self-healing)" if args.no_self_healing else "on"
    return f"explicit, {who}; self-healing {healing}; SIGHUP reloads changed models"


def _say(message: str) -> None:
    print(f"gebackend: {message}", flush=True)


def _complain(message: str) -> None:
    print(f"gebackend: {message}", file=sys.stderr)


def _report_shutdown(result: Shutdown, exit_timeout: int) -> int:
    drain = result.drain
    if drain is not None and drain.broken:
        _say(f"{', '.join(drain.broken)}: a backend process had died and was not restored yet; "
             "its requests had already failed")
    if drain is not None and drain.complete:
        _say(f"every in-flight request finished ({drain.seconds:.1f}s)")
    elif drain is not None and drain.busy:
        _say(f"requests to {', '.join(drain.busy)} were still running after --exit-timeout {exit_timeout}s; "
             "they were cut off")
    elif drain is not None:
        _say(f"could not drain through the model-repository API ({drain.error}); left it to tritonserver")
    if not result.exited_by_itself and (drain is None or not drain.busy):
        what = f" (it said: found {result.waiting_on})" if result.waiting_on else ""
        _say(f"tritonserver was still waiting{what} with no request left to finish; ended it")
    if result.clean:
        _say("stopped cleanly")
        return 0
    _say(f"stopped (tritonserver exit code {result.code})")
    return result.code if result.code > 0 else 1


def _where(address: str) -> str:
    return "listening on every interface" if address in ("", "0.0.0.0", "::") else f"listening on {address}"


def _host(address: str) -> str:
    host = "127.0.0.1" if address in ("", "0.0.0.0", "::") else address
    return f"[{host}]" if ":" in host else host


def _ready_line(index: list[dict]) -> str:
    ready = sum(e.get("state") == "READY" for e in index)
    return f"{ready} of {len(index)} models ready"


def _announce(settings: ServerSettings, index: list[dict], control: str) -> None:
    failed = [e for e in index if e.get("state") != "READY"]
    extra = settings.extra_args
    http = (flag_values(extra, "--http-address") or ["0.0.0.0"])[-1]
    grpc = (flag_values(extra, "--grpc-address") or ["0.0.0.0"])[-1]
    metrics = (flag_values(extra, "--metrics-address") or [http])[-1]  # Triton's default follows --http-address
    lines = [
        f"gebackend: serving {settings.model_repository}",
        f"  HTTP     http://{_host(http)}:{settings.http_port}  ({_where(http)})",
        f"  gRPC     {_host(grpc)}:{settings.grpc_port}  ({_where(grpc)})",
        f"  metrics  http://{_host(metrics)}:{settings.metrics_port}/metrics  ({_where(metrics)})",
        f"  model control: {control}",
        f"gebackend: {_ready_line(index)}",
        *format_model_table(index),
    ]
    for entry in failed:
        reason = failure_reason(settings.model_repository, entry)
        lines.append(f"gebackend: model '{entry.get('name')}' failed to load: {reason}")
    lines.append("gebackend: ready; Ctrl-C to stop")
    print("\n".join(lines), flush=True)
