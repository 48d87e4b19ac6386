"""The bench's and tune's server start (bench/server.py) through the real CLI: a port another process takes between
its pick and the server's bind costs a retry on new ports, not the measurement."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from gebackend.bench import server as bench_server
from gebackend.modelzoo import build_add_mul
from gebackend.server.ports import free_ports

from .conftest import ADD_MUL_CONFIG, add_model
from .server import taken_port

pytestmark = pytest.mark.e2e


def test_a_port_taken_before_the_bind_is_retried_on_new_ones(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    with taken_port() as port:
        picks = iter([[port, *free_ports(2)]])  # the first pick's HTTP port is the one taken
        real = bench_server.free_ports
        monkeypatch.setattr(bench_server, "free_ports", lambda count: next(picks, None) or real(count))
        server = bench_server.start(repo, tmp_path / "serve.log", timeout=240)
    try:
        assert server.http_port != port and next(picks, None) is None
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        client = httpclient.InferenceServerClient(server.http_url)
        inputs = []
        for name in ("x", "y"):
            inputs.append(httpclient.InferInput(name, list(x.shape), "FP32"))
            inputs[-1].set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer("add_mul", inputs).as_numpy("sum"), x + x)
    finally:
        server.stop()
