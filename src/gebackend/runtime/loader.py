"""Builds what a `ModelSpec` asks for: a dynamic engine, or static graphs compiled per shape behind a bucket router."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from gebackend.config.spec import ModelSpec
from gebackend.engines import create_engine, create_static_engine
from gebackend.runtime.buckets import BucketRouter
from gebackend.runtime.executor import Executor
from gebackend.runtime.runners import BucketRunner, DynamicRunner


def load_executor(
    spec: ModelSpec, providers: Sequence = ("CPUExecutionProvider",), log: Callable[[str], None] = lambda m: None
) -> tuple[Executor, str]:
    """The executor for a model and one line describing how it runs."""
    output_names = [t.name for t in spec.outputs]
    if not spec.static:
        engine = create_engine(spec, providers)
        return Executor(spec, DynamicRunner(spec.name, engine, output_names)), f"dynamic graph, {engine.describe()}"

    from gebackend.compile.pipeline import compile_static

    graphs, report = compile_static(spec.path, spec.static_shapes, spec.options.fold_size_limit, log)
    if spec.options.dump_graph:
        _dump(spec, graphs, log)
    for line in report.format_text().splitlines():
        log(f"graph doctor: {line}")
    engine = create_static_engine(spec, graphs, providers)
    router = BucketRouter(
        spec.static_shapes,
        spec.batching,
        {t.name: t.labels for t in spec.inputs},
        {t.name: t.labels for t in spec.outputs},
        spec.options.bucket_paddable_dims,
    )
    fallback = create_engine(spec, providers) if spec.options.bucket_fallback == "dynamic" else None
    runner = BucketRunner(spec.name, router, engine, output_names, fallback)
    how = f"static graph, buckets [{' | '.join(router.describe())}], fallback={spec.options.bucket_fallback}, {engine.describe()}"
    return Executor(spec, runner), how


def _dump(spec: ModelSpec, graphs, log: Callable[[str], None]) -> None:
    """dump_graph=1: every compiled graph as ONNX, ready for Netron."""
    import onnx

    folder = Path(spec.options.profiling_dir).resolve() / spec.name / "graphs"
    folder.mkdir(parents=True, exist_ok=True)
    for number, graph in enumerate(graphs, start=1):
        shape = "_".join(f"{n}-{'x'.join(map(str, s))}" for n, s in graph.shapes.items())
        onnx.save(graph.model, str(folder / f"static{number}_{shape}.onnx"))
    log(f"dump_graph: wrote {len(graphs)} compiled graph(s) to {folder}")
