"""Compiles a model for static graph mode: one specialised, folded graph per compiled shape, and the doctor's report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import onnx

from gebackend.compile.doctor import DoctorReport, analyze
from gebackend.compile.fold import fold_constants
from gebackend.compile.specialize import specialize
from gebackend.engines.onnxruntime_static import CompiledGraph
from gebackend.errors import ModelLoadError

Shapes = Mapping[str, Sequence[int]]


def _fmt(shapes: Shapes) -> str:
    return " ".join(f"{name}:{','.join(str(d) for d in shape)}" for name, shape in shapes.items())


def compile_static(
    path: Path,
    shape_sets: Sequence[Shapes],
    size_limit: int | None,
    log: Callable[[str], None] = lambda message: None,
) -> tuple[list[CompiledGraph], DoctorReport]:
    """Specialise and fold the model once per shape set, logging progress; return the graphs and the report."""
    try:
        base = onnx.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    graphs = []
    weights = frozenset(init.name for init in base.graph.initializer)
    for number, shapes in enumerate(shape_sets, start=1):
        started = time.perf_counter()
        model = fold_constants(specialize(base, shapes), size_limit)
        graphs.append(CompiledGraph(dict(shapes), model, source_weights=weights))
        log(f"compiled static graph {number}/{len(shape_sets)} [{_fmt(shapes)}]: "
            f"{len(model.graph.node)} nodes in {time.perf_counter() - started:.2f}s")
    report = analyze(base, shape_sets[0], size_limit=size_limit, folded=graphs[0].model)
    return graphs, report
