"""A stateful test model for Triton's sequence batcher: ``build_accumulator``, a running sum carried as implicit state,
with every kind of sequence control as an input, and ``build_streaming_gru``, a recurrent encoder fed chunk by
chunk."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ._graph import FLOAT, GraphBuilder, tensor_info

#: The `control_input` of a config.pbtxt's `sequence_batching` for ``build_accumulator``: START and END as int32,
#: READY as float, CORRID as uint64, as the model takes them.
ACCUMULATOR_CONTROLS = """  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]"""


def build_accumulator(width: int = 4) -> onnx.ModelProto:
    """A running sum per sequence: ``OUTPUT_STATE = INPUT + INPUT_STATE`` (float32 ``[batch, width]``), and
    ``OUTPUT = OUTPUT_STATE + 100 * START + 1000 * END``, so an answer shows the sum so far and which flags
    Triton set; ``ECHO = [CORRID, READY]`` (float32 ``[batch, 2]``) shows the other two controls."""
    g = GraphBuilder("accumulator")
    total = g.op("Add", "INPUT", "INPUT_STATE", name="OUTPUT_STATE")
    start = g.op("Mul", g.op("Cast", "START", to=TensorProto.FLOAT), g.const(100.0, "hundred"))
    end = g.op("Mul", g.op("Cast", "END", to=TensorProto.FLOAT), g.const(1000.0, "thousand"))
    g.op("Add", g.op("Add", total, start), end, name="OUTPUT")
    g.op("Concat", g.op("Cast", "CORRID", to=TensorProto.FLOAT), "READY", name="ECHO", axis=1)
    return g.build(
        [tensor_info("INPUT", FLOAT, ["batch", width]), tensor_info("INPUT_STATE", FLOAT, ["batch", width]),
         tensor_info("START", TensorProto.INT32, ["batch", 1]), tensor_info("END", TensorProto.INT32, ["batch", 1]),
         tensor_info("READY", FLOAT, ["batch", 1]), tensor_info("CORRID", TensorProto.UINT64, ["batch", 1])],
        [tensor_info("OUTPUT", FLOAT, ["batch", width]), tensor_info("OUTPUT_STATE", FLOAT, ["batch", width]),
         tensor_info("ECHO", FLOAT, ["batch", 2])],
        doc="Running sum carried as implicit state, with sequence controls (gebackend test model).",
    )


def accumulator_reference(steps: list[np.ndarray], correlation_id: int) -> list[dict[str, np.ndarray]]:
    """What ``build_accumulator`` answers to one sequence's requests (each ``[rows, width]``), in order."""
    answers, state = [], 0.0
    for i, rows in enumerate(steps):
        state = state + rows
        flags = 100.0 * (i == 0) + 1000.0 * (i == len(steps) - 1)
        echo = np.tile(np.array([[float(correlation_id), 1.0]], np.float32), (rows.shape[0], 1))
        answers.append({"OUTPUT": (state + flags).astype(np.float32), "OUTPUT_STATE": state.astype(np.float32), "ECHO": echo})
    return answers


def build_streaming_gru(features: int = 80, hidden: int = 512, frames: int = 16, classes: int = 128,
                        seed: int = 0) -> onnx.ModelProto:
    """A streaming recurrent encoder, as a speech model serves chunks: ``INPUT`` float32 ``[batch, frames,
    features]`` runs through a GRU that starts from ``INPUT_STATE`` ``[batch, 1, hidden]`` and leaves its last
    hidden state in ``OUTPUT_STATE``; ``OUTPUT`` ``[batch, frames, classes]`` is a linear layer over each frame.
    Random weights (``seed``); about ``6 * frames * hidden * (features + hidden)`` flops a chunk."""
    g = GraphBuilder("streaming_gru", seed)
    x = g.op("Transpose", "INPUT", perm=[1, 0, 2])  # ONNX Runtime's GRU takes [frames, batch, features]
    h0 = g.op("Transpose", "INPUT_STATE", perm=[1, 0, 2])
    w = g.normal("W", [1, 3 * hidden, features], features ** -0.5)
    r = g.normal("R", [1, 3 * hidden, hidden], hidden ** -0.5)
    b = g.normal("B", [1, 6 * hidden], 0.1)
    y = g.fresh("Y")
    y_h = g.fresh("Y_h")
    g.nodes.append(onnx.helper.make_node("GRU", [x, w, r, b, "", h0], [y, y_h], name="gru", hidden_size=hidden,
                                         linear_before_reset=1))
    g.op("Transpose", y_h, name="OUTPUT_STATE", perm=[1, 0, 2])
    frames_first = g.op("Squeeze", y, g.const([1], "axis", np.int64))
    g.op("MatMul", g.op("Transpose", frames_first, perm=[1, 0, 2]), g.normal("W_out", [hidden, classes], hidden ** -0.5),
         name="OUTPUT")
    return g.build(
        [tensor_info("INPUT", FLOAT, ["batch", frames, features]), tensor_info("INPUT_STATE", FLOAT, ["batch", 1, hidden])],
        [tensor_info("OUTPUT", FLOAT, ["batch", frames, classes]), tensor_info("OUTPUT_STATE", FLOAT, ["batch", 1, hidden])],
        doc="Streaming GRU encoder with its hidden state carried as implicit state (gebackend bench model).",
    )
