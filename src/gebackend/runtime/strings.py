"""BYTES tensors between Triton and the engines: Triton hands them over as `bytes`, ONNX Runtime's Python API takes and
gives `str`; the text preprocessing reads them as UTF-8 text the same way. Bytes that are not UTF-8 are the
request's error (400), answered for that request alone."""

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


def to_engine(array: np.ndarray, model: str, name: str) -> np.ndarray:
    """Triton hands BYTES tensors over as objects of `bytes`; ONNX Runtime's Python API takes `str` only (bytes that
    are not UTF-8 cannot reach it), so an element that is no UTF-8 text is the request's error, `InvalidRequest`
    naming the model, the input and the element."""
    if array.dtype != np.object_:
        return array
    try:
        return np.vectorize(decode_utf8, otypes=[object])(array)
    except InvalidRequest as exc:
        where = next((list(i) for i in np.ndindex(array.shape) if not _is_text(array[i])), "?")
        raise InvalidRequest(f"model '{model}', input '{name}', element {where}: {exc}; a STRING input reaches the "
                             f"engine as text, so send UTF-8") from None


def _is_text(value) -> bool:
    try:
        decode_utf8(value)
    except InvalidRequest:
        return False
    return True


def to_triton(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:
        return np.vectorize(lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object])(array)
    return np.ascontiguousarray(array)
