"""bfloat16 tensors (TYPE_BF16) at the engines' edges and in gebackend's own runs (the accuracy checks, dumps): numpy
has no bfloat16 of its own (ml_dtypes gives one, as onnx and tritonclient use), and neither engine's Python API takes
or gives it as such an array. It lives below the engines: compile's own ONNX Runtime runs (compile/accuracy.py) need
it too.

- ONNX Runtime: `session.run` refuses a bfloat16 array and returns no bfloat16 output; a session with a bfloat16 input
  or output runs with OrtValues instead, made from the array's 16-bit buffer as the ONNX type, its outputs read
  back from their buffers (`run_with_values`).
- OpenVINO: a tensor is made from the 16-bit buffer with its element type (`ov_tensor`); its data comes back as a
  float16 view of the bits, which `from_ov` views as bfloat16 again.
"""

from __future__ import annotations

import ctypes
from typing import Mapping, Sequence

import numpy as np

from gebackend.config import dtypes

BF16 = dtypes.from_triton("TYPE_BF16").numpy  # ml_dtypes' bfloat16, as the type table has it
_ORT_BF16 = "tensor(bfloat16)"


# ------------------------------------------------------------------------------------------ ONNX Runtime


def needs_values(session) -> bool:
    """Whether a session has a bfloat16 input or output (then it runs through `run_with_values`)."""
    return any(meta.type == _ORT_BF16 for meta in [*session.get_inputs(), *session.get_outputs()])


def _to_value(array: np.ndarray):
    import onnxruntime as ort
    from onnx import TensorProto

    array = np.ascontiguousarray(array)
    if array.dtype == BF16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _from_value(value) -> np.ndarray:
    if value.data_type() != _ORT_BF16:
        return value.numpy()
    result = np.empty(value.shape(), dtype=np.uint16)
    if result.size:
        ctypes.memmove(result.ctypes.data, value.data_ptr(), result.nbytes)
    return result.view(BF16)


def run_with_values(session, output_names: Sequence[str], feeds: Mapping[str, np.ndarray], options=None) -> list[np.ndarray]:
    """`session.run` for a session `needs_values` says cannot take plain arrays; raises what ONNX Runtime raises."""
    values = {name: _to_value(array) for name, array in feeds.items()}  # alive until the run ends
    return [_from_value(v) for v in session.run_with_ort_values(list(output_names), values, options)]


def run(session, output_names: Sequence[str], feeds: Mapping[str, np.ndarray], options=None) -> list[np.ndarray]:
    """`session.run`, or `run_with_values` for a session with bfloat16 tensors (for gebackend's own runs: the
    accuracy checks, dumps; the engines decide once per session)."""
    if needs_values(session):
        return run_with_values(session, output_names, feeds, options)
    return session.run(list(output_names), dict(feeds), options)


# ------------------------------------------------------------------------------------------ OpenVINO


def ov_dtype(element_type) -> np.dtype:
    """The numpy dtype of an OpenVINO element type (bfloat16 included, which OpenVINO maps to float16)."""
    import openvino as ov

    return BF16 if element_type == ov.Type.bf16 else np.dtype(element_type.to_dtype())


def ov_tensor(array: np.ndarray):
    """An OpenVINO tensor on the array's memory (the caller keeps the array alive until the run ends)."""
    import openvino as ov

    if array.dtype == BF16:
        return ov.Tensor(array.view(np.uint16), list(array.shape), ov.Type.bf16)
    return ov.Tensor(array, shared_memory=True)


def from_ov(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A tensor's `data` as `dtype` (its port's `ov_dtype`): a bfloat16 tensor's float16 view of the bits, as bfloat16."""
    return data.view(np.uint16).view(BF16) if dtype == BF16 and data.dtype != BF16 else data
