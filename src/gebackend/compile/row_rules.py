"""Which rows of its inputs a node needs for some rows of its output: the rules of compile/unused_rows.py, one per kind
of op, and the view of the graph they read (who makes and reads each tensor, its dims, its constants).

`plan(view, node, rows)` answers for the node making a tensor, `rows` (`Rows`: [start, stop) of one axis) of which
are wanted: per input, the rows of it to compute from (None: the whole input, as a weight or a broadcast operand),
and what of the node changes with them (a Reshape's target); or None when the node does not work row by row on that
axis, or a dim the rule needs is unknown. ai.onnx ops have rules, and the com.microsoft ops ONNX Runtime's transformer
optimizer writes row by row (`SkipLayerNormalization`, `BiasGelu`, ... : `optimum-cli export onnx --optimize`'s files);
a graph with com.microsoft ops gets its dims from ONNX Runtime's symbolic shape inference, which knows them.
An int8 file's ops pass rows too: (De)QuantizeLinear, MatMulInteger, and DynamicQuantizeLinear, whose scale and zero
point (`recomputed_outputs`) then describe the kept rows, not the whole input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gebackend.compile.upgrade import default_opset
from gebackend.config import light

Dim = int | str | None  # a fixed dim, a symbolic one, or unknown

_UNARY = frozenset({
    "Abs", "Acos", "Asin", "Atan", "Cast", "Ceil", "Celu", "Cos", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu",
    "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal",
    "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
    "ThresholdedRelu", "Clip", "CastLike",
})  # input 0 row by row; Clip's bounds and CastLike's target are scalars / types
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Mod", "Equal", "Greater", "Less",
    "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Where", "PRelu", "BitShift",
})
# ONNX Runtime's fused ops that work row by row on every axis but the last, which they normalise or add a bias along;
# the Skip* norms also add their second input (the residual, broadcast as Add broadcasts)
_CONTRIB_ROWWISE = frozenset({"BiasGelu", "FastGelu", "Gelu", "QuickGelu"})
_CONTRIB_SKIP_NORMS = frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
_ROWS_IN_EVERY_OUTPUT = _CONTRIB_SKIP_NORMS | {"LayerNormalization", "Dropout"}
# outputs that describe a node's whole input, not its rows: DynamicQuantizeLinear's scale and zero point. Where its
# rows are cut they are computed from the kept rows, whose own range quantizes them at least as finely (the step
# `range / 255` can only shrink): the answer moves by less than the int8 model's own rounding, towards fp32
_STATISTICS = {"DynamicQuantizeLinear": (1, 2)}
_REDUCE = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
})


@dataclass(frozen=True)
class Rows:
    """Rows [start, stop) of one axis of a tensor; counted from the axis' end where `start` is negative (then `stop`
    is too, or 0 for the end: the last token of a sequence of any length is (-1, 0))."""

    axis: int
    start: int
    stop: int


class GraphView:
    """The model's nodes, who makes and who reads each tensor (`readers`: each reading node, once per input it is
    read through; subgraph bodies' reads in `body_reads`), its dims as shape inference gives them and its constants."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.model = model
        self.opset = default_opset(model) or 1
        self.maker = {out: node for node in graph.node for out in node.output if out}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(node)
        self.body_reads = subgraph_reads(graph)
        self.outputs = {value.name for value in graph.output}
        self.values = {init.name: init for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
                self.values[node.output[0]] = node.attribute[0].t
        inferred = light.typed_light_copy(model, data_prop=True)  # no copy of the weights (0.4 s on BERT-base)
        self.dims: dict[str, tuple[Dim, ...]] = {}
        for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
            tensor = value.type.tensor_type
            if value.type.WhichOneof("value") == "tensor_type" and tensor.HasField("shape"):
                self.dims[value.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                              for d in tensor.shape.dim)
        for init in graph.initializer:
            self.dims[init.name] = tuple(init.dims)

    def constant(self, name: str) -> np.ndarray | None:
        tensor = self.values.get(name)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:  # a weight's bytes are not loaded
            return None
        return numpy_helper.to_array(tensor)

    def stored(self, name: str) -> np.ndarray | None:
        """The stored value of `name`, through the `Identity`s an exporter reads a weight used twice through."""
        while (maker := self.maker.get(name)) is not None and maker.op_type == "Identity" \
                and maker.domain in ("", "ai.onnx"):
            name = maker.input[0]
        return self.constant(name)

    def ints(self, node: onnx.NodeProto, attribute: str, input_index: int) -> list[int] | None:
        """An int-list operand given as an attribute (older opsets) or a constant input (newer ones)."""
        for attr in node.attribute:
            if attr.name == attribute:
                return list(helper.get_attribute_value(attr))
        if len(node.input) > input_index and node.input[input_index]:
            value = self.constant(node.input[input_index])
            return None if value is None else [int(v) for v in value.reshape(-1)]
        return None


def attribute(node: onnx.NodeProto, name: str, default):
    """The node's attribute `name`, or `default` where it has none."""
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _broadcast_input(graph: GraphView, name: str, rows: Rows, rank: int, out_dim: Dim):
    """How input `name` of a broadcasting op takes `rows` of the output: None (it broadcasts there: unchanged),
    the Rows on its own axis, or False (its dim there is unknown: cannot tell)."""
    dims = graph.dims.get(name)
    if dims is None:
        return False
    axis = rows.axis - (rank - len(dims))
    if axis < 0 or dims[axis] == 1:
        return None
    if dims[axis] == out_dim and out_dim is not None:
        return Rows(axis, rows.start, rows.stop)
    return False


Plan = list  # per input: Rows to take, or None to keep it whole; or None when the node cannot pass the rows


def plan(graph: GraphView, node: onnx.NodeProto, rows: Rows) -> tuple[Plan, dict] | None:
    """Which rows of each input make `rows` of the node's (first) output, and what of the node must change with them
    ({"shape": new Reshape target}); None when the node does not work row by row on that axis."""
    out_dims = graph.dims.get(node.output[0])
    if out_dims is None:
        return None
    if node.domain == "com.microsoft":
        return _plan_contrib(graph, node, rows, len(out_dims), out_dims[rows.axis])
    if node.domain not in ("", "ai.onnx"):
        return None
    rank, op = len(out_dims), node.op_type
    keep = [None] * len(node.input)
    if op in _UNARY:
        return [rows, *keep[1:]], {}
    if op in _BROADCAST:
        parts = [_broadcast_input(graph, name, rows, rank, out_dims[rows.axis]) for name in node.input]
        return None if False in parts else (parts, {})
    if op == "MatMul":
        a_dims, b_dims = graph.dims.get(node.input[0]), graph.dims.get(node.input[1])
        if a_dims is None or b_dims is None or len(a_dims) < 2 or len(b_dims) < 2:
            return None
        if rows.axis == rank - 2:
            return [Rows(len(a_dims) - 2, rows.start, rows.stop), None], {}
        if rows.axis == rank - 1:
            return [None, Rows(len(b_dims) - 1, rows.start, rows.stop)], {}
        parts = [_broadcast_input(graph, name, rows, rank, out_dims[rows.axis]) for name in node.input]
        return None if False in parts else (parts, {})
    if op == "Gemm":
        if rows.axis != 0 or attribute(node, "transA", 0):
            return None
        parts = [Rows(0, rows.start, rows.stop), None]
        if len(node.input) > 2:
            bias = _broadcast_input(graph, node.input[2], rows, rank, out_dims[0])
            if bias is False:
                return None
            parts.append(bias)
        return parts, {}
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        axis = attribute(node, "axis", -1 if graph.opset >= 13 else 1) % rank
        passes = rows.axis != axis if graph.opset >= 13 else rows.axis < axis
        return ([rows], {}) if passes else None
    if op == "LayerNormalization":
        axis = attribute(node, "axis", -1) % rank
        return ([rows, *keep[1:]], {}) if rows.axis < axis else None
    if op in _REDUCE:
        return _plan_reduce(graph, node, rows)
    if op == "DynamicQuantizeLinear":
        return [rows], {}
    if op in ("QuantizeLinear", "DequantizeLinear"):
        return _plan_linear_quantization(graph, node, rows, rank)
    if op == "MatMulInteger":
        return _plan_matmul_integer(graph, node, rows, rank)
    if op == "Transpose":
        perm = attribute(node, "perm", list(range(rank))[::-1])
        return [Rows(perm[rows.axis], rows.start, rows.stop)], {}
    if op == "Reshape":
        return _plan_reshape(graph, node, rows)
    if op in ("Unsqueeze", "Squeeze"):
        axes = graph.ints(node, "axes", 1)
        in_dims = graph.dims.get(node.input[0])
        if axes is None or in_dims is None:
            return None
        if op == "Unsqueeze":
            added = {a % rank for a in axes}
            if rows.axis in added:
                return None
            axis = rows.axis - sum(1 for a in added if a < rows.axis)
        else:
            removed = {a % len(in_dims) for a in axes}
            kept = [a for a in range(len(in_dims)) if a not in removed]
            axis = kept[rows.axis]
        return [Rows(axis, rows.start, rows.stop), *keep[1:]], {}
    if op == "Concat":
        return ([rows] * len(node.input), {}) if attribute(node, "axis", 0) % rank != rows.axis else None
    if op == "Slice":
        axes = graph.ints(node, "axes", 3)
        if axes is None:
            starts = graph.ints(node, "starts", 1)
            axes = None if starts is None else list(range(len(starts)))
        if axes is None or rows.axis in {a % rank for a in axes}:
            return None
        return [rows, *keep[1:]], {}
    if op == "Gather":
        in_dims, index_dims = graph.dims.get(node.input[0]), graph.dims.get(node.input[1])
        if in_dims is None or index_dims is None:
            return None
        axis, width = attribute(node, "axis", 0) % len(in_dims), len(index_dims)
        if rows.axis < axis:
            return [rows, None], {}
        if rows.axis >= axis + width:
            return [Rows(rows.axis - width + 1, rows.start, rows.stop), None], {}
        return None
    return None


def outputs_follow_rows(node: onnx.NodeProto) -> bool:
    """Whether every output of `node` holds, on the axes its rule passes, the rows its first output holds: a norm's
    mean and inverse deviation (one per row) and the sum a Skip* norm also answers, Dropout's mask."""
    return node.op_type in _ROWS_IN_EVERY_OUTPUT and node.domain in ("", "ai.onnx", "com.microsoft")


def recomputed_outputs(node: onnx.NodeProto) -> tuple[str, ...]:
    """The outputs of `node` that describe its whole input (DynamicQuantizeLinear's scale and zero point): where the
    node computes the kept rows only, they describe those rows, and every reader of them reads the new values."""
    if node.domain not in ("", "ai.onnx"):
        return ()
    return tuple(node.output[i] for i in _STATISTICS.get(node.op_type, ()) if i < len(node.output) and node.output[i])


def _per_tensor(graph: GraphView, name: str) -> bool:
    dims = graph.dims.get(name)
    return dims is not None and all(isinstance(d, int) for d in dims) and math.prod(dims) == 1


def _plan_linear_quantization(graph: GraphView, node: onnx.NodeProto, rows: Rows, rank: int) -> tuple[Plan, dict] | None:
    """(De)QuantizeLinear works element by element with a scale per tensor, or per slice of `axis`: rows of another
    axis pass; blocked scales (opset 21's `block_size`) do not."""
    if attribute(node, "block_size", 0) or len(node.input) < 2:
        return None
    keep = [None] * (len(node.input) - 1)
    if _per_tensor(graph, node.input[1]):
        return [rows, *keep], {}
    return ([rows, *keep], {}) if rows.axis != attribute(node, "axis", 1) % rank else None


def _plan_matmul_integer(graph: GraphView, node: onnx.NodeProto, rows: Rows, rank: int) -> tuple[Plan, dict] | None:
    """MatMulInteger as MatMul, for the rows of its first operand or a broadcast axis, where that operand's zero point
    is one for the tensor (a zero point per row would have to be cut too)."""
    a_dims, b_dims = graph.dims.get(node.input[0]), graph.dims.get(node.input[1])
    if a_dims is None or b_dims is None or len(a_dims) < 2 or len(b_dims) < 2 or rows.axis >= rank - 1:
        return None
    if len(node.input) > 2 and node.input[2] and not _per_tensor(graph, node.input[2]):
        return None
    zero_points = [None] * (len(node.input) - 2)
    if rows.axis == rank - 2:
        return [Rows(len(a_dims) - 2, rows.start, rows.stop), None, *zero_points], {}
    parts = [_broadcast_input(graph, name, rows, rank, graph.dims[node.output[0]][rows.axis]) for name in node.input[:2]]
    return None if False in parts else ([*parts, *zero_points], {})


def _plan_contrib(graph: GraphView, node: onnx.NodeProto, rows: Rows, rank: int, out_dim: Dim) -> tuple[Plan, dict] | None:
    """The rule of an ONNX Runtime fused op (com.microsoft); None for the ops not listed (its fused Attention, which
    reads every row of its input for each row of its output)."""
    keep = [None] * len(node.input)
    if node.op_type in _CONTRIB_ROWWISE and rows.axis < rank - 1:
        return [rows, *keep[1:]], {}
    if node.op_type in _CONTRIB_SKIP_NORMS and rows.axis < rank - 1 and len(node.input) > 1:
        skip = _broadcast_input(graph, node.input[1], rows, rank, out_dim)
        return None if skip is False else ([rows, skip, *keep[2:]], {})
    return None


def _plan_reduce(graph: GraphView, node: onnx.NodeProto, rows: Rows) -> tuple[Plan, dict] | None:
    in_dims = graph.dims.get(node.input[0])
    by_input = node.op_type == "ReduceSum" and graph.opset >= 13 or graph.opset >= 18
    axes = graph.ints(node, "axes", 1) if by_input or any(a.name == "axes" for a in node.attribute) else None
    if in_dims is None or not axes:
        return None  # no axes: every axis is reduced (or none, with noop_with_empty_axes)
    reduced = {a % len(in_dims) for a in axes}
    if attribute(node, "keepdims", 1):
        axis = rows.axis
    else:
        kept = [a for a in range(len(in_dims)) if a not in reduced]
        axis = kept[rows.axis]
    if axis in reduced:
        return None
    return [Rows(axis, rows.start, rows.stop), *[None] * (len(node.input) - 1)], {}


def _plan_reshape(graph: GraphView, node: onnx.NodeProto, rows: Rows) -> tuple[Plan, dict] | None:
    """A Reshape passes rows whose elements lie in one block of the input too: output dims before the axis multiply
    to the input's dims before some axis, and that axis splits into whole rows. Its new target is written out: the
    output's dims with the rows' count, `0` (copy) for a symbolic dim the input has at the same place before it."""
    in_dims, out_dims = graph.dims.get(node.input[0]), graph.dims.get(node.output[0])
    if in_dims is None or out_dims is None or attribute(node, "allowzero", 0):
        return None
    inner = _product(out_dims[rows.axis + 1:])
    if inner is None:
        return None
    for axis in range(len(in_dims)):
        if not _same_product(in_dims[:axis], out_dims[:rows.axis]):
            continue
        below = _product(in_dims[axis + 1:])
        if below is None or (rows.start * inner) % below or (rows.stop * inner) % below:
            continue
        kept, wanted = in_dims[axis], out_dims[rows.axis]
        same = (kept * below == wanted * inner) if isinstance(kept, int) and isinstance(wanted, int) \
            else (isinstance(kept, str) and kept == wanted and below == inner)
        target = _target(in_dims, out_dims, rows, axis)
        if same and target is not None:
            return [Rows(axis, rows.start * inner // below, rows.stop * inner // below), None], {"shape": target}
    return None


def _target(in_dims: Sequence[Dim], out_dims: Sequence[Dim], rows: Rows, axis: int) -> list[int] | None:
    """The Reshape's new target: fixed dims as they are, the rows' count on their axis, `0` for a symbolic dim the
    input has at the same place before its own axis `axis` (copied from the input, which keeps it); None otherwise."""
    target = []
    for index, dim in enumerate(out_dims):
        if index == rows.axis:
            target.append(rows.stop - rows.start)
        elif isinstance(dim, int) and dim > 0:
            target.append(dim)
        elif isinstance(dim, str) and index < min(rows.axis, axis) and tuple(in_dims[:index + 1]) == tuple(out_dims[:index + 1]):
            target.append(0)
        else:
            return None
    return target


def _product(dims: Sequence[Dim]) -> int | None:
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else None


def _same_product(left: Sequence[Dim], right: Sequence[Dim]) -> bool:
    """Whether two lists of dims multiply to the same number: equal when fixed, the same symbols otherwise."""
    fixed_left, fixed_right = _product(left), _product(right)
    if fixed_left is not None and fixed_right is not None:
        return fixed_left == fixed_right
    if None in left or None in right:
        return False
    return tuple(left) == tuple(right)


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Names the subgraphs of `graph`'s nodes (If, Loop, Scan bodies) read, at any depth."""
    return set().union(*(node_subgraph_reads(node) for node in graph.node))


def node_subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of one node (an If's branches, a Loop's or Scan's body) read, at any depth."""
    names: set[str] = set()
    for attr in node.attribute:
        for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            names.update(name for inner in body.node for name in inner.input)
            names.update(subgraph_reads(body))
    return names
