"""The graph doctor: what keeps a model from being a static graph, and what constant folding would remove.

`analyze` finds the constant subgraphs of the original model (`constants.py`: grouped by the node whose
value leaves them, with a preview of that value), then runs the load's passes (`passes.py`: specialise
when shapes are given, upgrade an old file, fold; a pass that fails is skipped and noted), and walks the
result in graph order to count the nodes whose output shapes are fully known and to name the first node
where that breaks, and why. With shapes it also lists the outputs whose shape is known only at run time
(`runtime_shapes.py`), which a static engine allocates on every run, and how many nodes the rows pass made compute
only the rows the outputs keep (`unused_rows.py`; the nodes it adds are not counted as the fold's). `fix` folds what
can be folded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx
from onnx import helper

from gebackend.compile.constants import (
    PREVIEW_MAX_ELEMENTS,
    FoldableGroup,
    constant_nodes,
    find_foldable,
    first_unknown_dim,
    initializer_names,
    known_shape,
    label,
    types_of,
)
from gebackend.compile.runtime_shapes import (
    CONTROL_FLOW,
    DATA_DEPENDENT,
    DEFAULT_DOMAINS,
    VALUE_DEPENDENT,
    runtime_shaped_outputs,
)
from gebackend.compile.unused_rows import pass_record
from gebackend.config.light import CONTRIB_DOMAIN

__all__ = ["PREVIEW_MAX_ELEMENTS", "DoctorReport", "FoldableGroup", "StaticBreak", "analyze", "find_foldable", "fix",
           "host_ops", "static_node_names"]

_TEXT_MAX_GROUPS = 20
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
    # graph outputs whose shape is known only at run time -> why; a static engine allocates them on every run
    runtime_outputs: dict[str, str] = field(default_factory=dict)
    # per input, what its values and lengths may be, where tables stored in the model bound them (the request check's)
    request_limits: dict[str, str] = field(default_factory=dict)
    # nodes the rows pass made compute only the rows of a sequence the outputs keep (compile/unused_rows.py)
    kept_rows_nodes: int = 0

    @property
    def is_static(self) -> bool:
        return self.first_break is None and not self.unresolved_inputs

    def to_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result["is_static"] = self.is_static
        return result

    def format_text(self, brief: bool = False) -> str:
        """The report as lines of text; `brief` (the load log, once per instance) lists only the foldable subgraphs
        the fold left in the graph, not those it removed (`gebackend analyze` lists every one)."""
        lines = [
            f"nodes: {self.node_count}, static: {self.static_node_count}/{self.node_count} "
            f"(original model: {self.original_node_count} nodes, folding removes {self.foldable_node_count})"
        ]
        if self.shapes:
            lines.append("shapes: " + ", ".join(f"{k}=[{', '.join(map(str, v))}]" for k, v in self.shapes.items()))
        else:
            lines.append("shapes: none given (inputs keep the model's dims)")
        if self.request_limits:
            lines.append("request limits (checked on every request): " + "; ".join(
                f"{name} {what}" for name, what in self.request_limits.items()))
        elif not brief:
            lines.append("request limits: none found (no input indexes a table stored in the model)")
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
        listed = [g for g in self.foldable if not (brief and g.folded)]
        removed = "" if not brief or not self.foldable else (
            ", all folded into the static graph" if not listed else f", {len(listed)} of them left unfolded:")
        nodes = f"{count} node{'' if count == 1 else 's'}"
        lines.append(f"foldable constant subgraphs: {len(self.foldable)} ({nodes}){removed}")
        for group in listed[:_TEXT_MAX_GROUPS]:
            kept = "" if group.folded else " [not folded" + (
                f": larger than {self.size_limit} bytes]" if self.size_limit is not None else "]")
            lines.append(f"  {group.sink_op} '{group.sink}' = {group.preview()} ({', '.join(group.op_types)}){kept}")
        if len(listed) > _TEXT_MAX_GROUPS:
            lines.append(f"  ... and {len(listed) - _TEXT_MAX_GROUPS} more")
        if self.kept_rows_nodes:
            lines.append(f"rows: {self.kept_rows_nodes} node(s) compute only the rows of a sequence the outputs keep "
                         f"(the first token)")
        if self.runtime_outputs:
            lines.append("outputs with a runtime shape (allocated on every run, not bound once): " + "; ".join(
                f"{name} ({why})" for name, why in self.runtime_outputs.items()))
        if self.host_ops is None:
            lines.append(f"host ops: not checked ({self.host_ops_note or 'unknown reason'})")
        else:
            lines.append(f"host ops: {len(self.host_ops)} ({self.host_ops_note})" + "".join(
                f"\n  {h['op_type']} '{h['name']}'" for h in self.host_ops))
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


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
    if node.domain in DEFAULT_DOMAINS and op in DATA_DEPENDENT:
        return "data-dependent output shape"
    for name in (i for i in node.input if i and i not in constants):
        if known_shape(types.get(name)) is not None:
            continue
        axis, param = first_unknown_dim(types.get(name))
        where = "a graph input left symbolic" if name in graph_inputs else "its shape is not fully known"
        if axis is None:
            return f"input '{name}' has no known shape ({where})"
        return f"input '{name}' has unresolved dim {axis}" + (f" ('{param}')" if param else "") + f" ({where})"
    if node.domain == "ai.onnx.ml":  # a standard domain: onnx infers most of its ops, not all of their outputs
        return f"ONNX-ML op {node.domain}::{op}: onnx's shape inference does not resolve its outputs"
    if node.domain == CONTRIB_DOMAIN:
        return f"ONNX Runtime op {node.domain}::{op}: its symbolic shape inference did not resolve its outputs"
    if node.domain not in DEFAULT_DOMAINS:
        return f"custom op {node.domain}::{op}: no shape inference for it"
    for position in VALUE_DEPENDENT.get(op, ()):
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
        from gebackend.compile.ort_session import internal_options, open_session

        session = open_session(model, internal_options(config={"session.record_ep_graph_assignment_info": "1"}),
                               [accelerators[0], "CPUExecutionProvider"])
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


def _default_notes(model: onnx.ModelProto) -> list[str]:
    """What the doctor says of initializers the file also lists as graph inputs (config/optional_inputs.py) and of
    nodes it runs in training mode (config/training_mode.py)."""
    from gebackend.config import training_mode
    from gebackend.config.onnx_signature import signature_of

    signature = signature_of(model)
    notes = [training_mode.describe(signature.training)] if signature.training else []
    names = [t.name for t in signature.defaults]
    if not names:
        return notes
    shown = ", ".join(names[:5]) + (f", … ({len(names)} in all)" if len(names) > 5 else "")
    return notes + [
        f"{len(names)} initializer(s) are also graph inputs ({shown}), as old exporters wrote them: as the file "
        f"stands ONNX Runtime neither folds nor prepacks them (a caller could replace them); `ge` serves those "
        f"config.pbtxt does not list (with `optional: true`) as constants"]


def request_limits(model: onnx.ModelProto) -> dict[str, str]:
    """Per input, the values and lengths the model's stored tables allow (config/index_bounds.py), in words."""
    from gebackend.config.index_bounds import index_bounds, length_limits

    bounds, lengths = index_bounds(model), length_limits(model)
    out = {}
    for name in [v.name for v in model.graph.input if v.name in bounds or v.name in lengths]:
        parts = [f"values in {bounds[name].describe()}"] if name in bounds else []
        parts += [f"dim {limit.axis} at most {limit.describe()}" for limit in lengths.get(name, ())]
        out[name] = ", ".join(parts)
    return out


def analyze(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None = None,
    size_limit: int | None = 1 << 20,
    providers: Sequence[str] | None = None,
    folded: onnx.ModelProto | None = None,
    notes: Sequence[str] = (),
) -> DoctorReport:
    """Diagnose `model` for the static graph mode; see the module docstring. `model` is not changed.

    `shapes` fixes graph-input dims first (a `ConfigError` if they do not fit); `size_limit` is the folding
    limit in bytes (None: fold everything); `providers` restricts the accelerators tried for host ops;
    `folded`: the model already through the passes for `shapes` (the compile pipeline has it), so that
    work is not done twice; `notes`: lines the report carries (the pipeline's skipped passes). A pass that
    fails here is skipped the same way as at load, and said in a note.
    """
    from gebackend.compile.passes import compile_graph

    if size_limit is not None and size_limit < 1:
        raise ValueError(f"size_limit must be at least 1 byte, or None for no limit; got {size_limit}")
    notes = list(notes) + _default_notes(model)
    groups = find_foldable(model)
    if folded is not None:
        analysed = folded
    else:
        analysed = compile_graph(model, shapes, size_limit,
                                 lambda name, why: notes.append(f"pass '{name}' skipped: {why}"))
    produced = {o for n in analysed.graph.node for o in n.output}
    for group in groups:
        group.folded = group.output not in produced
    static, first = _walk(analysed)
    hosts, host_note = host_ops(analysed, providers)
    limits = request_limits(model)
    kept, added = pass_record(analysed)
    return DoctorReport(
        node_count=len(analysed.graph.node),
        static_node_count=static,
        first_break=first,
        foldable=groups,
        foldable_node_count=len(model.graph.node) - len(analysed.graph.node) + added,
        unresolved_inputs=_unresolved_inputs(analysed),
        host_ops=hosts,
        host_ops_note=host_note,
        shapes={k: [int(d) for d in v] for k, v in shapes.items()} if shapes else None,
        original_node_count=len(model.graph.node),
        size_limit=size_limit,
        notes=notes,
        request_limits=limits,
        runtime_outputs=runtime_shaped_outputs(analysed) if shapes is not None else {},
        kept_rows_nodes=kept,
    )


def fix(model: onnx.ModelProto, size_limit: int | None = 1 << 20) -> tuple[onnx.ModelProto, int]:
    """`model` with its constant subgraphs folded (up to `size_limit` bytes each), and how many nodes that removed.

    An old file is upgraded first, as at load (see `passes.py`); a fold that fails raises `ModelLoadError` saying why.
    """
    from gebackend.compile.passes import compile_graph
    from gebackend.errors import ModelLoadError

    failed: list[str] = []
    folded = compile_graph(model, None, size_limit, lambda name, why: failed.append(f"{name}: {why}"))
    if any(f.startswith("fold:") for f in failed):
        raise ModelLoadError("cannot fold the model: " + "; ".join(failed))
    return folded, len(model.graph.node) - len(folded.graph.node) + pass_record(folded)[1]
