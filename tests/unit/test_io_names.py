"""Unit tests for gebackend.config.io_names: npu_ge configs pair tensors by position, as Ascend ge-backend does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.config.io_names import aliased_model, aliased_signature, positional_renames
from gebackend.config.onnx_signature import read_signature, signature_of
from gebackend.errors import ConfigError
from gebackend.modelzoo import build_add_mul

ADD_MUL = signature_of(build_add_mul())  # inputs x, y; outputs sum, product


def _config(backend="npu_ge", inputs=(), outputs=()):
    return {"backend": backend, "input": [{"name": n} for n in inputs], "output": [{"name": n} for n in outputs]}


def test_ge_backend_example_renames_the_output_by_position():
    renames = positional_renames(_config(inputs=["x", "y"], outputs=["total", "product"]), ADD_MUL)
    assert renames.inputs == () and renames.outputs == ((0, "sum", "total"),)
    assert renames.describe() == ["config.pbtxt output 'total' is not in the ONNX file: served as its output #0 'sum' "
                                  "(ge-backend pairs them by position)"]
    signature = aliased_signature(_config(inputs=["a", "b"], outputs=["total", "product"]), ADD_MUL)
    assert [t.name for t in signature.inputs] == ["a", "b"] and [t.name for t in signature.outputs] == ["total", "product"]
    assert signature.inputs[0].shape == ADD_MUL.inputs[0].shape and signature.inputs[0].dtype == ADD_MUL.inputs[0].dtype


@pytest.mark.parametrize("config", [
    _config(backend="ge", outputs=["total", "product"]),  # Triton onnxruntime's rule: names must match
    _config(inputs=["x", "y"], outputs=["sum", "product"]),  # every name in the file
    _config(outputs=["product", "sum"]),  # present, in another order: names decide
    _config(outputs=["total"]),  # a count that differs stays an error
    _config(outputs=["total", "sum"]),  # 'sum' is the file's output #0, declared at #1: ambiguous
    _config(outputs=["t", "t"]),
    _config(),
    {"backend": "npu_ge"},
])
def test_nothing_is_renamed(config):
    assert not positional_renames(config, ADD_MUL)
    assert aliased_signature(config, ADD_MUL) is ADD_MUL


def _write(tmp_path, model, name="resnet18-v1-7.onnx", **save):
    path = tmp_path / "resnet" / "1" / name
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path), **save)
    return path


def _temp(tmp_path):
    (tmp_path / "temp").mkdir(exist_ok=True)
    return tmp_path / "temp"


def _run(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {o.name: v for o, v in zip(session.get_outputs(), session.run(None, feeds))}


def test_aliased_model_is_a_renamed_copy_that_computes_the_same(tmp_path):
    path = _write(tmp_path, build_add_mul())
    lines = []
    copy = aliased_model(_config(inputs=["a", "y"], outputs=["s", "p"]), path, lines.append, _temp(tmp_path))
    assert copy != path and copy.name == path.name and (tmp_path / "temp") in copy.parents
    assert len(lines) == 3 and "input 'a'" in lines[0]
    signature = read_signature(copy)
    assert [t.name for t in signature.inputs] == ["a", "y"] and [t.name for t in signature.outputs] == ["s", "p"]
    x, y = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 3, np.float32)
    got, want = _run(copy, {"a": x, "y": y}), _run(path, {"x": x, "y": y})
    np.testing.assert_array_equal(got["s"], want["sum"])
    np.testing.assert_array_equal(got["p"], want["product"])
    assert [t.name for t in read_signature(path).outputs] == ["sum", "product"]  # the original is untouched


@pytest.mark.parametrize("config", [_config(backend="ge", outputs=["s", "p"]), _config(outputs=["sum", "product"]),
                                    {"backend": "npu_ge"}])
def test_aliased_model_keeps_the_file_when_nothing_is_renamed(tmp_path, config):
    path = _write(tmp_path, build_add_mul())
    assert aliased_model(config, path) == path


def test_a_name_used_inside_the_graph_is_not_taken(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["hidden"]), helper.make_node("Neg", ["hidden"], ["y"])], "g", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])]), opset_imports=[helper.make_opsetid("", 17)])
    path = _write(tmp_path, model)
    lines = []
    assert aliased_model(_config(outputs=["hidden"]), path, lines.append) == path
    assert "used inside the ONNX file" in lines[0]


def test_external_data_is_hard_linked_beside_the_copy(tmp_path):
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(1, 4096), "w")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4096])], [w]), opset_imports=[helper.make_opsetid("", 17)])
    path = _write(tmp_path, model, "model.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    copy = aliased_model(_config(outputs=["out"]), path, temp_parent=_temp(tmp_path))
    assert (copy.parent / "weights.bin").read_bytes() == (path.parent / "weights.bin").read_bytes()  # linked, or copied
    feeds = {"x": np.ones((1, 4096), np.float32)}
    np.testing.assert_array_equal(_run(copy, feeds)["out"], _run(path, feeds)["y"])


def test_an_unreadable_file_is_a_config_error(tmp_path):
    path = tmp_path / "resnet" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not an onnx file")
    with pytest.raises(ConfigError, match="cannot read ONNX file"):
        aliased_model(_config(outputs=["out"]), path)
