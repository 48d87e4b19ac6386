"""Checks one request's inputs against the model spec before any engine sees them.

Every failure is an `InvalidRequest` whose message names the model, the input, what was
expected and what was sent, so a client can fix its request from the message alone. An empty tensor (a dim of 0
where the model's dims allow any length: no boxes for a post-processing model) is a request like any other, as on
Triton's onnxruntime backend: the engine decides whether the model computes on it (runtime/runners.py says which
input was empty when it does not); only a batch of 0 rows is refused here. Likewise a dim name the file gives two
axes is no contract (config/dim_names.py): a request giving them two sizes runs, and only where the engine then
fails does the answer add what the names suggest (`broken_tie`).

The verdict depends only on the request's input names, data types and shapes, which repeat from request
to request, so `RequestValidator` keeps it per signature: measured on a 2-input model, checking a request
took ~20 us and was the largest of gebackend's own costs per request; a known signature costs ~1 us. Values are
checked on every request only where an input indexes a table of the model (a text model's token ids: a minimum and
a maximum, `check_values`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from gebackend.config.index_bounds import IndexBound, out_of_bounds
from gebackend.config.spec import ModelSpec, TensorSpec
from gebackend.errors import InvalidRequest


def _fmt(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _expected_shape(spec: ModelSpec, tensor: TensorSpec) -> str:
    dims = (["batch"] if spec.batching else []) + [str(d) if d != -1 else (label or "?") for d, label in zip(tensor.dims, tensor.labels)]
    return "[" + ", ".join(dims) + "]"


class RequestValidator:
    """`validate_request` for one model, remembering each signature's verdict (at most `LIMIT` signatures)."""

    LIMIT = 4096

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self._verdicts: dict[tuple, str | None] = {}  # signature -> None (valid) or the error message
        self._bounded = [(t.name, t.bound) for t in spec.inputs if t.bound is not None]  # checked on every request

    def check(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Raise `InvalidRequest` unless `inputs` can run on the model."""
        try:
            signature = tuple((name, array.dtype, array.shape) for name, array in inputs.items())
        except AttributeError:  # not arrays: no signature to remember
            validate_request(self.spec, inputs)
            check_values(self.spec.name, self._bounded, inputs)
            return
        try:
            verdict = self._verdicts[signature]
        except KeyError:
            try:
                validate_request(self.spec, inputs)
                verdict = None
            except InvalidRequest as exc:
                verdict = str(exc)
            if len(self._verdicts) >= self.LIMIT:
                self._verdicts.clear()
            self._verdicts[signature] = verdict
        if verdict is not None:
            raise InvalidRequest(verdict)
        if self._bounded:
            check_values(self.spec.name, self._bounded, inputs)


def check_values(model: str, bounded: Sequence[tuple[str, IndexBound]], inputs: Mapping[str, np.ndarray]) -> None:
    """Raise `InvalidRequest` where an input that indexes a table of the model (config/index_bounds.py) holds a value
    outside its rows: ONNX Runtime would fail the run with its own message, OpenVINO answer with an empty row."""
    for name, bound in bounded:
        array = inputs.get(name)
        if array is None:
            continue
        found = out_of_bounds(array, bound)
        if found is not None:
            value, where = found
            raise InvalidRequest(
                f"model '{model}', input '{name}': value {value} at {_fmt(where)} is out of range; this input indexes "
                f"the rows of a table in the model, so its values must be in {bound.describe()}")


def broken_tie(spec: ModelSpec, inputs: Mapping[str, np.ndarray]) -> str | None:
    """Where the request gives one dim name of the file two sizes, a phrase saying so, else None. Never a reason to
    refuse (the file's names are hints: config/dim_names.py); it explains a run the engine then fails."""
    offset = 1 if spec.batching else 0
    named: dict[str, tuple[int, str]] = {}  # dim label -> (size, input that set it)
    for tensor in spec.inputs:
        array = inputs.get(tensor.name)
        if array is None or getattr(array, "ndim", -1) != len(tensor.dims) + offset:
            continue
        for label, got in zip(tensor.labels, array.shape[offset:]):
            if label is None:
                continue
            seen = named.setdefault(label, (got, tensor.name))
            if seen[0] != got:
                return (f"input '{tensor.name}' has dim '{label}' = {got} (shape sent {_fmt(array.shape)}) but input "
                        f"'{seen[1]}' has '{label}' = {seen[0]}, and the ONNX file names both '{label}'")
    return None


def validate_request(spec: ModelSpec, inputs: Mapping[str, np.ndarray]) -> None:
    """Raise `InvalidRequest` unless `inputs` can run on the model described by `spec`."""
    model = spec.name
    expected_names = [t.name for t in spec.inputs]
    unknown = sorted(set(inputs) - set(expected_names))
    if unknown:
        raise InvalidRequest(f"model '{model}' has no input {unknown[0]!r}; its inputs are {expected_names}")
    missing = [t.name for t in spec.inputs if t.name not in inputs and not t.optional]
    if missing:
        raise InvalidRequest(f"model '{model}': input {missing[0]!r} is missing; the model needs {expected_names}")

    batch_size: tuple[int, str] | None = None
    for tensor in spec.inputs:
        if tensor.name not in inputs:  # an optional input left out: the model runs on its default
            continue
        array = inputs[tensor.name]
        where = f"model '{model}', input '{tensor.name}'"
        if array.dtype != tensor.dtype.numpy:
            got = "BYTES" if array.dtype == np.object_ else str(array.dtype)
            raise InvalidRequest(f"{where}: expected data type {tensor.dtype.wire}, got {got}")
        offset = 1 if spec.batching else 0
        if array.ndim != len(tensor.dims) + offset:
            raise InvalidRequest(
                f"{where}: expected shape {_expected_shape(spec, tensor)} (rank {len(tensor.dims) + offset}), "
                f"got {_fmt(array.shape)} (rank {array.ndim})"
            )
        if spec.batching:
            rows = array.shape[0]
            if rows == 0:  # (Triton refuses these itself; an in-process caller may not)
                raise InvalidRequest(f"{where}: batch size 0 (shape {_fmt(array.shape)}); a request needs at least "
                                     f"one row")
            if rows > spec.max_batch_size:
                raise InvalidRequest(f"{where}: batch size {rows} exceeds the model's max_batch_size {spec.max_batch_size}")
            if batch_size is not None and rows != batch_size[0]:
                raise InvalidRequest(f"{where}: batch size {rows} differs from input '{batch_size[1]}' ({batch_size[0]})")
            batch_size = (rows, tensor.name)
        for axis, (want, label, got) in enumerate(zip(tensor.dims, tensor.labels, array.shape[offset:])):
            if want != -1 and got != want:
                raise InvalidRequest(
                    f"{where}: expected shape {_expected_shape(spec, tensor)}, got {_fmt(array.shape)} "
                    f"(dim {axis + offset} must be {want})"
                )
        for limit in tensor.limits:  # an axis whose length numbers the rows of a table (config/index_bounds.py)
            if array.shape[limit.axis] > limit.most:
                raise InvalidRequest(f"{where}: dim {limit.axis} is {array.shape[limit.axis]} (shape sent "
                                     f"{_fmt(array.shape)}), longer than the model takes: at most {limit.describe()}")
