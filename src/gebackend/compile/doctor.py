"""The graph doctor: what keeps a model from being a static graph, and what constant folding would remove.

`analyze` finds the constant subgraphs of the original model (grouped by the node whose value leaves
them, with a preview of that value), then specialises (when shapes are given) and folds, and walks the
result in graph order to count the nodes whose output shapes are fully known and to name the first node
where that breaks, and why. `fix` folds what can be folded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from gebackend.compile.fold import fold_constants
from gebackend.compile.specialize import specialize

PREVIEW_MAX_ELEMENTS = 16
_TEXT_MAX_GROUPS = 20

# Output shape known only once the data is seen.
_DATA_DEPENDENT = {"NonZero", "Unique", "NonMaxSuppression", "Compress", "StringSplit"}
_CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
# op -> the inputs whose values (not just shapes) decide the output shape.
_VALUE_DEPENDENT: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,),
    "TopK": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "CenterCropPad": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "MaxUnpool": (2,), "Col2Im": (1, 2), "DFT": (1,), "STFT": (1, 2),
}
# Never folded: a different value every run.
_NONDETERMINISTIC = {
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
}
_DEFAULT_DOMAINS = ("", "ai.onnx")
_HOST_PROVIDERS = ("CPUExecutionProvider", "AzureExecutionProvider")


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


@dataclass
class StaticBreak:
    """The first node (in graph order) with an output whose shape is not fully known."""

    index: int
    name: str
    op_type: str
    inputs: list[str]
    reason: str


@dataclass
class DoctorReport:
    node_count: int  # nodes of the analysed model (specialised when shapes are given, then folded)
    static_node_count: int  # of those, nodes whose every output shape is fully known
    first_break: StaticBreak | None
    foldable: list[FoldableGroup]  # constant subgraphs of the original model
    foldable_node_count: int  # how many nodes folding removes
    unresolved_inputs: list[dict[str, Any]]  # {"input", "dim", "dim_param"} per graph-input dim not fixed
    host_ops: list[dict[str, str]] | None  # nodes an accelerator provider leaves on the CPU; None: not checked
    shapes: dict[str, list[int]] | None
    host_ops_note: str | None = None  # how host_ops was found, or why it was not checked
    original_node_count: int = 0
    size_limit: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def is_static(self) -> bool:
        return self.first_break is None and not self.unresolved_inputs

    def to_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result["is_static"] = self.is_static
        return result

    def format_text(self) -> str:
        lines = [
            f"nodes: {self.node_count}, static: {self.static_node_count}/{self.node_count} "
            f"(original model: {self.original_node_count} nodes, folding removes {self.foldable_node_count})"
        ]
        if self.shapes:
            lines.append("shapes: " + ", ".join(f"{k}=[{', '.join(map(str, v))}]" for k, v in self.shapes.items()))
        else:
            lines.append("shapes: none given (inputs keep the model's dims)")
        if self.unresolved_inputs:
            lines.append("unresolved inputs: " + ", ".join(
                f"{u['input']} dim {u['dim']}" + (f" ({u['dim_param']!r})" if u.get("dim_param") else "")
                for u in self.unresolved_inputs
            ))
        if self.first_break is None:
            lines.append("first node where static breaks: none, every output shape is known")
        else:
            b = self.first_break
            lines.append(
                f"first node where static breaks: #{b.index} {b.op_type} '{b.name}' "
                f"(inputs: {', '.join(i for i in b.inputs if i) or 'none'}): {b.reason}"
            )
        count = sum(len(g.nodes) for g in self.foldable)
        lines.append(f"foldable constant subgraphs: {len(self.foldable)} ({count} node{'' if count == 1 else 's'})")
        for group in self.foldable[:_TEXT_MAX_GROUPS]:
            kept = "" if group.folded else " [not folded" + (
                f": larger than {self.size_limit} bytes]" if self.size_limit is not None else "]")
            lines.append(f"  {group.sink_op} '{group.sink}' = {group.preview()} ({', '.join(group.op_types)}){kept}")
        if len(self.foldable) > _TEXT_MAX_GROUPS:
            lines.append(f"  ... and {len(self.foldable) - _TEXT_MAX_GROUPS} more")
        if self.host_ops is None:
            lines.append(f"host ops: not checked ({self.host_ops_note or 'unknown reason'})")
        else:
            lines.append(f"host ops: {len(self.host_ops)} ({self.host_ops_note})" + "".join(
                f"\n  {h['op_type']} '{h['name']}'" for h in self.host_ops))
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- helpers


def _label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def _np_name(elem_type: int) -> str:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:  # noqa: BLE001 - exotic element types have no numpy dtype
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor's type the model declares: inputs, outputs and value_info (later entries do not override)."""
    types: dict[str, onnx.TypeProto] = {}
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        types.setdefault(value.name, value.type)
    return types


def _known_shape(t: onnx.TypeProto | None) -> list[int] | None:
    """The dims of a tensor type when every one is fixed, else None."""
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return None
    return [int(d.dim_value) for d in dims]


def _first_unknown_dim(t: onnx.TypeProto | None) -> tuple[int | None, str | None]:
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


def _initializer_names(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer} | {i.name for i in model.graph.sparse_initializer}


# ------------------------------------------------------------------------------------ constant subgraphs


def _is_foldable_op(node: onnx.NodeProto) -> bool:
    return (
        node.domain in _DEFAULT_DOMAINS
        and node.op_type not in _NONDETERMINISTIC
        and node.op_type not in _CONTROL_FLOW
        and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
    )


def _constant_nodes(model: onnx.ModelProto) -> tuple[list[int], set[str]]:
    """Indices of the constant-computable nodes (not `Constant` nodes) and every constant tensor name."""
    constants = _initializer_names(model)
    found: list[int] = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
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
    const_idx, _ = _constant_nodes(model)
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
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(sub.SerializeToString(), options, providers=["CPUExecutionProvider"])
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
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - previews then come from evaluation alone
        inferred = model
    types = _types(inferred)
    groups: list[FoldableGroup] = []
    for sink, output, members in found:
        t = types.get(output)
        shape = _known_shape(t)
        dtype = _np_name(t.tensor_type.elem_type) if t is not None and t.WhichOneof("value") == "tensor_type" else None
        groups.append(FoldableGroup(
            sink=_label(nodes[sink]), sink_op=nodes[sink].op_type, output=output,
            nodes=[_label(nodes[i]) for i in members], op_types=[nodes[i].op_type for i in members],
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


# ------------------------------------------------------------------------------------------ static walk


def _unresolved_inputs(model: onnx.ModelProto) -> list[dict[str, Any]]:
    initializers = _initializer_names(model)
    result = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        t = value.type
        if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
            result.append({"input": value.name, "dim": None, "dim_param": None})
            continue
        for axis, d in enumerate(t.tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                result.append({"input": value.name, "dim": axis, "dim_param": d.dim_param or None})
    return result


def _break_reason(
    node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto], constants: set[str], graph_inputs: set[str]
) -> str:
    op = node.op_type
    if node.domain in _DEFAULT_DOMAINS and op in _CONTROL_FLOW:
        return f"control-flow op ({op}): output shapes depend on the branch taken or the iterations run"
    if node.domain in _DEFAULT_DOMAINS and op in _DATA_DEPENDENT:
        return "data-dependent output shape"
    for name in (i for i in node.input if i and i not in constants):
        if _known_shape(types.get(name)) is not None:
            continue
        axis, param = _first_unknown_dim(types.get(name))
        where = "a graph input left symbolic" if name in graph_inputs else "its shape is not fully known"
        if axis is None:
            return f"input '{name}' has no known shape ({where})"
        return f"input '{name}' has unresolved dim {axis}" + (f" ('{param}')" if param else "") + f" ({where})"
    if node.domain not in _DEFAULT_DOMAINS:
        return f"custom op {node.domain}::{op}: no shape inference for it"
    for position in _VALUE_DEPENDENT.get(op, ()):
        if position < len(node.input) and node.input[position] and node.input[position] not in constants:
            kind = "data-dependent output shape: " if op == "TopK" else ""
            return f"{kind}output shape depends on runtime values of input {node.input[position]}"
    unknown = next((o for o in node.output if o and _known_shape(types.get(o)) is None), "?")
    return f"shape inference could not resolve output '{unknown}'"


def _walk(model: onnx.ModelProto) -> tuple[int, StaticBreak | None]:
    """How many nodes have every output shape fully known, and the first node that does not."""
    types = _types(model)
    for init in model.graph.initializer:
        types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    _, constants = _constant_nodes(model)
    graph_inputs = {v.name for v in model.graph.input}
    static, first = 0, None
    for index, node in enumerate(model.graph.node):
        if all(_known_shape(types.get(o)) is not None for o in node.output if o):
            static += 1
        elif first is None:
            first = StaticBreak(
                index=index, name=_label(node), op_type=node.op_type, inputs=list(node.input),
                reason=_break_reason(node, types, constants, graph_inputs),
            )
    return static, first


def static_node_names(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes whose every output shape is fully known (after specialisation and folding)."""
    types = _types(model)
    return [n.name for n in model.graph.node if all(_known_shape(types.get(o)) is not None for o in n.output if o)]


# -------------------------------------------------------------------------------------------- host ops


def host_ops(model: onnx.ModelProto, providers: Sequence[str] | None = None) -> tuple[list[dict[str, str]] | None, str | None]:
    """Nodes onnxruntime leaves on the CPU next to an accelerator provider, or (None, why not checked)."""
    try:
        import onnxruntime as ort

        available = set(ort.get_available_providers())
        candidates = providers if providers is not None else ort.get_available_providers()
        accelerators = [p for p in candidates if p in available and p not in _HOST_PROVIDERS]
        if not accelerators:
            return None, "no accelerator execution provider available"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=[accelerators[0], "CPUExecutionProvider"]
        )
        if accelerators[0] not in session.get_providers():
            # onnxruntime falls back to the CPU alone when a provider fails to start; that is no placement.
            return None, f"could not place the model on an accelerator: {accelerators[0]} did not start"
        hosts = [
            {"name": n.name, "op_type": n.op_type, "provider": sub.ep_name}
            for sub in session.get_provider_graph_assignment_info()
            if sub.ep_name in _HOST_PROVIDERS
            for n in sub.get_nodes()
        ]
        return hosts, f"nodes onnxruntime places on the CPU next to {accelerators[0]}"
    except Exception as exc:  # noqa: BLE001 - a diagnosis, never a failure
        return None, f"could not place the model on an accelerator: {type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------ public API


def analyze(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None = None,
    size_limit: int | None = 1 << 20,
    providers: Sequence[str] | None = None,
    folded: onnx.ModelProto | None = None,
) -> DoctorReport:
    """Diagnose `model` for the static graph mode; see the module docstring. `model` is not changed.

    `shapes` fixes graph-input dims first (a `ConfigError` if they do not fit); `size_limit` is the folding
    limit in bytes (None: fold everything); `providers` restricts the accelerators tried for host ops;
    `folded`: the model already specialised to `shapes` and folded (the compile pipeline has it), so that
    work is not done twice.
    """
    if size_limit is not None and size_limit < 1:
        raise ValueError(f"size_limit must be at least 1 byte, or None for no limit; got {size_limit}")
    notes: list[str] = []
    groups = find_foldable(model)
    if folded is not None:
        analysed = folded
    else:
        work = specialize(model, shapes) if shapes else model
        try:
            analysed = fold_constants(work, size_limit)
        except Exception as exc:  # noqa: BLE001 - report on the unfolded model rather than not at all
            notes.append(f"constant folding failed, analysing the unfolded model: {type(exc).__name__}: {exc}")
            analysed = onnx.shape_inference.infer_shapes(work, strict_mode=False, data_prop=True)
    produced = {o for n in analysed.graph.node for o in n.output}
    for group in groups:
        group.folded = group.output not in produced
    static, first = _walk(analysed)
    hosts, host_note = host_ops(analysed, providers)
    return DoctorReport(
        node_count=len(analysed.graph.node),
        static_node_count=static,
        first_break=first,
        foldable=groups,
        foldable_node_count=len(model.graph.node) - len(analysed.graph.node),
        unresolved_inputs=_unresolved_inputs(analysed),
        host_ops=hosts,
        host_ops_note=host_note,
        shapes={k: [int(d) for d in v] for k, v in shapes.items()} if shapes else None,
        original_node_count=len(model.graph.node),
        size_limit=size_limit,
        notes=notes,
    )


def fix(model: onnx.ModelProto, size_limit: int | None = 1 << 20) -> tuple[onnx.ModelProto, int]:
    """`model` with its constant subgraphs folded (up to `size_limit` bytes each), and how many nodes that removed."""
    folded = fold_constants(model, size_limit)
    return folded, len(model.graph.node) - len(folded.graph.node)
