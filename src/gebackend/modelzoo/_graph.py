"""Tiny graph-assembly helper shared by the modelzoo builders.

Owns unique naming, seeded random initializers, node creation and model finalisation (opset/IR pinning + full check).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 17  # first opset with LayerNormalization
IR_VERSION = 9  # IR version paired with opset 17; loadable by onnxruntime 1.32
FLOAT = onnx.TensorProto.FLOAT
INT64 = onnx.TensorProto.INT64


def tensor_info(name: str, elem_type: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    """Graph input/output declaration; string dims become symbolic dim_params."""
    return helper.make_tensor_value_info(name, elem_type, list(shape))


class GraphBuilder:
    """Accumulates nodes and initializers; every helper returns the produced tensor name."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: set[str] = set()

    def fresh(self, prefix: str) -> str:
        name, i = prefix, 0
        while name in self._used:
            i += 1
            name = f"{prefix}_{i}"
        self._used.add(name)
        return name

    def const(self, value, name: str = "const", dtype=np.float32) -> str:
        name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float) -> str:
        return self.const(self.rng.normal(0.0, std, size=tuple(shape)), name)

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs) -> str:
        """Add a single-output node; ``name`` (made unique) names both node and output."""
        out = self.fresh(name or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def build(
        self,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        doc: str = "",
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, list(inputs), list(outputs), self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="gebackend.modelzoo",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model
