"""The requests `gebackend tune --input-data FILE` measures with: perf_analyzer's --input-data JSON of the user's own
requests (the same file every candidate, reference and the peer get), read here to see whether their token ids are
padded, which makes every ge candidate cut each batch's padding (trim_padding) before its engine runs it, and as
feeds (`in_process`) for the in-process timings and ceiling, which send the requests perf_analyzer sends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

IN_PROCESS_LIMIT = 64  # the in-process timings send at most this many of the user's requests (in turn)


# the last file read, (path, mtime, size) -> its entries: the tune reads one file for several things (the shapes its
# requests send, their padding, the in-process requests), a file of many images once
_LAST: dict[tuple, list[dict]] = {}


def read(path: Path) -> list[dict]:
    """The entries of a perf_analyzer --input-data file; ValueError naming the file and what is wrong."""
    try:
        stat = Path(path).stat()
        key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
        if key in _LAST:
            return _LAST[key]
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--input-data {path}: cannot read it: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--input-data {path}: not JSON ({exc})") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"--input-data {path}: expected perf_analyzer's format, {{\"data\": [{{INPUT: ...}}, ...]}}")
    _LAST.clear()
    _LAST[key] = entries
    return entries


def _values(tensor) -> np.ndarray | None:
    """One request's tensor as numbers (perf_analyzer's list or {"content": [...], "shape": [...]}); None for b64."""
    content, shape = (tensor.get("content"), tensor.get("shape")) if isinstance(tensor, dict) else (tensor, None)
    if not isinstance(content, list):
        return None
    try:
        values = np.asarray(content, dtype=np.int64)
        return values.reshape(shape) if shape else values
    except (TypeError, ValueError):
        return None


def padding(path: Path, name: str, pad: int = 0) -> tuple[int, int] | None:
    """(the most positions any request of `name` uses, the positions each sends) when the requests' token ids end in
    `pad` ids, else None (not padded, not in the file, or not readable as numbers)."""
    used, full = 0, 0
    for entry in read(path):
        values = _values(entry.get(name)) if name in entry else None
        if values is None or values.ndim < 1 or values.shape[-1] == 0:
            return None
        real = np.flatnonzero((values != pad).reshape(-1, values.shape[-1]).any(axis=0))
        used, full = max(used, int(real[-1]) + 1 if real.size else 1), max(full, values.shape[-1])
    return (used, full) if used < full else None


def in_process(model_name: str, onnx_path: Path, path: Path, batching: bool, limit: int = IN_PROCESS_LIMIT
               ) -> list[dict[str, np.ndarray]]:
    """The first `limit` requests of a --input-data file as feeds (batch dim 1 where the model batches), for the
    in-process timing and ceiling to send what perf_analyzer sends; ValueError saying why they cannot be read so."""
    from gebackend.compile.calibration import load_samples
    from gebackend.errors import ModelLoadError

    try:
        entries = read(path)
    except ValueError as exc:
        raise ValueError(f"read: {exc}") from None
    try:
        return load_samples(model_name, Path(onnx_path), Path(path), batching, limit=limit, entries=entries)
    except ModelLoadError as exc:  # the reader is static int8's, which reads the same format as calibration_data
        raise ValueError(f"read as the model's inputs by the calibration reader, which says: {exc}") from None
