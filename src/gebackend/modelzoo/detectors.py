"""Small convolution models, random weights, built in code, shaped like the real files whose input sizes matter:
`build_detector_neck` is a detector's neck (YOLO, DBNet) with free height and width whose full-resolution branch is
concatenated with one downsampled by 64 and upsampled back, so it runs only at sides divisible by 64 (320, 640, not
16 nor 224), as YOLOv8's Concat runs only at multiples of 32; `build_unranked_conv` is a voice-activity detector's
front whose convolutions read a tensor of a rank only a run knows (a Squeeze with no axes of a free dim), which ONNX
Runtime runs and OpenVINO cannot read ("The input data tensor's rank has to be known")."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STRIDE = 64  # the neck's coarsest stride: its height and width must be multiples of it


def _weights(rng: np.random.Generator, shapes: Mapping[str, tuple[int, ...]], scale: float = 0.3) -> list:
    return [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
            for name, shape in shapes.items()]


def build_detector_neck(seed: int = 0, metadata: Mapping[str, str] | None = None, channels: int = 8) -> onnx.ModelProto:
    """images [batch, 3, height, width] -> y [batch, 4, height, width]: three Convs, a stride-64 branch upsampled 64x
    by Resize and concatenated with the full-resolution one. `metadata`: the file's metadata_props (an exporter's
    `imgsz`)."""
    rng = np.random.default_rng(seed)
    stored = _weights(rng, {"w1": (channels, 3, 3, 3), "b1": (channels,), "w2": (channels, channels, 1, 1),
                            "w3": (4, 2 * channels, 3, 3)})
    stored.append(numpy_helper.from_array(np.array([1, 1, STRIDE, STRIDE], np.float32), "scales"))
    nodes = [helper.make_node("Conv", ["images", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["coarse"], strides=[STRIDE, STRIDE]),
             helper.make_node("Resize", ["coarse", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["r1", "up"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "detector_neck",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "height", "width"])], stored)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    return model


def build_unranked_conv(seed: int = 0) -> onnx.ModelProto:
    """audio [1, 1, samples] -> y [1, 2]: Squeeze (no axes) and Unsqueeze back, two Conv1d, a mean over time and a
    MatMul head."""
    rng = np.random.default_rng(seed)
    stored = _weights(rng, {"w1": (4, 1, 3), "w2": (4, 4, 3), "head": (4, 2)}, scale=1.0)
    stored.append(numpy_helper.from_array(np.array([0, 1], np.int64), "axes"))
    nodes = [helper.make_node("Squeeze", ["audio"], ["flat"]),
             helper.make_node("Unsqueeze", ["flat", "axes"], ["framed"]),
             helper.make_node("Conv", ["framed", "w1"], ["c1"], pads=[1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1]),
             helper.make_node("ReduceMean", ["c2"], ["mean"], axes=[2], keepdims=0),
             helper.make_node("MatMul", ["mean", "head"], ["y"])]
    graph = helper.make_graph(nodes, "unranked_conv",
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "samples"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], stored)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model
