"""config/training_mode.py: the nodes a file exported from a module in training mode runs that way, named at load
and by the graph doctor."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile.doctor import analyze
from gebackend.config.training_mode import training_nodes
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from tests.unit.test_instance import Log


def _dropout(training, ratio=0.5, as_input=False):
    """x [batch, 64] -> Dropout(ratio, training_mode) -> Relu -> y (Relu keeps ONNX Runtime from dropping the node)."""
    stored = [numpy_helper.from_array(np.array(ratio, np.float32), "ratio")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])]
    if as_input:
        inputs.append(helper.make_tensor_value_info("training", TensorProto.BOOL, []))
    else:
        stored.append(numpy_helper.from_array(np.array(training), "training"))
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["dropped"], name="drop"),
             helper.make_node("Relu", ["dropped"], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
                              stored)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_a_dropout_stored_in_training_mode_is_found_and_one_in_inference_mode_or_fed_is_not():
    assert training_nodes(_dropout(True)) == ("Dropout 'drop'",)
    assert training_nodes(_dropout(False)) == ()
    assert training_nodes(_dropout(True, as_input=True)) == ()  # the caller decides: nothing stored


def test_batch_normalization_in_training_mode_is_found():
    stored = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in ("scale", "bias", "mean", "var")]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], name="bn",
                            training_mode=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], stored)
    assert training_nodes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])) == (
        "BatchNormalization 'bn'",)


def test_onnx_runtime_answers_such_a_file_by_chance():
    """What the warning says: without the optimization that removes it, the Dropout drops at random per request."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(_dropout(True).SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.ones((4, 64), np.float32)
    first, second = (session.run(None, {"x": x})[0] for _ in range(2))
    assert not np.array_equal(first, second) and (first == 0).any()


def test_the_load_warns_and_the_doctor_says_so(tmp_path):
    folder = tmp_path / "drop" / "1"
    folder.mkdir(parents=True)
    onnx.save(_dropout(True), str(folder / "model.onnx"))
    log = Log()
    instance = ModelInstance.load({"name": "drop", "backend": "ge", "max_batch_size": 4}, folder,
                                  InstanceInfo("drop_0"), log, pin=False)
    instance.close()
    warned = [m for level, m in log.lines if "training mode" in m]
    assert len(warned) == 1 and "model 'drop': the file runs 1 node(s) in training mode (Dropout 'drop')" in warned[0]
    assert "export again after model.eval()" in warned[0]
    assert [level for level, m in log.lines if "training mode" in m] == ["warn"]
    notes = analyze(_dropout(True)).notes
    assert any("1 node(s) in training mode (Dropout 'drop')" in note for note in notes), notes
    assert not any("training mode" in note for note in analyze(_dropout(False)).notes)


@pytest.mark.parametrize("ratio", [0.0, 0.5])
def test_the_warning_does_not_depend_on_the_ratio(ratio):
    assert training_nodes(_dropout(True, ratio=ratio)) == ("Dropout 'drop'",)
