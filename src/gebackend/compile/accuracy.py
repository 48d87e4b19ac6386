"""Accuracy of a lowered model: the same seeded random input through the reference and the lowered graph.

`random_feeds` makes the input from the model's signature: floats standard normal; integers small and
non-negative (below 100, and below the rows of the table where the input indexes one stored in the model,
config/index_bounds.py, so embedding lookups stay in range), all ones for inputs named like a mask; booleans
random. Symbolic dims take the sizes given (the loader gives config.pbtxt's), else what compile/free_dims.py
chooses: the channels a Conv reads, one size per dim name (`batch` for the first dim, `dim` for the others), and a
dim named by an expression of other names (`past_sequence_length + sequence_length`) its value.
`accuracy_report` runs both models on the CPU and compares every output: max-abs-diff and cosine
similarity (computed in float64). The load log and `gebackend analyze --precision` print its `format_text()`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence, Union, runtime_checkable

import numpy as np
import onnx

from gebackend.compile import bfloat16
from gebackend.compile.free_dims import concrete_shapes
from gebackend.config import dtypes
from gebackend.config.index_bounds import index_bounds
from gebackend.errors import ConfigError, ModelLoadError

ModelSource = Union[str, Path, bytes, onnx.ModelProto]
TOKEN_ID_LIMIT = 100


@runtime_checkable
class RunsFeeds(Protocol):
    """A lowered model already built with its precision: an `Engine` (engines/base.py), which runs numpy feeds."""

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class OutputAccuracy:
    name: str
    max_abs_diff: float
    cosine: float
    reference_max_abs: float  # the scale max_abs_diff is to be read against

    def to_dict(self) -> dict:
        return {"name": self.name, "max_abs_diff": self.max_abs_diff, "cosine": self.cosine,
                "reference_max_abs": self.reference_max_abs}


@dataclass(frozen=True)
class AccuracyReport:
    max_abs_diff: float  # the largest over all outputs
    cosine: float  # the smallest over all outputs
    per_output: tuple[OutputAccuracy, ...]
    input_shapes: Mapping[str, tuple[int, ...]]
    seed: int = 0
    input_label: str = ""  # what the input was when not seeded random data (e.g. "the first calibration sample")

    def to_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "cosine": self.cosine, "seed": self.seed,
                "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                "outputs": [o.to_dict() for o in self.per_output]}

    def summary(self) -> str:
        shapes = " ".join(f"{n}:{','.join(map(str, s))}" for n, s in self.input_shapes.items())
        source = f"{self.input_label} {shapes}" if self.input_label else f"seeded random input {shapes}, seed {self.seed}"
        return f"max_abs_diff={self.max_abs_diff:.3g} cosine={self.cosine:.6f} ({source})"

    def format_text(self) -> str:
        lines = [self.summary()]
        if len(self.per_output) > 1:
            lines += [f"  {o.name}: max_abs_diff={o.max_abs_diff:.3g} cosine={o.cosine:.6f} "
                      f"(reference max |x| {o.reference_max_abs:.3g})" for o in self.per_output]
        return "\n".join(lines)


def _load(model: ModelSource) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return onnx.load(str(model), load_external_data=False)


def random_feeds(
    model: ModelSource,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    batch: int = 1,
    dim: int = 16,
    fixed: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """One seeded random input for every graph input (see the module docstring); the inputs in `fixed` (an optional
    input's default, config/optional_inputs.py) get that value instead."""
    proto = _load(model)
    shapes = {**concrete_shapes(proto, batch=batch, default=dim), **(shapes or {})}
    initializers = {init.name for init in proto.graph.initializer}
    limits = {name: bound.high + 1 for name, bound in index_bounds(proto).items()}  # rows of the table each indexes
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        if fixed and value.name in fixed:
            feeds[value.name] = fixed[value.name]
            continue
        tensor = value.type.tensor_type
        dtype = dtypes.from_onnx(tensor.elem_type).numpy
        shape = tuple(int(d) for d in shapes.get(value.name, ()))
        feeds[value.name] = _random(value.name, shape, np.dtype(dtype), rng, limits.get(value.name, TOKEN_ID_LIMIT))
    return feeds


def _random(name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator, limit: int) -> np.ndarray:
    if dtype.kind == "f" or dtype == bfloat16.BF16:  # bfloat16 (ml_dtypes) is of kind "V"
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        if "mask" in name.lower():
            return np.ones(shape, dtype=dtype)
        return rng.integers(0, max(1, min(limit, TOKEN_ID_LIMIT)), size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise ConfigError(f"input '{name}': cannot make a random {dtype} tensor for the accuracy check")


def _session(model: ModelSource, providers: Sequence):
    from gebackend.compile.ort_session import internal_options, open_session

    # threads explicit: ORT's default pins its own threads
    return open_session(model, internal_options(threads=len(os.sched_getaffinity(0)), spinning=False), providers)


def compare(name: str, reference: np.ndarray, lowered: np.ndarray) -> OutputAccuracy:
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(lowered, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ModelLoadError(f"output '{name}': the lowered model gives shape {np.shape(lowered)}, "
                             f"the reference {np.shape(reference)}")
    if a.size == 0:
        return OutputAccuracy(name, 0.0, 1.0, 0.0)
    diff = float(np.max(np.abs(a - b)))
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        cosine = 1.0
    elif na == 0.0 or nb == 0.0 or not (math.isfinite(na) and math.isfinite(nb)):
        cosine = 0.0 if math.isfinite(na) and math.isfinite(nb) else float("nan")
    else:
        cosine = float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))
    return OutputAccuracy(name, diff, cosine, float(np.max(np.abs(a))))


def reference_outputs(model: ModelSource, feeds: Mapping[str, np.ndarray],
                      providers: Sequence = ("CPUExecutionProvider",)) -> dict[str, np.ndarray]:
    """Every output of `model` on `feeds`, by name, from a plain ONNX Runtime session (the fp32 reference)."""
    session = _session(model, providers)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, bfloat16.run(session, names, feeds)))


def accuracy_report(
    reference_model: ModelSource,
    lowered_model: ModelSource | RunsFeeds,
    feeds: Mapping[str, np.ndarray],
    providers: Sequence = ("CPUExecutionProvider",),
    seed: int = 0,
    input_label: str = "",
) -> AccuracyReport:
    """Run both models on `feeds` and compare each output of the reference with the lowered model's.

    The reference runs on ONNX Runtime; the lowered model is an ONNX model (run the same way) or an
    `Engine` already built with its precision (`RunsFeeds`; e.g. OpenVINO with an inference precision hint).
    """
    try:
        reference = reference_outputs(reference_model, feeds, providers)
        names, expected = list(reference), list(reference.values())
        if isinstance(lowered_model, RunsFeeds):
            got = lowered_model.run(dict(feeds), names)
        else:
            got = bfloat16.run(_session(lowered_model, providers), names, feeds)
    except Exception as exc:
        shapes = " ".join(f"{name}:{list(np.shape(value))}" for name, value in feeds.items())
        raise ModelLoadError(f"accuracy check failed to run on {input_label or 'the seeded input'} ({shapes}): "
                             f"{type(exc).__name__}: {exc}; where the model takes other sizes for its free dims, give "
                             f"them as dims in config.pbtxt") from None
    outputs = tuple(compare(n, e, g) for n, e, g in zip(names, expected, got))
    worst_cosine = min((o.cosine for o in outputs), key=lambda c: (not math.isnan(c), c), default=1.0)
    return AccuracyReport(
        max(o.max_abs_diff for o in outputs) if outputs else 0.0,
        worst_cosine,
        outputs,
        {n: tuple(a.shape) for n, a in feeds.items()},
        seed,
        input_label,
    )
