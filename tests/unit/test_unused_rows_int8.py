"""compile/unused_rows.py on int8 graphs: the rows pass moves a selection through the ops ONNX Runtime's quantizers
write (DynamicQuantizeLinear, MatMulInteger, QuantizeLinear, DequantizeLinear): small graphs for what moves and what
must stop the selection (a torch export quantized by ONNX Runtime: tests/unit/test_sequence_first_attention.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile.row_rules import GraphView
from gebackend.compile.unused_rows import prune_unused_rows

from test_unused_rows import _run


def _dims(model: onnx.ModelProto, op_type: str) -> list[tuple]:
    view = GraphView(model)
    return [view.dims.get(node.output[0]) for node in model.graph.node if node.op_type == op_type]


def _quantized_rows(scale_is_output: bool = False, zero_point_per_row: bool = False, tokens: int = 6) -> onnx.ModelProto:
    """x [1, tokens, 8] -> DynamicQuantizeLinear -> MatMulInteger (int8 weight) -> Cast -> Mul(scale) -> token 0."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.integers(-127, 128, (8, 4)).astype(np.int8), "w")
    weight_zero = numpy_helper.from_array(np.array(0, np.int8), "w_zero")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero"])]
    zero = "zero"
    if zero_point_per_row:
        nodes.append(helper.make_node("Expand", ["zero", "rows"], ["zero_rows"]))
        zero = "zero_rows"
    nodes += [
        helper.make_node("MatMulInteger", ["q", "w", zero, "w_zero"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_f", "scale"], ["scaled"]),
        helper.make_node("Gather", ["scaled", "first"], ["y"], axis=1),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]
    if scale_is_output:
        outputs.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "int8_rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, 8])],
                              outputs, [weight, weight_zero, numpy_helper.from_array(np.array(0, np.int64), "first"),
                                        numpy_helper.from_array(np.array([tokens], np.int64), "rows")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dynamic_quantization_moved_quantizes_the_kept_rows_with_their_own_range():
    model = _quantized_rows()
    pruned, moved = prune_unused_rows(model)
    assert moved == 4 and _dims(pruned, "DynamicQuantizeLinear") == [(1, 1, 8)]
    x = np.random.default_rng(2).standard_normal((1, 6, 8)).astype(np.float32)
    x[0, 3] *= 20  # a row far from the kept one: the whole tensor's range would quantize the kept row coarsely
    got = _run(pruned, {"x": x})[0]
    alone = _run(_quantized_rows(tokens=1), {"x": np.ascontiguousarray(x[:, :1])})[0]
    np.testing.assert_array_equal(got, alone)  # row 0 quantized on its own
    assert not np.allclose(got, _run(model, {"x": x})[0], atol=1e-3)  # and not as the whole tensor quantized it


@pytest.mark.parametrize("what", ["the scale is an output", "a zero point per row"])
def test_a_quantization_the_kept_rows_cannot_describe_stops_the_selection(what):
    model = _quantized_rows(scale_is_output=what == "the scale is an output",
                            zero_point_per_row=what == "a zero point per row")
    pruned, _ = prune_unused_rows(model)
    assert _dims(pruned, "DynamicQuantizeLinear") == [(1, 6, 8)]  # the MatMulInteger after it, for the kept row only
    if what == "a zero point per row":
        assert _dims(pruned, "MatMulInteger") == [(1, 6, 4)]
        return  # ONNX Runtime's MatMulInteger takes a zero point per tensor only: the graph is the spec's, not run
    x = np.random.default_rng(3).standard_normal((1, 6, 8)).astype(np.float32)
    for got, want in zip(_run(pruned, {"x": x}), _run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def _qdq_rows(axis: int | None) -> onnx.ModelProto:
    """x [1, 6, 8] -> QuantizeLinear -> DequantizeLinear (scale per tensor, or per slice of `axis`) -> MatMul -> token 0."""
    rng = np.random.default_rng(4)
    size = 1 if axis is None else (1, 6, 8)[axis]
    scale = numpy_helper.from_array(np.full(size, 0.02, np.float32).reshape(() if axis is None else (size,)), "s")
    zero = numpy_helper.from_array(np.full(size, 3, np.uint8).reshape(() if axis is None else (size,)), "z")
    per_axis = {} if axis is None else {"axis": axis}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **per_axis),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **per_axis),
        helper.make_node("MatMul", ["d", "w"], ["m"]),
        helper.make_node("Gather", ["m", "first"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "qdq_rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [scale, zero, numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
                               numpy_helper.from_array(np.array(0, np.int64), "first")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("axis, rows", [(None, 1), (2, 1), (1, 6)])
def test_quantize_dequantize_pass_rows_unless_their_scales_run_along_them(axis, rows):
    model = _qdq_rows(axis)
    pruned, _ = prune_unused_rows(model)
    assert _dims(pruned, "QuantizeLinear") == [(1, rows, 8)] and _dims(pruned, "DequantizeLinear") == [(1, rows, 8)]
    x = np.random.default_rng(5).standard_normal((1, 6, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(pruned, {"x": x})[0], _run(model, {"x": x})[0])
