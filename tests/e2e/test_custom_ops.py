"""A model with ONNX Runtime custom operators through the real Triton: config.pbtxt's
`model_operations { op_library_filename }` names onnxruntime-extensions' library, as a repository written for Triton's
onnxruntime backend does; the answers are the operator's, batched requests included."""

from __future__ import annotations

import numpy as np
import onnxruntime_extensions as ortx  # pyproject's test extra: a real custom operator library
import pytest
import tritonclient.http as httpclient

from gebackend.modelzoo import build_custom_negpos

from .conftest import add_model, params
from .server import start_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("custom_ops")
    section = f'model_operations {{ op_library_filename: "{ortx.get_library_path()}" }}\n'
    add_model(repo, "negpos", 'backend: "ge"\nmax_batch_size: 8\n' + section, build_custom_negpos())
    add_model(repo, "negpos_static", 'backend: "ge"\nmax_batch_size: 8\n' + section + params(static_model="1"),
              build_custom_negpos())
    add_model(repo, "negpos_nolib", 'backend: "ge"\nmax_batch_size: 8\n', build_custom_negpos())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server
    server.stop()


@pytest.mark.parametrize("model", ["negpos", "negpos_static"])
def test_custom_operators_answer_through_triton(served, model):
    x = np.array([[-1, 2, -3, 4], [0.5, -0.5, 7, -8]], np.float32)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with httpclient.InferenceServerClient(served.http_url) as client:
        y = client.infer(model, [tensor]).as_numpy("y")
    np.testing.assert_array_equal(y, np.where(x > 0, 2 * x, x))


def test_without_the_library_the_load_fails_naming_the_operator(served):
    assert "model 'negpos_nolib' failed to load" in served.output() and "NegPos" in served.output()
