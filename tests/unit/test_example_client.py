"""examples/client.py without a server: one line saying where it looked and what to do, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gebackend.server.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]


def test_no_server_is_one_clear_line_not_a_traceback():
    port, = free_ports(1)  # free a moment ago: nothing listens there
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "client.py"), "--http", f"127.0.0.1:{port}",
                           "--grpc", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"no Triton server answers http at 127.0.0.1:{port}" in done.stderr and "make serve" in done.stderr, done.stderr
