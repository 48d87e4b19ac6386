"""Tiny weight-free test models: ``build_add_mul`` (dynamic batch, two outputs) and ``build_identity_fixed`` (static, no batch dim)."""

from __future__ import annotations

import onnx

from ._graph import FLOAT, GraphBuilder, tensor_info


def build_add_mul(seed: int = 0) -> onnx.ModelProto:
    """``sum = x + y`` and ``product = x * y`` for ``x``, ``y`` float32 ``[batch, 4]``. ``seed`` is unused (no weights)."""
    g = GraphBuilder("add_mul", seed)
    g.op("Add", "x", "y", name="sum")
    g.op("Mul", "x", "y", name="product")
    return g.build(
        [tensor_info("x", FLOAT, ["batch", 4]), tensor_info("y", FLOAT, ["batch", 4])],
        [tensor_info("sum", FLOAT, ["batch", 4]), tensor_info("product", FLOAT, ["batch", 4])],
        doc="Elementwise add and multiply (gebackend test model).",
    )


def build_identity_fixed() -> onnx.ModelProto:
    """``y = Identity(x)`` with ``x`` float32 ``[2, 3]``: a fully static model without a batch dimension."""
    g = GraphBuilder("identity_fixed")
    g.op("Identity", "x", name="y")
    return g.build(
        [tensor_info("x", FLOAT, [2, 3])],
        [tensor_info("y", FLOAT, [2, 3])],
        doc="Static-shape identity (gebackend test model).",
    )
