"""examples/client.py without a server: one line saying where it looked and what to do, exit status 2, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_server_is_one_clear_line_not_a_traceback():
    port = _closed_port()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "client.py"), "--http", f"127.0.0.1:{port}",
                           "--grpc", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"no Triton server answers http at 127.0.0.1:{port}" in done.stderr and "make serve" in done.stderr, done.stderr
