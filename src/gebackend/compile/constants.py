"""Constant subgraphs of a model for the graph doctor: which nodes always compute the same value, and a preview of it.

`find_foldable` groups the constant-computable nodes by the node whose value leaves the group (its
sink) and evaluates the small ones (onnxruntime, else onnx's reference evaluator) to show the value;
a large one is described by its dtype and shape. A `DequantizeLinear` of constants is no constant subgraph
here: in a QDQ model it is a quantized weight, which the engines fuse with its consumer into an int8 kernel and the
fold keeps (folding it would serve the weight as fp32); the doctor counted the 54 of NNCF's int8 ResNet-50 as
foldable and each as not folded. The small helpers on types and shapes are shared with `doctor.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from gebackend.compile.runtime_shapes import CONTROL_FLOW, DEFAULT_DOMAINS, NONDETERMINISTIC
from gebackend.config import light

PREVIEW_MAX_ELEMENTS = 16
QUANTIZED_WEIGHT_OPS = ("DequantizeLinear",)  # of constants: a QDQ model's int8 weight, kept (see above)


@dataclass
class FoldableGroup:
    """A constant subgraph: nodes whose inputs are all constants, ending at `sink`, whose value leaves it."""

    sink: str  # node name (or its first output's name when the node is unnamed)
    sink_op: str
    output: str  # the sink output previewed
    nodes: list[str]
    op_types: list[str]
    dtype: str | None  # numpy name, e.g. "int64"
    shape: list[int] | None
    value: Any = None  # the value itself (a number or nested list) when it has <= 16 elements
    folded: bool = False  # whether folding (with the size limit) removed it
    note: str | None = None  # why there is no preview

    def preview(self) -> str:
        if self.value is not None:
            return str(self.value)
        if self.dtype is not None and self.shape is not None:
            return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
        return "?"


# ---------------------------------------------------------------------------------------------- helpers


def label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def _np_name(elem_type: int) -> str:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:  # noqa: BLE001 - exotic element types have no numpy dtype
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def types_of(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor's type the model declares: inputs, outputs and value_info (later entries do not override)."""
    types: dict[str, onnx.TypeProto] = {}
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        types.setdefault(value.name, value.type)
    return types


def known_shape(t: onnx.TypeProto | None) -> list[int] | None:
    """The dims of a tensor type when every one is fixed, else None."""
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return None
    return [int(d.dim_value) for d in dims]


def first_unknown_dim(t: onnx.TypeProto | None) -> tuple[int | None, str | None]:
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None, None
    for axis, d in enumerate(t.tensor_type.shape.dim):
        if not d.HasField("dim_value"):
            return axis, d.dim_param or None
    return None, None


def _subgraph_names(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read, including outer-scope ones."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                names.update(inner.input)
                names.update(_subgraph_names(inner))
    return names


def initializer_names(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer} | {i.name for i in model.graph.sparse_initializer}



# ------------------------------------------------------------------------------------ constant subgraphs


def _is_foldable_op(node: onnx.NodeProto) -> bool:
    return (
        node.domain in DEFAULT_DOMAINS
        and node.op_type not in NONDETERMINISTIC
        and node.op_type not in CONTROL_FLOW
        and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
    )


def constant_nodes(model: onnx.ModelProto) -> tuple[list[int], set[str]]:
    """Indices of the constant-computable nodes (not `Constant` nodes) and every constant tensor name."""
    constants = initializer_names(model)
    found: list[int] = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            constants.update(node.output)
            continue
        inputs = [i for i in node.input if i]
        if inputs and _is_foldable_op(node) and all(i in constants for i in inputs):
            found.append(index)
            constants.update(o for o in node.output if o)
    return found, constants


def _find_groups(model: onnx.ModelProto) -> list[tuple[int, str, list[int]]]:
    """(sink index, previewed output, member indices in graph order) per constant subgraph."""
    nodes = model.graph.node
    const_idx = [i for i in constant_nodes(model)[0] if nodes[i].op_type not in QUANTIZED_WEIGHT_OPS]
    is_const = set(const_idx)
    producer = {o: i for i in const_idx for o in nodes[i].output if o}
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in set(node.input) | _subgraph_names(node):
            if name:
                consumers.setdefault(name, []).append(index)
    graph_outputs = {o.name for o in model.graph.output}

    def leaves(name: str) -> bool:
        return name in graph_outputs or any(c not in is_const for c in consumers.get(name, []))

    groups: list[tuple[int, str, list[int]]] = []
    claimed: set[int] = set()
    for index in const_idx:
        outputs = [o for o in nodes[index].output if o]
        used = [o for o in outputs if leaves(o)]
        dead = not any(consumers.get(o) for o in outputs) and not any(o in graph_outputs for o in outputs)
        if not used and not dead:
            continue
        members, stack = set(), [index]
        while stack:
            i = stack.pop()
            if i in members or i in claimed:
                continue
            members.add(i)
            stack.extend(producer[n] for n in nodes[i].input if n in producer)
        claimed |= members
        groups.append((index, (used or outputs)[0], sorted(members)))
    return groups


def _evaluation_model(model: onnx.ModelProto, outputs: Sequence[str], types: Mapping[str, onnx.TypeProto]) -> onnx.ModelProto:
    """A model without inputs computing `outputs` from the constant nodes and initializers they need."""
    nodes = model.graph.node
    producer = {o: n for n in nodes for o in n.output if o}
    initializers = {i.name: i for i in model.graph.initializer}
    needed_nodes: dict[int, onnx.NodeProto] = {}
    needed_inits: dict[str, onnx.TensorProto] = {}
    stack = list(outputs)
    while stack:
        name = stack.pop()
        if name in initializers:
            needed_inits[name] = initializers[name]
        elif name in producer and id(producer[name]) not in needed_nodes:
            node = producer[name]
            needed_nodes[id(node)] = node
            stack.extend(i for i in node.input if i)
    ordered = [n for n in nodes if id(n) in needed_nodes]
    values = [
        helper.make_value_info(o, types[o]) if o in types else helper.make_empty_tensor_value_info(o)
        for o in outputs
    ]
    graph = helper.make_graph(ordered, "constant_subgraph", [], values, list(needed_inits.values()))
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), functions=list(model.functions))
    sub.ir_version = model.ir_version
    return sub


def _evaluate(model: onnx.ModelProto, outputs: Sequence[str], types: Mapping[str, onnx.TypeProto]) -> dict[str, np.ndarray]:
    """Compute `outputs` with onnxruntime, falling back to onnx's reference evaluator."""
    sub = _evaluation_model(model, outputs, types)
    try:
        from gebackend.compile.ort_session import internal_options, open_session

        session = open_session(sub, internal_options(optimize=False))
        return dict(zip(outputs, session.run(list(outputs), {})))
    except Exception:  # noqa: BLE001 - try the reference evaluator instead
        from onnx.reference import ReferenceEvaluator

        return dict(zip(outputs, ReferenceEvaluator(sub).run(list(outputs), {})))


def _to_python(array: np.ndarray) -> Any:
    if array.dtype == np.object_:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return array.tolist()


def find_foldable(model: onnx.ModelProto) -> list[FoldableGroup]:
    """The constant subgraphs of `model`, in graph order, each with a preview of the value it always computes."""
    nodes = model.graph.node
    found = _find_groups(model)
    if not found:
        return []
    try:
        inferred = light.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - previews then come from evaluation alone
        inferred = model
    types = types_of(inferred)
    groups: list[FoldableGroup] = []
    for sink, output, members in found:
        t = types.get(output)
        shape = known_shape(t)
        dtype = _np_name(t.tensor_type.elem_type) if t is not None and t.WhichOneof("value") == "tensor_type" else None
        groups.append(FoldableGroup(
            sink=label(nodes[sink]), sink_op=nodes[sink].op_type, output=output,
            nodes=[label(nodes[i]) for i in members], op_types=[nodes[i].op_type for i in members],
            dtype=dtype, shape=shape,
        ))
    # Evaluate only what may be small enough to show; a big tensor is described by its shape and dtype.
    wanted = [g for g in groups if g.shape is None or int(np.prod(g.shape)) <= PREVIEW_MAX_ELEMENTS]
    values: dict[str, np.ndarray] = {}
    if wanted:
        try:
            values = _evaluate(model, [g.output for g in wanted], types)
        except Exception:  # noqa: BLE001 - one bad subgraph must not hide the others
            for g in wanted:
                try:
                    values.update(_evaluate(model, [g.output], types))
                except Exception as exc:  # noqa: BLE001
                    g.note = f"could not evaluate: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    for g in wanted:
        array = values.get(g.output)
        if array is None:
            continue
        array = np.asarray(array)
        g.shape, g.dtype = [int(d) for d in array.shape], array.dtype.name if array.dtype != np.object_ else "string"
        if array.size <= PREVIEW_MAX_ELEMENTS:
            g.value = _to_python(array)
    return groups
