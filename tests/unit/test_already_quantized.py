"""precision_mode=int8 on a file that is quantized already (here ONNX Runtime's quantize_static QDQ output): served as
its producer quantized it (runtime/loader.py `_already_int8`), never quantized a second time. Before, ONNX Runtime's
static quantization of such a file wrote an invalid model (two nodes with one name) and the load failed, and NNCF
quantized it again."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.compile.precision import quantized_nodes
from gebackend.config.onnx_signature import read_signature
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec
from gebackend import cpu
from gebackend.modelzoo import build_qdq_resnet, build_resnet
from gebackend.runtime.loader import load_executor


@pytest.fixture(scope="module")
def qdq_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qdq")
    source, quantized = folder / "fp32.onnx", folder / "model.onnx"
    onnx.save(build_resnet(width=8, image_size=32), str(source))
    onnx.save(build_qdq_resnet(), str(quantized))
    return source, quantized


def test_quantization_nodes_are_counted_and_an_fp32_file_has_none(qdq_file):
    source, quantized = qdq_file
    assert quantized_nodes(source) == 0 and quantized_nodes(quantized) > 10


@pytest.mark.parametrize("engine, quantization", [("onnxruntime", "static"), ("onnxruntime", "dynamic"),
                                                  ("openvino", "static")])
def test_int8_serves_the_files_own_quantization(qdq_file, engine, quantization, tmp_path):
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed")
    _, path = qdq_file
    options = BackendOptions.make(engine=engine, precision_mode="int8", quantization=quantization,
                                  intra_op_thread_count=1)
    spec = build_model_spec({"name": "qdq", "max_batch_size": 4}, read_signature(path), path, options)
    lines: list[str] = []
    executor, how = load_executor(spec, log=lines.append)
    assert how.startswith("precision int8 (the file's own quantization), "), how
    assert any(line.startswith("precision int8: the file is quantized already (") for line in lines), lines
    assert not any("calibrating" in line or "quantized in" in line for line in lines), lines  # no second quantization
    image = np.random.default_rng(9).standard_normal((2, 3, 32, 32)).astype(np.float32)
    (answer,) = executor.execute([{"image": image}])
    want = ort.InferenceSession(str(path)).run(None, {"image": image})[0]
    cosine = float((answer["logits"] * want).sum() / np.linalg.norm(answer["logits"]) / np.linalg.norm(want))
    # OpenVINO's int8 kernels round differently from ONNX Runtime's; without VNNI (AVX2 only) its u8 x s8 products of
    # this file's full 8-bit weights can saturate, as ONNX Runtime's do where it quantizes (compile/quantize_static.py)
    bound = 0.999 if engine == "onnxruntime" or cpu.flags() & cpu.VNNI_FLAGS else 0.99
    assert cosine > bound, (cosine, bound)
    if engine == "onnxruntime":
        np.testing.assert_allclose(answer["logits"], want, rtol=1e-5, atol=1e-5)
    executor.close()
