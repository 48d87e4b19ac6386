"""A test model for ragged batching: ``build_ragged_sum`` takes a ragged input flattened across the batch and one
batch input of each kind that describes element counts, and answers each request's sum and what it was told."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ._graph import FLOAT, GraphBuilder, tensor_info

INT32 = TensorProto.INT32

#: The config.pbtxt lines declaring ``build_ragged_sum``'s ragged input and its batch inputs.
RAGGED_SUM_CONFIG = """input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ENDS" data_type: TYPE_FP32 source_input: "INPUT" },
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "LONGEST" data_type: TYPE_FP32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE target_name: "ITEMS" data_type: TYPE_INT32 source_input: "INPUT" }
]
"""


def build_ragged_sum() -> onnx.ModelProto:
    """Per request (each row of the batch), float32 ``[batch, 1]`` outputs: ``SUM`` of its elements of ``INPUT``
    (found through ``OFFSETS``), ``END`` (its ``ENDS`` entry), ``COUNT``, ``LONGEST`` (the length of ``LONGEST``,
    the same for the whole batch) and ``ITEM`` (its ``ITEMS`` row)."""
    g = GraphBuilder("ragged_sum")
    running = g.op("Concat", g.const([0.0], "zero"), g.op("CumSum", "INPUT", g.const(0, "axis", dtype="int64")), axis=0)
    offsets = g.op("Cast", "OFFSETS", to=TensorProto.INT64)
    begin = g.op("Slice", offsets, g.const([0], "s0", dtype="int64"), g.const([-1], "e1", dtype="int64"))
    end = g.op("Slice", offsets, g.const([1], "s1", dtype="int64"), g.const([2**62], "big", dtype="int64"))
    one = g.const([1], "one", dtype="int64")
    g.op("Unsqueeze", g.op("Sub", g.op("Gather", running, end), g.op("Gather", running, begin)), one, name="SUM")
    g.op("Unsqueeze", "ENDS", one, name="END")
    count = g.op("Unsqueeze", g.op("Cast", "COUNTS", to=TensorProto.FLOAT), one, name="COUNT")
    longest = g.op("Cast", g.op("Shape", "LONGEST"), to=TensorProto.FLOAT)
    g.op("Expand", longest, g.op("Shape", count), name="LONGEST_OUT")
    g.op("Cast", "ITEMS", to=TensorProto.FLOAT, name="ITEM")
    out = lambda name: tensor_info(name, FLOAT, ["batch", 1])  # noqa: E731
    return g.build(
        [tensor_info("INPUT", FLOAT, ["elements"]), tensor_info("OFFSETS", INT32, ["batch_plus_one"]),
         tensor_info("ENDS", FLOAT, ["batch"]), tensor_info("COUNTS", INT32, ["batch"]),
         tensor_info("LONGEST", FLOAT, ["longest"]), tensor_info("ITEMS", INT32, ["batch", 1])],
        [out("SUM"), out("END"), out("COUNT"), out("LONGEST_OUT"), out("ITEM")],
        doc="Sums of a ragged input, with every element-count batch input (gebackend test model).",
    )
