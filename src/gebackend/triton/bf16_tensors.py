"""BF16 tensors between Triton's Python backend and numpy: `pb_utils.Tensor.as_numpy` refuses them ("Use to_dlpack()
and from_dlpack() instead"), numpy cannot import a bfloat16 DLPack tensor, and `pb_utils.Tensor` refuses a bfloat16
array (ml_dtypes, the type tritonclient sends and reads). So an input is read from its DLPack capsule's buffer, and an
output is made as a UINT16 tensor of the same bits whose DLPack dtype is then marked bfloat16 before Triton takes it.

The structs are DLPack's (dlpack.h, v0.8 and later: the layout the Python backend exports); only CPU tensors come here
(the backend's inputs and outputs of a CPU instance).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from gebackend.compile.bfloat16 import BF16

_KDL_BFLOAT = 4  # DLDataTypeCode kDLBfloat


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _managed(capsule) -> _Managed:
    """The DLPack tensor a (not yet consumed) capsule holds; the capsule keeps it alive and frees it."""
    return _Managed.from_address(_capsule_pointer(capsule, b"dltensor"))


def read_bf16(tensor: Any) -> np.ndarray:
    """A copy of a BF16 `pb_utils.Tensor` as a bfloat16 array."""
    capsule = tensor.to_dlpack()
    dl = _managed(capsule).dl_tensor
    if dl.dtype.code != _KDL_BFLOAT or dl.dtype.bits != 16 or dl.device.device_type != 1:  # kDLCPU
        raise ValueError(f"tensor '{tensor.name()}' is not a bfloat16 tensor in CPU memory")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    result = np.empty(shape, dtype=np.uint16)
    if result.size:
        ctypes.memmove(result.ctypes.data, dl.data + dl.byte_offset, result.nbytes)  # a contiguous tensor: no strides
    return result.view(BF16)


def bf16_tensor(pb_utils: Any, name: str, array: np.ndarray) -> Any:
    """A BF16 `pb_utils.Tensor` holding `array` (bfloat16)."""
    bits = pb_utils.Tensor(name, np.ascontiguousarray(array).view(np.uint16))
    capsule = bits.to_dlpack()
    _managed(capsule).dl_tensor.dtype.code = _KDL_BFLOAT
    return pb_utils.Tensor.from_dlpack(name, capsule)
