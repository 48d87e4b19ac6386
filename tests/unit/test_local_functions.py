"""A model with ONNX local functions served on OpenVINO, whose reader has none: from a copy with them inlined
(config/local_functions.py); ONNX Runtime gets the file as it is."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.config.local_functions import served_inlined
from tests.unit.test_auto_choice import _config
from tests.unit.test_instance import Log


def build_with_function() -> onnx.ModelProto:
    """out = Relu(MulAdd(x, w, c)), MulAdd a local function (x * a + b) of domain `pkg.fn`."""
    muladd = helper.make_function("pkg.fn", "MulAdd", ["x", "a", "b"], ["y"],
                                  [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
                                  [helper.make_opsetid("", 18)])
    graph = helper.make_graph(
        [helper.make_node("MulAdd", ["x", "w", "c"], ["z"], domain="pkg.fn"), helper.make_node("Relu", ["z"], ["out"])],
        "fn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.array([2, 3, 4], np.float32), "w"), numpy_helper.from_array(np.ones(3, np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("pkg.fn", 1)],
                             functions=[muladd])


def test_only_openvino_gets_a_copy_with_the_functions_inlined(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_with_function(), str(path))
    assert served_inlined(path, "onnxruntime") == path
    lines = []
    copy = served_inlined(path, "openvino", lines.append, tmp_path)
    assert lines == ["1 ONNX local function(s) ['pkg.fn.MulAdd'] inlined for OpenVINO, which reads none"]
    inlined = onnx.load(str(copy))
    assert not inlined.functions and [n.op_type for n in inlined.graph.node] == ["Mul", "Add", "Relu"]


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="OpenVINO is not installed")
@pytest.mark.parametrize("static", ["0", "1"])
def test_openvino_serves_a_model_with_local_functions(static, tmp_path):
    from gebackend.runtime.instance import InstanceInfo, ModelInstance

    folder = tmp_path / "fn" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_with_function(), str(folder / "model.onnx"))
    log = Log()
    instance = ModelInstance.load(_config("fn", engine="openvino", static_model=static), folder, InstanceInfo("fn_0"),
                                  log, pin=False)
    try:
        x = np.array([[1, -1, 0.5], [-2, 2, 0]], np.float32)
        got = instance.execute([{"x": x}])[0]["out"]
        np.testing.assert_allclose(got, np.maximum(x * [2, 3, 4] + 1, 0), rtol=1e-6)
        assert any("inlined for OpenVINO" in m for _, m in log.lines), log.lines
    finally:
        instance.close()
