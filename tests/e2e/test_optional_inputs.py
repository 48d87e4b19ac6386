"""Optional inputs through the real Triton, as Triton's onnxruntime backend serves them: initializers the ONNX file
also lists as graph inputs, declared in config.pbtxt with `optional: true` on a model without batching. A request
may leave them out (the file's value runs) or send its own; answers are ONNX Runtime's on the original file, fed the
same tensors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tritonclient.http as httpclient

from gebackend.modelzoo import SCALE_SHIFT_OPTIONAL, build_scale_shift

from .conftest import add_model, params
from .server import start_server
from .test_serving import infer, reference

pytestmark = pytest.mark.e2e

OUTPUT = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
CONFIG = 'backend: "ge"\nmax_batch_size: 0\n' + SCALE_SHIFT_OPTIONAL + OUTPUT
FIXED = CONFIG.replace("-1, 4", "2, 4")  # the static graph's shape
MODELS = ["ss", "ss_static", "ss_openvino"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("optional")
    add_model(repo, "ss", CONFIG, build_scale_shift())
    add_model(repo, "ss_static", FIXED + params(static_model="1"), build_scale_shift())
    add_model(repo, "ss_openvino", CONFIG + params(engine="openvino"), build_scale_shift())
    add_model(repo, "ss_auto", 'backend: "ge"\n', build_scale_shift())
    add_model(repo, "ss_batched", CONFIG.replace("max_batch_size: 0", "max_batch_size: 8").replace("-1, 4", "4"),
              build_scale_shift())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server, repo
    server.stop()


@pytest.mark.parametrize("model", MODELS)
def test_a_request_runs_on_the_files_defaults_or_on_what_it_sends(served, model):
    server, repo = served
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    scale, shift = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    for feeds in [{"x": x}, {"x": x, "scale": scale}, {"x": x, "shift": shift}, {"x": x, "scale": scale, "shift": shift}]:
        got = infer(server, "http", model, feeds).as_numpy("y")
        np.testing.assert_allclose(got, reference(repo, "ss", feeds)["y"], rtol=1e-5, atol=1e-5, err_msg=str(list(feeds)))
    assert not np.allclose(reference(repo, "ss", {"x": x})["y"], reference(repo, "ss", {"x": x, "scale": scale})["y"])


def test_a_wrong_override_fails_alone_naming_the_input(served):
    server, repo = served
    x = np.ones((2, 4), np.float32)
    with pytest.raises(Exception, match=r"unexpected shape for input 'scale' for model 'ss'. Expected \[4\], got \[5\]"):
        infer(server, "http", "ss", {"x": x, "scale": np.ones(5, np.float32)})
    np.testing.assert_allclose(infer(server, "http", "ss", {"x": x}).as_numpy("y"), reference(repo, "ss", {"x": x})["y"],
                               rtol=1e-5)


def test_auto_complete_serves_only_the_required_inputs_and_batching_with_optional_ones_is_refused(served):
    server, repo = served
    with httpclient.InferenceServerClient(server.http_url) as client:
        auto = client.get_model_config("ss_auto")
        listed = client.get_model_config("ss")
    assert [i["name"] for i in auto["input"]] == ["x"] and auto["max_batch_size"] == 8
    assert [(i["name"], i.get("optional", False)) for i in listed["input"]] == [
        ("x", False), ("scale", True), ("shift", True)]
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(infer(server, "http", "ss_auto", {"x": x}).as_numpy("y"),
                               reference(repo, "ss", {"x": x})["y"], rtol=1e-5)
    assert re.search(r"model 'ss_batched'.*optional input\(s\) \['scale', 'shift'\] need a model without batching "
                     r"\(max_batch_size: 0\)", server.output()), server.output()[-3000:]
