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

import onnx
from onnx import helper

from gebackend.compile.constants import (
    CONTROL_FLOW,
    DEFAULT_DOMAINS,
    FoldableGroup,
    constant_nodes,
    find_foldable,
    first_unknown_dim,
    initializer_names,
    known_shape,
    label,
    types_of,
)
from gebackend.compile.fold import fold_constants
from gebackend.compile.specialize import specialize

_TEXT_MAX_GROUPS = 20

# Output shape known only once the data is seen.
_DATA_DEPENDENT = {"NonZero", "Unique", "NonMaxSuppression", "Compress", "StringSplit"}
# op -> the inputs whose values (not just shapes) decide the output shape.
_VALUE_DEPENDENT: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,),
    "TopK": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "CenterCropPad": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "MaxUnpool": (2,), "Col2Im": (1, 2), "DFT": (1,), "STFT": (1, 2),
}
_HOST_PROVIDERS = ("CPUExecutionProvider", "AzureExecutionProvider")


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


# ------------------------------------------------------------------------------------ constant subgraphs


# ------------------------------------------------------------------------------------------ static walk


def _unresolved_inputs(model: onnx.ModelProto) -> list[dict[str, Any]]:
    initializers = initializer_names(model)
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
    if node.domain in DEFAULT_DOMAINS and op in CONTROL_FLOW:
        return f"control-flow op ({op}): output shapes depend on the branch taken or the iterations run"
    if node.domain in DEFAULT_DOMAINS and op in _DATA_DEPENDENT:
        return "data-dependent output shape"
    for name in (i for i in node.input if i and i not in constants):
        if known_shape(types.get(name)) is not None:
            continue
        axis, param = first_unknown_dim(types.get(name))
        where = "a graph input left symbolic" if name in graph_inputs else "its shape is not fully known"
        if axis is None:
            return f"input '{name}' has no known shape ({where})"
        return f"input '{name}' has unresolved dim {axis}" + (f" ('{param}')" if param else "") + f" ({where})"
    if node.domain not in DEFAULT_DOMAINS:
        return f"custom op {node.domain}::{op}: no shape inference for it"
    for position in _VALUE_DEPENDENT.get(op, ()):
        if position < len(node.input) and node.input[position] and node.input[position] not in constants:
            kind = "data-dependent output shape: " if op == "TopK" else ""
            return f"{kind}output shape depends on runtime values of input {node.input[position]}"
    unknown = next((o for o in node.output if o and known_shape(types.get(o)) is None), "?")
    return f"shape inference could not resolve output '{unknown}'"


def _walk(model: onnx.ModelProto) -> tuple[int, StaticBreak | None]:
    """How many nodes have every output shape fully known, and the first node that does not."""
    types = types_of(model)
    for init in model.graph.initializer:
        types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    _, constants = constant_nodes(model)
    graph_inputs = {v.name for v in model.graph.input}
    static, first = 0, None
    for index, node in enumerate(model.graph.node):
        if all(known_shape(types.get(o)) is not None for o in node.output if o):
            static += 1
        elif first is None:
            first = StaticBreak(
                index=index, name=label(node), op_type=node.op_type, inputs=list(node.input),
                reason=_break_reason(node, types, constants, graph_inputs),
            )
    return static, first


def static_node_names(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes whose every output shape is fully known (after specialisation and folding)."""
    types = types_of(model)
    return [n.name for n in model.graph.node if all(known_shape(types.get(o)) is not None for o in n.output if o)]


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
