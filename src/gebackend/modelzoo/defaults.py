"""Models whose initializers are also graph inputs, as old exporters wrote them (torch.onnx's
`keep_initializers_as_inputs=True`): defaults a caller may replace (config/optional_inputs.py)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx

from ._graph import FLOAT, GraphBuilder, tensor_info

#: The config.pbtxt input lines serving ``build_scale_shift``'s two defaults as optional inputs (``W`` stays unlisted).
SCALE_SHIFT_OPTIONAL = """input [
  { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "scale" data_type: TYPE_FP32 dims: [ 4 ] optional: true },
  { name: "shift" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
]
"""


def initializers_as_inputs(model: onnx.ModelProto, names: Iterable[str] | None = None) -> onnx.ModelProto:
    """A copy of `model` listing its initializers (all, or those in `names`) among the graph inputs too."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    wanted = None if names is None else set(names)
    listed = {v.name for v in result.graph.input}
    for init in result.graph.initializer:
        if (wanted is None or init.name in wanted) and init.name not in listed:
            result.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return result


def build_scale_shift() -> onnx.ModelProto:
    """``y = (x @ W) * scale + shift`` for float32 ``x`` of shape ``[n, 4]``; ``W``, ``scale`` and ``shift`` are
    initializers listed as graph inputs (defaults: seeded random ``W``, ``scale`` 1..4, ``shift`` 0.5)."""
    g = GraphBuilder("scale_shift", seed=7)
    weight = g.normal("W", (4, 4), 0.5)
    scale = g.const([1.0, 2.0, 3.0, 4.0], "scale")
    shift = g.const([0.5] * 4, "shift")
    g.op("Add", g.op("Mul", g.op("MatMul", "x", weight), scale), shift, name="y")
    return initializers_as_inputs(g.build([tensor_info("x", FLOAT, ["n", 4])], [tensor_info("y", FLOAT, ["n", 4])]))


def scale_shift_reference(x: np.ndarray, scale: np.ndarray | None = None, shift: np.ndarray | None = None) -> np.ndarray:
    """What ``build_scale_shift`` answers, with the file's defaults where `scale` or `shift` is None."""
    model = build_scale_shift()
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    scale = values["scale"] if scale is None else scale
    shift = values["shift"] if shift is None else shift
    return (x @ values["W"]) * scale + shift
