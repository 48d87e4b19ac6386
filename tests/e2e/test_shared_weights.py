"""One copy of the weights for two instances (`share_weights`) through the real server: both instances' stubs map the
one file of prepacked weights the first wrote, the kernel counts each stub half of it, and they answer as
ONNX Runtime does on the model's own file; with share_weights=off each stub holds its own weights, mapped from no
such file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from gebackend.modelzoo import build_weights_mlp
from gebackend.server.stubs import stub_identity

from .conftest import add_model, params
from .server import start_server

pytestmark = pytest.mark.e2e

WIDTH = 1024
WEIGHTS_MIB = 64  # share_weights=auto's threshold: two layers of two [1024, 4096] fp32 weights
CONFIG = """backend: "ge"
max_batch_size: 8
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


def mapped_weights(pid: int) -> tuple[int, int]:
    """(Rss, Pss) in bytes of the process's mappings of a shared-weights file."""
    rss = pss = 0
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[-1].endswith(".weights") and ".shared." in fields[-1]
        elif inside and fields[0] == "Rss:":
            rss += int(fields[1]) << 10
        elif inside and fields[0] == "Pss:":
            pss += int(fields[1]) << 10
    return rss, pss


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("shared") / "models"
    path = add_model(repo, "mlp_shared", CONFIG, build_weights_mlp(WEIGHTS_MIB, WIDTH))
    add_model(repo, "mlp_own", CONFIG + params(share_weights="off"), onnx.load(str(path)))
    server = start_server(repo, repo.parent / "serve.log")
    yield server, path
    server.stop()


def stubs_of(server, model: str) -> list[int]:
    return [process.pid for process, argv in server.children_and_command_lines()
            if (stub_identity(argv) or ("", ""))[0] == model]


@pytest.mark.parametrize("model", ["mlp_shared", "mlp_own"])
def test_both_instances_answer_as_onnxruntime(served, model):
    server, path = served
    x = np.random.default_rng(2).standard_normal((3, WIDTH)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(4):  # the two instances take turns
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer(model, [tensor]).as_numpy("y"), expected, rtol=1e-4, atol=1e-5)


def test_two_instances_map_one_copy_of_the_weights(served):
    server, _ = served
    log = server.output()
    said = [line for line in log.splitlines() if "model 'mlp_shared' instance" in line and " loaded " in line]
    assert len(said) == 2, said
    assert all(f"share_weights: {WEIGHTS_MIB} MiB of weights mapped from model.shared." in line for line in said), said
    assert sum("(written now)" in line for line in said) == 1, said  # the second instance reused the first's file
    stubs = stubs_of(server, "mlp_shared")
    assert len(stubs) == 2, server.children_and_command_lines()
    for pid in stubs:
        rss, pss = mapped_weights(pid)
        assert rss >= 0.9 * (WEIGHTS_MIB << 20), (pid, rss)  # the prepacked weights are read from the file ...
        assert pss <= 0.6 * rss, (pid, rss, pss)  # ... whose pages the two stubs share


def test_share_weights_off_keeps_a_copy_in_each_instance(served):
    server, _ = served
    said = [line for line in server.output().splitlines() if "model 'mlp_own' instance" in line and " loaded " in line]
    assert len(said) == 2 and not any("share_weights" in line for line in said), said
    assert all(mapped_weights(pid) == (0, 0) for pid in stubs_of(server, "mlp_own"))
