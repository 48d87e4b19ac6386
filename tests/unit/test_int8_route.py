"""compile/int8_route.py and its load: int8 on a model whose weights live in Conv is static quantization (ONNX
Runtime's QDQ) calibrated on seeded inputs of a size the model runs, and the load line says what ran (the ops
quantized of how many, the inputs and whence their sizes, the cosine); a quantization that quantizes nothing is
served as fp32, said; precision_mode=auto never picks an int8 that quantizes nothing."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import int8_route
from gebackend.compile.accuracy import compare
from gebackend.compile.precision import lower_precision
from gebackend.engines import auto_choice, registry
from gebackend.errors import ModelLoadError
from gebackend.modelzoo import build_bert
from gebackend.modelzoo.detectors import build_detector_neck
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from tests.unit.test_instance import Log

AVX2 = {"avx2", "fma"}


def _folder(tmp_path, name, model):
    folder = tmp_path / name / "1"
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder


def _load(folder, **params):
    config = {"name": folder.parent.name, "backend": "ge", "max_batch_size": 4,
              "parameters": {k: {"string_value": v} for k, v in params.items()}}
    log = Log()
    return ModelInstance.load(config, folder, InstanceInfo(f"{folder.parent.name}_0"), log, pin=False), log


def _cosine_to_fp32(instance, folder, side, images=None):
    """The served answer's cosine to ONNX Runtime's on the file, on `images` (else 2 standard normal ones)."""
    if images is None:
        images = np.random.default_rng(side).standard_normal((2, 3, side, side)).astype(np.float32)
    got = instance.execute([{"images": images}])[0]["y"]
    want = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"images": images})[0]
    return compare("y", want, got).cosine, got, want


def _relu_only():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])]))


def test_auto_quantization_is_static_where_the_weights_live_in_conv(tmp_path):
    ort_kind, neck, bert = registry.kind("onnxruntime"), tmp_path / "neck.onnx", tmp_path / "bert.onnx"
    onnx.save(build_detector_neck(), str(neck))
    onnx.save(build_bert(), str(bert))
    assert int8_route.choose("auto", "", ort_kind, neck) == (
        "static", "the weights live in 3 Conv against 0 MatMul/Gemm, and dynamic quantization quantizes MatMul/Gemm only")
    assert int8_route.choose("auto", "", ort_kind, bert) == ("dynamic", "")
    assert int8_route.choose("auto", "calib", ort_kind, bert) == ("static", "calibration_data is set")
    assert int8_route.choose("dynamic", "", ort_kind, neck) == ("dynamic", "")  # the user's word is kept
    with pytest.raises(ModelLoadError, match="quantization=dynamic is not available with engine=openvino"):
        int8_route.choose("dynamic", "", registry.kind("openvino"), bert)


def test_what_each_quantization_would_quantize(tmp_path):
    neck, relu = tmp_path / "neck.onnx", tmp_path / "relu.onnx"
    onnx.save(build_detector_neck(), str(neck))
    onnx.save(_relu_only(), str(relu))
    assert int8_route.nothing_to_quantize(neck, "dynamic") == (
        "dynamic quantization quantizes MatMul/Gemm with a constant weight and the model has none; its 3 Conv need "
        "quantization=static (or auto)")
    assert int8_route.nothing_to_quantize(neck, "static") == ""
    assert int8_route.nothing_to_quantize(relu, "static") == "the model has no Conv, MatMul or Gemm with a constant weight"


def test_the_quantized_ops_are_counted_from_the_lowered_file(tmp_path):
    from gebackend.compile.calibration import random_samples

    neck, bert = tmp_path / "neck.onnx", tmp_path / "bert.onnx"
    onnx.save(build_detector_neck(), str(neck))
    onnx.save(build_bert(), str(bert))
    samples = random_samples(neck, 4, {"images": (1, 3, 320, 320)})
    static = lower_precision(neck, "int8", tmp_path / "out", quantization="static", samples=samples)
    assert int8_route.quantized_in(static).describe() == "3 of 3 Conv quantized"
    dynamic = lower_precision(bert, "int8", tmp_path / "out")
    counted = int8_route.quantized_in(dynamic)
    assert counted.describe() == "13 of 13 MatMul/Gemm quantized" and counted.quantized == counted.total == 13
    assert int8_route.quantized_in(neck).describe() == "0 of 3 Conv quantized"  # the fp32 file: none


def test_int8_of_a_conv_detector_with_a_bare_config_serves_fp32_and_says_what_it_needs(tmp_path):
    folder = _folder(tmp_path, "neck", build_detector_neck())
    instance, _ = _load(folder, precision_mode="int8")
    try:
        assert instance.executor.spec.options.engines.precision_mode == "origin"
        assert instance.how.startswith(
            "precision origin (int8: static int8 (the weights live in 3 Conv against 0 MatMul/Gemm, and dynamic "
            "quantization quantizes MatMul/Gemm only) calibrates on inputs like the real ones, and seeded random values "
            "of images do not stand for real images or audio; set calibration_data to real requests"), instance.how
        cosine, got, want = _cosine_to_fp32(instance, folder, 320)
        np.testing.assert_array_equal(got, want)  # the exact model
    finally:
        instance.close()


def test_int8_static_of_a_conv_detector_quantizes_it_at_a_size_it_runs(tmp_path):
    folder = _folder(tmp_path, "neck", build_detector_neck())
    instance, _ = _load(folder, precision_mode="int8", quantization="static")
    try:
        assert instance.executor.spec.options.engines.precision_mode == "int8"
        assert re.match(r"precision int8 static \(cosine 0\.99\d+ to fp32 on images:\[1, 3, 320, 320\], probed 320x320; "
                        r"ONNX Runtime QDQ, 3 of 3 Conv quantized, calibrated on 32 seeded input\(s\)\), dynamic graph",
                        instance.how), instance.how
        for side in (320, 640):  # any size the model takes, not only the one it was calibrated at
            cosine, got, want = _cosine_to_fp32(instance, folder, side)
            assert cosine >= 0.99 and not np.array_equal(got, want), (side, cosine)  # int8: close, not exact
    finally:
        instance.close()


def test_auto_lowers_a_conv_model_for_real_on_calibration_data(tmp_path):
    folder = _folder(tmp_path, "neck", build_detector_neck())
    calibration = folder.parent / "calib" / "images"  # beside config.pbtxt, one sample a file
    calibration.mkdir(parents=True)
    for number in range(4):
        image = np.random.default_rng(number).random((3, 320, 320)).astype(np.float32)
        np.save(calibration / f"{number}.npy", image)
    instance, log = _load(folder, precision_mode="auto", engine="onnxruntime", calibration_data="calib")
    try:
        assert re.search(r"^precision int8 static \(cosine 0\.99\d+ to fp32 on images:\[1, 3, 320, 320\], the first "
                         r"calibration_data sample; ONNX Runtime QDQ, 3 of 3 Conv quantized, calibrated on 4 "
                         r"calibration_data sample\(s\)\)", instance.how), instance.how
        said = [m for _, m in log.lines if "quantization=auto -> static" in m]
        assert said and "calibration_data is set" in said[0], log.lines
        images = np.random.default_rng(9).random((2, 3, 320, 320)).astype(np.float32)  # like the calibration's
        assert _cosine_to_fp32(instance, folder, 320, images)[0] >= auto_choice.AUTO_MIN_COSINE
    finally:
        instance.close()


def test_dynamic_int8_that_quantizes_nothing_is_served_as_fp32_and_says_so(tmp_path):
    folder = _folder(tmp_path, "neck", build_detector_neck())
    instance, log = _load(folder, precision_mode="int8", quantization="dynamic")
    try:
        assert instance.executor.spec.options.engines.precision_mode == "origin"
        assert instance.how.startswith("precision origin (int8: nothing to quantize: dynamic quantization quantizes "
                                       "MatMul/Gemm with a constant weight and the model has none; its 3 Conv need "
                                       "quantization=static (or auto)), dynamic graph"), instance.how
        assert not list((folder / ".gebackend-cache" / "precision").glob("*.onnx"))  # nothing was lowered
        cosine, got, want = _cosine_to_fp32(instance, folder, 320)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the exact model
    finally:
        instance.close()


def test_a_lowered_file_with_nothing_quantized_is_not_served_as_int8(tmp_path, monkeypatch):
    """Where the quantizer leaves every op in float (its own rules), the load line does not say int8."""
    from gebackend.compile import precision

    def untouched(path, out, op_types, log):
        onnx.save(onnx.load(str(path)), str(out))

    monkeypatch.setattr(precision, "_int8", untouched)
    instance, log = _load(_folder(tmp_path, "bert", build_bert()), precision_mode="int8")
    try:
        assert instance.executor.spec.options.engines.precision_mode == "origin"
        assert instance.how.startswith("precision origin (int8: 0 of 13 MatMul/Gemm quantized), "), instance.how
        assert any("not served: nothing was quantized (0 of 13 MatMul/Gemm quantized)" in m for _, m in log.lines)
    finally:
        instance.close()


def test_auto_precision_never_picks_an_int8_that_quantizes_nothing(tmp_path):
    relu, neck = tmp_path / "relu.onnx", tmp_path / "neck.onnx"
    onnx.save(_relu_only(), str(relu))
    onnx.save(build_detector_neck(), str(neck))
    precision, why = auto_choice.auto_precision("onnxruntime", AVX2, lambda: (), relu)
    assert (precision, why) == ("origin", "int8 would quantize nothing here (no Conv, MatMul or Gemm with a constant "
                                          "weight): exact fp32")
    assert auto_choice.auto_precision("onnxruntime", AVX2, lambda: (), neck)[0] == "int8"  # static: it lowers


def test_a_weight_shared_through_an_identity_counts_as_a_weight(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    nodes = [helper.make_node("Identity", ["w"], ["shared"]), helper.make_node("MatMul", ["x", "shared"], ["y"])]
    stored = [numpy_helper.from_array(np.ones((4, 2), np.float32), "w")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                              ["n", 2])], stored))
    path = tmp_path / "shared.onnx"
    onnx.save(model, str(path))
    assert auto_choice.weighted_op_counts(path) == (0, 1) and int8_route.nothing_to_quantize(path, "dynamic") == ""


def test_tune_prunes_a_rung_whose_load_serves_the_exact_model(tmp_path):
    """tune/measure.py reads the rung's load: ONNX Runtime's dynamic int8 rung on a convolution model is the origin
    rung again, and its candidates are pruned saying why."""
    from types import SimpleNamespace

    from gebackend.tune import measure, space

    rungs = {rung.name: rung for rung in space.PRECISIONS}
    folder = _folder(tmp_path, "neck", build_detector_neck())
    instance, _ = _load(folder, precision_mode="int8", quantization="dynamic")
    try:
        ceiling = SimpleNamespace(instances_here=[instance], how=instance.how)
        assert measure.exact_instead(rungs["int8"], ceiling) == (
            "int8 serves the exact model here: int8: nothing to quantize: dynamic quantization quantizes MatMul/Gemm "
            "with a constant weight and the model has none; its 3 Conv need quantization=static (or auto)")
        assert measure.exact_instead(rungs["origin"], ceiling) == ""
    finally:
        instance.close()
    lowered, _ = _load(folder, precision_mode="int8", quantization="static")
    try:
        assert measure.exact_instead(rungs["int8-static"], SimpleNamespace(instances_here=[lowered], how=lowered.how)) == ""
    finally:
        lowered.close()
