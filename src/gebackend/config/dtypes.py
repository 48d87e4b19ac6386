"""The one table of tensor element types: Triton `TYPE_*` names, ONNX element types and numpy dtypes."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

from gebackend.errors import ConfigError


@dataclass(frozen=True)
class DType:
    triton: str  # config.pbtxt name, e.g. "TYPE_FP32"
    onnx: int  # onnx.TensorProto element type
    numpy: np.dtype

    @property
    def wire(self) -> str:
        """The name the KServe v2 protocol uses on the wire, e.g. "FP32"."""
        return "BYTES" if self.triton == "TYPE_STRING" else self.triton[len("TYPE_"):]


_TABLE = [
    DType("TYPE_BOOL", TensorProto.BOOL, np.dtype(np.bool_)),
    DType("TYPE_UINT8", TensorProto.UINT8, np.dtype(np.uint8)),
    DType("TYPE_UINT16", TensorProto.UINT16, np.dtype(np.uint16)),
    DType("TYPE_UINT32", TensorProto.UINT32, np.dtype(np.uint32)),
    DType("TYPE_UINT64", TensorProto.UINT64, np.dtype(np.uint64)),
    DType("TYPE_INT8", TensorProto.INT8, np.dtype(np.int8)),
    DType("TYPE_INT16", TensorProto.INT16, np.dtype(np.int16)),
    DType("TYPE_INT32", TensorProto.INT32, np.dtype(np.int32)),
    DType("TYPE_INT64", TensorProto.INT64, np.dtype(np.int64)),
    DType("TYPE_FP16", TensorProto.FLOAT16, np.dtype(np.float16)),
    DType("TYPE_BF16", TensorProto.BFLOAT16, np.dtype(ml_dtypes.bfloat16)),
    DType("TYPE_FP32", TensorProto.FLOAT, np.dtype(np.float32)),
    DType("TYPE_FP64", TensorProto.DOUBLE, np.dtype(np.float64)),
    DType("TYPE_STRING", TensorProto.STRING, np.dtype(np.object_)),
]
_BY_TRITON = {d.triton: d for d in _TABLE}
_BY_ONNX = {d.onnx: d for d in _TABLE}


def from_triton(name: str) -> DType:
    try:
        return _BY_TRITON[name]
    except KeyError:
        raise ConfigError(f"data type {name!r} is not supported; supported: {sorted(_BY_TRITON)}") from None


def from_onnx(elem_type: int) -> DType:
    try:
        return _BY_ONNX[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise ConfigError(f"ONNX element type {name} has no Triton equivalent") from None
