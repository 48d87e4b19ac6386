"""compile/unused_rows.py where the region holds a selection itself: queries taken with a Gather from a projection
that stacks queries, keys and values (CLIP's image encoder, `nn.MultiheadAttention`'s packed in-projection). The
moved Gather selects rows the region already keeps: it is not moved again (it swapped places with the Slice it
reads, one node a time, until the pass's limit of 16 moves)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import unused_rows
from tests.unit.test_unused_rows import _same_answers

S, B, H = 5, 2, 4


def _stacked() -> onnx.ModelProto:
    """x [S, B, H] @ w [H, 3H] -> [S, B, 3, H] -> [3, S, B, H]; q = [0] -> relu -> its first token; k = [1] summed."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((H, 3 * H)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([S, B, 3, H], np.int64), "split"),
               numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["qkv"]), helper.make_node("Reshape", ["qkv", "split"], ["parts"]),
             helper.make_node("Transpose", ["parts"], ["stacked"], perm=[2, 0, 1, 3]),
             helper.make_node("Gather", ["stacked", "zero"], ["q"], axis=0), helper.make_node("Relu", ["q"], ["r"]),
             helper.make_node("Gather", ["r", "zero"], ["first"], axis=0),
             helper.make_node("Gather", ["stacked", "one"], ["k"], axis=0),
             helper.make_node("ReduceSum", ["k"], ["k_sum"], keepdims=0)]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("x", f, [S, B, H])],
                              [helper.make_tensor_value_info(name, f, None) for name in ("first", "k_sum")], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_moved_selection_is_not_moved_again():
    model = _stacked()
    pruned, moved = unused_rows.prune_unused_rows(model)
    # the projection for the queries and keys only (values unread: 3 nodes), then the Relu and the queries' Gather
    # once (before: 19, the Gather and its Slice swapping 14 times more)
    assert moved == 5
    assert not [node for node in pruned.graph.node if node.op_type == "Identity"]
    _same_answers(model, pruned, {"x": np.random.default_rng(1).standard_normal((S, B, H)).astype(np.float32)})
