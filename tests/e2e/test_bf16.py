"""BF16 inputs and outputs through the real Triton, as Triton's onnxruntime backend serves them: a model whose graph
takes and gives bfloat16 (TYPE_BF16), on the dynamic graph, the static graph and OpenVINO; the client sends and reads
ml_dtypes.bfloat16 arrays (tritonclient's BF16 type); answers equal numpy's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gebackend.modelzoo import build_bf16_affine

from .conftest import add_model, params
from .server import start_server

pytestmark = pytest.mark.e2e

BF16 = np.dtype(ml_dtypes.bfloat16)
MODELS = ["bf", "bf_static", "bf_openvino"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bf16")
    add_model(repo, "bf", 'backend: "ge"\nmax_batch_size: 4\n', build_bf16_affine())  # auto-completed
    add_model(repo, "bf_static", 'backend: "ge"\nmax_batch_size: 4\n' + params(static_model="1"), build_bf16_affine())
    add_model(repo, "bf_openvino", 'backend: "ge"\nmax_batch_size: 4\n' + params(engine="openvino"), build_bf16_affine())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server
    server.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", MODELS)
def test_bf16_in_and_out(served, model, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = served.http_url if protocol == "http" else served.grpc_url
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(BF16)
    tensor = module.InferInput("x", [3, 4], "BF16")
    tensor.set_data_from_numpy(x)
    with module.InferenceServerClient(url) as client:
        result = client.infer(model, [tensor])
    y, y32 = result.as_numpy("y"), result.as_numpy("y32")
    want = x.astype(np.float32) * 2 + 1
    assert y.dtype == BF16 and y32.dtype == np.float32
    np.testing.assert_allclose(y32, want, rtol=1e-6)
    np.testing.assert_allclose(y.astype(np.float32), want.astype(BF16).astype(np.float32), rtol=2 ** -7)


def test_auto_complete_declares_bf16_and_a_wrong_type_is_refused(served):
    with httpclient.InferenceServerClient(served.http_url) as client:
        config = client.get_model_config("bf")
        assert [(t["name"], t["data_type"]) for t in config["input"]] == [("x", "TYPE_BF16")]
        assert [(t["name"], t["data_type"]) for t in config["output"]] == [("y", "TYPE_BF16"), ("y32", "TYPE_FP32")]
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(Exception, match=r"inference input 'x' data-type is 'FP32', but model 'bf' expects 'BF16'"):
            client.infer("bf", [tensor])
