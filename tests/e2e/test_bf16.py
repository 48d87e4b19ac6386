"""BF16 inputs and outputs through the real Triton, as Triton's onnxruntime backend serves them: a model whose graph
takes and gives bfloat16 (TYPE_BF16), on the dynamic graph, the static graph and OpenVINO; the client sends and reads
ml_dtypes.bfloat16 arrays (tritonclient's BF16 type); answers equal numpy's. And static int8 of a bfloat16 model
(both quantizers calibrate with float32 edges: compile/bf16_edges.py), close to the fp32 model's answers."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gebackend.compile import bfloat16
from gebackend.modelzoo import build_bf16_affine, build_bf16_mlp

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
    for name, engine in (("bf_int8", "onnxruntime"), ("bf_int8_openvino", "openvino")):
        add_model(repo, name, 'backend: "ge"\nmax_batch_size: 4\n' + params(
            engine=engine, precision_mode="int8", quantization="static", precision_min_cosine="0.99"), build_bf16_mlp())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server, repo
    server.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", MODELS)
def test_bf16_in_and_out(served, model, protocol):
    served, _ = served
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
    served, _ = served
    with httpclient.InferenceServerClient(served.http_url) as client:
        config = client.get_model_config("bf")
        assert [(t["name"], t["data_type"]) for t in config["input"]] == [("x", "TYPE_BF16")]
        assert [(t["name"], t["data_type"]) for t in config["output"]] == [("y", "TYPE_BF16"), ("y32", "TYPE_FP32")]
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(Exception, match=r"inference input 'x' data-type is 'FP32', but model 'bf' expects 'BF16'"):
            client.infer("bf", [tensor])


@pytest.mark.parametrize("model", ["bf_int8", "bf_int8_openvino"])
def test_static_int8_of_a_bfloat16_model_answers_close_to_fp32(served, model):
    import onnxruntime as ort

    served, repo = served
    x = np.random.default_rng(6).standard_normal((4, 64)).astype(BF16)
    tensor = grpcclient.InferInput("x", [4, 64], "BF16")
    tensor.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        result = client.infer(model, [tensor])
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    want = dict(zip(["y", "y32"], bfloat16.run(session, ["y", "y32"], {"x": x})))
    assert result.as_numpy("y").dtype == BF16
    for name in ("y", "y32"):
        ours, ref = result.as_numpy(name).astype(np.float64).ravel(), want[name].astype(np.float64).ravel()
        assert ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref)) > 0.99  # int8 of random weights
        assert not np.array_equal(ours, ref)  # int8 ran
    assert re.search(rf"model '{model}' instance \S+ loaded .*precision int8 static \(cosine 0\.99", served.output())


def test_perf_analyzer_measures_a_bf16_model_with_the_benchs_input_data(served, tmp_path):
    """The bench's and tune's --input-data for a BF16 input (b64 of its 16-bit patterns: perf_analyzer refuses bf16
    as JSON numbers, which failed every tune of such a model)."""
    from gebackend.bench import perf_analyzer

    served, _ = served
    x = np.random.default_rng(7).standard_normal((1, 4)).astype(BF16)
    data = perf_analyzer.write_input_data(tmp_path / "inputs.json", {"x": x})
    settings = perf_analyzer.PerfSettings(measurement_interval_ms=500, stability_percentage=1000, max_trials=3)
    result = perf_analyzer.run(perf_analyzer.find_perf_analyzer(), "bf", served.grpc_url, [1], tmp_path, settings,
                               input_data=data, log=lambda line: None)
    assert result.failures == [] and result.rows[0].throughput > 0, result.failures
