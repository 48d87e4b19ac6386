"""Specialisation pass: a copy of a model whose graph inputs have fixed dims, with shapes inferred throughout.

Shape inference runs afresh on the fixed dims: value_info and the dims the file declares on its graph
outputs (not their rank) are dropped first. A declared output shape is the exporter's claim: onnx keeps
a wrong one over what it infers, and a static engine would allocate that output at the wrong size.
When ONNX shape inference gives up on a model, it is tried again without data propagation, and then
left out: the graph keeps its fixed input dims, the engine infers the rest, and the caller is told why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import onnx

from gebackend.compile.graph_pass import GraphPass, PassContext
from gebackend.config import light
from gebackend.errors import ConfigError

Warn = Callable[[str, str], None]  # (pass, reason)


def _show(shape: onnx.TensorShapeProto) -> str:
    return "[" + ", ".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim
    ) + "]"


def specialize(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], warn: Warn | None = None) -> onnx.ModelProto:
    """A copy of `model` whose graph inputs named in `shapes` get those dims, with value_info filled in.

    Inputs not named keep their shapes. Raises `ConfigError` for a name that is not a graph input, a rank
    that differs from the model's, a dim that is not a positive int, or a dim the model already fixes to
    another value. A shape inference that fails is reported to `warn` as ("shape inference", why).
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
    initializers = {init.name for init in result.graph.initializer}
    inputs = {v.name: v for v in result.graph.input if v.name not in initializers}
    for name, dims in shapes.items():
        value = inputs.get(name)
        if value is None:
            raise ConfigError(
                f"cannot specialise '{name}': not a graph input; the inputs are {', '.join(inputs) or '(none)'}"
            )
        dims = list(dims)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            raise ConfigError(f"cannot specialise '{name}' to {dims}: every dim must be an int > 0")
        if value.type.WhichOneof("value") != "tensor_type":
            raise ConfigError(f"cannot specialise '{name}': it is not a tensor")
        tensor_type = value.type.tensor_type
        if tensor_type.HasField("shape"):
            shape = tensor_type.shape
            if len(shape.dim) != len(dims):
                raise ConfigError(
                    f"cannot specialise '{name}' to {dims}: rank {len(dims)}, but the model's shape "
                    f"{_show(shape)} has rank {len(shape.dim)}"
                )
            for axis, (d, want) in enumerate(zip(shape.dim, dims)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != want:
                    raise ConfigError(
                        f"cannot specialise '{name}' to {dims}: dim {axis} is fixed to {d.dim_value} in the model, "
                        f"not {want} (model shape {_show(shape)})"
                    )
        tensor_type.ClearField("shape")
        tensor_type.shape.SetInParent()  # a scalar ([]) keeps an empty shape: without one the dims are unknown
        for want in dims:
            tensor_type.shape.dim.add().dim_value = want
    # Shapes inferred for the symbolic model would contradict the fixed dims: infer afresh.
    del result.graph.value_info[:]
    for value in result.graph.output:  # keep the rank, forget the dims
        if value.type.WhichOneof("value") == "tensor_type" and value.type.tensor_type.HasField("shape"):
            for dim in value.type.tensor_type.shape.dim:
                dim.ClearField("dim_value")
                dim.ClearField("dim_param")
    return infer(result, warn)


def infer(model: onnx.ModelProto, warn: Warn | None = None) -> onnx.ModelProto:
    """`model` (changed in place: a specialised copy) with ONNX shape inference applied: with data propagation, else
    without, else not at all."""
    failures = []
    for data_prop in (True, False):
        try:
            return light.infer_shapes(model, data_prop=data_prop, in_place=True)  # on the model less its weights
        except Exception as exc:  # noqa: BLE001 - onnx raises InferenceError, ValidationError, RuntimeError, ...
            failures.append(describe_error(exc))
    if warn is not None:
        warn("shape inference", f"ONNX shape inference failed ({failures[-1]}); the engine infers the shapes at build time")
    return model


def describe_error(exc: BaseException) -> str:
    """One line for a dependency's exception: its type and first message line (no traceback), at most 300 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"
    return text if len(text) <= 300 else text[:297] + "..."


class SpecialisePass(GraphPass):
    """Fix the input dims to the compiled shape (no shapes given: the pass does nothing)."""

    name = "specialise"

    def run(self, model: onnx.ModelProto, context: PassContext) -> onnx.ModelProto:
        return specialize(model, context.shapes, context.warn) if context.shapes else model

    def explain(self, exc: BaseException) -> str:
        return describe_error(exc) + "; the graph keeps the model's own input dims"


PASS = SpecialisePass()
