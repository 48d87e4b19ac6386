"""Builds what a `ModelSpec` asks for: a dynamic engine, or static graphs compiled per shape behind a bucket router.

Static graph mode never fails where dynamic mode loads: where some buckets cannot be built (a pass, shape inference
or the engine refusing the specialised file) and others can, the others serve and the requests the failing ones would
hold run on the dynamic graph beside them; a model none of whose buckets can be built, or that static_model=1 cannot
fix (a free input dim no bucket fixes), is served on the dynamic graph. The load log says why in one warning.

With `precision_mode` int8 (any engine) or fp16 on ONNX Runtime, the model is lowered first (compile/precision.py,
int8 static: compile/quantize_static.py), once per model version and options: the lowered file is cached for every
instance and restart (compile/precision_cache.py), and it is what the engines load, in both graph modes. The same
input (seeded random, or the first calibration sample) then runs through the original and the lowered model and the
load log says how close they are (compile/accuracy.py).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.control.env import control_dir, server_temp_parent
from gebackend.control.timing_lock import timing_alone
from gebackend.engines import create_engine, create_static_engine, engine_name
from gebackend.engines.providers import as_selection
from gebackend.engines.registry import kind
from gebackend.errors import GeBackendError, ModelLoadError
from gebackend.heap import return_freed_memory
from gebackend.runtime import bucket_costs, lowering, static_fallback
from gebackend.runtime.buckets import BucketRouter
from gebackend.runtime.executor import Executor
from gebackend.runtime.runners import BucketRunner, DynamicRunner


def load_executor(
    spec: ModelSpec, providers: Sequence = ("CPUExecutionProvider",), log: Callable[[str], None] = lambda m: None,
    lending=None, defaults: Mapping[str, np.ndarray] | None = None,
) -> tuple[Executor, str]:
    """The executor for a model and one line describing how it runs (`lending`: the cores a pinned instance may borrow
    while its siblings idle, runtime/lending.py; `defaults`: the optional inputs' values in the ONNX file, which a
    lowering calibrates and checks its accuracy on, as requests leaving them out run on them)."""
    precision = ""
    engine_kind = kind(engine_name(spec.options.engines))
    mode = spec.options.engines.precision_mode
    # lowered here unless the engine (OpenVINO's precision hint for bf16/fp16) or the provider (TensorRT, CANN)
    # applies it itself; the lowered file lives in the precision cache, shared by instances and restarts
    original = spec.path
    if mode != "origin" and not engine_kind.lowers(mode) and not getattr(providers, "lowers_precision", False):
        spec, precision = _already_int8(spec, log) if mode == "int8" else (spec, "")
        if not precision:
            spec, precision = _lower(spec, engine_kind, log, defaults)
    # the fp32 file a lowered model's answers are compared through (trim_padding's and the bucket padding's checks)
    fp32 = original if spec.options.engines.precision_mode != "origin" else None
    if lending is not None:
        lending = _lendable(spec, providers, lending, log)

    def build(spec: ModelSpec, fp32: Path | None) -> tuple[Executor, str]:
        if spec.options.static.trim_padding is None:
            return _build(spec, providers, log, fp32, lending)
        from gebackend.runtime.padding_trim import build_trimmed

        return build_trimmed(spec, lambda loosened: _build(loosened, providers, log, fp32, lending), log,
                             reference=original if spec.path != original else None)

    try:
        executor, how = build(spec, fp32)
    except ModelLoadError as exc:
        lowered = spec.path != original and spec.options.engines.precision_mode != "origin"
        if not lowered or not spec.options.engines.precision_min_cosine:
            raise
        # the guard serves fp32 where the lowered model cannot be trusted, and one its engine cannot load is no
        # better (OpenVINO cannot read some files NNCF writes: a QDQ pair on a tensor of unknown rank)
        spec, precision = lowering.fp32(dataclasses.replace(spec, path=original), log,
                                         f"its engine cannot load the lowered model ({exc})", refused_by="its engine")
        executor, how = build(spec, None)
    return executor, f"{precision}{how}"


def _lower(spec: ModelSpec, engine_kind, log: Callable[[str], None],
           defaults: Mapping[str, np.ndarray] | None = None) -> tuple[ModelSpec, str]:
    """The spec pointing at the lowered model (compile/precision_cache.py), or at the original at fp32 where it is
    not lowered, and the precision part of the load line (runtime/lowering.py)."""
    from gebackend.compile.seed_shapes import SeedShapes

    spec = _lowerable(spec, log)
    seeded = (SeedShapes(_file_shapes(spec), "the first bucket's shape") if spec.static
              else lowering.seeded_shapes(spec, defaults))
    return lowering.lower(spec, engine_kind, log, defaults, seeded)


def _lowerable(spec: ModelSpec, log: Callable[[str], None]) -> ModelSpec:
    """The quantizers and the accuracy check run ONNX Runtime on the file, which has no opset-6 Add, Gemm or PRelu: a
    file below opset 7 is lowered from its conversion to opset 7 (compile/upgrade.py, as the engines serve it), or
    from the file as it is when the conversion fails."""
    from gebackend.compile.upgrade import MIN_FOLD_OPSET, upgraded_copy

    mode = spec.options.engines.precision_mode
    try:
        upgraded = upgraded_copy(spec.path, server_temp_parent())
    except ModelLoadError as exc:
        log(f"precision {mode}: {exc}; lowered from the file as it is")
        return spec
    if upgraded is None:
        return spec
    path, old = upgraded
    log(f"precision {mode}: lowered from the file converted from opset {old} to {MIN_FOLD_OPSET} with "
        f"onnx.version_converter (the quantizers and the accuracy check run ONNX Runtime, which has no opset-{old} kernels)")
    return dataclasses.replace(spec, path=path)


def _already_int8(spec: ModelSpec, log: Callable[[str], None]) -> tuple[ModelSpec, str]:
    """precision_mode=int8 on a file quantized already: served as its producer quantized it (quantizing it again fails
    on ONNX Runtime, duplicate node names, and quantizes NNCF's output twice); the spec as it is and "" otherwise."""
    from gebackend.compile.precision import quantized_nodes

    nodes = quantized_nodes(spec.path)
    if not nodes:
        return spec, ""
    log(f"precision int8: the file is quantized already ({nodes} quantization node(s): QuantizeLinear/DequantizeLinear, "
        f"QLinear*, *Integer): served as it is, int8 where its producer quantized it")
    serving = dataclasses.replace(spec, options=spec.options.replace(precision_mode="origin"))
    return serving, "precision int8 (the file's own quantization), "


def _file_shapes(spec: ModelSpec):
    """A compiled shape the model's own file takes (trim_padding may compile lengths shorter than the file fixes)."""
    if spec.options.static.trim_padding is None:
        return spec.static_shapes[0]
    from gebackend.runtime.padding_trim import TrimPlan, full_shapes

    return full_shapes(spec, TrimPlan.of(spec))


def _build(spec: ModelSpec, providers: Sequence, log: Callable[[str], None],
           fp32: Path | None = None, lending=None) -> tuple[Executor, str]:
    output_names = [t.name for t in spec.outputs]
    if not spec.static:
        if spec.static_note:
            log(f"static graph mode: WARNING {spec.static_note}")
        engine = create_engine(spec, providers)
        lost = engine.lost_inputs([t.name for t in spec.inputs])
        if lost:
            engine.close()
            raise ModelLoadError(f"engine={engine.name} lost the model's {lost} reading the file, so it would refuse every "
                                 f"request; serve it with engine=onnxruntime")
        own = DynamicRunner(spec.name, engine, output_names)
        runner = own if lending is None else _lending_runner(spec, providers, own, lending, output_names, log)
        lent = f"; {lending.describe()}" if runner is not own else ""
        graph = "dynamic graph (static graph not used: see the warning above)" if spec.static_note else "dynamic graph"
        return Executor(spec, runner), f"{graph}, {engine.describe()}{lent}"
    try:
        return _static_executor(spec, providers, log, output_names, fp32)
    except Exception as exc:  # noqa: BLE001 - any failure to build the static graph: the dynamic graph serves
        failure = exc
    narrowed = static_fallback.without_failing_buckets(
        spec, lambda one: _static_engine(one, providers, lambda message: None)[0])
    if narrowed is not None:
        kept, failed = narrowed
        log(f"static graph mode: WARNING {static_fallback.describe(failed)} could not be built "
            f"({static_fallback.why(failed[0][1])}), so the requests they would hold run on the dynamic graph beside "
            f"the other buckets (bucket_fallback=dynamic)")
        try:
            return _static_executor(kept, providers, log, output_names, fp32)
        except Exception as exc:  # noqa: BLE001 - the buckets built alone but not together: the dynamic graph serves
            failure = exc
    return _dynamic_instead(spec, providers, log, fp32, failure)


def _dynamic_instead(spec: ModelSpec, providers: Sequence, log: Callable[[str], None], fp32: Path | None,
                     failure: Exception) -> tuple[Executor, str]:
    """The dynamic graph serving a model whose static graph could not be built (a pass, shape inference or the engine
    refused the specialised file), with one warning naming the cause; the static graph's error where the dynamic
    graph cannot be built either."""
    why = static_fallback.why(failure)
    note = f"the static graph could not be built ({why}), so the model is served on the dynamic graph"
    try:
        return _build(dataclasses.replace(spec, static_shapes=(), static_note=note), providers, log, fp32)
    except GeBackendError as exc:
        raise ModelLoadError(f"static graph mode could not build model '{spec.name}': {why}; nor could the dynamic "
                             f"graph: {exc}") from None


def _lendable(spec: ModelSpec, providers: Sequence, lending, log: Callable[[str], None]):
    """`lending` where this engine, provider and graph mode can borrow cores, else None (and the log says why)."""
    from gebackend.runtime.lending import refused, why_not_lent

    why = why_not_lent(spec.options, engine_name(spec.options.engines), as_selection(providers).kind.name, spec.static,
                       control_dir())
    if not why:
        return lending
    log(refused(why))
    return None


def _lending_runner(spec: ModelSpec, providers: Sequence, own: DynamicRunner, lending, output_names,
                    log: Callable[[str], None]):
    """`own` beside a runner whose engine also has threads on the borrowed cores, switched by the model's board;
    `own` alone where the board or that engine cannot be made."""
    from gebackend.runtime.lending import BusyBoard, LendingRunner, lending_options, refused

    try:
        board = BusyBoard(control_dir(), spec.name, lending.index, lending.total)
    except (OSError, ValueError) as exc:
        log(refused(f"the instances' board cannot be made: {exc}"))
        return own
    lent_spec = dataclasses.replace(spec, options=lending_options(spec.options, lending))
    try:
        lent = DynamicRunner(spec.name, create_engine(lent_spec, providers), output_names)
    except GeBackendError as exc:  # the model loads as it would without lending
        board.close()
        log(refused(f"the engine on the borrowed cores did not load: {exc}"))
        return own
    return LendingRunner(own, lent, board)


def _static_executor(spec: ModelSpec, providers: Sequence, log: Callable[[str], None], output_names,
                     fp32: Path | None = None) -> tuple[Executor, str]:
    engine, timable = _static_engine(spec, providers, log)
    static = spec.options.static
    beside = dataclasses.replace(spec, options=engine.companion_options(spec.options))  # the dynamic graph's spec
    fallback = create_engine(beside, providers) if static.bucket_fallback == "dynamic" else None
    costs, dynamic_costs, candidate = None, None, None
    if timable and bucket_costs.worth_measuring(spec):
        if static.bucket_plan == "measured" and as_selection(providers).kind.name == "cpu":
            candidate = fallback if fallback is not None else _dynamic_candidate(beside, providers, log)
        measured = _timed_costs(spec, providers, engine, output_names, candidate, log)
        if measured is not None:
            costs, dynamic_costs = measured
    def router_padding(paddable: Sequence[str]) -> BucketRouter:
        return BucketRouter(spec.static_shapes, spec.batching, {t.name: t.labels for t in spec.inputs},
                            {t.name: t.labels for t in spec.outputs}, paddable, costs, dynamic_costs)

    router = router_padding(static.bucket_paddable_dims)
    if static.bucket_paddable_dims:
        router = _checked_padding(spec, providers, log, output_names, engine, router, router_padding,
                                  fallback if fallback is not None else candidate, fp32)
    if costs is not None:
        log(bucket_costs.describe(spec, costs, dynamic_costs, router.dynamic_rows))
    dynamic = candidate if router.dynamic_rows else None
    if candidate is not None and dynamic is None and candidate is not fallback:
        candidate.close()  # it won no batch size: its memory back
    runner = BucketRunner(spec.name, router, engine, output_names, fallback, dynamic)
    on_dynamic = router.describe_dynamic()
    how = (f"static graph, buckets [{' | '.join(router.describe())}], fallback={static.bucket_fallback}, "
           + (f"batch sizes {on_dynamic} on the dynamic graph, " if on_dynamic else "") + engine.describe())
    return Executor(spec, runner), how


def _dynamic_candidate(spec: ModelSpec, providers: Sequence, log: Callable[[str], None]):
    """The dynamic graph `bucket_plan=measured` times beside the buckets, or None when it cannot be built (an opset-6
    file with a free dim the converter refuses, which the buckets, their dims fixed, serve)."""
    try:
        return create_engine(spec, providers)
    except ModelLoadError as exc:
        log(f"bucket_plan=measured: no dynamic graph to time beside the buckets, they serve every batch size: {exc}")
        return None


def _timed_costs(spec: ModelSpec, providers: Sequence, engine, output_names, candidate, log: Callable[[str], None]):
    """`bucket_costs.measure`'s answer: timed here alone on the server's cores, or what another instance of this
    model timed for the same question when it loaded beside this one (control/shared_costs.py)."""
    from gebackend.control.shared_costs import CostRecord

    record = CostRecord.here(spec.name, _timing_question(spec, providers, output_names, candidate is not None))
    shared, wait = _shared_costs(spec, record), None
    if shared is None:
        with timing_alone() as wait:
            shared = _shared_costs(spec, record)  # timed by another instance while this one waited for its turn
            if shared is None:
                measured = bucket_costs.measure(engine, spec, output_names, candidate)
                if wait.alone:  # a timing beside others' work stays this instance's own
                    record.write(bucket_costs.to_payload(spec, measured))
    waited = f" (waited {wait.seconds:.1f}s for it)" if wait is not None and wait.seconds >= 1.0 else ""
    if shared is not None:
        log(f"bucket costs: {shared[1].describe()}, used as they are{waited}")
        return shared[0]
    if not wait.alone:
        log(f"bucket costs: timed while other instances still load or time (waited {wait.seconds:.0f}s for "
            f"them); the costs may favour splitting batches more than a quiet machine would")
    elif waited:
        log(f"bucket costs: waited {wait.seconds:.1f}s for other instances to finish loading or timing")
    return measured


def _timing_question(spec: ModelSpec, providers: Sequence, output_names, dynamic: bool) -> dict:
    """What a bucket timing depends on, beside the machine: instances asking the same share one timing."""
    from gebackend.cache_dir import fingerprint

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    selection = as_selection(providers)
    return {"file": fingerprint(spec.home), "options": repr(spec.options), "outputs": list(output_names),
            "shapes": [{name: list(dims) for name, dims in shapes.items()} for shapes in spec.static_shapes],
            "providers": [selection.kind.name, repr(tuple(selection))], "cores": cores, "dynamic": dynamic}


def _shared_costs(spec: ModelSpec, record):
    """(costs as `measure` answers, the record) where another instance's record fits this spec, else None."""
    found = record.read()
    if found is None:
        return None
    try:
        return bucket_costs.from_payload(spec, found.payload), found
    except (ValueError, TypeError, AttributeError):
        return None


def _checked_padding(spec: ModelSpec, providers: Sequence, log: Callable[[str], None], output_names, engine, router,
                     rebuild, dynamic, fp32: Path | None) -> BucketRouter:
    """The router padding the paddable dims once runtime/padding_check.py found the answers unmoved by it; the dynamic
    graph it compares with is the instance's own (`dynamic`) or, without one, a session made for the check only."""
    from gebackend.runtime.padding_check import checked_router

    reference = dynamic if dynamic is not None else create_engine(spec, providers)
    try:
        return checked_router(
            spec, router, lambda bucket, feeds: dict(zip(output_names, engine.run_bucket(bucket, feeds, output_names))),
            lambda feeds: dict(zip(output_names, reference.run(feeds, output_names))), rebuild, log, fp32)
    finally:
        if reference is not dynamic:
            reference.close()


def _static_engine(spec: ModelSpec, providers: Sequence, log: Callable[[str], None]):
    """Compile every shape of a static spec through the passes, log the doctor's report, build the engine; also
    whether zeros are a valid input of every compiled graph (none reads a shape from an input's values)."""
    from gebackend.compile.pipeline import compile_static

    graphs, report = compile_static(spec.path, spec.static_shapes, spec.options.static.fold_size_limit, log)
    if spec.options.diagnostics.dump_graph:
        _dump(spec, graphs, log)
    if report is not None:
        for line in report.format_text(brief=True).splitlines():
            log(f"graph doctor: {line}")
    engine = create_static_engine(spec, graphs, providers, temp_parent=server_temp_parent())
    timable = not any(graph.reads_shape_values for graph in graphs)  # zeros are a valid input for every bucket
    del graphs  # the engine keeps files, not models: the weights live once, in the engine
    return_freed_memory()
    return engine, timable


def _dump(spec: ModelSpec, graphs, log: Callable[[str], None]) -> None:
    """dump_graph=1: every compiled graph as ONNX, ready for Netron."""
    import onnx

    folder = Path(spec.options.diagnostics.profiling_dir).resolve() / spec.name / "graphs"
    folder.mkdir(parents=True, exist_ok=True)
    for number, graph in enumerate(graphs, start=1):
        shape = "_".join(f"{n}-{'x'.join(map(str, s))}" for n, s in graph.shapes.items())
        onnx.save(graph.model, str(folder / f"static{number}_{shape}.onnx"))
    log(f"dump_graph: wrote {len(graphs)} compiled graph(s) to {folder}")
