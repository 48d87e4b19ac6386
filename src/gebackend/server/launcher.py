"""Starts tritonserver with our backends, watches it come up, and stops it leaving nothing behind: the process.

Owns: the command line and environment of the server process, the port pre-flight check, waiting for
readiness (or for the reason it will never be ready), draining and stopping it, and clean-up of the temp
folder and the `/dev/shm` regions of this server. Its model-repository API (explicit model control behind a
secret header) is `repository_client.py`'s, reached as `TritonServer.repository`.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
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
from typing import IO

from gebackend.errors import GeBackendError
from gebackend.server.distribution import TritonDistribution, find_triton
from gebackend.control import env as control_env, registry
from gebackend.server.layout import lay_out_backends
from gebackend.server.ports import port_in_use, shared_port
from gebackend.server.repository_client import LaunchError, ModelControl, RepositoryClient, RepositoryError

SHM_DIR = Path("/dev/shm")


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
        self.repository = RepositoryClient(settings, self.control)  # index, load, unload: the watchdog's too
        self._line_watchers: list = []

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
        ports = {"HTTP": s.http_port, "gRPC": s.grpc_port, "metrics": s.metrics_port}
        if (clash := shared_port(ports)) is not None:
            raise LaunchError(f"{clash}; choose another with --http-port, --grpc-port or --metrics-port")
        for label, port in ports.items():
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
                    return self.repository.repository_index()
                except RepositoryError as exc:
                    raise LaunchError(f"tritonserver refused the model repository index: {exc.status} {exc}") from None
            time.sleep(0.2)
        raise LaunchError(f"tritonserver was not ready within {self.settings.startup_timeout:.0f}s:\n{self._last_errors()}")

    def _last_errors(self) -> str:
        lines = [line for line in self.tail if line[:1] in "EW" or "error" in line.lower()] or list(self.tail)
        return "".join(lines[-20:]).rstrip() or "(no output)"

    def url(self, path: str) -> str:
        return self.repository.url(path)

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
            return [e["name"] for e in self.repository.repository_index() if e.get("state") in _LOADED_STATES]

        try:
            busy = loaded()
            for name in busy:
                self.repository.unload_model(name, timeout=max(1.0, deadline - time.monotonic()))
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
        self.repository.close()
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


