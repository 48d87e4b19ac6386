"""Which tensors of a specialised graph have a shape known only at run time, and why.

A static graph's engine allocates an output once, at its compiled shape, only when that shape follows
from the input shapes alone. It does not when the shape depends on the data: an op whose output size
is the data's (`NonZero`, `Unique`, `NonMaxSuppression`, ...), an op whose output shape is read from
the *values* of an input that is not a constant after folding (`Reshape` to a shape fed by a request,
`TopK` with a tensor `k`, `Resize` to request-given scales), control flow, an op outside the ai.onnx
domain whose output shapes no shape inference fixed (ONNX Runtime's symbolic one types its com.microsoft ops:
`light.infer_shapes`), or any tensor computed from one of those. `runtime_shaped` walks the graph once, in graph order,
and says for each such tensor which node made it so; `Shape`/`Size` of a tensor whose shape is known
give values known at compile time, so `Reshape(x, Shape(y))` stays static. `reads_shape_values` names the
tensors whose runtime values decide a shape: the static engines do not warm such graphs up on zeros.
The op lists below are shared with the doctor.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

DEFAULT_DOMAINS = ("", "ai.onnx")

# Output shape known only once the data is seen.
DATA_DEPENDENT = {
    "NonZero", "Unique", "NonMaxSuppression", "Compress", "StringSplit", "StringNormalizer", "ImageDecoder",
}
CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
# Ops on sequences and optionals: the shapes of their elements are not tracked.
SEQUENCE_OPS = {
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
    "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement",
}
# op -> the inputs whose values (not just shapes) decide the output shape.
VALUE_DEPENDENT: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Resize": (2, 3), "Upsample": (1,), "OneHot": (1,),
    "TopK": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "CenterCropPad": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "MaxUnpool": (2,), "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (1, 3),
    "BlackmanWindow": (0,), "HannWindow": (0,), "HammingWindow": (0,), "MelWeightMatrix": (0, 1),
    "AffineGrid": (1,),
}
# Outputs whose value follows from their input's shape alone.
SHAPE_OF = {"Shape", "Size"}
# A different value every run: never a compile-time value.
NONDETERMINISTIC = {
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
}


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _fixed(value_type: onnx.TypeProto | None) -> bool:
    if value_type is None or value_type.WhichOneof("value") != "tensor_type":
        return False
    tensor_type = value_type.tensor_type
    return tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in tensor_type.shape.dim)


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name or (node.output[0] if node.output else node.op_type)}'"


def _value_fed(node: onnx.NodeProto, known_values: set[str]) -> str | None:
    """The first input whose runtime values decide this node's output shape, or None."""
    if node.domain not in DEFAULT_DOMAINS:
        return None
    for position in VALUE_DEPENDENT.get(node.op_type, ()):
        if position < len(node.input) and node.input[position] and node.input[position] not in known_values:
            return node.input[position]
    return None


def _reason(node: onnx.NodeProto, inputs: list[str], runtime: Mapping[str, str], known_values: set[str],
            fixed: set[str]) -> str | None:
    """Why this node's outputs have a runtime shape, or None when their shape follows from the input shapes."""
    op = node.op_type
    if node.domain not in DEFAULT_DOMAINS:
        if all(o in fixed for o in node.output if o) and not any(i in runtime for i in inputs):
            return None  # typed by ONNX Runtime's symbolic shape inference from its inputs' fixed shapes
        return f"{_label(node)}: {node.domain}::{op} is outside the ai.onnx domain, its output shapes are only known when it runs"
    if op in DATA_DEPENDENT:
        return f"{_label(node)}: data-dependent output shape"
    if op in CONTROL_FLOW or _has_subgraph(node):
        return f"{_label(node)}: control flow, output shapes depend on the branch taken or the iterations run"
    if op in SEQUENCE_OPS:
        return f"{_label(node)}: sequence/optional op, element shapes are not tracked"
    fed = _value_fed(node, known_values)
    if fed is not None:
        return f"{_label(node)}: output shape depends on the runtime values of input '{fed}'"
    upstream = next((i for i in inputs if i in runtime), None)
    if upstream is not None and op not in SHAPE_OF:
        return runtime[upstream]
    return None


def _analyse(model: onnx.ModelProto) -> tuple[dict[str, str], dict[str, str]]:
    """(runtime-shaped tensor -> reason, tensor whose runtime values decide a shape -> the node reading it)."""
    graph = model.graph
    known_values = {init.name for init in graph.initializer} | {init.name for init in graph.sparse_initializer}
    runtime: dict[str, str] = {}
    shape_values: dict[str, str] = {}
    fixed = {value.name for value in (*graph.value_info, *graph.output) if _fixed(value.type)}
    for value in graph.input:
        if value.name not in known_values and not _fixed(value.type):
            runtime[value.name] = f"graph input '{value.name}' has no fixed shape"
    for node in graph.node:
        outputs = [o for o in node.output if o]
        inputs = [i for i in node.input if i]
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            known_values.update(outputs)
            continue
        deterministic = (node.domain in DEFAULT_DOMAINS and node.op_type not in NONDETERMINISTIC
                         and node.op_type not in CONTROL_FLOW and not _has_subgraph(node))
        if deterministic and inputs and all(i in known_values for i in inputs):
            known_values.update(outputs)  # computable at compile time (folding left it for its size, or was skipped)
            continue
        if node.op_type in SHAPE_OF and node.domain in DEFAULT_DOMAINS and inputs and inputs[0] not in runtime:
            known_values.update(outputs)
            continue
        fed = _value_fed(node, known_values)
        if fed is not None:
            shape_values.setdefault(fed, _label(node))
        reason = _reason(node, inputs, runtime, known_values, fixed)
        if reason is not None:
            for name in outputs:
                runtime[name] = reason
    return runtime, shape_values


def runtime_shaped(model: onnx.ModelProto) -> dict[str, str]:
    """Every tensor of `model` (graph order) whose shape is known only at run time -> the reason, naming the node.

    `model` should be specialised (its inputs' dims fixed); a graph input with a dim left open is itself
    runtime-shaped. Tensors with a fixed shape are left out.
    """
    return _analyse(model)[0]


def reads_shape_values(model: onnx.ModelProto) -> dict[str, str]:
    """Tensors computed at run time whose values decide an output shape (a `Reshape` target fed by a request,
    `Col2Im`'s block shape, ...) -> the node that reads them. Feeding zeros there (a warm-up) may be no valid
    input at all: OpenVINO's Col2Im divides by the zero block shape and takes the process down (SIGFPE)."""
    return _analyse(model)[1]


def runtime_shaped_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """The graph outputs of `model` whose shape is known only at run time -> why (see `runtime_shaped`).

    An output whose shape inference left a dim open is listed too, even when no node explains it.
    """
    runtime = runtime_shaped(model)
    result = {}
    for value in model.graph.output:
        if value.name in runtime:
            result[value.name] = runtime[value.name]
        elif not _fixed(value.type):
            result[value.name] = f"output '{value.name}': shape inference could not resolve its shape"
    return result
