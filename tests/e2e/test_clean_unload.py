"""A clean unload and stop through the real server: every backend stub exits 0, and a model's `gebackend_*` series
leave /metrics with it, for a dynamic, a static and an OpenVINO model, a model of two instances and a preprocessing
model (CN_CLIP's images).

How a stub ended is read through a wrapper: Triton 2.51 starts a `triton_python_backend_stub` found in a model's
folder instead of its own, so each model folder gets a script that runs the wheel's stub as its child and writes
down its exit status (139 is the SIGSEGV that tritonserver 2.51's stub died of when a model kept pb_utils metrics
past `finalize()`). One server serves the module.
"""

from __future__ import annotations

import io
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from gebackend.modelzoo import build_add_mul
from gebackend.server.distribution import find_triton

from .conftest import ADD_MUL_CONFIG, add_model, params
from .server import RunningServer, start_server
from .test_lifecycle import Footprint, add_mul_plus, add_mul_request, wait_for

pytestmark = pytest.mark.e2e

STUB = "triton_python_backend_stub"
SMALL = 'backend: "ge"\nmax_batch_size: 4\n'
MODELS = {  # the ones unloaded (their folders removed), each of another kind
    "dynamic": ADD_MUL_CONFIG,
    "static": SMALL + params(static_model="1"),
    "openvino": SMALL + params(engine="openvino"),
    "two": SMALL + "instance_group [ { count: 2, kind: KIND_CPU } ]\n",
}
KEPT = "kept"  # changed on disk instead: reloaded, then stopped with the server
PREPROCESS = "image_preprocess"  # unloaded too; it has no series of its own
WRAPPER = """#!/bin/sh
# the wheel's stub, run as a child so that how it ended can be written down
"{stub}" "$@"
status=$?
if [ $# -ge 8 ]; then echo "$8 $$ $status" >> "{record}"; fi
exit $status
"""


def _wrap(folder: Path, record: Path) -> None:
    wrapper = folder / STUB
    wrapper.write_text(WRAPPER.format(stub=find_triton().stub(), record=record))
    wrapper.chmod(0o755)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean_unload")
    repo, record = root / "models", root / "stub_exits.txt"
    for name, config in {**MODELS, KEPT: ADD_MUL_CONFIG}.items():
        model = add_model(repo, name, config, add_mul_plus(0.0) if name == KEPT else build_add_mul())
        _wrap(model.parent.parent, record)
    (repo / PREPROCESS / "1").mkdir(parents=True)
    (repo / PREPROCESS / "config.pbtxt").write_text('backend: "cnclip_image_preprocess"\n')
    _wrap(repo / PREPROCESS, record)
    server = start_server(repo, root / "serve.log")
    footprint = Footprint.of(server)
    yield server, repo, record
    server.stop()
    assert footprint.leftovers() == []


def wrappers(server: RunningServer) -> dict[int, tuple[str, str]]:
    """The running stubs of the server's instances, by the pid Triton knows (the wrapper's): (model folder, instance)."""
    found = {}
    for process, args in server.children_and_command_lines():
        if len(args) > 9 and args[1].endswith(STUB) and args[9] != Path(args[2]).parent.parent.name:
            found[process.pid] = (Path(args[2]).parent.parent.name, args[9])
    return found


def exits(record: Path) -> dict[int, tuple[str, int]]:
    """pid -> (stub name, exit status), as the wrappers wrote them down."""
    lines = record.read_text().split("\n") if record.exists() else []
    return {int(pid): (name, int(status)) for name, pid, status in (line.split() for line in lines if line)}


def wait_for_exits(record: Path, pids: set[int], timeout: float = 60) -> dict[int, tuple[str, int]]:
    deadline = time.monotonic() + timeout
    while not pids <= set(exits(record)):
        assert time.monotonic() < deadline, f"no exit written down for pids {sorted(pids - set(exits(record)))}"
        time.sleep(0.1)
    return {pid: exit for pid, exit in exits(record).items() if pid in pids}


def png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def series(server: RunningServer) -> dict[str, list[str]]:
    """Model -> its `gebackend_*` series on /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("gebackend_") and 'model="' in line:
            found.setdefault(line.split('model="', 1)[1].split('"', 1)[0], []).append(line)
    return found


def test_an_unload_deletes_the_series_and_every_stub_exits_0(served):
    server, repo, record = served
    client = httpclient.InferenceServerClient(server.http_url)
    for name in [*MODELS, KEPT]:
        got = client.infer(name, add_mul_request(httpclient, 1.0)).as_numpy("sum")
        np.testing.assert_array_equal(got, np.full((1, 4), 2.0, np.float32))
    image = httpclient.InferInput("image", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[png()]], dtype=object))
    assert client.infer(PREPROCESS, [image]).as_numpy("pixel_values").shape == (1, 3, 224, 224)
    client.close()
    assert set(series(server)) >= {*MODELS, KEPT}, "each model publishes its series while it serves"
    before = wrappers(server)
    assert sorted(instance for model, instance in before.values() if model == "two") == ["two_0_0", "two_0_1"]
    for name in [*MODELS, PREPROCESS]:
        shutil.rmtree(repo / name)
    onnx.save(add_mul_plus(1.0), str(repo / KEPT / "1" / "model.onnx"))
    server.process.send_signal(signal.SIGHUP)
    wait_for(server, f"gebackend: reload: model '{KEPT}' reloaded in ", 1)
    for name in [*MODELS, PREPROCESS]:
        wait_for(server, f"gebackend: reload: model '{name}' is gone from the repository; unloaded", 1)

    deadline, stale = time.monotonic() + 20, {}
    while time.monotonic() < deadline:
        stale = {model: lines for model, lines in series(server).items() if model in MODELS}
        if not stale:
            break
        time.sleep(0.2)
    assert stale == {}, f"series left after the unload: {stale}"
    assert KEPT in series(server), "the reloaded model's new instance publishes on"

    ended = wait_for_exits(record, set(before))
    print(f"\nstub exits after the unload and the reload: {sorted(ended.values())}")
    assert {pid: status for pid, (_, status) in ended.items() if status != 0} == {}, ended
    assert "Error when deleting" not in server.output()  # the stub's complaint about a metric it could not delete


def test_a_stop_lets_every_stub_exit_0(served):
    server, _, record = served
    running = wrappers(server)
    assert running, "the server should have an instance running"
    started = time.monotonic()
    server.process.send_signal(signal.SIGINT)
    code = server.process.wait(timeout=60)
    seconds = time.monotonic() - started
    out = server.output()
    assert code == 0, out[-3000:]
    assert "gebackend: stopped cleanly" in out
    ended = wait_for_exits(record, set(running), timeout=10)
    print(f"\nstub exits at the stop ({seconds:.1f}s): {sorted(ended.values())}")
    assert {pid: status for pid, (_, status) in ended.items() if status != 0} == {}, ended
