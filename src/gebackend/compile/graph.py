"""What static graph mode compiles: one `CompiledGraph` per compiled shape (bucket), and what the engines need of it.

The compile pipeline (`pipeline.py`) makes these; the static engines (`engines/*_static.py`, OpenVINO's static
engine) build their sessions from them. Nothing here runs a graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import onnx


@dataclass
class CompiledGraph:
    """One static graph: the input shapes it was specialised to and the resulting model."""

    shapes: Mapping[str, tuple[int, ...]]
    model: onnx.ModelProto
    # the original file's dim_params at this shape ({"batch": 4, "sequence": 32}), handed to ORT as free
    # dimension overrides; the specialised graph has none left, so they only matter for what it missed
    dim_overrides: Mapping[str, int] = field(default_factory=dict)
    # the original file's initializer names: only those are shared across sessions. Constants that folding
    # made are left to each session, since overriding them broke ONNX Runtime's optimizer on a real model
    # (CN_CLIP's class embedding fed to a Concat failed with "Non concat axis dimensions must match").
    # None: share every large initializer.
    source_weights: frozenset[str] | None = None


def dim_overrides(signature_inputs, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Each named (dim_param) input dim of the original model at one compiled shape set.

    `signature_inputs`: the original inputs as (name, dims) with str for named dims. A name bound to two
    different sizes in one shape set is left out (ORT would pin it to one of them).
    """
    values: dict[str, int] = {}
    clashing: set[str] = set()
    for name, dims in signature_inputs:
        shape = shapes.get(name)
        if shape is None:
            continue
        for dim, size in zip(dims, shape):
            if isinstance(dim, str):
                if values.setdefault(dim, int(size)) != int(size):
                    clashing.add(dim)
    return {k: v for k, v in values.items() if k not in clashing}
