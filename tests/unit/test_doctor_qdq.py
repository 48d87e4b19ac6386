"""The graph doctor on a QDQ int8 model (compile/constants.py): a DequantizeLinear of constant int8 weights is a
quantized weight the fold keeps, not a foldable constant subgraph; every subgraph it reports is one the fold removes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile.doctor import analyze, fix
from gebackend.modelzoo import build_qdq_resnet


def _qdq_conv() -> onnx.ModelProto:
    """x -> Conv(x, DequantizeLinear(int8 weight)) + Identity(bias): one quantized weight, one foldable Identity."""
    weight = numpy_helper.from_array(np.arange(-27, 27, dtype=np.int8).reshape(2, 3, 3, 3), "w_q")
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "w_scale")
    zero = numpy_helper.from_array(np.array(0, np.int8), "w_zero")
    bias = numpy_helper.from_array(np.array([0.5, -0.5], np.float32).reshape(1, 2, 1, 1), "bias")
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_dq"),
        helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
        helper.make_node("Identity", ["bias"], ["bias_id"], name="bias_id"),
        helper.make_node("Add", ["conv", "bias_id"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 6])],
                              [weight, scale, zero, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_quantized_weight_is_not_reported_as_foldable():
    model = _qdq_conv()
    report = analyze(model)
    assert [(g.sink_op, g.folded) for g in report.foldable] == [("Identity", True)]
    assert report.foldable_node_count == 1
    assert "foldable constant subgraphs: 1 (1 node)" in report.format_text()
    fixed, removed = fix(model)
    assert removed == 1 and [n.op_type for n in fixed.graph.node].count("DequantizeLinear") == 1  # the weight stays int8
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]  # noqa: E731
    np.testing.assert_allclose(run(fixed), run(model), rtol=1e-5, atol=1e-6)


def test_onnxruntimes_qdq_model_reports_only_what_the_fold_removes():
    model = build_qdq_resnet()
    weights = sum(n.op_type == "DequantizeLinear" and all(i in {t.name for t in model.graph.initializer} for i in n.input)
                  for n in model.graph.node)
    assert weights > 0  # ONNX Runtime's quantizer wrote int8 weights behind DequantizeLinear nodes
    report = analyze(model, {"image": (1, 3, 32, 32)})
    assert all(g.sink_op != "DequantizeLinear" for g in report.foldable), [g.sink_op for g in report.foldable]
    assert all(g.folded for g in report.foldable)
    assert sum(len(g.nodes) for g in report.foldable) <= report.foldable_node_count
