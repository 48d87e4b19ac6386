"""Static int8 through the real server: a conv model served with precision_mode=int8 quantization=static on ONNX
Runtime (calibrated on a folder of .npy) and on OpenVINO (NNCF, seeded random calibration), 2 instances each: the
outputs stay within int8 tolerance of fp32, the model is quantized once and the second instance reuses the cached
file; a bad calibration folder fails that model's load with a clear message while the others serve. And
precision_mode=auto with engine=auto: the log says what this CPU got (engines/auto_choice.py), the answers stay close."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gebackend.compile.accuracy import compare
from gebackend.modelzoo import build_resnet

from .conftest import add_model, params
from .server import start_server
from .test_serving import client_for, infer, reference

pytestmark = pytest.mark.e2e

IMAGE = 32
BASE = 'backend: "ge"\nmax_batch_size: 4\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n'
MODELS = {
    "int8_ort": BASE + params(precision_mode="int8", quantization="static", engine="onnxruntime",
                              calibration_data="calib", calibration_samples="16"),
    "int8_ov": BASE + params(precision_mode="int8", quantization="static", engine="openvino", calibration_samples="16"),
    "int8_bad": BASE + params(precision_mode="int8", quantization="static", calibration_data="calib"),
    "auto": 'backend: "ge"\nmax_batch_size: 4\n' + params(precision_mode="auto", engine="auto"),
}


@pytest.fixture(scope="module")
def int8_server(tmp_path_factory):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    repo = tmp_path_factory.mktemp("int8") / "models"
    model = build_resnet(width=8, image_size=IMAGE)
    for name, config in MODELS.items():
        add_model(repo, name, config, model)
    rng = np.random.default_rng(11)
    (repo / "int8_ort" / "calib").mkdir()
    np.save(repo / "int8_ort" / "calib" / "image.npy", rng.standard_normal((16, 3, IMAGE, IMAGE)).astype(np.float32))
    (repo / "int8_bad" / "calib").mkdir()
    np.save(repo / "int8_bad" / "calib" / "pixels.npy", np.zeros((4, 3, IMAGE, IMAGE), np.float32))  # not an input
    running = start_server(repo, repo.parent / "serve.log", timeout=420)
    yield running, repo
    running.stop()


@pytest.mark.parametrize("model", ["int8_ort", "int8_ov"])
def test_static_int8_serves_close_to_fp32(int8_server, model):
    server, repo = int8_server
    for seed in (101, 102, 103):  # inputs the model was not calibrated on; several requests reach both instances
        feeds = {"image": np.random.default_rng(seed).standard_normal((3, 3, IMAGE, IMAGE)).astype(np.float32)}
        got = infer(server, "grpc", model, feeds).as_numpy("logits")
        want = reference(repo, model, feeds)["logits"]
        cosine = compare("logits", want, got).cosine
        assert cosine >= 0.99, (model, seed, cosine)


@pytest.mark.parametrize("model, how", [("int8_ort", "int8 static (ONNX Runtime, QDQ)"),
                                        ("int8_ov", "int8 static (NNCF, QDQ)")])
def test_two_instances_quantize_once_and_reuse(int8_server, model, how):
    server, repo = int8_server
    out = server.output()
    quantized = re.findall(rf"model '{model}'[^\n]*precision int8: quantized in [\d.]+ s, cached at ([^\s\x22]+)", out)
    reused = re.findall(rf"model '{model}'[^\n]*precision int8: reused the int8 model cached at ([^\s\x22]+)", out)
    assert len(quantized) == 1 and len(reused) == 1, out[-6000:]
    assert quantized == reused and Path(quantized[0]).is_file()
    assert Path(quantized[0]).parent == repo / model / "1" / ".gebackend-cache" / "precision"
    assert re.search(rf"model '{model}'[^\n]*precision int8: {re.escape(how)}", out), out[-6000:]
    if model == "int8_ort":
        assert re.search(r"model 'int8_ort'[^\n]*calibrating on 16 sample\(s\) from \S+calib", out)
        assert re.search(r"model 'int8_ort'[^\n]*precision int8 vs fp32: [^\n]*the first calibration sample", out)
    else:
        assert re.search(r"model 'int8_ov'[^\n]*16 seeded random sample\(s\)[^\n]*real inputs give better scales", out)


def test_bad_calibration_folder_fails_only_that_model(int8_server):
    server, _ = int8_server
    failed = re.search(r"model 'int8_bad' failed to load: (.*)", server.output())
    assert failed, server.output()[-6000:]
    assert "calibration_data" in failed.group(1) and "input 'image' is missing" in failed.group(1)
    assert "image.npy" in failed.group(1)
    _, client = client_for(server, "http")
    assert client.is_model_ready("int8_ort") and client.is_model_ready("int8_ov")
    assert not client.is_model_ready("int8_bad")


def test_auto_says_what_this_cpu_got_and_serves_close_to_fp32(int8_server):
    from gebackend import cpu
    from gebackend.engines import auto_choice
    from gebackend.engines.openvino import openvino_capabilities

    server, repo = int8_server
    expected = auto_choice.resolve("auto", "auto", repo / "auto" / "1" / "model.onnx", cpu.flags(), openvino_capabilities)
    said = re.findall(r"model 'auto': (precision_mode=auto -> [^\n\x22]*)", server.output())
    assert said == [expected.why], server.output()[-4000:]
    feeds = {"image": np.random.default_rng(7).standard_normal((2, 3, IMAGE, IMAGE)).astype(np.float32)}
    cosine = compare("logits", reference(repo, "auto", feeds)["logits"], infer(server, "http", "auto", feeds).as_numpy("logits")).cosine
    assert cosine >= auto_choice.AUTO_MIN_COSINE
