"""Calibration samples for static int8 quantization: read from `calibration_data`, or made seeded and random.

Owns reading and checking the samples (compile/quantize_static.py runs them through the quantizers). A sample is one
request's inputs, `{input name: array}`, shaped as the ONNX graph takes them: with the batch dim (size 1) where the
model batches (max_batch_size > 0), added when the file lacks it. `calibration_data` is one of:

* a folder with, per model input, `<input>.npy` (the samples stacked on axis 0), or a subfolder `<input>/` of `.npy`
  files, one sample each, taken in the order of their names;
* a perf_analyzer `--input-data` JSON file: `{"data": [{"INPUT": [flat values] | {"content": [flat values], "shape":
  [dims]} | {"b64": "<base64 of the raw row-major bytes>"}, ...}, ...]}`. As for perf_analyzer, a shape leaves out
  the batch dim, and an input given without one takes the model's dims (which must then be fixed).

A relative path is read against the model's folder (the one holding config.pbtxt). Values are cast to the input's
type where numpy casts them within their kind (int64 -> int32, float64 -> float32, ints -> floats); anything else,
a missing input, or a shape the model cannot take is a `ModelLoadError` naming the model, the input, the file and
what was expected. Without `calibration_data`, `random_samples` makes `calibration_samples` seeded random inputs
(compile/accuracy.py's `random_feeds`, seed = the sample's number).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from gebackend.config import dtypes
from gebackend.errors import ModelLoadError

Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...]  # the ONNX dims; None where symbolic

    def expected(self, batching: bool) -> str:
        shown = ["batch" if batching and k == 0 else ("?" if d is None else str(d)) for k, d in enumerate(self.dims)]
        return f"{self.dtype} [{', '.join(shown)}]"


def model_folder(model_path: Path) -> Path:
    """The folder holding config.pbtxt: `<repo>/<model>/` for `<repo>/<model>/<version>/model.onnx`."""
    model_path = Path(model_path)
    above = model_path.parent.parent
    if model_path.parent.name.isdigit() or (above / "config.pbtxt").is_file():
        return above
    return model_path.parent


def resolve(text: str, model_path: Path) -> Path:
    """`calibration_data` as a path: relative ones against the model's folder."""
    path = Path(text).expanduser()
    return path if path.is_absolute() else model_folder(model_path) / path


def data_files(source: Path) -> list[Path]:
    """The files a `calibration_data` path reads (for the cache key)."""
    if source.is_file():
        return [source]
    if source.is_dir():
        return sorted(p for p in source.rglob("*.npy") if p.is_file())
    return []


def _inputs(model_path: Path) -> list[_Input]:
    proto = onnx.load(str(model_path), load_external_data=False)
    initializers = {init.name for init in proto.graph.initializer}
    found = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
        found.append(_Input(value.name, np.dtype(dtypes.from_onnx(tensor.elem_type).numpy), dims))
    return found


def random_samples(model_path: Path, count: int, shapes: Mapping[str, Sequence[int]] | None = None,
                   fixed: Mapping[str, np.ndarray] | None = None) -> list[Sample]:
    """`count` seeded random samples (seed 0, 1, ...): the same every load, so the cache key need not hold them;
    the inputs in `fixed` (optional inputs' defaults) keep their value."""
    from gebackend.compile.accuracy import random_feeds

    return [random_feeds(model_path, shapes, seed=seed, fixed=fixed) for seed in range(count)]


def load_samples(model: str, model_path: Path, source: Path, batching: bool, limit: int | None = None,
                 fixed: Mapping[str, np.ndarray] | None = None, entries: Sequence | None = None) -> list[Sample]:
    """The samples in `source` (a folder or a perf_analyzer JSON file), checked against the model's inputs; an input
    in `fixed` (an optional input's default) that `source` leaves out gets that value, as a request would. `entries`:
    the JSON file's "data" where the caller has parsed it already (the tune reads its --input-data once)."""
    fixed = fixed or {}
    inputs = _inputs(model_path)
    if source.is_dir():
        raw = _from_folder(model, source, inputs, fixed)
    elif entries is not None or source.is_file():
        raw = _from_json(model, source, inputs, batching, fixed, limit, entries)
    else:
        raise ModelLoadError(f"model '{model}': calibration_data {source} does not exist; expected a folder of "
                             f"<input>.npy or <input>/*.npy files, or a perf_analyzer --input-data JSON file")
    samples = [{i.name: _check(model, i, *sample[i.name], batching) if i.name in sample else fixed[i.name]
                for i in inputs} for sample in raw[:limit]]
    if not samples:
        raise ModelLoadError(f"model '{model}': calibration_data {source} holds no sample")
    return samples


def _check(model: str, spec: _Input, array: np.ndarray, where: str, batching: bool) -> np.ndarray:
    """One input of one sample cast to the input's type, with the batch dim added where the file lacks it."""
    def refuse(problem: str) -> ModelLoadError:
        return ModelLoadError(f"model '{model}': calibration_data {where}: input '{spec.name}' {problem}; "
                              f"expected {spec.expected(batching)}")

    array = np.asarray(array)
    if array.dtype != spec.dtype:
        if not np.can_cast(array.dtype, spec.dtype, casting="same_kind") and not (
                array.dtype.kind in "iub" and spec.dtype.kind in "iuf"):
            raise refuse(f"has type {array.dtype}, which cannot be cast to {spec.dtype}")
        array = array.astype(spec.dtype)
    if batching and array.ndim == len(spec.dims) - 1:
        array = array[np.newaxis]
    if array.ndim != len(spec.dims):
        raise refuse(f"has shape {list(array.shape)} (rank {array.ndim}), the model takes rank {len(spec.dims)}")
    for axis, (size, want) in enumerate(zip(array.shape, spec.dims)):
        if want is not None and size != want and not (batching and axis == 0):
            raise refuse(f"has shape {list(array.shape)}: dim {axis} is {size}, the model needs {want}")
    return np.ascontiguousarray(array)


def _load_npy(model: str, path: Path, name: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - a bad file is the user's to fix, said plainly
        raise ModelLoadError(f"model '{model}': calibration_data {path}: input '{name}' cannot be read as .npy: "
                             f"{type(exc).__name__}: {exc}") from None


def _from_folder(model: str, folder: Path, inputs: Sequence[_Input],
                 fixed: Mapping[str, np.ndarray]) -> list[dict[str, tuple[np.ndarray, str]]]:
    per_input: dict[str, list[tuple[np.ndarray, str]]] = {}
    for spec in inputs:
        stacked, subfolder = folder / f"{spec.name}.npy", folder / spec.name
        if spec.name in fixed and not stacked.is_file() and not subfolder.is_dir():
            continue
        if stacked.is_file():
            array = _load_npy(model, stacked, spec.name)
            if array.ndim == 0:
                raise ModelLoadError(f"model '{model}': calibration_data {stacked}: input '{spec.name}' is a scalar; "
                                     f"expected the samples stacked on axis 0")
            per_input[spec.name] = [(array[k], f"{stacked} [sample {k}]") for k in range(array.shape[0])]
        elif subfolder.is_dir():
            files = sorted(p for p in subfolder.glob("*.npy") if p.is_file())
            if not files:
                raise ModelLoadError(f"model '{model}': calibration_data {subfolder}: input '{spec.name}' has no "
                                     f".npy file there; expected one file per sample")
            per_input[spec.name] = [(_load_npy(model, p, spec.name), str(p)) for p in files]
        else:
            raise ModelLoadError(f"model '{model}': calibration_data {folder}: input '{spec.name}' is missing; expected "
                                 f"{stacked.name} (samples stacked on axis 0) or a folder {spec.name}/ of .npy files")
    counts = {name: len(samples) for name, samples in per_input.items()}
    if len(set(counts.values())) > 1:
        raise ModelLoadError(f"model '{model}': calibration_data {folder}: the inputs have different sample counts "
                             f"({', '.join(f'{n}: {c}' for n, c in counts.items())}); expected the same for each")
    count = next(iter(counts.values()), 0)
    return [{name: samples[k] for name, samples in per_input.items()} for k in range(count)]


def _from_json(model: str, path: Path, inputs: Sequence[_Input], batching: bool, fixed: Mapping[str, np.ndarray],
               limit: int | None = None, entries: Sequence | None = None) -> list[dict[str, tuple[np.ndarray, str]]]:
    """The file's entries (parsed here unless given) as samples, the first `limit` of them (the others are not
    decoded)."""
    if entries is None:
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"model '{model}': calibration_data {path} is not a readable JSON file: {exc}") from None
        entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ModelLoadError(f"model '{model}': calibration_data {path}: expected perf_analyzer's --input-data "
                             f'format, {{"data": [{{"INPUT": [...]}}, ...]}}')
    samples = []
    for number, entry in enumerate(entries[:limit]):
        where = f"{path} [data {number}]"
        if not isinstance(entry, dict):
            raise ModelLoadError(f"model '{model}': calibration_data {where}: expected an object of input name -> "
                                 f"values (streams of sequences are not read)")
        sample = {}
        for spec in inputs:
            if spec.name not in entry and spec.name in fixed:
                continue
            if spec.name not in entry:
                raise ModelLoadError(f"model '{model}': calibration_data {where}: input '{spec.name}' is missing; "
                                     f"expected {spec.expected(batching)}")
            sample[spec.name] = (_json_tensor(model, spec, entry[spec.name], where, batching), where)
        samples.append(sample)
    return samples


def _json_tensor(model: str, spec: _Input, value, where: str, batching: bool) -> np.ndarray:
    """One perf_analyzer tensor: flat values, {"content", "shape"}, or {"b64"}; shapes without the batch dim."""
    def refuse(problem: str) -> ModelLoadError:
        return ModelLoadError(f"model '{model}': calibration_data {where}: input '{spec.name}' {problem}; "
                              f"expected {spec.expected(batching)}")

    shape = None
    if isinstance(value, dict) and "b64" in value:
        try:
            flat = np.frombuffer(base64.b64decode(value["b64"], validate=True), dtype=spec.dtype)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise refuse(f"has b64 data that is not {spec.dtype} bytes ({exc})") from None
        shape = value.get("shape")
    elif isinstance(value, dict) and "content" in value:
        flat, shape = value["content"], value.get("shape")
    elif isinstance(value, list):
        flat = value
    else:
        raise refuse('is neither a list of values, {"content": [...], "shape": [...]} nor {"b64": ...}')
    try:
        flat = np.asarray(flat).reshape(-1)
    except ValueError as exc:
        raise refuse(f"has values that are not one flat list ({exc})") from None
    if flat.dtype.kind not in "biuf":
        raise refuse(f"has values of type {flat.dtype}, which cannot be cast to {spec.dtype}")
    if shape is None:
        dims = spec.dims[1:] if batching else spec.dims
        if any(d is None for d in dims):
            raise refuse('has no "shape" and the model\'s dims are not all fixed: give {"content": [...], "shape": [...]}')
        shape = list(dims)
    try:
        array = flat.reshape([int(d) for d in shape])
    except (ValueError, TypeError):
        raise refuse(f"has {flat.size} values, which do not fill shape {list(shape)}") from None
    return array
