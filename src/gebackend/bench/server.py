"""Runs `gebackend serve` (the real CLI and tritonserver) on free ports for one scenario, and stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.server.layout import extra_backends_env
from gebackend.server.ports import free_ports, port_taken

GEBACKEND = [sys.executable, "-m", "gebackend.cli.main"]
_FAILED = re.compile(r"gebackend: model '([^']+)' failed to load: (.*)")


class ServeError(RuntimeError):
    pass


@dataclass
class BenchServer:
    process: subprocess.Popen
    log_path: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    started: float

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def failures(self) -> dict[str, str]:
        """Models the server reported as failed to load, and why."""
        return {m.group(1): m.group(2).strip() for m in _FAILED.finditer(self.output())}

    def stop(self, timeout: float = 90) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()  # the CLI's own child dies with it (parent-death signal)
            return self.process.wait(timeout=30)


def start(repo: Path, log_path: Path, cli_args: Sequence[str] = (), timeout: float = 600,
          extra_backends: Mapping[str, Path] | None = None, attempts: int = 3) -> BenchServer:
    """Start `gebackend serve REPO` and wait for "gebackend: ready" (raises ServeError with the log tail).

    `extra_backends` (backend name -> folder, e.g. the peer's onnxruntime backend) are laid out beside ours in the
    server's backends folder ($GE_EXTRA_BACKENDS, gebackend.server.layout). A server that exits because another
    process took one of its ports between their pick and its bind is started again on new ones, `attempts` in all."""
    for attempt in range(1, attempts + 1):
        try:
            return _start_once(repo, log_path, cli_args, timeout, extra_backends)
        except _PortTaken as exc:
            if attempt == attempts:
                raise ServeError(str(exc)) from None
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    pass


def _start_once(repo: Path, log_path: Path, cli_args: Sequence[str], timeout: float,
                extra_backends: Mapping[str, Path] | None) -> BenchServer:
    ports = free_ports(3)
    cmd = GEBACKEND + [
        "serve", str(repo),
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--startup-timeout", str(int(timeout)), *cli_args,
    ]
    log = open(log_path, "w")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=dict(os.environ, PYTHONUNBUFFERED="1", **extra_backends_env(extra_backends or {})))
    log.close()
    server = BenchServer(process, log_path, *ports, started=time.monotonic())
    deadline = time.monotonic() + timeout + 30
    try:
        while time.monotonic() < deadline:
            if "gebackend: ready" in server.output():
                return server
            if process.poll() is not None:
                error = _PortTaken if port_taken(server.output()) else ServeError
                raise error(f"gebackend serve exited with {process.returncode}:\n{_tail(server.output())}")
            time.sleep(0.25)
    except BaseException:
        server.stop()  # Ctrl-C while the server starts must not leave it running
        raise
    server.stop()
    raise ServeError(f"gebackend serve not ready after {timeout:.0f}s:\n{_tail(server.output())}")


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
