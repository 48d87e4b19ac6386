"""How much arithmetic one run of a model is: the multiply-adds of its matrix products and convolutions, counted
from the graph at fixed input shapes (bench/ceiling.py divides it by what this CPU's kernels do per second).

Two classes, because engines run them with different kernels and int8 pays off differently on each:
- "matmul": MatMul, Gemm, MatMulInteger, QLinearMatMul (2·M·K·N operations for an [M, K] × [K, N] product,
  batched products counted once per batch entry);
- "conv": Conv, ConvInteger, QLinearConv (2 operations per output element per input channel of its group and
  per kernel position).

Everything else (normalisations, activations, softmax, reshapes) is left out: it is memory-bound and is the
same work at any precision. A node whose shapes shape inference could not give is counted in `unknown`, so a
caller can say the count is a floor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from gebackend.compile.passes import compile_graph

MATMUL_OPS = {"MatMul": (0, 1), "MatMulInteger": (0, 1), "QLinearMatMul": (0, 3), "Gemm": (0, 1)}
CONV_OPS = {"Conv": (0, 1), "ConvInteger": (0, 1), "QLinearConv": (0, 3)}  # (input, weight) positions


@dataclass
class Flops:
    """Operations (2 per multiply-add) by class, and the nodes of those classes whose shapes were unknown."""

    by_class: dict[str, int] = field(default_factory=lambda: {"matmul": 0, "conv": 0})
    unknown: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.by_class.values())


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every tensor whose dims are all known: graph inputs, value_info, outputs and initializers."""
    known: dict[str, tuple[int, ...]] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            known[value.name] = tuple(d.dim_value for d in dims)
    for init in model.graph.initializer:
        known[init.name] = tuple(init.dims)
    return known


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _matmul(node: onnx.NodeProto, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> int:
    """2 per multiply-add: every output element sums K products (K: A's last dim, or its first for Gemm's transA)."""
    if node.op_type == "Gemm" and _attr(node, "transA", 0):
        return 2 * math.prod(out) * a[0]
    return 2 * math.prod(out) * a[-1]


def _conv(node: onnx.NodeProto, x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...]) -> int:
    """2 per multiply-add: every output element sums its group's input channels x kernel positions (W's dims 1..)."""
    return 2 * math.prod(out) * math.prod(w[1:])


def count(model: onnx.ModelProto) -> Flops:
    """The operations of `model` as it is (its inputs' dims must be fixed, and shapes inferred: see `at_shapes`)."""
    known = _shapes(model)
    result = Flops()
    for node in model.graph.node:
        table, kind = (MATMUL_OPS, "matmul") if node.op_type in MATMUL_OPS else (CONV_OPS, "conv")
        if node.op_type not in table:
            continue
        first, second = (node.input[i] if i < len(node.input) else "" for i in table[node.op_type])
        a, b, out = known.get(first), known.get(second), known.get(node.output[0])
        if a is None or b is None or out is None:
            result.unknown.append(node.name or node.op_type)
        else:
            result.by_class[kind] += (_matmul if kind == "matmul" else _conv)(node, a, b, out)
    return result


def at_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> Flops:
    """The operations of one run of `model` with its inputs at `shapes` (specialised, shapes inferred, folded)."""
    fixed = compile_graph(model, shapes, None, lambda pass_name, why: None)
    return count(onnx.shape_inference.infer_shapes(fixed, data_prop=True))


def kernel_time(ops: Mapping[str, int], rates: Mapping[str, float]) -> float:
    """Seconds one run's products take at the kernels' `rates` (operations a second, per class); a class without a
    rate is not counted. Over a model's measured time: how close it runs to what its kernels do alone."""
    return sum(n / rates[kind] for kind, n in ops.items() if n and rates.get(kind))
