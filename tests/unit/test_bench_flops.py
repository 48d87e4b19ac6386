"""bench/flops.py: the operations of a graph's matrix products and convolutions, by class."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.bench import flops


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _float(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def test_a_batched_matmul_counts_two_operations_per_multiply_add_for_every_batch_entry():
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                   [_float("a", ["n", 4, 3, 5]), _float("b", [5, 7])], [_float("y", None)])
    counted = flops.at_shapes(model, {"a": [2, 4, 3, 5]})
    assert counted.by_class == {"matmul": 2 * (2 * 4 * 3) * 5 * 7, "conv": 0}
    assert counted.unknown == []


def test_gemm_reads_k_from_the_transposed_side():
    weight = numpy_helper.from_array(np.zeros((6, 5), np.float32), "w")
    model = _model([helper.make_node("Gemm", ["a", "w"], ["y"], transA=1, transB=1)],
                   [_float("a", [5, 3])], [_float("y", None)], [weight])
    assert flops.at_shapes(model, {}).by_class["matmul"] == 2 * 3 * 5 * 6


def test_a_grouped_convolution_sums_only_its_groups_channels():
    weight = numpy_helper.from_array(np.zeros((8, 2, 3, 3), np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1])],
                   [_float("x", ["n", 8, 10, 10])], [_float("y", None)], [weight])
    counted = flops.at_shapes(model, {"x": [1, 8, 10, 10]})
    assert counted.by_class == {"matmul": 0, "conv": 2 * (8 * 10 * 10) * (2 * 3 * 3)}


def test_other_operators_are_not_counted_and_unknown_shapes_are_named():
    model = _model([helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "b"], ["y"], name="mm")],
                   [_float("a", [2, 3]), _float("b", [3, 4])], [_float("y", [2, 4])])
    assert flops.count(model).total == 0  # no shapes inferred yet: r is unknown
    assert flops.count(model).unknown == ["mm"]
    assert flops.at_shapes(model, {}).total == 2 * 2 * 3 * 4


def test_kernel_time_adds_each_class_at_its_rate_and_leaves_out_a_class_without_one():
    ops = {"matmul": 80e9, "conv": 30e9, "other": 5e9}
    assert flops.kernel_time(ops, {"matmul": 100e9, "conv": 150e9}) == pytest.approx(0.8 + 0.2)
    assert flops.kernel_time(ops, {"matmul": 100e9}) == pytest.approx(0.8)
