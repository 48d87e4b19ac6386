"""An ONNX file cannot make the backend read files outside its model's folder through `external_data` locations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from gebackend.config.onnx_signature import check_external_data, model_folder_of, read_signature
from gebackend.errors import ConfigError


def model_with_weight() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def point_at(tensor: onnx.TensorProto, location: str) -> None:
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="length", value="64")


def write(repo: Path, model: onnx.ModelProto) -> Path:
    path = repo / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))  # the proto as is: its locations are not rewritten
    return path


def test_external_data_inside_the_model_folder_is_read(tmp_path):
    path = tmp_path / "repo" / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(model_with_weight(), str(path), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    assert (path.parent / "weights.bin").exists()
    signature = read_signature(path)
    assert [t.name for t in signature.inputs] == ["x"]


@pytest.mark.parametrize("location", ["weights.bin", "sub/weights.bin", "../shared/weights.bin", "./a/../weights.bin"])
def test_relative_locations_inside_the_model_folder_pass(tmp_path, location):
    model = model_with_weight()
    point_at(model.graph.initializer[0], location)
    check_external_data(model, write(tmp_path / "repo", model))


@pytest.mark.parametrize("location", [
    "../../etc/passwd",
    "../../../../../../etc/passwd",
    "/etc/passwd",
    "sub/../../../other_model/1/weights.bin",
    "",
    "weights.bin\0/../../x",
])
def test_locations_leaving_the_model_folder_are_refused_with_the_reason(tmp_path, location):
    model = model_with_weight()
    point_at(model.graph.initializer[0], location)
    path = write(tmp_path / "repo", model)
    with pytest.raises(ConfigError) as info:
        read_signature(path)
    message = str(info.value)
    assert "tensor 'w'" in message and "outside the model folder" in message
    assert str(tmp_path / "repo" / "m") in message and str(path) in message


def test_constants_in_nodes_subgraphs_and_functions_are_checked(tmp_path):
    const = numpy_helper.from_array(np.ones(2, np.float32), "c")
    point_at(const, "../../../secret")
    then_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=const)], "then", [],
        [helper.make_tensor_value_info("k", onnx.TensorProto.FLOAT, [2])])
    model = model_with_weight()
    model.graph.node.append(helper.make_node("If", ["cond"], ["k"], then_branch=then_branch, else_branch=then_branch))
    with pytest.raises(ConfigError, match="tensor 'c'"):
        check_external_data(model, write(tmp_path / "repo", model))
    function_model = model_with_weight()
    function_model.functions.append(helper.make_function(
        "local", "f", [], ["k"], [helper.make_node("Constant", [], ["k"], value=const)],
        [helper.make_opsetid("", 17)]))
    with pytest.raises(ConfigError, match="tensor 'c'"):
        check_external_data(function_model, write(tmp_path / "repo2", function_model))


def test_the_model_folder_is_the_one_above_a_version_folder(tmp_path):
    assert model_folder_of(tmp_path / "repo" / "m" / "3" / "model.onnx") == tmp_path / "repo" / "m"
    assert model_folder_of(tmp_path / "loose" / "model.onnx") == tmp_path / "loose"
