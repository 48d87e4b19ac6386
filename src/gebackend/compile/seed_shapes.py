"""The shapes of every input we invent (the accuracy check of a lowered model, static int8's seeded calibration, the
tune's and the bench's seeded requests), chosen in this one place: where the file and config.pbtxt's dims leave a dim
free, the candidates of compile/shape_sources.py (`model_warmup`, the first `calibration_data` sample, the file's
metadata, typical sizes), each under config.pbtxt's dims and sized by compile/free_dims.py, are run in order by plain
ONNX Runtime on the CPU, and the first that runs is chosen, `SeedShapes.source` naming it for the load line ("probed
320x320"). The probing is bounded (it stops at the first that runs, and after `PROBE_SECONDS`); where none runs, the
sizes free_dims.py gives alone are returned with `runs=False` and what failed, and the caller keeps fp32 saying so;
where ONNX Runtime cannot open the file or no seeded input can be made for it (custom operators, strings), the first
candidate, unprobed (`runs=None`); a model with no free dim is not probed. The verdict is kept per file version and
candidates, in this process and beside the model (`.gebackend-cache/shapes/`, cache_dir.py), so a model's instances
probe once."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from gebackend.compile import shape_sources
from gebackend.compile.free_dims import concrete_shapes

LEAF = "shapes"
PROBE_SECONDS = 60.0
Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class SeedShapes:
    shapes: Shapes
    source: str  # "the file's dims", "the config's dims", "model_warmup", "probed 320x320", ...
    runs: bool | None = None  # True: ran on ONNX Runtime; False: no candidate ran; None: not probed
    why: str = ""  # runs=False: the sizes tried and how they failed; runs=None: why they were not tried, if any
    tried: int = 0  # runs=False: how many candidates were tried

    def describe(self) -> str:
        """`images:[1, 3, 320, 320]`, one per input."""
        return shapes_text(self.shapes)

    def phrase(self) -> str:
        """The shapes and where they came from, as the load line says them."""
        return f"{self.describe()}, {self.source}"


def shapes_text(shapes: Mapping[str, Sequence[int]]) -> str:
    """Input shapes as the load log says them: `images:[1, 3, 320, 320] mask:[1, 8]`."""
    return " ".join(f"{name}:{list(shape)}" for name, shape in shapes.items())


def config_hints(inputs: Sequence, batching: bool) -> dict[str, tuple[int, ...]]:
    """config.pbtxt's tensors (name and dims without the batch dim, -1 where free) as whole-shape hints."""
    lead = (-1,) if batching else ()
    return {t.name: (*lead, *t.dims) for t in inputs}


def seed_shapes(path: Path, inputs: Sequence = (), batching: bool = False, warmup: Sequence[Mapping] | None = None,
                sample: Mapping[str, np.ndarray] | None = None, fixed: Mapping[str, np.ndarray] | None = None,
                home: Path | None = None, name: str = "model") -> SeedShapes:
    """The shapes to invent inputs at for the ONNX file at `path` (see the module docstring): `inputs` config.pbtxt's
    tensors, `warmup` its model_warmup entries, `sample` the first calibration sample, `fixed` the optional inputs'
    values (config/optional_inputs.py), `home` the file in the repository, beside which the verdict is kept."""
    model = onnx.load(str(path), load_external_data=False)
    hints = config_hints(inputs, batching)
    base = concrete_shapes(model, hints)
    free = shape_sources.free_axes(model, hints)
    if not free:
        return SeedShapes(base, "the config's dims" if shape_sources.free_axes(model, {}) else "the file's dims")
    images = shape_sources.image_axes(model, free, hints)
    candidates = (shape_sources.warmup(warmup, batching) + shape_sources.sample(sample)
                  + shape_sources.metadata(model, images) + shape_sources.probes(model, images))
    shaped = _distinct([(c.source, concrete_shapes(model, _over(hints, c.hints), default=c.default))
                        for c in candidates])
    index, why, probed = _verdict(path, model, shaped, fixed, home or path, name)
    if index is not None:
        return SeedShapes(shaped[index][1], shaped[index][0], True)
    if not probed:
        return SeedShapes(shaped[0][1], shaped[0][0], None, why)
    return SeedShapes(base, "no size tried runs", False, why, len(shaped))


def _over(config: Mapping[str, Sequence[int]], hints: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """A source's hints under config.pbtxt's dims: the config's sizes win where it gives them."""
    merged = {}
    for name in {*config, *hints}:
        mine, theirs = tuple(config.get(name) or ()), tuple(hints.get(name) or ())
        if len(mine) == len(theirs):
            merged[name] = tuple(m if m > 0 else t for m, t in zip(mine, theirs))
        else:
            merged[name] = mine or theirs
    return merged


def _distinct(shaped: list[tuple[str, Shapes]]) -> list[tuple[str, Shapes]]:
    """The candidates without repeats of shapes an earlier one gave."""
    seen, kept = [], []
    for source, shapes in shaped:
        if shapes not in seen:
            seen.append(shapes)
            kept.append((source, shapes))
    return kept


# ------------------------------------------------------------------------------------------ the verdict, kept

_VERDICTS: dict[str, tuple[int | None, str, bool]] = {}


def _verdict(path: Path, model: onnx.ModelProto, shaped: list[tuple[str, Shapes]],
             fixed: Mapping[str, np.ndarray] | None, home: Path, name: str) -> tuple[int | None, str, bool]:
    """(the index of the first candidate that runs or None, why none does, whether they were tried), from this
    process's or the disk's memory of this file and these candidates, else probed now and kept."""
    key = _key(path, shaped, fixed)
    if key in _VERDICTS:
        return _VERDICTS[key]
    kept = _read(home, name, key)
    if kept is None:
        kept = _probe(path, model, shaped, fixed)
        if kept[2]:
            _write(home, name, key, kept)
    _VERDICTS[key] = kept
    return kept


def _key(path: Path, shaped: list[tuple[str, Shapes]], fixed: Mapping[str, np.ndarray] | None) -> str:
    from gebackend.cache_dir import fingerprint

    digest = hashlib.sha256(f"{os.path.realpath(path)}\0{fingerprint(Path(path))}\0{shaped!r}".encode())
    for input_name in sorted(fixed or {}):
        value = np.asarray(fixed[input_name])
        digest.update(f"\0{input_name}\0{value.dtype}\0{value.shape}\0".encode() + value.tobytes())
    return digest.hexdigest()[:24]


def _folder(home: Path, name: str) -> Path | None:
    from gebackend.cache_dir import candidates, first_writable
    from gebackend.errors import ModelLoadError

    try:
        return first_writable(candidates(Path(os.path.realpath(home)), name, LEAF), "the seeded shapes' cache")
    except ModelLoadError:
        return None


def _read(home: Path, name: str, key: str) -> tuple[int | None, str, bool] | None:
    folder = _folder(home, name)
    try:
        found = json.loads((folder / f"{key}.json").read_text()) if folder is not None else None
        return (found["index"], str(found["why"]), True) if isinstance(found, dict) else None
    except (OSError, ValueError, KeyError):
        return None


def _write(home: Path, name: str, key: str, verdict: tuple[int | None, str, bool]) -> None:
    folder = _folder(home, name)
    if folder is None:
        return
    part = folder / f".{key}.{os.getpid()}.json"
    try:
        part.write_text(json.dumps({"index": verdict[0], "why": verdict[1]}))
        os.replace(part, folder / f"{key}.json")
    except OSError:
        part.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ probing

def _probe(path: Path, model: onnx.ModelProto, shaped: list[tuple[str, Shapes]],
           fixed: Mapping[str, np.ndarray] | None) -> tuple[int | None, str, bool]:
    """Each candidate run in turn by plain ONNX Runtime on the CPU until one runs."""
    from gebackend.compile.accuracy import random_feeds

    try:
        runner = _runner(path)
    except Exception as exc:  # noqa: BLE001 - a file ONNX Runtime cannot open alone: its engine may
        return None, f"ONNX Runtime cannot open the file to try sizes on it ({short(exc)})", False
    failed, started = [], time.monotonic()
    for index, (source, shapes) in enumerate(shaped):
        if time.monotonic() - started > PROBE_SECONDS:
            failed.append(f"stopped trying after {PROBE_SECONDS:.0f} s")
            break
        try:
            feeds = random_feeds(model, shapes, fixed=fixed)
        except Exception as exc:  # noqa: BLE001 - an input no seeded value is made for (strings)
            return None, f"no seeded input can be made for it ({short(exc)})", False
        try:
            runner.run(None, feeds)
            return index, "", True
        except Exception as exc:  # noqa: BLE001 - the model refuses these sizes: the next are tried
            failed.append(f"{shapes_text(shapes)} ({source}): {short(exc)}")
    return None, _tried(failed), True


def _tried(failed: list[str]) -> str:
    """What was tried, the first failures in full and the count of the others."""
    shown = "; ".join(failed[:2])
    return f"{shown}; and {len(failed) - 2} more" if len(failed) > 2 else shown


def _runner(path: Path):
    from gebackend.compile.ort_session import internal_options, open_session

    options = internal_options(threads=len(os.sched_getaffinity(0)), spinning=False)
    options.log_severity_level = 4  # a size the model refuses is expected here: no error in the server's log
    return open_session(path, options)


def short(exc: BaseException) -> str:
    """ONNX Runtime's error in one line: the node and its message, without status codes, source files and functions."""
    text = " ".join(str(exc).split())
    marker = "Non-zero status code returned while running "
    if marker in text:
        node, _, message = text.split(marker, 1)[1].partition(" Status Message: ")
        op, _, name = node.partition(" node. Name:")
        named = f" {name.strip()}" if name.strip() not in ("", "''") else ""
        return f"{op}{named}: {_message(message)}"[:300]
    if text.startswith("[ONNXRuntimeError] : "):
        text = text.split(" : ", 3)[-1]
    return text[:300]


def _message(text: str) -> str:
    """A kernel's status message without the source file and function it names first."""
    located = re.match(r"\S+\.(?:h|cc|cpp):\d+ ", text)
    if not located:
        return text
    text = text[located.end():]
    if " was false. " in text:
        return text.split(" was false. ", 1)[1]
    return text.split(" ", 1)[-1]
