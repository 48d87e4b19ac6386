"""What static graph mode compiles: one `CompiledGraph` per compiled shape (bucket), and what the engines need of it.

The compile pipeline (`pipeline.py`) makes these, with what the engines need to know of each graph worked out
here once: the original file's named dims at this shape (ONNX Runtime's free dimension overrides), the nodes
whose shapes are all known, the outputs whose shape only a run decides, and whether an input's values decide
a shape (then zeros are no safe warm-up). The static engines (`engines/onnxruntime_static.py`, OpenVINO's
static engine) build their sessions from them and ask no pass or analysis themselves. Nothing here runs a graph.
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
    # filled from `model` when not given (see `__post_init__`)
    static_nodes: tuple[str, ...] | None = None  # nodes whose every output shape is known
    runtime_outputs: frozenset[str] | None = None  # outputs whose shape only a run decides (compile/runtime_shapes.py)
    reads_shape_values: bool | None = None  # an input's values decide a shape: zeros are no safe warm-up

    def __post_init__(self) -> None:
        from gebackend.compile.doctor import static_node_names
        from gebackend.compile.runtime_shapes import reads_shape_values, runtime_shaped_outputs

        if self.static_nodes is None:
            self.static_nodes = tuple(static_node_names(self.model))
        if self.runtime_outputs is None:
            self.runtime_outputs = frozenset(runtime_shaped_outputs(self.model))
        if self.reads_shape_values is None:
            self.reads_shape_values = bool(reads_shape_values(self.model))

    @property
    def fully_static(self) -> bool:
        """Every node's output shape known at compile time: safe to capture as a device graph."""
        return not self.runtime_outputs and len(self.static_nodes) == len(self.model.graph.node)


def signature_dims(model: onnx.ModelProto) -> list[tuple[str, list[int | str | None]]]:
    """The model's graph inputs (not its weights) as (name, dims): int for a fixed dim, str for a named one."""
    weights = {init.name for init in model.graph.initializer}
    return [(value.name, [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
                          for d in value.type.tensor_type.shape.dim])
            for value in model.graph.input if value.name not in weights]


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
