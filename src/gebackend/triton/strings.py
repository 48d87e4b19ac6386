"""BYTES tensors between Triton and the engines: Triton hands them over as `bytes`, ONNX Runtime's Python API takes and
gives `str`; the text preprocessing reads them as UTF-8 text the same way."""

from __future__ import annotations

import numpy as np

from gebackend.errors import InvalidRequest


def decode_utf8(value) -> str:
    """A TYPE_STRING element as text: UTF-8 bytes (strictly: invalid UTF-8 is the client's error) or str."""
    if isinstance(value, str):
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidRequest(f"expected UTF-8 text, got {type(value).__name__}")
    data = bytes(value)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"expected UTF-8 text, got {len(data)} bytes that are not valid UTF-8 "
                             f"({exc.reason} at byte {exc.start})") from None


def to_engine(array: np.ndarray) -> np.ndarray:
    """Triton hands BYTES tensors over as objects of `bytes`; ONNX Runtime wants `str`."""
    if array.dtype == np.object_:
        return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)
    return array


def to_triton(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:
        return np.vectorize(lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object])(array)
    return np.ascontiguousarray(array)
