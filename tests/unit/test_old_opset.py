"""Files below opset 7: the static graph's upgrade pass converts them to opset 7 (compile/upgrade.py), and PRelu's
per-channel slope keeps its meaning."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import upgrade
from gebackend.config.options import BackendOptions


def _opset6(nodes, inputs, output, initializers=()):
    graph = helper.make_graph(nodes, "old", inputs, [output], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    return model


def _prelu_model(shape, slope):
    """PRelu at opset 6 with a per-channel slope (a constant also listed as a graph input, as PyTorch wrote it)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    s = helper.make_tensor_value_info("slope", TensorProto.FLOAT, [len(slope)])
    return _opset6([helper.make_node("PRelu", ["x", "slope"], ["y"])], [x, s],
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
                   [numpy_helper.from_array(np.asarray(slope, np.float32), "slope")])


@pytest.mark.parametrize("static", [True], ids=["static"])
def test_prelu_keeps_its_per_channel_slope_where_opset_7_would_broadcast_it_over_the_last_axis(static, tmp_path):
    # [2, 3, 3]: the slope's 3 values fit the last axis too, so without the Unsqueeze the answer is silently wrong
    from gebackend.config.onnx_signature import read_signature
    from gebackend.config.spec import build_model_spec
    from gebackend.runtime.loader import load_executor

    slope = [0.1, 0.2, 0.3]
    path = tmp_path / "model.onnx"
    onnx.save(_prelu_model([2, 3, 3], slope), str(path))
    spec = build_model_spec({"name": "prelu", "max_batch_size": 0}, read_signature(path), path,
                            BackendOptions.make(static_model=static, intra_op_thread_count=1))
    executor, _ = load_executor(spec)
    x = -np.ones((2, 3, 3), np.float32)
    (answer,) = executor.execute([{"x": x}])
    want = x * np.asarray(slope, np.float32).reshape(1, 3, 1)  # channel c scaled by slope[c]
    np.testing.assert_allclose(answer["y"], want, rtol=1e-6)
    executor.close()


def test_a_shared_slope_and_a_rank_2_input_are_left_as_they_are():
    shared = _prelu_model([2, 3, 4], [0.25])
    assert upgrade.channel_slopes(shared) is shared
    rank2 = _prelu_model([2, 3], [0.1, 0.2, 0.3])  # [N, C]: broadcasting from the right is the channel axis
    assert upgrade.channel_slopes(rank2) is rank2
