"""Stubs that die early: before the server says it is ready, or on their first request. Each is noticed and its model
restored within the self-healing time docs/operations.md states; with self-healing off, Ctrl-C with such a dead
instance exits 0 within seconds, naming the model. And a SIGHUP with nothing changed reloads nothing, though every
`backend: "python"` model's stub wrote a `__pycache__` into its folder.

The models are `backend: "python"` models whose `model.py` kills its own process once (a marker file outside the
repository says it has): one half a second after it loaded, while a slow neighbour keeps the server from being ready, and
one on its first request. The first is seen only if the watchdog learns the stubs from the first load on (its
zombie's command line is empty), and a dead instance must not hold the stop for the whole --exit-timeout.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from .server import RunningServer, start_server
from .test_lifecycle import wait_for

pytestmark = pytest.mark.e2e

RESTORE_LIMIT_S = 10.0  # generous on 2 busy cores: noticing the death, the reload, the first answer
STOP_LIMIT_S = 10.0

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

MODEL = '''
import os
import signal
import threading
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

MARKER = Path({marker!r})  # once it exists, this model has died its one death
DIES = {dies!r}  # "after_load", "on_request" or ""


def die_once():
    if MARKER.exists():
        return False
    MARKER.write_text(str(os.getpid()))
    return True


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({load_seconds})
        if DIES == "after_load" and die_once():
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()

    def execute(self, requests):
        if DIES == "on_request" and die_once():
            os.kill(os.getpid(), signal.SIGKILL)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
'''


def python_model(repo: Path, name: str, dies: str = "", load_seconds: float = 0.0) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG)
    marker = repo.parent / f"{name}.died"
    (version / "model.py").write_text(MODEL.format(marker=str(marker), dies=dies, load_seconds=load_seconds))


def repository(root: Path) -> Path:
    repo = root / "models"
    python_model(repo, "dies_after_load", dies="after_load")
    python_model(repo, "slow", load_seconds=2.0)  # the server is ready only after dies_after_load died
    python_model(repo, "dies_on_request", dies="on_request")
    return repo


def ask(server: RunningServer, model: str, value: float = 3.0) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    try:
        tensor = httpclient.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([value], np.float32))
        return client.infer(model, [tensor]).as_numpy("y")
    finally:
        client.close()


def answers_again(server: RunningServer, model: str, limit: float) -> float:
    """Seconds until `model` answers correctly (failing the test past `limit`)."""
    started = time.monotonic()
    while True:
        try:
            np.testing.assert_array_equal(ask(server, model), np.array([3.0], np.float32))
            return time.monotonic() - started
        except Exception as exc:
            assert time.monotonic() - started < limit, f"{model} not restored within {limit:.0f}s: {exc}\n" \
                                                        f"{server.output()[-3000:]}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("early_deaths")


@pytest.fixture(scope="module")
def healing(root):
    server = start_server(repository(root), root / "serve.log")
    yield server
    assert server.stop() == 0, server.output()[-3000:]


def test_a_stub_dead_before_the_server_was_ready_is_restored(healing, root):
    assert (root / "dies_after_load.died").exists(), "the model should have died while the server started"
    seconds = answers_again(healing, "dies_after_load", RESTORE_LIMIT_S)
    print(f"\ndies_after_load answers {seconds:.1f}s after the server said ready")
    out = healing.output()
    assert "model 'dies_after_load': stub process of instance 'dies_after_load_0'" in out and \
        "died; reloading the model" in out, out[-3000:]
    assert "model 'dies_after_load': restored in " in out


def test_a_stub_that_dies_on_its_first_request_is_restored(healing):
    with pytest.raises(Exception, match="not healthy"):
        ask(healing, "dies_on_request")
    seconds = answers_again(healing, "dies_on_request", RESTORE_LIMIT_S)
    print(f"\ndies_on_request answers {seconds:.1f}s after its first request failed")
    assert "model 'dies_on_request': restored in " in healing.output()


def test_sighup_with_nothing_changed_reloads_nothing(healing, root):
    assert list((root / "models").glob("*/1/__pycache__/*.pyc")), "each stub should have written the byte code of its model.py"
    healing.process.send_signal(signal.SIGHUP)
    wait_for(healing, "gebackend: SIGHUP: reloading ", 1)
    assert "gebackend: SIGHUP: reloading nothing (no model folder changed)" in healing.output(), \
        healing.output()[-2000:]


def test_ctrl_c_with_an_instance_dead_since_the_start_exits_0_within_seconds(tmp_path):
    """Self-healing off: the instance that died before the server was ready stays dead; a request met it, so
    tritonserver can never unload its model. The stop does not wait for it, and says which model was down."""
    server = start_server(repository(tmp_path), tmp_path / "serve.log", ["--no-self-healing"])
    try:
        with pytest.raises(Exception, match="not healthy"):
            ask(server, "dies_after_load")
    finally:
        started = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        code = server.process.wait(timeout=120)
        seconds = time.monotonic() - started
    out = server.output()
    print(f"\nCtrl-C with a dead instance: exit {code} in {seconds:.1f}s")
    assert code == 0, out[-3000:]
    assert seconds <= STOP_LIMIT_S, out[-3000:]
    assert "gebackend: dies_after_load: a backend process had died and was not restored yet" in out, out[-3000:]
    assert "gebackend: stopped cleanly" in out
