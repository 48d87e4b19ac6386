"""Models Triton's own onnxruntime backend loads and runs, served through `gebackend serve` with the smallest
config (`backend: "ge"`, plus `static_model=1` for the static twins): a batch-only output (an ArgMax class
index), a rank-0 scalar input, opset-6 and -7 model-zoo style CNNs, and a data-dependent output shape (NonZero).
Each was a load failure or a 500 before; each answer is checked against plain onnxruntime on the same file.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from .conftest import add_model, params
from .server import start_server
from .test_serving import infer

pytestmark = pytest.mark.e2e


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    if opset <= 7:  # as old model-zoo files are: IR version 3, every weight also listed as a graph input
        inputs = list(inputs) + [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in initializers]
    graph = helper.make_graph(nodes, "peer", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3 if opset <= 7 else 8
    onnx.checker.check_model(model)
    return model


def classifier() -> onnx.ModelProto:
    """logits = x @ W; idx = ArgMax(logits): `idx: int64 [batch]`, only the batch dim."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((10, 5)).astype(np.float32), "w")
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("ArgMax", ["logits"], ["idx"], axis=1, keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 10])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])], [w])


def scaled() -> onnx.ModelProto:
    """y = x * s and total = sum(y), with `s` and `total` rank-0 scalars; nothing batches."""
    return _model([helper.make_node("Mul", ["x", "s"], ["y"]), helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]), helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]), helper.make_tensor_value_info("total", TensorProto.FLOAT, [])])


def old_cnn(opset: int = 7) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> GlobalAveragePool -> Flatten -> Gemm at opset 7 (a shorter CNN at opset 6),
    as model-zoo files are."""
    rng = np.random.default_rng(1)
    weights = {
        "conv_w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "conv_b": rng.standard_normal(8).astype(np.float32),
        "bn_scale": rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_bias": rng.standard_normal(8).astype(np.float32),
        "bn_mean": rng.standard_normal(8).astype(np.float32) * 0.1, "bn_var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "fc_w": rng.standard_normal((4, 8)).astype(np.float32), "fc_b": rng.standard_normal(4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["data", "conv_w", "conv_b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["b"], epsilon=1e-5),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["scores"], transB=1),
    ]
    if opset <= 6:  # ONNX Runtime has no opset-6 BatchNormalization or Gemm kernels: Conv -> Relu -> pool -> MatMul
        weights["fc_w"] = weights["fc_w"].T.copy()
        nodes = [nodes[0], helper.make_node("Relu", ["c"], ["r"]), *nodes[3:5],
                 helper.make_node("MatMul", ["f", "fc_w"], ["scores"])]
        weights = {k: weights[k] for k in ("conv_w", "conv_b", "fc_w")}
    return _model(nodes, [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, 16, 16])],
                  [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 4])],
                  [numpy_helper.from_array(v, k) for k, v in weights.items()], opset=opset)


def nonzero() -> onnx.ModelProto:
    """idx = NonZero(Relu(x)): how many entries are positive decides the output's shape."""
    return _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["idx"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                  [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, "count"])])


MODELS = {
    "classifier": ('backend: "ge"\n', classifier),
    "classifier_static": ('backend: "ge"\n' + params(static_model="1"), classifier),
    "scaled": ('backend: "ge"\n', scaled),
    "scaled_static": ('backend: "ge"\n' + params(static_model="1"), scaled),
    "opset7": ('backend: "ge"\nmax_batch_size: 4\n', old_cnn),
    "opset7_static": ('backend: "ge"\nmax_batch_size: 4\n' + params(static_model="1"), old_cnn),
    "opset6": ('backend: "ge"\nmax_batch_size: 4\n', lambda: old_cnn(6)),
    "opset6_static": ('backend: "ge"\nmax_batch_size: 4\n' + params(static_model="1"), lambda: old_cnn(6)),
    "nonzero_static": ('backend: "ge"\n' + params(static_model="1"), nonzero),
}


@pytest.fixture(scope="module")
def peer_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("peer") / "models"
    for name, (config, build) in MODELS.items():
        add_model(repo, name, config, build())
    server = start_server(repo, repo.parent / "serve.log")
    server.repo = repo
    yield server
    server.stop()


def reference(server, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(server.repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_every_peer_model_loads(peer_server):
    out = peer_server.output()
    for name in MODELS:
        assert re.search(rf"^  {name} v1: READY$", out, re.M), out[-4000:]
    assert "Traceback" not in out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["classifier", "classifier_static"])
def test_a_batch_only_output_comes_back_as_batch_by_one(peer_server, protocol, model):
    x = np.random.default_rng(2).standard_normal((3, 10)).astype(np.float32)
    result = infer(peer_server, protocol, model, {"x": x})
    want = reference(peer_server, model, {"x": x})
    assert result.as_numpy("idx").shape == (3, 1)  # config dims [1], reshaped from the model's [batch]
    np.testing.assert_array_equal(result.as_numpy("idx")[:, 0], want["idx"])
    np.testing.assert_allclose(result.as_numpy("logits"), want["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["scaled", "scaled_static"])
def test_a_scalar_input_is_sent_as_one_value(peer_server, protocol, model):
    x = np.array([1.5, -2.0, 4.0], np.float32)
    result = infer(peer_server, protocol, model, {"x": x, "s": np.array([3.0], np.float32)})
    np.testing.assert_allclose(result.as_numpy("y"), reference(peer_server, model, {"x": x, "s": np.array(3.0, np.float32)})["y"])
    np.testing.assert_allclose(result.as_numpy("y"), x * 3.0)
    assert result.as_numpy("total").shape == (1,)  # a scalar goes back as its config dims, [1]
    np.testing.assert_allclose(result.as_numpy("total"), [np.sum(x * 3.0)], rtol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["opset7", "opset7_static", "opset6", "opset6_static"])
def test_an_old_opset_model_serves_in_both_graph_modes(peer_server, protocol, model):
    data = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    got = infer(peer_server, protocol, model, {"data": data}).as_numpy("scores")
    np.testing.assert_allclose(got, reference(peer_server, model, {"data": data})["scores"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_data_dependent_output_shape_is_answered_in_static_mode(peer_server, protocol):
    for x in (np.array([1, -1, 2, 0, 3, -4], np.float32), np.array([-1, -1, 5, -2, -3, -4], np.float32),
              np.array([1, 2, 3, 4, 5, 6], np.float32)):
        got = infer(peer_server, protocol, "nonzero_static", {"x": x}).as_numpy("idx")
        np.testing.assert_array_equal(got, np.array(np.nonzero(np.maximum(x, 0))))
