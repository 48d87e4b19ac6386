"""Starts tritonserver with our backends, watches it come up, and stops it leaving nothing behind.

Owns: the command line and environment of the server process, the port pre-flight check,
waiting for readiness (or for the reason it will never be ready), the model status table,
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
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

from gebackend.config.model_file import REPOSITORY_ENV_VAR
from gebackend.config.options import ENV_VAR as OPTIONS_ENV_VAR
from gebackend.errors import GeBackendError
from gebackend.server.distribution import TritonDistribution, find_triton
from gebackend.server import registry
from gebackend.server.layout import lay_out_backends
from gebackend.server.registry import CONTROL_ENV_VAR

SHM_DIR = Path("/dev/shm")


class LaunchError(GeBackendError):
    """The server could not be started or did not become ready."""


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
        env[OPTIONS_ENV_VAR] = json.dumps(self.settings.backend_options)
        env[REPOSITORY_ENV_VAR] = str(self.settings.model_repository)
        if self.control_dir is not None:
            env[CONTROL_ENV_VAR] = str(self.control_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self) -> None:
        s = self.settings
        if not s.model_repository.is_dir():
            raise LaunchError(f"model repository {s.model_repository} is not a folder")
        for label, port in (("HTTP", s.http_port), ("gRPC", s.grpc_port), ("metrics", s.metrics_port)):
            if port_in_use(port):
                raise LaunchError(f"{label} port {port} is already in use; choose another with --{label.lower()}-port")
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
            self.log.write(line)
            self.log.flush()

    def wait_ready(self) -> list[dict]:
        """Wait until the HTTP endpoint answers; return the repository index (every model and its state)."""
        deadline = time.monotonic() + self.settings.startup_timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                if self._reader is not None:
                    self._reader.join(timeout=2)
                raise LaunchError(f"tritonserver exited with code {code} before it was ready:\n{self._last_errors()}")
            try:
                with urllib.request.urlopen(self.url("/v2/health/live"), timeout=1) as response:
                    if response.status == 200:
                        return self.repository_index()
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.2)
        raise LaunchError(f"tritonserver was not ready within {self.settings.startup_timeout:.0f}s:\n{self._last_errors()}")

    def _last_errors(self) -> str:
        lines = [line for line in self.tail if line[:1] in "EW" or "error" in line.lower()] or list(self.tail)
        return "".join(lines[-20:]).rstrip() or "(no output)"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.settings.http_port}{path}"

    def repository_index(self) -> list[dict]:
        request = urllib.request.Request(self.url("/v2/repository/index"), data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"[]")

    # -- stop ----------------------------------------------------------------------------------
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
            self._kill_group()  # stubs that outlived the server
            if self._reader is not None:
                self._reader.join(timeout=5)
        self.cleanup()
        return code

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
        for region in self.leftover_shm():
            region.unlink(missing_ok=True)
        if self.workdir is not None:
            registry.unregister(self.settings.http_port)
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


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
