"""compile/runtime_shapes.py on ONNX Runtime's com.microsoft ops: a static graph binds the output of one once ONNX
Runtime's symbolic shape inference (through `specialize`) fixed its shape, and not where what feeds it has a runtime
shape or no inference typed it."""

from __future__ import annotations

from onnx import TensorProto, helper

from gebackend.config import light
from gebackend.compile.runtime_shapes import runtime_shaped, runtime_shaped_outputs
from gebackend.compile.specialize import specialize


def _model():
    """x -> Gelu (com.microsoft) -> direct; x -> NonZero -> Cast -> Gelu (com.microsoft) -> after_nonzero."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Gelu", ["x"], ["direct"], name="gelu1", domain="com.microsoft"),
             helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("Cast", ["nz"], ["nzf"], to=f),
             helper.make_node("Gelu", ["nzf"], ["after_nonzero"], name="gelu2", domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, ["n", 4])],
                              [helper.make_tensor_value_info(name, f, None) for name in ("direct", "after_nonzero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_a_com_microsoft_op_typed_from_fixed_inputs_is_bound_one_after_a_runtime_shape_is_not():
    special = specialize(_model(), {"x": [2, 4]})
    outputs = runtime_shaped_outputs(special)
    assert list(outputs) == ["after_nonzero"]
    assert outputs["after_nonzero"] == ("Gelu 'gelu2': com.microsoft::Gelu is outside the ai.onnx domain, its output "
                                        "shapes are only known when it runs")
    assert "direct" not in runtime_shaped(special)


def test_without_the_symbolic_inference_a_com_microsoft_output_has_a_runtime_shape(monkeypatch):
    monkeypatch.setattr(light, "symbolic_shapes", lambda model: None)  # what it answers for opset < 7
    assert list(runtime_shaped_outputs(specialize(_model(), {"x": [2, 4]}))) == ["direct", "after_nonzero"]
