"""Reads what an ONNX file promises at its boundary: input and output names, element types and shapes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

import onnx

from gebackend.config import dtypes
from gebackend.errors import ConfigError

# A dim is an int (fixed), a str (a named symbolic dim such as "batch") or None (unknown).
Dim = Union[int, str, None]


@dataclass(frozen=True)
class OnnxTensor:
    name: str
    dtype: dtypes.DType
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[OnnxTensor, ...]
    outputs: tuple[OnnxTensor, ...]

    def input(self, name: str) -> OnnxTensor | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> OnnxTensor | None:
        return next((t for t in self.outputs if t.name == name), None)


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value") and d.dim_value > 0:
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def _tensor(value: onnx.ValueInfoProto, where: str) -> OnnxTensor:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ConfigError(f"{where} '{value.name}' is a {kind}, only tensors can be served")
    tensor_type = value.type.tensor_type
    try:
        dtype = dtypes.from_onnx(tensor_type.elem_type)
    except ConfigError as exc:
        raise ConfigError(f"{where} '{value.name}': {exc}") from None
    shape = tuple(_dim(d) for d in tensor_type.shape.dim) if tensor_type.HasField("shape") else ()
    return OnnxTensor(value.name, dtype, shape)


def signature_of(model: onnx.ModelProto) -> Signature:
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_tensor(v, "input") for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_tensor(v, "output") for v in model.graph.output)
    return Signature(inputs, outputs)


def read_signature(path: str | Path) -> Signature:
    """The signature of the ONNX file at `path`, without loading external weight files."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise ConfigError(f"cannot read ONNX file {path}: {type(exc).__name__}: {exc}") from None
    return signature_of(model)
