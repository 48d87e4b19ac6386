"""Unit tests for gebackend.config.dtypes: the Triton <-> ONNX <-> numpy type table."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto

from gebackend.config import dtypes
from gebackend.errors import ConfigError

# Triton name, ONNX element type, numpy dtype, KServe wire name: written out independently of the module.
ALL = [
    ("TYPE_BOOL", TensorProto.BOOL, np.bool_, "BOOL"),
    ("TYPE_UINT8", TensorProto.UINT8, np.uint8, "UINT8"),
    ("TYPE_UINT16", TensorProto.UINT16, np.uint16, "UINT16"),
    ("TYPE_UINT32", TensorProto.UINT32, np.uint32, "UINT32"),
    ("TYPE_UINT64", TensorProto.UINT64, np.uint64, "UINT64"),
    ("TYPE_INT8", TensorProto.INT8, np.int8, "INT8"),
    ("TYPE_INT16", TensorProto.INT16, np.int16, "INT16"),
    ("TYPE_INT32", TensorProto.INT32, np.int32, "INT32"),
    ("TYPE_INT64", TensorProto.INT64, np.int64, "INT64"),
    ("TYPE_FP16", TensorProto.FLOAT16, np.float16, "FP16"),
    ("TYPE_BF16", TensorProto.BFLOAT16, ml_dtypes.bfloat16, "BF16"),
    ("TYPE_FP32", TensorProto.FLOAT, np.float32, "FP32"),
    ("TYPE_FP64", TensorProto.DOUBLE, np.float64, "FP64"),
    ("TYPE_STRING", TensorProto.STRING, np.object_, "BYTES"),
]


@pytest.mark.parametrize("triton,onnx_type,np_type,wire", ALL, ids=[row[0] for row in ALL])
def test_round_trip(triton, onnx_type, np_type, wire):
    d = dtypes.from_triton(triton)
    assert d.triton == triton
    assert d.onnx == onnx_type
    assert d.numpy == np.dtype(np_type)
    assert d.wire == wire
    # Triton -> ONNX -> Triton
    assert dtypes.from_onnx(d.onnx) is d
    assert dtypes.from_onnx(onnx_type).triton == triton
    # ONNX <-> numpy agrees with onnx's own mapping
    assert onnx.helper.tensor_dtype_to_np_dtype(d.onnx) == d.numpy
    if triton != "TYPE_STRING":
        assert onnx.helper.np_dtype_to_tensor_dtype(d.numpy) == d.onnx
    # numpy -> Triton: arrays of that dtype carry exactly this DType's numpy dtype
    assert np.zeros(2, dtype=np_type).dtype == d.numpy


def test_every_type_is_distinct():
    found = [dtypes.from_triton(row[0]) for row in ALL]
    assert len({d.onnx for d in found}) == len(ALL)
    assert len({d.numpy for d in found if d.triton != "TYPE_STRING"}) == len(ALL) - 1


def test_wire_names():
    assert dtypes.from_triton("TYPE_STRING").wire == "BYTES"
    assert dtypes.from_triton("TYPE_FP32").wire == "FP32"
    assert dtypes.from_triton("TYPE_INT64").wire == "INT64"


@pytest.mark.parametrize("name", ["TYPE_BF32", "FP32", "TYPE_FLOAT", "", "type_fp32"])
def test_unknown_triton_name(name):
    with pytest.raises(ConfigError) as info:
        dtypes.from_triton(name)
    assert repr(name) in str(info.value)
    assert "TYPE_FP32" in str(info.value)  # lists what is supported


@pytest.mark.parametrize(
    "elem_type,shown",
    [(TensorProto.COMPLEX64, "COMPLEX64"), (TensorProto.UNDEFINED, "UNDEFINED"), (9999, "9999")],
)
def test_unknown_onnx_type(elem_type, shown):
    with pytest.raises(ConfigError) as info:
        dtypes.from_onnx(elem_type)
    assert shown in str(info.value)
    assert "no Triton equivalent" in str(info.value)

