"""Starts `gebackend serve` as a user would (the real CLI, the real tritonserver) on free ports, for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil

from gebackend.server.ports import free_ports, port_taken

GEBACKEND = [sys.executable, "-m", "gebackend.cli.main"]


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port another process listens on while the block runs (on every address, as a server would take it)."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        yield taken.getsockname()[1]


@dataclass
class RunningServer:
    process: subprocess.Popen
    log_path: Path
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def tritonserver(self) -> psutil.Process:
        """The tritonserver process `gebackend serve` started."""
        return next(p for p in psutil.Process(self.process.pid).children() if p.name() == "tritonserver")

    def children_and_command_lines(self) -> list[tuple[psutil.Process, list[str]]]:
        """tritonserver's child processes (its stubs) with their command lines, those still readable."""
        found = []
        for process in self.tritonserver().children():
            try:
                found.append((process, process.cmdline()))
            except psutil.Error:
                continue
        return found

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 120) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"gebackend serve did not stop within {timeout:.0f}s of SIGTERM:\n{self.output()[-3000:]}") from None


def start_server(repo: Path, log_path: Path, cli_args: list[str] = (), timeout: float = 240, attempts: int = 3) -> RunningServer:
    """Start `gebackend serve` on free ports; if another process takes a port between our pick and the
    server's bind (the CLI then refuses at once), pick new ports and try again."""
    for attempt in range(1, attempts + 1):
        try:
            return _start_once(repo, log_path, list(cli_args), timeout)
        except PortTaken:
            if attempt == attempts:
                raise


class PortTaken(RuntimeError):
    pass


def _start_once(repo: Path, log_path: Path, cli_args: list[str], timeout: float) -> RunningServer:
    ports = free_ports(3)
    cmd = GEBACKEND + [
        "serve", str(repo),
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        *cli_args,
    ]
    log = open(log_path, "w")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    server = RunningServer(process, log_path, *ports)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "gebackend: ready" in server.output():
            return server
        if process.poll() is not None:
            error = PortTaken if port_taken(server.output()) else RuntimeError
            raise error(f"gebackend serve exited with {process.returncode}:\n{server.output()[-5000:]}")
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"gebackend serve not ready after {timeout}s:\n{server.output()[-5000:]}")
