"""compile/untie.py: an Identity of an initializer becomes an initializer of its own, the graph computing the same,
so that ONNX Runtime's static int8 fuses every convolution of a torch-exported net into an int8 kernel."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import quantize_static
from gebackend.compile.calibration import random_samples
from gebackend.compile.precision import lower_precision
from gebackend.compile.untie import untie_constants


def shared_bias_convnet() -> onnx.ModelProto:
    """Two 3x3 convolutions sharing one bias, the second through an Identity (as PyTorch's exporter writes it)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, c, 3, 3)) / 6).astype(np.float32), f"w{i}")
             for i, c in ((1, 4), (2, 8))]
    inits.append(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) / 10, "bias"))
    nodes = [helper.make_node("Conv", ["x", "w1", "bias"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Identity", ["bias"], ["bias_again"]),
             helper.make_node("Conv", ["r1", "w2", "bias_again"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"])]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_an_identity_of_an_initializer_becomes_its_own_initializer_and_the_outputs_stay_the_same():
    model = shared_bias_convnet()
    x = np.random.default_rng(1).standard_normal((2, 4, 16, 16)).astype(np.float32)
    before = _run(model, x)
    assert untie_constants(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu", "Conv", "Relu"]
    copy = next(i for i in model.graph.initializer if i.name == "bias_again")
    assert np.array_equal(numpy_helper.to_array(copy), numpy_helper.to_array(
        next(i for i in model.graph.initializer if i.name == "bias")))
    onnx.checker.check_model(model)
    np.testing.assert_array_equal(_run(model, x)[0], before[0])


def test_a_chain_of_identities_is_untied_to_its_end():
    model = shared_bias_convnet()
    conv = model.graph.node[3]
    conv.input[2] = "bias_thrice"
    model.graph.node.insert(3, helper.make_node("Identity", ["bias_again"], ["bias_thrice"]))
    assert untie_constants(model) == 2
    assert "Identity" not in {n.op_type for n in model.graph.node}
    onnx.checker.check_model(model)


def test_an_identity_giving_a_graph_output_or_reading_an_overridable_default_is_kept():
    model = shared_bias_convnet()
    model.graph.output.append(helper.make_tensor_value_info("bias_again", TensorProto.FLOAT, [8]))
    assert untie_constants(model) == 0
    model = shared_bias_convnet()
    model.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [8]))  # IR 3 style default
    assert untie_constants(model) == 0
    assert "Identity" in {n.op_type for n in model.graph.node}


def test_onnxruntime_static_int8_runs_every_convolution_as_an_int8_kernel_when_a_bias_is_shared(tmp_path):
    source, out = tmp_path / "net.onnx", tmp_path / "net.int8.onnx"
    onnx.save(shared_bias_convnet(), str(source))
    lines = []
    quantize_static.quantize("onnxruntime", source, out, random_samples(source, 8), lines.append)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    ops = Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)
    assert ops["QLinearConv"] == 2 and ops["Conv"] == 0, ops  # untied: no fp32 Conv between DequantizeLinear nodes
    assert any("1 constant(s) the graph held in Constant nodes or shared through Identity" in line for line in lines), lines


def constant_weight_mlp() -> onnx.ModelProto:
    """y = x @ W with W held in a Constant node (as some exporters write weights), and a scalar Constant scale."""
    weight = numpy_helper.from_array(np.random.default_rng(2).standard_normal((64, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["w_out"], value=weight),
             helper.make_node("Constant", [], ["scale"], value_float=0.5),
             helper.make_node("MatMul", ["x", "w_out"], ["h"]), helper.make_node("Mul", ["h", "scale"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_constant_nodes_become_initializers_with_their_values():
    model = constant_weight_mlp()
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    before = _run(model, x)[0]
    assert untie_constants(model) == 2
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Mul"]
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert values["scale"].dtype == np.float32 and float(values["scale"]) == 0.5
    onnx.checker.check_model(model)
    np.testing.assert_array_equal(_run(model, x)[0], before)


def test_string_constants_and_ir3_files_are_left_as_they_are():
    model = constant_weight_mlp()
    model.graph.node.insert(0, helper.make_node("Constant", [], ["label"], value=helper.make_tensor(
        "label", TensorProto.STRING, [1], [b"cat"])))
    assert untie_constants(model) == 2 and model.graph.node[0].output[0] == "label"
    old = constant_weight_mlp()
    old.ir_version = 3
    assert untie_constants(old) == 0


def test_dynamic_int8_quantizes_a_weight_held_in_a_constant_node(tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(constant_weight_mlp(), str(source))
    lines = []
    out = lower_precision(source, "int8", tmp_path / "out", log=lines.append)
    ops = Counter(node.op_type for node in onnx.load(str(out)).graph.node)
    assert ops["MatMul"] == 0 and ops["MatMulInteger"] + ops["DynamicQuantizeMatMul"] >= 1, ops
    assert any("1 of 1 node(s) with constant weights quantized" in line for line in lines), lines
