"""Whether a model gives the same answer two ways, for the load-time checks that change the shape of what the engine
runs: `trim_padding` (a batch's padding cut off, runtime/padding_trim.py) and `bucket_paddable_dims` (a batch padded up
to its bucket, runtime/padding_check.py). The model must ignore its padding for either to be right.

Exact models: every output within `RTOL` of its largest value (what float summation order moves). A lowered model
(int8, fp16) is exact at neither shape, and dynamic int8 scales activations by their range, padding included: there the
changed answer must be as close to the fp32 model's answer as the unchanged one is (cosine within `COSINE_SLACK`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

Tensors = Mapping[str, np.ndarray]
RTOL = 1e-4  # outputs equal within this, relative to the output's largest value
COSINE_SLACK = 1e-4  # a lowered model: how much closer to fp32 the unchanged answer may be than the changed one


def exact_disagreement(expected: Tensors, got: Tensors, change: str) -> str | None:
    """None when every output of `got` is within RTOL of `expected`'s; else which moved and by how much (`change`
    says what was done to the inputs, e.g. "when the padding is cut")."""
    from gebackend.compile.accuracy import compare

    for name, value in expected.items():
        moved = compare(name, value, got[name])
        scale = max(moved.reference_max_abs, 1e-6)
        if not moved.max_abs_diff <= RTOL * scale:
            return (f"output '{name}' moves by {moved.max_abs_diff:.3g} (its largest value {scale:.3g}) {change}: the "
                    f"model does not ignore its padding")
    return None


def fp32_disagreement(reference: Path, feeds: Tensors, unchanged: Tensors, changed: Tensors, done: str) -> str | None:
    """None when `changed` (the lowered model's answer with its inputs changed, `done`: e.g. "cut") is as close to the
    fp32 file `reference`'s answer on `feeds` as `unchanged` is; else which output fell and how far."""
    from gebackend.compile.accuracy import compare, reference_outputs

    fp32 = reference_outputs(reference, feeds)
    for name, expected in unchanged.items():
        before, after = compare(name, fp32[name], expected).cosine, compare(name, fp32[name], changed[name]).cosine
        if not after >= before - COSINE_SLACK:
            return (f"output '{name}': {done}, the lowered model's cosine to fp32 falls from {before:.6f} to "
                    f"{after:.6f}: the model does not ignore its padding")
    return None
