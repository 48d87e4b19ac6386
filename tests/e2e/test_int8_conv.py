"""int8 of convolution models through the real server: a detector's neck with free height and width that runs only at
sides divisible by 64 (as YOLOv8 runs at multiples of 32). With a bare `precision_mode=int8` it is served fp32, the
load line saying why (static int8 needs calibration_data: seeded random images calibrate it badly); with
`quantization=static` it is quantized for real (QDQ calibrated on seeded inputs at the size its probe found, the load
line saying how many Conv were quantized) and answers close to fp32; precision_mode=auto with engine=auto lowers it
or says why not; and a model OpenVINO cannot read served with engine=auto runs on ONNX Runtime, saying why."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

from gebackend.compile.accuracy import compare
from gebackend.modelzoo.detectors import build_detector_neck, build_unranked_conv

from .conftest import add_model, params
from .server import start_server
from .test_serving import infer, reference

pytestmark = pytest.mark.e2e

BARE = 'backend: "ge"\n'
MODELS = {
    "neck_int8": (BARE + params(precision_mode="int8"), build_detector_neck),
    "neck_int8_static": (BARE + params(precision_mode="int8", quantization="static"), build_detector_neck),
    "neck_auto": (BARE + params(precision_mode="auto", engine="auto"), build_detector_neck),
    "vad_auto": (BARE + params(precision_mode="int8", quantization="static", engine="auto"), build_unranked_conv),
}
OPENVINO = importlib.util.find_spec("openvino") is not None


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("int8_conv") / "models"
    for name, (config, build) in MODELS.items():
        add_model(repo, name, config, build())
    running = start_server(repo, repo.parent / "serve.log", timeout=300)
    yield running, repo
    running.stop()


def _load_line(server, model: str) -> str:
    lines = re.findall(rf"model '{model}' instance \S+ loaded model\.onnx in [\d.]+s: (.*)", server.output())
    assert lines, server.output()[-4000:]
    return lines[-1]


def _close_to_fp32(server, repo, model: str, feeds: dict, output: str = "y") -> float:
    got = infer(server, "grpc", model, feeds).as_numpy(output)
    return compare(output, reference(repo, model, feeds)[output], got).cosine


def test_int8_of_a_conv_detector_without_calibration_data_serves_fp32_saying_why(served):
    server, repo = served
    line = _load_line(server, "neck_int8")
    assert re.search(r"precision origin \(int8: static int8 \(the weights live in 3 Conv against 0 MatMul/Gemm.*\) "
                     r"calibrates on inputs like the real ones, and seeded random values of images do not stand for "
                     r"real images or audio; set calibration_data to real requests", line), line
    images = np.random.default_rng(3).standard_normal((1, 3, 320, 320)).astype(np.float32)
    assert _close_to_fp32(server, repo, "neck_int8", {"images": images}) >= 0.99999


def test_int8_static_of_a_conv_detector_quantizes_its_convolutions(served):
    server, repo = served
    line = _load_line(server, "neck_int8_static")
    found = re.search(r"precision int8 static \(cosine (0\.99\d+|1\.0+) to fp32 on images:\[1, 3, 320, 320\], probed "
                      r"320x320; ONNX Runtime QDQ, (\d+) of (\d+) Conv quantized, calibrated on 32 seeded input\(s\)\)",
                      line)
    assert found and int(found.group(2)) == int(found.group(3)) == 3, line
    for side in (320, 640):
        images = np.random.default_rng(side).standard_normal((1, 3, side, side)).astype(np.float32)
        assert _close_to_fp32(server, repo, "neck_int8_static", {"images": images}) >= 0.99, side


def test_auto_lowers_the_detector_or_says_why_not(served):
    """What auto chose is said; int8 is checked on the engine that serves it (OpenVINO's int8 kernels may answer NNCF's
    file less closely than ONNX Runtime runs it), and served only where it quantized Conv and stays close to fp32."""
    from gebackend import cpu
    from gebackend.engines import auto_choice
    from gebackend.engines.openvino import openvino_capabilities

    server, repo = served
    expected = auto_choice.resolve("auto", "auto", repo / "neck_auto" / "1" / "model.onnx", cpu.flags(),
                                   openvino_capabilities if OPENVINO else lambda: ())
    assert re.search(rf"model 'neck_auto': {re.escape(expected.why)}", server.output()), server.output()[-4000:]
    line = _load_line(server, "neck_auto")
    images = np.random.default_rng(5).standard_normal((1, 3, 320, 320)).astype(np.float32)
    cosine = _close_to_fp32(server, repo, "neck_auto", {"images": images})
    lowered = re.search(r"precision int8 static \(cosine (0\.99\d+|1\.0+) to fp32 on images:\[1, 3, 320, 320\], probed "
                        r"320x320; (NNCF|ONNX Runtime) QDQ, (\d+) of 3 Conv quantized", line)
    if lowered:
        assert int(lowered.group(3)) > 0 and cosine >= 0.98, (line, cosine)
    elif expected.precision_mode == "int8":  # not served: the line says why, and the answers are fp32's
        assert re.search(r"precision origin \(int8 refused by the accuracy guard: cosine 0\.\d+ to fp32 on "
                         r"images:\[1, 3, 320, 320\], probed 320x320, below 0\.99\)", line) or re.search(
            r"precision origin \(int8: static int8 .* seeded random values of images do not stand for real", line), line
        assert cosine >= 0.99999, cosine
    else:  # bf16 where OpenVINO reports it, or exact fp32 where neither pays: within the guard
        assert cosine >= auto_choice.AUTO_MIN_COSINE, (line, cosine)


def test_engine_auto_serves_what_openvino_cannot_read_on_onnxruntime_saying_why(served):
    server, repo = served
    line = _load_line(server, "vad_auto")
    if OPENVINO:
        assert line.startswith("max_batch_size=0, engine=auto -> onnxruntime (OpenVINO cannot read model.onnx: "
                               "conversion failed for Conv-13: The input data tensor's rank has to be known"), line
    assert re.search(r"precision int8 static \(cosine 0\.99\d+ .*2 of 2 Conv, 1 of 1 MatMul/Gemm quantized", line), line
    assert "onnxruntime" in line.split("precision int8", 1)[1]
    audio = np.random.default_rng(9).standard_normal((1, 1, 400)).astype(np.float32)
    assert _close_to_fp32(server, repo, "vad_auto", {"audio": audio}) >= 0.99
