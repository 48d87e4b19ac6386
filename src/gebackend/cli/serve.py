"""`gebackend serve`: run Triton on a model repository until Ctrl-C or SIGTERM; SIGHUP reloads what changed on disk."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from gebackend.config.options import parse_backend_config_args
from gebackend.config.pbtxt import config_parse_error
from gebackend.errors import GeBackendError
from gebackend.server.container import preflight
from gebackend.server.log_format import LOG_FORMATS, apply_log_format, log_format_default
from gebackend.server.shm import backend_config_values
from gebackend.server.launcher import ServerSettings, Shutdown, TritonServer
from gebackend.server.repository_client import flag_values, format_model_table, load_failure_reason, repository_fingerprints
from gebackend.server.watchdog import Watchdog, backoff


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
    if not preflight(settings.model_repository, ours, others + backend_config_values(extra),
                     lambda line: print(f"gebackend: cannot serve {settings.model_repository}: {line}", file=sys.stderr),
                     say_ok=_say, shm=not args.no_shm_check):
        return 1
    stop, reload = SignalFlag(), SignalFlag()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    started = _start(settings, stop)
    if isinstance(started, int):
        return started
    server, index = started
    _announce(settings, index, _control_line(server, args))
    watchdog = _start_watchdog(server, args)
    fingerprints = repository_fingerprints(settings.model_repository)
    crashes = Crashes()
    while True:
        if server.process.poll() is not None:
            watchdog.stop()
            code = server.stop()
            if args.no_self_healing:
                print(f"gebackend: tritonserver exited unexpectedly with code {code}", file=sys.stderr)
                return code or 1
            pause = crashes.record()
            _say(f"tritonserver exited unexpectedly with code {code}{crashes.describe()}; starting it again"
                 + (f" in {pause:.0f}s" if pause else ""))
            if not _sleep(pause, stop):
                _say("stopped")
                return 0
            started = _start(settings, stop)
            if isinstance(started, int):
                return started
            server, index = started
            _say(f"tritonserver restarted: {_ready_line(index)}")
            watchdog = _start_watchdog(server, args)
            fingerprints = repository_fingerprints(settings.model_repository)
            continue
        time.sleep(0.25)  # a signal cuts the sleep short; the handler has already set its flag
        if stop.is_set():
            break
        if reload.is_set():
            reload.clear()
            fingerprints = _reload(server, watchdog, fingerprints)
    print("gebackend: stopping: finishing in-flight requests, refusing new ones", flush=True)
    watchdog.stop()
    result = server.shutdown(broken=watchdog.broken_models())
    return _report_shutdown(result, settings.exit_timeout)


def _start(settings: ServerSettings, stop: "SignalFlag") -> "tuple[TritonServer, list[dict]] | int":
    """A started tritonserver and its repository index, or the exit code when it did not start (or was stopped)."""
    server = TritonServer(settings)
    try:
        server.start()
        index = server.wait_ready(stop)
    except GeBackendError as exc:
        server.stop(timeout=10)
        print(f"gebackend: cannot serve {settings.model_repository}: {exc}", file=sys.stderr)
        return 1
    if stop.is_set():
        print("gebackend: stopping before the server was ready", flush=True)
        server.stop(timeout=10)
        print("gebackend: stopped", flush=True)
        return 0
    return server, index


def _sleep(seconds: float, stop: "SignalFlag") -> bool:
    """Wait `seconds` unless a stop signal comes first (then False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop.is_set():
            return False
        time.sleep(0.1)
    return not stop.is_set()


class Crashes:
    """tritonserver crashes in a row (a run of `stable_after` seconds starts the count afresh) and the pause
    before the next start: 0 the first time, then 1 s, 2 s, 4 s ... at most 60 s (the watchdog's backoff)."""

    def __init__(self, stable_after: float = 60.0, clock=time.monotonic):
        self.stable_after, self.clock = stable_after, clock
        self.in_a_row = 0
        self.total = 0
        self._last = 0.0

    def record(self) -> float:
        now = self.clock()
        self.in_a_row = 1 if not self.total or now - self._last > self.stable_after else self.in_a_row + 1
        self.total += 1
        self._last = now
        return backoff(self.in_a_row - 1)

    def describe(self) -> str:
        return f" ({self.in_a_row} times in a row)" if self.in_a_row > 1 else ""


class SignalFlag:
    """Set by a signal handler: a plain attribute, no lock. A handler that takes a lock (threading.Event.set)
    deadlocks when the signal lands while the main thread holds that same lock inside Event.wait/clear: seen
    as a `gebackend serve` that ignored SIGTERM for good."""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def clear(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


def _control_line(server: TritonServer, args: argparse.Namespace) -> str:
    who = "clients too (--allow-model-control)" if args.allow_model_control else "this CLI only (clients get 403)"
    if not server.control.can_reload:
        return f"--model-control-mode={server.control.mode}; no self-healing, no reload on SIGHUP"
    healing = "off (--no-self-healing)" if args.no_self_healing else "on"
    return f"explicit, {who}; self-healing {healing}; SIGHUP reloads changed models"


def _reload(server: TritonServer, watchdog: Watchdog, before: dict[str, tuple]) -> dict[str, tuple]:
    """SIGHUP: load the model folders that are new or whose files changed, unload the ones that are gone.

    Triton loads the new version beside the old one and switches over, so requests keep being answered;
    a failed load leaves the model as Triton then has it (reported). Needs explicit model control.
    """
    if not server.control.can_reload:
        _say(f"SIGHUP: cannot reload, this server runs --model-control-mode={server.control.mode}")
        return before
    now = repository_fingerprints(server.settings.model_repository)
    changed = sorted(name for name in now if before.get(name) != now[name])
    gone = sorted(set(before) - set(now))
    _say(f"SIGHUP: reloading {', '.join(changed + gone) or 'nothing (no model folder changed)'}")
    with watchdog.paused():
        for name in changed:
            started = time.monotonic()
            try:
                server.repository.load_model(name)
            except GeBackendError as exc:
                reason = failure_reason(server.settings.model_repository, {"name": name, "reason": str(exc)})
                _say(f"reload: model '{name}' failed: {reason}")
                continue
            verb = "reloaded" if name in before else "loaded"
            _say(f"reload: model '{name}' {verb} in {time.monotonic() - started:.1f}s")
        for name in gone:
            try:
                server.repository.unload_model(name)
                _say(f"reload: model '{name}' is gone from the repository; unloaded")
            except GeBackendError as exc:
                _say(f"reload: model '{name}' could not be unloaded: {exc}")
    return now


def _say(message: str) -> None:
    print(f"gebackend: {message}", flush=True)


def _start_watchdog(server: TritonServer, args: argparse.Namespace) -> Watchdog:
    """Self-healing, or (when off or impossible) a watchdog that only reports dead stubs."""
    why_not = ""
    if args.no_self_healing:
        why_not = "--no-self-healing"
    elif not server.control.can_reload:
        why_not = f"self-healing needs --model-control-mode=explicit, this server runs '{server.control.mode}'"
        _say(f"self-healing is off: {why_not}")
    watchdog = Watchdog(server.process.pid, server.repository, _say, interval=args.watch_interval, heal=not why_not,
                        why_not=why_not, control_dir=server.control_dir)
    server.watch_lines(watchdog.notice_line)  # a model loading: look for its new stubs at once
    return watchdog.start()


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


def failure_reason(repository: Path, entry: dict) -> str:
    """Why a model did not load: Triton's reason, except for a config.pbtxt it could not read, where Triton says
    nothing (or only "failed to read text proto"): then the file, line, column and the parser's complaint."""
    reason = load_failure_reason({"reason": entry.get("reason")})
    if entry.get("name") and (not reason or "text proto" in reason or "failed to poll" in reason):
        parsed = config_parse_error(Path(repository) / str(entry["name"]))
        if parsed:
            return parsed
    return reason or f"tritonserver gave no reason (state {entry.get('state') or 'UNKNOWN'}; see its log above)"


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
