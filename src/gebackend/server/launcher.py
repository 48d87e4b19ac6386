"""Starts tritonserver with our backends, watches it come up, and stops it leaving nothing behind.

Owns: the command line and environment of the server process, the port pre-flight check,
waiting for readiness (or for the reason it will never be ready), the model status table,
the model-repository API the CLI keeps for itself (explicit model control behind a secret header),
and clean-up of the temp folder and the `/dev/shm` regions of this server.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

from gebackend.errors import GeBackendError
from gebackend.server.distribution import TritonDistribution, find_triton
from gebackend.control import env as control_env, registry
from gebackend.server.layout import lay_out_backends

SHM_DIR = Path("/dev/shm")
# The header that unlocks Triton's model-repository API (index, load, unload) when clients may not use it.
CONTROL_HEADER = "gebackend-control-key"


class LaunchError(GeBackendError):
    """The server could not be started or did not become ready."""


class _RepositoryError(GeBackendError):
    """Triton refused a model-repository call; `status` is its HTTP or gRPC status."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


@dataclass
class ServerSettings:
    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    backend_options: dict[str, str] = field(default_factory=dict)
    triton_backend_configs: list[str] = field(default_factory=list)  # other backends' --backend-config values
    extra_args: list[str] = field(default_factory=list)
    startup_timeout: float = 300.0
    exit_timeout: int = 30
    allow_model_control: bool = False  # clients may load/unload models through the repository API


def flag_values(args: Sequence[str], name: str) -> list[str]:
    """The values of a tritonserver flag in `args`, written `--name=value` or `--name value`."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            values.append(arg[len(name) + 1:])
        elif arg == name and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def restriction_for(values: Sequence[str], api: str = "model-repository") -> tuple[str, str] | None:
    """The (header, value) a `--http-restricted-api` / `--grpc-restricted-protocol` list puts on `api`, if any.

    Each value reads `<api>[,<api>...]:<header>=<value>`.
    """
    for value in values:
        apis, sep, rule = value.partition(":")
        header, eq, secret = rule.partition("=")
        if sep and eq and api in [a.strip() for a in apis.split(",")]:
            return header.strip(), secret
    return None


@dataclass(frozen=True)
class ModelControl:
    """How this server's models are managed, decided from the settings and the user's extra flags."""

    mode: str  # tritonserver --model-control-mode: "explicit" unless the user chose another
    flags: tuple[str, ...]  # what the launcher adds to the command line for it
    header: tuple[str, str] | None  # (name, value) the CLI sends to reach the repository API; None when open
    grpc_header: tuple[str, str] | None = None  # the same over gRPC (differs if the user restricted it himself)

    @property
    def can_reload(self) -> bool:
        return self.mode == "explicit"

    @classmethod
    def decide(cls, settings: "ServerSettings", secret: str) -> "ModelControl":
        extra = settings.extra_args
        flags: list[str] = []
        modes = flag_values(extra, "--model-control-mode")
        mode = modes[-1] if modes else "explicit"
        if not modes:
            flags.append("--model-control-mode=explicit")
            if not flag_values(extra, "--load-model"):
                flags.append("--load-model=*")
        # A restriction the user set himself is kept, and used by the CLI too.
        header = user_http = restriction_for(flag_values(extra, "--http-restricted-api"))
        grpc_header = user_grpc = restriction_for(flag_values(extra, "--grpc-restricted-protocol"))
        if not settings.allow_model_control:
            header = user_http or (CONTROL_HEADER, secret)
            grpc_header = user_grpc or (CONTROL_HEADER, secret)
            if user_http is None:
                flags.append(f"--http-restricted-api=model-repository:{CONTROL_HEADER}={secret}")
            if user_grpc is None:
                flags.append(f"--grpc-restricted-protocol=model-repository:{CONTROL_HEADER}={secret}")
        return cls(mode, tuple(flags), header, grpc_header)


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child: receive SIGTERM if the launcher dies, so no server outlives it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class TritonServer:
    """One tritonserver process and everything laid out for it."""

    def __init__(self, settings: ServerSettings, triton: TritonDistribution | None = None, log: IO[str] | None = None):
        self.settings = settings
        self.triton = triton or find_triton()
        self.log = log if log is not None else sys.stdout
        self.shm_prefix = f"gebackend{os.getpid()}x{secrets.token_hex(3)}_"
        self.workdir: Path | None = None
        self.control_dir: Path | None = None
        self.process: subprocess.Popen | None = None
        self.tail: deque[str] = deque(maxlen=60)
        self._reader: threading.Thread | None = None
        self.control = ModelControl.decide(settings, secrets.token_hex(24))
        self._line_watchers: list = []
        self._grpc_channel = None
        self._grpc_stub = None

    # -- start ---------------------------------------------------------------------------------
    def command(self, backends: Path) -> list[str]:
        s = self.settings
        cmd = [
            str(self.triton.server_binary),
            f"--model-repository={s.model_repository}",
            f"--backend-directory={backends}",
            f"--cache-directory={self.triton.caches}",
            f"--http-port={s.http_port}",
            f"--grpc-port={s.grpc_port}",
            f"--metrics-port={s.metrics_port}",
            "--exit-on-error=false",  # a model that fails to load must not take the others down
            f"--exit-timeout-secs={s.exit_timeout}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *self.control.flags,
        ]
        cmd += [f"--backend-config={value}" for value in s.triton_backend_configs]
        return cmd + list(s.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The stub embeds Python: it finds its packages through the first python3 on PATH ...
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        # ... and needs libpython of the same version.
        libdirs = [str(self.triton.libs)]
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):
            libdirs.insert(0, str(sysconfig.get_config_var("LIBDIR")))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libdirs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
        env[control_env.BACKEND_CONFIG] = json.dumps(self.settings.backend_options)
        env[control_env.MODEL_REPOSITORY] = str(self.settings.model_repository)
        if self.control_dir is not None:
            env[control_env.CONTROL_DIR] = str(self.control_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self) -> None:
        s = self.settings
        if not s.model_repository.is_dir():
            raise LaunchError(f"model repository {s.model_repository} is not a folder")
        for label, port in (("HTTP", s.http_port), ("gRPC", s.grpc_port), ("metrics", s.metrics_port)):
            if port_in_use(port):
                raise LaunchError(f"{label} port {port} is already in use; choose another with --{label.lower()}-port")
        for leftover in registry.sweep_stale(SHM_DIR):
            self.log.write(f"gebackend: removed {leftover}, left by a server whose gebackend process was killed\n")
        self.workdir = Path(tempfile.mkdtemp(prefix="gebackend-"))
        backends = lay_out_backends(self.triton, self.workdir)
        self.control_dir = self.workdir / "control"
        self.control_dir.mkdir()
        registry.register(s.http_port, self.control_dir)
        self.process = subprocess.Popen(
            self.command(backends),
            env=self.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches us, and we stop the server in order
            preexec_fn=_die_with_parent,
            text=True,
            errors="replace",
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line)
            for watcher in list(self._line_watchers):
                watcher(line)
            self.log.write(line)
            self.log.flush()

    def watch_lines(self, callback) -> None:
        """Call `callback(line)` for every later line tritonserver prints (from the reader thread)."""
        self._line_watchers.append(callback)

    def wait_ready(self, stop: threading.Event | None = None) -> list[dict]:
        """Wait until the HTTP endpoint answers; return the repository index (every model and its state).

        Returns early (with an empty index) once `stop` is set, so Ctrl-C during a long start-up is obeyed.
        """
        deadline = time.monotonic() + self.settings.startup_timeout
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                return []
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                if self._reader is not None:
                    self._reader.join(timeout=2)
                raise LaunchError(f"tritonserver exited with code {code} before it was ready:\n{self._last_errors()}")
            try:
                with urllib.request.urlopen(self.url("/v2/health/live"), timeout=1) as response:
                    live = response.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                live = False
            if live:
                try:
                    return self.repository_index()
                except _RepositoryError as exc:
                    raise LaunchError(f"tritonserver refused the model repository index: {exc.status} {exc}") from None
            time.sleep(0.2)
        raise LaunchError(f"tritonserver was not ready within {self.settings.startup_timeout:.0f}s:\n{self._last_errors()}")

    def _last_errors(self) -> str:
        lines = [line for line in self.tail if line[:1] in "EW" or "error" in line.lower()] or list(self.tail)
        return "".join(lines[-20:]).rstrip() or "(no output)"

    def url(self, path: str) -> str:
        addresses = flag_values(self.settings.extra_args, "--http-address")
        host = addresses[-1] if addresses and addresses[-1] not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.settings.http_port}{path}"

    # -- the model-repository API, for this CLI only --------------------------------------------
    # Over gRPC: in tritonserver 2.51 an HTTP load or unload blocks an HTTP front-end thread for as long as
    # the load takes (measured: HTTP inference to other models stalls ~2 s per reload), a gRPC one does not.
    def _use_grpc(self) -> bool:
        allowed = flag_values(self.settings.extra_args, "--allow-grpc")
        return not allowed or allowed[-1].lower() not in ("false", "0", "no", "off")

    def _grpc(self):
        if self._grpc_stub is None:
            import grpc
            from tritonclient.grpc import service_pb2_grpc

            addresses = flag_values(self.settings.extra_args, "--grpc-address")
            host = addresses[-1] if addresses and addresses[-1] not in ("", "0.0.0.0", "::") else "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
            self._grpc_channel = grpc.insecure_channel(f"{host}:{self.settings.grpc_port}")
            self._grpc_stub = service_pb2_grpc.GRPCInferenceServiceStub(self._grpc_channel)
        return self._grpc_stub

    def _grpc_call(self, method: str, request, timeout: float):
        import grpc

        # Triton reads a restricted gRPC protocol's header with this prefix.
        header = self.control.grpc_header
        metadata = [(f"triton-grpc-protocol-{header[0]}".lower(), header[1])] if header else []
        try:
            return getattr(self._grpc(), method)(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise _RepositoryError(exc.details() or str(exc.code()), str(exc.code())) from None

    def _http_call(self, path: str, timeout: float) -> bytes:
        """POST to Triton's model-repository API with the header that unlocks it for us."""
        headers = {"Content-Type": "application/json"}
        if self.control.header is not None:
            headers[self.control.header[0]] = self.control.header[1]
        request = urllib.request.Request(self.url(path), data=b"{}", method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise _RepositoryError(_body(exc), str(exc.code)) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            raise _RepositoryError(str(exc), "") from None

    def repository_index(self) -> list[dict]:
        """Every model in the repository with its state (and the reason when it is not READY)."""
        if not self._use_grpc():
            return json.loads(self._http_call("/v2/repository/index", timeout=10) or b"[]")
        from tritonclient.grpc import service_pb2

        response = self._grpc_call("RepositoryIndex", service_pb2.RepositoryIndexRequest(), timeout=10)
        return [{key: value for key, value in (("name", m.name), ("version", m.version), ("state", m.state),
                                              ("reason", m.reason)) if value} for m in response.models]

    def load_model(self, name: str, timeout: float = 600) -> None:
        """Load (or reload, if loaded and changed) one model; raises `LaunchError` with Triton's reason if it fails."""
        self._model_call(name, "load", timeout)

    def unload_model(self, name: str, timeout: float = 600) -> None:
        self._model_call(name, "unload", timeout)

    def _model_call(self, name: str, action: str, timeout: float) -> None:
        try:
            if self._use_grpc():
                from tritonclient.grpc import service_pb2

                if action == "load":
                    self._grpc_call("RepositoryModelLoad", service_pb2.RepositoryModelLoadRequest(model_name=name), timeout)
                else:
                    self._grpc_call("RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(model_name=name),
                                    timeout)
            else:
                self._http_call(f"/v2/repository/models/{urllib.parse.quote(name, safe='')}/{action}", timeout)
        except _RepositoryError as exc:
            raise LaunchError(f"{action} of model '{name}' failed: {exc}") from None

    # -- stop ----------------------------------------------------------------------------------
    def drain(self, timeout: float, broken: set[str] = frozenset()) -> "Drain":
        """Unload every model so Triton finishes their queued and running requests; new requests are refused.

        Bounded by `timeout` seconds. Needs explicit model control (the default); see `shutdown`.
        `broken`: models serving with a dead stub. Triton 2.51 never finishes unloading such a model once a
        request met the dead stub (that request is answered 500 but never released), so they are unloaded
        without being waited for: they have nothing left to finish.
        """
        started = time.monotonic()
        deadline = started + timeout

        def loaded() -> list[str]:
            return [e["name"] for e in self.repository_index() if e.get("state") in _LOADED_STATES]

        try:
            busy = loaded()
            for name in busy:
                self.unload_model(name, timeout=max(1.0, deadline - time.monotonic()))
            busy = [name for name in busy if name not in broken]
            while busy and time.monotonic() < deadline:
                time.sleep(0.1)
                busy = [name for name in loaded() if name not in broken]
        except (GeBackendError, OSError, ValueError) as exc:
            return Drain(False, [], time.monotonic() - started, str(exc))
        return Drain(not busy, sorted(busy), time.monotonic() - started, broken=sorted(broken))

    def shutdown(self, grace: float = 3.0, broken: set[str] = frozenset()) -> "Shutdown":
        """Stop in order: drain (bounded by the exit timeout), SIGTERM, clean up. Never leaves a process or region behind.

        Fact (tritonserver 2.51): after SIGTERM Triton waits, up to --exit-timeout-secs, for every client
        connection to close, an idle keep-alive one included, and then exits 1 ("Exit timeout expired")
        even though nothing was in flight. Once the drain has finished every request there is nothing left
        to wait for, so the server gets `grace` seconds and is then ended, and the stop is still clean.
        """
        if self.process is None or self.process.poll() is not None:
            code = self.stop()
            return Shutdown(code, None, exited_by_itself=True)
        drain = self.drain(self.settings.exit_timeout, broken) if self.control.can_reload else None
        waiting: list[str] = []

        def note(line: str) -> None:
            what = _waiting_on(line)
            if what:
                waiting.append(what)

        self.watch_lines(note)
        if drain is not None and drain.busy:  # out of time with requests still running: the bound is the bound
            self._kill_group()
            return Shutdown(self._finish(self.process.wait()), drain, False, None)
        # After a finished drain nothing is left to wait for but Triton's own exit; after one that failed having
        # used up the exit timeout (a model load hung in Triton, say) neither: the bound is the bound. Without a
        # drain, Triton drains.
        spent = drain is not None and drain.seconds >= self.settings.exit_timeout - 1
        wait = grace if drain is not None and (drain.complete or spent) else self.settings.exit_timeout + 15
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=wait)
            by_itself = True
        except subprocess.TimeoutExpired:
            self._kill_group()
            code = self.process.wait()
            by_itself = False
        return Shutdown(self._finish(code), drain, by_itself, waiting[-1] if waiting else None)

    def _finish(self, code: int) -> int:
        if self.process is not None:
            self._kill_group()  # stubs that outlived the server
            if self._reader is not None:
                self._reader.join(timeout=5)
        self.cleanup()
        return code

    def stop(self, timeout: float | None = None) -> int:
        """SIGTERM the server, wait for it (bounded), then remove what it left. Returns its exit code."""
        code = 0
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout=timeout if timeout is not None else self.settings.exit_timeout + 15)
            except subprocess.TimeoutExpired:
                self._kill_group()
                code = self.process.wait()
        return self._finish(code)

    def _kill_group(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def leftover_shm(self) -> list[Path]:
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*")) if SHM_DIR.is_dir() else []

    def cleanup(self) -> None:
        if self._grpc_channel is not None:
            self._grpc_channel.close()
            self._grpc_channel = self._grpc_stub = None
        for region in self.leftover_shm():
            region.unlink(missing_ok=True)
        if self.workdir is not None:
            registry.unregister(self.settings.http_port)
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


_LOADED_STATES = ("READY", "LOADING", "UNLOADING")


@dataclass(frozen=True)
class Drain:
    complete: bool  # every model unloaded: no request was left in flight
    busy: list[str]  # models still unloading (requests still running) when the time ran out
    seconds: float
    error: str = ""
    broken: list[str] = field(default_factory=list)  # models with a dead stub, unloaded without waiting


@dataclass(frozen=True)
class Shutdown:
    code: int  # tritonserver's exit code (negative: the signal that ended it)
    drain: Drain | None  # None: no drain (the server had exited, or model control is not explicit)
    exited_by_itself: bool  # False: it was still waiting (for client connections) after the drain and was ended
    waiting_on: str | None = None  # the last thing Triton said it waited for, e.g. "1 HTTP service connections"

    @property
    def clean(self) -> bool:
        """Every in-flight request finished and nothing is left behind."""
        if self.drain is not None:
            return self.drain.complete
        return self.code in (0, -signal.SIGTERM)


def _waiting_on(line: str) -> str | None:
    """What tritonserver says it still waits for while exiting, e.g. "1 HTTP service connections"."""
    # "Timeout 29: Found 1 HTTP service connections" / "Timeout 27: Found 1 live models and 0 in-flight ..."
    found = line.find(": Found ")
    if found < 0 or "Timeout " not in line[:found]:
        return None
    return line[found + len(": Found "):].strip().rstrip('"').strip()


def repository_fingerprints(repository: Path) -> dict[str, tuple]:
    """Per model folder, the (path, size, mtime) of every file in it: what a reload compares. Hidden folders (the
    caches gebackend keeps beside a model, `.gebackend-cache/`) are not the model: writing them reloads nothing."""
    found = {}
    for folder in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        entries = []
        for path in sorted(folder.rglob("*")):
            if any(part.startswith(".") for part in path.relative_to(folder).parts):
                continue
            try:
                stat = path.stat()
            except OSError:
                continue
            if path.is_file():
                entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
        found[folder.name] = tuple(entries)
    return found


def _body(error: urllib.error.HTTPError) -> str:
    try:
        text = error.read().decode(errors="replace")
        return json.loads(text).get("error", text)
    except (ValueError, AttributeError, OSError):
        return str(error)


def load_failure_reason(entry: dict) -> str:
    """Triton's reason for a model that did not load, without the Python stack it appends."""
    return (entry.get("reason") or entry.get("state") or "").split("\n\nAt:")[0].strip()


def format_model_table(index: Sequence[dict]) -> list[str]:
    lines = []
    for entry in sorted(index, key=lambda e: e.get("name", "")):
        version = f" v{entry['version']}" if entry.get("version") else ""
        state = entry.get("state") or "UNKNOWN"
        reason = f" - {load_failure_reason(entry)}" if entry.get("reason") and state != "READY" else ""
        lines.append(f"  {entry.get('name')}{version}: {state}{reason}")
    return lines
