"""Builds what a `ModelSpec` asks for: a dynamic engine, or static graphs compiled per shape behind a bucket router.

With `precision_mode` int8 or fp16 on ONNX Runtime, the model is lowered first (compile/precision.py) and
the lowered file is what the engines load, in both graph modes; the same seeded random input then runs
through the original and the lowered model and the load log says how close they are (compile/accuracy.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Callable, Sequence

from gebackend.config.spec import ModelSpec
from gebackend.control.env import server_temp_parent
from gebackend.engines import create_engine, create_static_engine, engine_name
from gebackend.engines.registry import kind
from gebackend.errors import GeBackendError, ModelLoadError
from gebackend.runtime.buckets import BucketRouter
from gebackend.runtime.executor import Executor
from gebackend.runtime.runners import BucketRunner, DynamicRunner


def load_executor(
    spec: ModelSpec, providers: Sequence = ("CPUExecutionProvider",), log: Callable[[str], None] = lambda m: None
) -> tuple[Executor, str]:
    """The executor for a model and one line describing how it runs."""
    folder: Path | None = None
    precision = ""
    # lowered here unless the engine (OpenVINO's precision hint) or the provider (TensorRT, CANN) applies it itself
    if (spec.options.engines.precision_mode != "origin" and not kind(engine_name(spec.options.engines)).lowers_in_engine
            and not getattr(providers, "lowers_precision", False)):
        folder = _lowered_dir(spec.name)
        try:
            spec, precision = _lower(spec, folder, providers, log)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    try:
        executor, how = _build(spec, providers, log)
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if folder is not None:
        weakref.finalize(executor, shutil.rmtree, str(folder), True)  # the engines re-open it to profile
    return executor, f"{precision}{how}"


def _lowered_dir(model: str) -> Path:
    """A private folder for the lowered model."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    return Path(tempfile.mkdtemp(prefix=f"lowered-{safe}-", dir=server_temp_parent()))


def _lower(spec: ModelSpec, folder: Path, providers: Sequence, log: Callable[[str], None]) -> tuple[ModelSpec, str]:
    """The spec pointing at the lowered model, and the precision part of the load line."""
    from gebackend.compile.accuracy import accuracy_report, random_feeds
    from gebackend.compile.precision import lower_precision

    mode = spec.options.engines.precision_mode
    lowered = lower_precision(spec.path, mode, folder, log)
    ran = kind(engine_name(spec.options.engines)).precision_run(mode)
    if ran.note:
        log(f"precision {mode}: {ran.note}")
    try:
        feeds = random_feeds(spec.path, spec.static_shapes[0] if spec.static else None)
        report = accuracy_report(spec.path, lowered, feeds)
    except GeBackendError as exc:
        log(f"precision {mode}: no accuracy check: {exc}")
        return dataclasses.replace(spec, path=lowered), f"precision {mode} (accuracy not checked), "
    for number, line in enumerate(report.format_text().splitlines()):
        log(f"precision {mode} vs fp32: {line}" if number == 0 else line)
    if not report.cosine >= 0.99:
        log(f"precision {mode}: WARNING cosine similarity {report.cosine:.4f} to fp32 is below 0.99; "
            f"check the outputs or use precision_mode=origin")
    return dataclasses.replace(spec, path=lowered), f"precision {mode} (cosine {report.cosine:.6f} to fp32), "


def _build(spec: ModelSpec, providers: Sequence, log: Callable[[str], None]) -> tuple[Executor, str]:
    output_names = [t.name for t in spec.outputs]
    if not spec.static:
        engine = create_engine(spec, providers)
        return Executor(spec, DynamicRunner(spec.name, engine, output_names)), f"dynamic graph, {engine.describe()}"
    try:
        return _static_executor(spec, providers, log, output_names)
    except GeBackendError:
        raise
    except Exception as exc:  # noqa: BLE001 - never a dependency's traceback as the reason a load failed
        from gebackend.compile.specialize import describe_error

        raise ModelLoadError(
            f"static graph mode could not build model '{spec.name}': {describe_error(exc)}; serve it with "
            f"static_model=0 (dynamic graph mode) and report this model"
        ) from None


def _static_executor(spec: ModelSpec, providers: Sequence, log: Callable[[str], None], output_names) -> tuple[Executor, str]:
    engine = _static_engine(spec, providers, log)
    router = BucketRouter(
        spec.static_shapes,
        spec.batching,
        {t.name: t.labels for t in spec.inputs},
        {t.name: t.labels for t in spec.outputs},
        spec.options.static.bucket_paddable_dims,
    )
    fallback = create_engine(spec, providers) if spec.options.static.bucket_fallback == "dynamic" else None
    runner = BucketRunner(spec.name, router, engine, output_names, fallback)
    how = (f"static graph, buckets [{' | '.join(router.describe())}], fallback={spec.options.static.bucket_fallback}, "
           f"{engine.describe()}")
    return Executor(spec, runner), how


def _static_engine(spec: ModelSpec, providers: Sequence, log: Callable[[str], None]):
    """Compile every shape of a static spec through the passes, log the doctor's report, build the engine."""
    from gebackend.compile.pipeline import compile_static

    graphs, report = compile_static(spec.path, spec.static_shapes, spec.options.static.fold_size_limit, log)
    if spec.options.diagnostics.dump_graph:
        _dump(spec, graphs, log)
    if report is not None:
        for line in report.format_text().splitlines():
            log(f"graph doctor: {line}")
    engine = create_static_engine(spec, graphs, providers, temp_parent=server_temp_parent())
    del graphs  # the engine keeps files, not models: the weights live once, in the engine
    _return_freed_memory()
    return engine


def _dump(spec: ModelSpec, graphs, log: Callable[[str], None]) -> None:
    """dump_graph=1: every compiled graph as ONNX, ready for Netron."""
    import onnx

    folder = Path(spec.options.diagnostics.profiling_dir).resolve() / spec.name / "graphs"
    folder.mkdir(parents=True, exist_ok=True)
    for number, graph in enumerate(graphs, start=1):
        shape = "_".join(f"{n}-{'x'.join(map(str, s))}" for n, s in graph.shapes.items())
        onnx.save(graph.model, str(folder / f"static{number}_{shape}.onnx"))
    log(f"dump_graph: wrote {len(graphs)} compiled graph(s) to {folder}")


def _return_freed_memory() -> None:
    """Compiling copies the model several times; hand the freed heap back to the OS (glibc's malloc_trim).

    Measured on a 42 MiB BERT with 8 buckets: the instance's RSS 983 MiB without it, 232 MiB with it.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
