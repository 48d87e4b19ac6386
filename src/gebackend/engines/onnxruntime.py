"""The ONNX Runtime engine: one InferenceSession per instance, configured from the backend options; its `KIND` for
the registry (the static engine lives in `onnxruntime_static.py`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from gebackend.compile import bfloat16
from gebackend.compile.ort_session import on_the_pool, open_session
from gebackend.config import arena_shrinkage
from gebackend.config.option_groups import BackendOptions, OrtSessionOptions
from gebackend.cpu import PrecisionRun, int8_note
from gebackend.engines.base import (
    Engine,
    EngineInputError,
    EngineRunError,
    ProfiledSession,
    ProfilingSwap,
    monotonic_from_wall_ns,
)
from gebackend.engines.providers import Selection, as_selection, run_options_config
from gebackend.engines.registry import EngineKind
from gebackend.errors import ModelLoadError

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

#: Triton's onnxruntime backend's `parameters` key (since 2025), handed to every session as this config entry
DEVICE_ALLOCATOR_KEY = "session.use_device_allocator_for_initializers"

#: Graph optimizers switched off by default in static graph mode on the CPU. With every dim fixed, ORT fuses
#: Add + LayerNormalization into SkipLayerNormalization, whose CPU kernel is slower than the pair it replaces:
#: 4.5x on [8, 32, 256] (0.326 vs 0.072 ms), 4.8x on [1, 52, 768] (ORT 1.32, this Xeon; bench/ort_tuning.py
#: --what sln-kernel), about 2 ms (~7%) of a batch-8 run of the BERT-type encoder (hidden 256, 4 layers, seq 32),
#: matching the 3-9% issue 4 measured on whole text encoders. Dynamic graphs keep symbolic dims, where ORT does
#: not apply that fusion, so they need no default. `disabled_optimizers=none` keeps every fusion; an explicit
#: list replaces the default.
STATIC_CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def disabled_optimizers(options: OrtSessionOptions, static: bool, device: str = "cpu") -> list[str]:
    """The ORT graph optimizers a session switches off: the user's list, else the default for the graph mode."""
    if options.disabled_optimizers is not None:
        return list(options.disabled_optimizers)
    return list(STATIC_CPU_DISABLED_OPTIMIZERS) if static and device == "cpu" else []


def owns_process() -> bool:
    """Whether this process is a Triton backend stub, which Triton starts for one model instance alone: there a
    setting for the whole process (the shared thread pool) is the instance's to make. Elsewhere (tests, the bench's
    in-process runs, a library user) `shared_thread_pool=auto` leaves every session its own pool."""
    return "triton_python_backend_utils" in sys.modules


def session_options(options: OrtSessionOptions) -> ort.SessionOptions:
    """Translate our options into ONNX Runtime's, as Triton's onnxruntime_backend names them."""
    so = on_the_pool(ort.SessionOptions())
    so.intra_op_num_threads = options.intra_op_thread_count
    so.inter_op_num_threads = options.inter_op_thread_count
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if options.execution_mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    so.enable_cpu_mem_arena = options.enable_mem_arena
    so.enable_mem_pattern = options.enable_mem_pattern
    so.graph_optimization_level = _OPT_LEVELS[options.graph_optimization_level]
    so.log_severity_level = 3  # errors only: warnings about unused initializers flood the server log
    if options.disable_prepacking:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if options.allow_spinning != "auto":  # pinned instances sharing cores turn it off (runtime/pinning.py)
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.allow_spinning == "on" else "0")
    if options.force_spinning_stop == "on":
        so.add_session_config_entry("session.force_spinning_stop", "1")
    if options.intra_op_thread_affinities:
        so.add_session_config_entry("session.intra_op_thread_affinities", options.intra_op_thread_affinities)
    if options.device_allocator_for_initializers:
        so.add_session_config_entry(DEVICE_ALLOCATOR_KEY, options.device_allocator_for_initializers)
    register_custom_ops(so, options.custom_op_libraries)
    return so


def custom_ops_hint(message: str, libraries: Sequence[str]) -> str:
    """What to add to ONNX Runtime's load failure over an operator it does not know (`… is not a registered
    function/op`): where its library goes, or that the libraries given do not hold it."""
    if "is not a registered function/op" not in message:
        return ""
    if libraries:
        return f"; the custom operator libraries given ({', '.join(libraries)}) do not hold it"
    return ("; if it is a custom operator, name its library in config.pbtxt: "
            'model_operations { op_library_filename: "/path/to/lib.so" }')


def register_custom_ops(so: ort.SessionOptions, libraries: Sequence[str]) -> ort.SessionOptions:
    """Register config.pbtxt's `model_operations { op_library_filename }` libraries with these session options, as
    Triton's onnxruntime backend does; `ModelLoadError` naming the library that does not load."""
    for library in libraries:
        try:
            so.register_custom_ops_library(library)
        except Exception as exc:  # onnxruntime raises Fail / RuntimeError for a file it cannot load
            raise ModelLoadError(f"cannot load the custom operator library {library} (model_operations "
                                 f"op_library_filename): {str(exc).strip().splitlines()[-1]}") from None
    return so


def arena_run_config(options: OrtSessionOptions, selection: Selection) -> tuple[dict[str, str], str]:
    """The RunOptions entries of `memory.enable_memory_arena_shrinkage` this session has arenas for, and the load
    line's words on them (config/arena_shrinkage.py)."""
    gpu = selection.device_id if selection.device == "cuda" else None
    return arena_shrinkage.run_entries(options.arena_shrinkage, options.enable_mem_arena, gpu)


def describe_provider(selection: Selection) -> str:
    """The provider part of an engine's load line: nothing for the plain CPU, else which provider and why."""
    return "" if selection.kind.name == "cpu" and not selection.note else f" {selection.describe()}"


def describe_tuning(options: OrtSessionOptions, disabled: Sequence[str]) -> str:
    """The tuning part of an engine's load line: spinning, disabled optimizers and where they come from."""
    text = f" allow_spinning={options.allow_spinning}" if options.allow_spinning != "auto" else ""
    text += f" force_spinning_stop={options.force_spinning_stop}" if options.force_spinning_stop != "auto" else ""
    text += f" intra_op_thread_affinities={options.intra_op_thread_affinities}" if options.intra_op_thread_affinities else ""
    if options.device_allocator_for_initializers:
        text += f" {DEVICE_ALLOCATOR_KEY}={options.device_allocator_for_initializers}"
    if disabled:
        origin = "default; disabled_optimizers=none keeps them" if options.disabled_optimizers is None else "disabled_optimizers"
        text += f" disabled_optimizers={','.join(disabled)} ({origin})"
    return text


class OrtEngine(Engine):
    name = "onnxruntime"

    def __init__(self, path: Path, options: BackendOptions, providers: Sequence = ("CPUExecutionProvider",)):
        self._options = options
        self._path = path
        self._selection = as_selection(providers)  # engines/providers/: the entries, and the provider they are
        self._disabled = disabled_optimizers(options.session, static=False)
        run_config, self._arena_text = arena_run_config(options.session, self._selection)
        self.run_options = run_options_config(run_config)  # None unless memory.enable_memory_arena_shrinkage is set
        self._upgraded_from: int | None = None  # the file's opset, when it runs converted (`_open`)
        self._shared: tuple[Path, Path, str] | None = None  # (our file, the file sessions load, the load line's words)
        self._swap = ProfilingSwap(self._open())
        self._values = bfloat16.needs_values(self._swap.serving)  # bfloat16 tensors: runs with OrtValues

    def _open(self) -> ort.InferenceSession:
        """The serving session. A file ONNX Runtime cannot load whose opset is below 7 (ONNX Runtime has no kernels
        for opset 6's Add, Gemm, BatchNormalization, ...) is converted to opset 7, as the static graph's upgrade pass
        does (compile/upgrade.py), and served from that copy."""
        try:
            return self._new_session()
        except ModelLoadError as refused:
            from gebackend.compile.upgrade import MIN_FOLD_OPSET, upgraded_copy
            from gebackend.control.env import server_temp_parent

            try:
                upgraded = upgraded_copy(self._path, server_temp_parent())
            except ModelLoadError as exc:  # the converter's adapters need fixed dims (Add, Sum: "is a param")
                raise ModelLoadError(f"{refused}; {exc}; static_model=1 converts each compiled shape, its dims "
                                     f"fixed") from None
            if upgraded is None:
                raise
            self._path, self._upgraded_from = upgraded
            try:
                return self._new_session()
            except ModelLoadError as exc:
                raise ModelLoadError(f"{refused}; converted from opset {self._upgraded_from} to {MIN_FOLD_OPSET}, "
                                     f"it still fails: {exc}") from None

    def _new_session(self, profile_prefix: Path | None = None) -> ort.InferenceSession:
        so = session_options(self._options.session)
        if profile_prefix is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(profile_prefix)
        try:
            session = open_session(self._source(), so, self._selection, self._disabled,
                                   fallback=not self._selection.accelerated)
        except Exception as exc:
            hint = custom_ops_hint(str(exc), self._options.session.custom_op_libraries)
            raise ModelLoadError(f"ONNX Runtime cannot load {self._path}: {exc}{hint}") from None
        self._selection.verify(session.get_providers())
        return session

    def _source(self) -> Path:
        """The file sessions load: ours, or the one file of prepacked weights every instance maps
        (`share_weights`, engines/ort_shared_weights.py), made once for each file we serve."""
        if self._shared is None or self._shared[0] != self._path:
            from gebackend.engines.ort_shared_weights import shared_file

            def writer_options() -> ort.SessionOptions:
                so = session_options(self._options.session)
                so.log_severity_level = 3  # ONNX Runtime warns that the file it writes is for this CPU: it is
                return so

            cpu_only = self._selection.kind.name == "cpu" and not self._selection.accelerated
            source, text = shared_file(self._path, self._options.session, cpu_only, writer_options,
                                       tuple(self._disabled))
            self._shared = (self._path, source, text)
        return self._shared[1]

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        try:
            with self._swap.lock:
                if self._values:
                    return bfloat16.run_with_values(self._swap.serving, output_names, feeds, self.run_options)
                return self._swap.serving.run(list(output_names), dict(feeds), self.run_options)
        except ort_state.InvalidArgument as exc:
            raise EngineInputError(str(exc)) from None
        except Exception as exc:
            raise EngineRunError(f"{type(exc).__name__}: {exc}") from None

    def start_profiling(self, prefix: Path) -> None:
        self._swap.start(self._new_session(prefix))

    def stop_profiling(self) -> list[ProfiledSession]:
        swapped = self._swap.stop()
        if swapped is None:
            return []
        profiled, _ = swapped
        start = monotonic_from_wall_ns(profiled.get_profiling_start_time_ns())
        return [ProfiledSession(Path(profiled.end_profiling()), "dynamic", "dynamic", start)]

    def describe(self) -> str:
        o = self._options.session
        return (
            f"onnxruntime {ort.__version__} providers={self._swap.serving.get_providers()} "
            f"intra_op_threads={o.intra_op_thread_count or 'default'} inter_op_threads={o.inter_op_thread_count or 'default'} "
            f"execution_mode={o.execution_mode} graph_optimization_level={o.graph_optimization_level}"
            f"{describe_tuning(o, self._disabled)}{describe_provider(self._selection)}"
            f"{' ' + self._arena_text if self._arena_text else ''}"
            f"{self._upgrade_text()}"
            f"{self._shared[2] if self._shared is not None else ''}"
        )

    def _upgrade_text(self) -> str:
        if self._upgraded_from is None:
            return ""
        from gebackend.compile.upgrade import MIN_FOLD_OPSET

        return (f" opset {self._upgraded_from} converted to {MIN_FOLD_OPSET} with onnx.version_converter (ONNX Runtime "
                f"{ort.__version__} cannot load the file's opset)")

    def close(self) -> None:
        self._swap.close()
        self._swap.serving = None


def _static_engine(graphs, options: BackendOptions, providers: Sequence, source: Path, temp_parent: Path | None) -> Engine:
    from gebackend.engines.onnxruntime_static import OrtStaticEngine

    return OrtStaticEngine(graphs, options, providers, temp_parent=temp_parent)


def precision_run(mode: str) -> PrecisionRun:
    """ONNX Runtime runs what the lowered file says (compile/precision.py; bf16 is refused there)."""
    ran = {"origin": "f32", "fp16": "f16", "bf16": "bf16", "int8": "int8"}.get(mode, mode)
    return PrecisionRun(mode, ran, int8_note(mode))


KIND = EngineKind("onnxruntime", dynamic=OrtEngine, static=_static_engine, lowers_in_engine=frozenset(),
                  precision_run=precision_run, onnxruntime_providers=True)
