"""A patch embedding's convolution as a MatMul, so that ONNX Runtime's dynamic int8 (which quantizes MatMul and Gemm)
quantizes it too.

ViT's, CLIP's and CN_CLIP's image encoders cut the image into patches with a convolution whose kernel is its stride
and which has no padding (`Conv2d(3, 768, 16, stride=16)`): each output pixel is one patch times the weight, a
`[patches, C·k·k] x [C·k·k, O]` product (115 M multiply-adds of the 4-layer CN_CLIP image encoder's ~4.4 G). The
dynamic quantization leaves a `Conv` in float (its `ConvInteger` is slower than the float Conv here), so that product
ran in float beside int8 everywhere else: 2.9 ms of a 60 ms int8 request at 1 thread on an AVX2 EPYC. Written as
Reshape, Transpose, Reshape, MatMul (+ bias), Transpose, the same sums in another order, it is quantized with the
rest. Used on the file the int8 lowering quantizes (compile/precision.py), nowhere else: in float the Conv is as fast.
"""

from __future__ import annotations

import numpy as np
import onnx

from gebackend.compile.node_writer import NodeWriter
from gebackend.compile.row_rules import GraphView, attribute
from gebackend.compile.runtime_shapes import DEFAULT_DOMAINS


def _patch_shape(view: GraphView, node: onnx.NodeProto) -> tuple[int, int, int, int, int] | None:
    """(C, H/kh, kh, W/kw, kw) where `node` is a Conv whose kernel is its stride, without padding, dilation or
    groups, over an input of fixed channels and size its kernel divides; else None."""
    if node.op_type != "Conv" or node.domain not in DEFAULT_DOMAINS or len(node.input) < 2:
        return None
    weight, dims = view.stored(node.input[1]), view.dims.get(node.input[0])
    if weight is None or weight.ndim != 4 or weight.dtype.kind != "f" or dims is None or len(dims) != 4 \
            or not all(isinstance(d, int) for d in dims[1:]):
        return None
    _, channels, kh, kw = weight.shape
    if attribute(node, "strides", [1, 1]) != [kh, kw] or any(attribute(node, "pads", [0, 0, 0, 0])) \
            or attribute(node, "dilations", [1, 1]) != [1, 1] or attribute(node, "group", 1) != 1 \
            or attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID", "NOTSET", "VALID") \
            or attribute(node, "kernel_shape", [kh, kw]) != [kh, kw] or kh * kw == 1:
        return None
    _, c, h, w = dims
    if c != channels or h % kh or w % kw:
        return None
    return channels, h // kh, kh, w // kw, kw


def patches_as_matmul(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with every patch embedding's Conv written as a MatMul (a new model) and how many; `model` itself and 0
    where none is."""
    if not any(node.op_type == "Conv" for node in model.graph.node):
        return model, 0
    view = GraphView(model)
    found = [(node, shape) for node in model.graph.node if (shape := _patch_shape(view, node)) is not None]
    if not found:
        return model, 0
    writer = NodeWriter(model, "__patch")
    for node, (channels, rows, kh, columns, kw) in found:
        base, kernel = node.name or node.output[0], view.stored(node.input[1])
        split = writer.node("Reshape", [node.input[0], writer.weight(np.array([0, channels, rows, kh, columns, kw]), base + "_cut")],
                            base + "_cut")
        patches = writer.node("Transpose", [split], base + "_patches", perm=[0, 2, 4, 1, 3, 5])
        flat = writer.node("Reshape", [patches, writer.weight(np.array([0, rows, columns, channels * kh * kw]), base + "_flat")],
                           base + "_flat")
        matrix = kernel.reshape(kernel.shape[0], -1).T.copy()  # [C·kh·kw, O], in the order the patches are flattened
        product = writer.node("MatMul", [flat, writer.weight(matrix, base + "_weight")], base + "_product")
        if len(node.input) > 2 and node.input[2]:
            product = writer.node("Add", [product, node.input[2]], base + "_bias")
        writer.node("Transpose", [product], base, outputs=[node.output[0]], perm=[0, 3, 1, 2])
    return writer.rewritten(model, {id(node) for node, _ in found}), len(found)
