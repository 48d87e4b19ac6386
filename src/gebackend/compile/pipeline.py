"""Compiles a model for static graph mode: one graph per compiled shape through the passes, and the doctor's report.

Each shape set goes through `passes.compile_graph` (specialise, upgrade, fold) and becomes a `CompiledGraph`
(`graph.py`) with the original file's named dims at that shape and the graph's analysis, so the engines take
what they need from it. A pass that fails on the
model is skipped and said once in the load log, as a WARNING naming the pass and the reason; the model
still loads. The graph doctor's report is best-effort too: if it fails, the log says so and the load goes on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import onnx

from gebackend.compile.doctor import DoctorReport, analyze
from gebackend.compile.passes import compile_graph, reason
from gebackend.compile.graph import CompiledGraph, dim_overrides, signature_dims
from gebackend.errors import ConfigError, ModelLoadError

Shapes = Mapping[str, Sequence[int]]


def _fmt(shapes: Shapes) -> str:
    return " ".join(f"{name}:{','.join(str(d) for d in shape)}" for name, shape in shapes.items())


def compile_static(
    path: Path,
    shape_sets: Sequence[Shapes],
    size_limit: int | None,
    log: Callable[[str], None] = lambda message: None,
) -> tuple[list[CompiledGraph], DoctorReport | None]:
    """Run the passes once per shape set, logging progress; return the graphs and the report (None if it failed).

    Raises `ModelLoadError` when the file cannot be read and `ConfigError` when a shape does not fit the model.
    """
    try:
        base = onnx.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    skipped: dict[str, str] = {}  # pass -> the first reason, said once per model

    def warn(name: str, why: str) -> None:
        if name not in skipped:
            skipped[name] = why
            log(f"WARNING: static graph pass '{name}' skipped: {why}")

    graphs = []
    weights = frozenset(init.name for init in base.graph.initializer)
    signature = signature_dims(base)
    for number, shapes in enumerate(shape_sets, start=1):
        started = time.perf_counter()
        model = compile_graph(base, shapes, size_limit, warn)
        graphs.append(CompiledGraph(dict(shapes), model, dim_overrides=dim_overrides(signature, shapes), source_weights=weights))
        log(f"compiled static graph {number}/{len(shape_sets)} [{_fmt(shapes)}]: "
            f"{len(model.graph.node)} nodes in {time.perf_counter() - started:.2f}s")
    notes = [f"pass '{name}' skipped: {why}" for name, why in skipped.items()]
    try:
        report = analyze(base, shape_sets[0], size_limit=size_limit, folded=graphs[0].model, notes=notes)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a diagnosis, never a load failure
        log(f"WARNING: graph doctor failed, no report: {reason(exc)}")
        report = None
    return graphs, report
