"""ONNX's shape inference and checker on the light copy (config/light.py): the same answers as on the whole model,
the weights never serialised; a model rebuilt with its own initializers is byte-for-byte the model; ONNX Runtime's
symbolic shape inference types com.microsoft outputs, and where it stops writes no file and ONNX's answers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.config import light
from gebackend.compile.specialize import specialize
from gebackend.modelzoo import build_bert, build_bf16_mlp, build_resnet


def _reshape_by_weight_shape() -> onnx.ModelProto:
    """A MatMul by a 64x4096 weight (1 MiB: heavy) whose product a small int64 initializer reshapes (its values are
    a shape: data propagation reads them), an IR 3 model listing every initializer as a graph input too."""
    weight = numpy_helper.from_array(np.ones((64, 4096), np.float32), "w")
    target = numpy_helper.from_array(np.array([0, 64, 64], np.int64), "target")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "target"], ["z"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64]),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 4096]),
              helper.make_tensor_value_info("target", TensorProto.INT64, [3])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                              [weight, target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 3
    return model


def _types(model: onnx.ModelProto) -> dict[str, bytes]:
    return {v.name: v.type.SerializeToString() for v in [*model.graph.value_info, *model.graph.output]}


@pytest.mark.parametrize("build, shapes", [
    (build_resnet, {"image": [2, 3, 64, 64]}),
    (build_bert, {"input_ids": [2, 16], "attention_mask": [2, 16]}),
    (build_bf16_mlp, {"x": [3, 64]}),
    (_reshape_by_weight_shape, {"x": [5, 64]}),
])
@pytest.mark.parametrize("data_prop", [True, False])
def test_inference_on_the_light_copy_equals_inference_on_the_model(build, shapes, data_prop):
    model = specialize(build(), shapes)
    del model.graph.value_info[:]
    assert light.light_copy(model).ByteSize() < model.ByteSize() // 4  # the heavy weights are not in it
    want = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=data_prop)
    got = light.infer_shapes(model, data_prop=data_prop)
    assert _types(got) == _types(want) and len(got.graph.value_info) > 0
    assert [i.SerializeToString() for i in got.graph.initializer] == [i.SerializeToString() for i in model.graph.initializer]


def test_data_propagation_still_reads_small_shape_values():
    model = specialize(_reshape_by_weight_shape(), {"x": [5, 64]})
    out = light.infer_shapes(model, data_prop=True).graph.output[0]
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [5, 64, 64]


def test_the_checker_on_the_light_copy_finds_what_it_finds_on_the_model():
    model = build_resnet()
    light.check_model(model)
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[3].op_type = "NoSuchOp"
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(broken)
    with pytest.raises(onnx.checker.ValidationError, match="NoSuchOp"):
        light.check_model(broken)


@pytest.mark.parametrize("build", [build_resnet, build_bert, build_bf16_mlp, _reshape_by_weight_shape])
def test_a_model_rebuilt_with_its_own_initializers_is_the_model(build):
    model = build()
    rebuilt = light.with_initializers(model, list(model.graph.initializer))
    assert rebuilt.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
def test_tensor_bytes_come_from_dims_and_type_alone(dtype):
    array = np.zeros((3, 5, 7), dtype)
    assert light.tensor_bytes(numpy_helper.from_array(array, "t")) == array.nbytes
    unloaded = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[60000, 10000],
                                data_location=TensorProto.EXTERNAL)  # 2.4 GB named, none of it here
    assert light.tensor_bytes(unloaded) == 60000 * 10000 * 4


def test_inference_in_place_changes_the_model_given_and_a_copy_does_not():
    model = specialize(build_resnet(), {"image": [2, 3, 64, 64]})
    del model.graph.value_info[:]
    copied = light.infer_shapes(model, data_prop=True)
    assert copied is not model and len(model.graph.value_info) == 0 and len(copied.graph.value_info) > 0
    assert light.infer_shapes(model, data_prop=True, in_place=True) is model and len(model.graph.value_info) > 0


def _with_contrib_gelu() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"), helper.make_node("Relu", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 4])],
                              [helper.make_tensor_value_info("y", f, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_the_symbolic_inference_types_com_microsoft_outputs():
    typed = light.typed_light_copy(_with_contrib_gelu(), data_prop=True)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*typed.graph.value_info,
                                                                                   *typed.graph.output)}
    assert dims["g"] == [2, 4] and dims["y"] == [2, 4]  # ONNX's inference leaves both without dims


def test_a_symbolic_inference_that_stops_writes_nothing_and_onnx_answers(tmp_path, monkeypatch):
    """ONNX Runtime's own `infer_shapes` saves the model into the working folder where it stops."""
    from onnxruntime.tools import symbolic_shape_infer

    def stops(self, *args, **options):
        self.run_ = False
        return False

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(symbolic_shape_infer.SymbolicShapeInference, "_infer_impl", stops)
    with pytest.raises(light.IncompleteShapes):
        light.symbolic_shapes(_with_contrib_gelu())
    assert list(tmp_path.iterdir()) == []
    typed = light.typed_light_copy(_with_contrib_gelu(), data_prop=True)  # ONNX's inference: Gelu's output untyped
    assert "g" not in {v.name for v in typed.graph.value_info if v.type.tensor_type.HasField("shape")}
