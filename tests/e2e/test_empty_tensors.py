"""Empty tensors through real Triton: a request with a dim of 0 where the model leaves that dim free (a detector's
post-processing step sent no boxes) is answered as Triton's onnxruntime backend answers it: the model's outputs,
empty or not, on both engines and both graph modes; a model that cannot compute on it gets a 400 naming the input,
and everything else keeps being served."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from .conftest import add_model, params
from .server import start_server

BATCHED = 'backend: "ge"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100000 }\n'
BUCKETS = {"graph.ge.inputShape": "boxes:-1,-1,4", "graph.ge.dynamicDims": "1,2;4,2"}
SERVED = ["corners_ort", "corners_openvino", "corners_static_fallback"]


def corners_model() -> onnx.ModelProto:
    """boxes [n, k, 4] -> sums [n, 4] (each box's k corners added up: zeros for k = 0) and copy [n, k, 4]."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["boxes", "axis"], ["sums"], keepdims=0),
         helper.make_node("Identity", ["boxes"], ["copy"])],
        "corners", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["n", "k", 4])],
        [helper.make_tensor_value_info("sums", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("copy", TensorProto.FLOAT, ["n", "k", 4])],
        [helper.make_tensor("axis", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def first_corner_model() -> onnx.ModelProto:
    """boxes [n, k, 4] -> each box's first corner: there is none when k = 0."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["boxes", "zero"], ["first"], axis=1)], "first_corner",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["n", "k", 4])],
        [helper.make_tensor_value_info("first", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("empty") / "models"
    add_model(repo, "corners_ort", BATCHED, corners_model())
    add_model(repo, "corners_openvino", BATCHED + params(engine="openvino"), corners_model())
    add_model(repo, "corners_static_fallback", BATCHED + params(static_model="1", bucket_fallback="dynamic", **BUCKETS),
              corners_model())
    add_model(repo, "corners_static", BATCHED + params(static_model="1", **BUCKETS), corners_model())
    add_model(repo, "first_corner", BATCHED, first_corner_model())
    running = start_server(repo, repo.parent / "serve.log")
    yield running
    running.stop()


def _infer(server, protocol: str, model: str, boxes: np.ndarray, outputs: tuple[str, ...] = ("sums", "copy")):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    request = module.InferInput("boxes", list(boxes.shape), "FP32")
    request.set_data_from_numpy(boxes)
    result = client.infer(model, [request], outputs=[module.InferRequestedOutput(n) for n in outputs])
    return {name: result.as_numpy(name) for name in outputs}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", SERVED)
def test_an_empty_tensor_gets_the_models_answer(server, model, protocol):
    empty = np.zeros((2, 0, 4), np.float32)
    got = _infer(server, protocol, model, empty)
    assert got["sums"].shape == (2, 4) and not got["sums"].any()  # the sum of no corners
    assert got["copy"].shape == (2, 0, 4) and got["copy"].dtype == np.float32
    boxes = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # and the same model still answers the others
    got = _infer(server, protocol, model, boxes)
    np.testing.assert_array_equal(got["sums"], boxes.sum(axis=1))
    np.testing.assert_array_equal(got["copy"], boxes)


@pytest.mark.parametrize("model", SERVED)
def test_empty_requests_batched_with_each_other_are_each_answered(server, model):
    sizes = [1, 3, 2, 1, 1]
    with ThreadPoolExecutor(len(sizes)) as pool:
        answers = list(pool.map(lambda n: _infer(server, "grpc", model, np.zeros((n, 0, 4), np.float32)), sizes))
    for rows, got in zip(sizes, answers):
        assert got["sums"].shape == (rows, 4) and not got["sums"].any()
        assert got["copy"].shape == (rows, 0, 4)


def test_a_static_graph_without_a_fallback_refuses_an_empty_tensor_naming_its_shapes(server):
    with pytest.raises(InferenceServerException) as info:
        _infer(server, "http", "corners_static", np.zeros((1, 0, 4), np.float32))
    message = str(info.value)
    assert "400" in message and "'corners_static'" in message
    assert "boxes:[1, 0, 4]" in message and "match no compiled shape" in message  # and which shapes there are
    boxes = np.ones((1, 2, 4), np.float32)
    np.testing.assert_array_equal(_infer(server, "http", "corners_static", boxes)["sums"], boxes.sum(axis=1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_that_cannot_compute_on_an_empty_tensor_says_which_input_and_serves_on(server, protocol):
    with pytest.raises(InferenceServerException) as info:
        _infer(server, protocol, "first_corner", np.zeros((1, 0, 4), np.float32), outputs=("first",))
    message = str(info.value)
    assert ("400" in message) if protocol == "http" else ("INVALID_ARG" in message)
    assert "'first_corner'" in message and "input 'boxes' is an empty tensor, shape [1, 0, 4]" in message
    assert "Traceback" not in message
    boxes = np.arange(8, dtype=np.float32).reshape(1, 2, 4)
    np.testing.assert_array_equal(_infer(server, protocol, "first_corner", boxes, outputs=("first",))["first"],
                                  boxes[:, 0])
