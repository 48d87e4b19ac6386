"""The server's life: clean shutdown leaves nothing behind, and a server that cannot start says why, fast."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from gebackend.modelzoo import build_add_mul

from .conftest import ADD_MUL_CONFIG, add_model
from .server import GEBACKEND, free_port, start_server

pytestmark = pytest.mark.e2e


def ours_in_shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("gebackend*")}


def test_clean_shutdown_leaves_no_shm_or_temp_folders(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    shm_before = ours_in_shm()
    temp_before = set(Path("/tmp").glob("gebackend-*"))
    server = start_server(repo, tmp_path / "serve.log")
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    y = httpclient.InferInput("y", [1, 4], "FP32")
    y.set_data_from_numpy(np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(client.infer("add_mul", [x, y]).as_numpy("sum"), np.full((1, 4), 2, np.float32))
    assert ours_in_shm() - shm_before, "the server should hold shm regions while running"
    client.close()  # an open keep-alive connection holds Triton's shutdown until --exit-timeout
    assert server.stop() == 0, server.output()[-3000:]
    assert ours_in_shm() - shm_before == set()
    assert set(Path("/tmp").glob("gebackend-*")) - temp_before == set()
    assert "gebackend: stopped" in server.output()


def test_port_in_use_fails_fast_with_reason(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            GEBACKEND + ["serve", str(repo), "--http-port", str(port), "--grpc-port", str(free_port()),
                         "--metrics-port", str(free_port())],
            capture_output=True, text=True, timeout=60,
        )
    assert done.returncode != 0
    assert f"HTTP port {port} is already in use" in done.stderr
    assert time.monotonic() - started < 30


def test_missing_repository_fails_fast(tmp_path):
    done = subprocess.run(GEBACKEND + ["serve", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "is not a folder" in done.stderr
