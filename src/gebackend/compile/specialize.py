"""Specialisation pass: a copy of a model whose graph inputs have fixed dims, with shapes inferred throughout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from gebackend.errors import ConfigError


def _show(shape: onnx.TensorShapeProto) -> str:
    return "[" + ", ".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim
    ) + "]"


def specialize(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of `model` whose graph inputs named in `shapes` get those dims, with value_info filled in.

    Inputs not named keep their shapes. Raises `ConfigError` for a name that is not a graph input, a rank
    that differs from the model's, a dim that is not a positive int, or a dim the model already fixes to
    another value.
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
    return onnx.shape_inference.infer_shapes(result, strict_mode=False, data_prop=True)
