"""Files below opset 7 (ONNX Runtime has no kernels for opset 6's Add, Gemm, BatchNormalization, ...): the dynamic
graph on ONNX Runtime serves them converted to opset 7 (engines/onnxruntime.py `_open`, compile/upgrade.py
`upgraded_copy`), as the static graph's upgrade pass does, and PRelu's per-channel slope keeps its meaning."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import upgrade
from gebackend.config.options import BackendOptions
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.errors import ModelLoadError


def _opset6(nodes, inputs, output, initializers=()):
    graph = helper.make_graph(nodes, "old", inputs, [output], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    return model


def _add_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    return _opset6([helper.make_node("Add", ["x", "y"], ["sum"])], [x, y],
                   helper.make_tensor_value_info("sum", TensorProto.FLOAT, [2, 3]))


def _prelu_model(shape, slope):
    """PRelu at opset 6 with a per-channel slope (a constant also listed as a graph input, as PyTorch wrote it)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    s = helper.make_tensor_value_info("slope", TensorProto.FLOAT, [len(slope)])
    return _opset6([helper.make_node("PRelu", ["x", "slope"], ["y"])], [x, s],
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
                   [numpy_helper.from_array(np.asarray(slope, np.float32), "slope")])


def _engine(model, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return OrtEngine(path, BackendOptions.make(intra_op_thread_count=1))


def test_an_opset_6_add_is_served_converted_and_says_so(tmp_path):
    engine = _engine(_add_model(), tmp_path)
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    np.testing.assert_array_equal(engine.run({"x": x, "y": y}, ["sum"])[0], x + y)
    assert "opset 6 converted to 7 with onnx.version_converter" in engine.describe()
    engine.close()


@pytest.mark.parametrize("static, precision", [(False, "origin"), (True, "origin"), (False, "int8")],
                         ids=["dynamic", "static", "dynamic-int8"])
def test_prelu_keeps_its_per_channel_slope_where_opset_7_would_broadcast_it_over_the_last_axis(static, precision,
                                                                                              tmp_path):
    # [2, 3, 3]: the slope's 3 values fit the last axis too, so without the Unsqueeze the answer is silently wrong
    from gebackend.config.onnx_signature import read_signature
    from gebackend.config.spec import build_model_spec
    from gebackend.runtime.loader import load_executor

    slope = [0.1, 0.2, 0.3]
    path = tmp_path / "model.onnx"
    onnx.save(_prelu_model([2, 3, 3], slope), str(path))
    spec = build_model_spec({"name": "prelu", "max_batch_size": 0}, read_signature(path), path,
                            BackendOptions.make(static_model=static, precision_mode=precision, intra_op_thread_count=1))
    lines: list[str] = []
    executor, how = load_executor(spec, log=lines.append)
    if precision == "int8":  # lowered from the converted file (ONNX Runtime runs opset 7), where a PRelu alone has
        # nothing int8 quantizes: served fp32, and the load line says so rather than int8
        assert any(line.startswith("precision int8: lowered from the file converted from opset 6 to 7") for line in lines)
        assert how.startswith("precision origin (int8: nothing to quantize: dynamic quantization quantizes MatMul/Gemm "
                              "with a constant weight and the model has none), "), how
    x = -np.ones((2, 3, 3), np.float32)
    (answer,) = executor.execute([{"x": x}])
    want = x * np.asarray(slope, np.float32).reshape(1, 3, 1)  # channel c scaled by slope[c]
    np.testing.assert_allclose(answer["y"], want, rtol=1e-6)
    executor.close()


def test_a_shared_slope_and_a_rank_2_input_are_left_as_they_are():
    shared = _prelu_model([2, 3, 4], [0.25])
    assert upgrade.channel_slopes(shared) is shared
    rank2 = _prelu_model([2, 3], [0.1, 0.2, 0.3])  # [N, C]: broadcasting from the right is the channel axis
    assert upgrade.channel_slopes(rank2) is rank2


def test_a_file_onnx_runtime_loads_as_it_is_is_not_converted(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    model = _opset6([helper.make_node("Relu", ["x"], ["y"])], [x], helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]))
    engine = _engine(model, tmp_path)
    assert "converted" not in engine.describe()
    np.testing.assert_array_equal(engine.run({"x": np.array([-1, 2, -3, 4], np.float32)}, ["y"])[0], [0, 2, 0, 4])
    engine.close()


def test_a_failing_conversion_names_onnx_runtimes_refusal_and_the_converters_failure(tmp_path, monkeypatch):
    def no_adapter(model, target=7):
        raise RuntimeError("adapter_lookup: No Adapter For Add")

    monkeypatch.setattr(upgrade, "upgrade_opset", no_adapter)
    with pytest.raises(ModelLoadError) as refused:
        _engine(_add_model(), tmp_path)
    text = str(refused.value)
    assert "ONNX Runtime cannot load" in text and "Add(6)" in text, text
    assert "converting its opset 6 to 7 with onnx.version_converter failed: RuntimeError: adapter_lookup" in text, text
    assert text.endswith("static_model=1 converts each compiled shape, its dims fixed"), text


def test_a_free_dim_the_converter_refuses_points_to_the_static_graph_which_converts_fixed_shapes(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    model = _opset6([helper.make_node("Add", ["x", "y"], ["sum"])], [x, y],
                    helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", 3]))
    with pytest.raises(ModelLoadError) as refused:
        _engine(model, tmp_path)
    text = str(refused.value)
    assert "Add(6)" in text and "N Dimension is a param" in text and "static_model=1" in text, text
    # and what it advises serves it: the batch buckets fix N
    from gebackend.config.onnx_signature import read_signature
    from gebackend.config.spec import build_model_spec
    from gebackend.runtime.loader import load_executor

    path = tmp_path / "model.onnx"
    spec = build_model_spec({"name": "old_add", "max_batch_size": 4}, read_signature(path), path,
                            BackendOptions.make(static_model=True, intra_op_thread_count=1))
    lines: list[str] = []
    executor, _ = load_executor(spec, log=lines.append)
    # no dynamic graph to time beside the buckets (bucket_plan=measured): said, and the buckets serve every batch
    assert any(line.startswith("bucket_plan=measured: no dynamic graph to time beside the buckets") for line in lines), lines
    x, y = np.ones((3, 3), np.float32), np.arange(9, dtype=np.float32).reshape(3, 3)
    (answer,) = executor.execute([{"x": x, "y": y}])
    np.testing.assert_array_equal(answer["sum"], x + y)
    executor.close()
