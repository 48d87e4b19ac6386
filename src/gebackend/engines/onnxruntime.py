"""The ONNX Runtime engine: one InferenceSession per instance, configured from the backend options."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from gebackend.config.options import BackendOptions
from gebackend.engines.base import Engine, EngineInputError, EngineRunError
from gebackend.errors import ModelLoadError

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(options: BackendOptions) -> ort.SessionOptions:
    """Translate our options into ONNX Runtime's, as Triton's onnxruntime_backend names them."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_thread_count
    so.inter_op_num_threads = options.inter_op_thread_count
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if options.execution_mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    so.enable_cpu_mem_arena = options.enable_mem_arena
    so.enable_mem_pattern = options.enable_mem_pattern
    so.graph_optimization_level = _OPT_LEVELS[options.graph_optimization_level]
    so.log_severity_level = 3  # errors only: warnings about unused initializers flood the server log
    return so


class OrtEngine(Engine):
    name = "onnxruntime"

    def __init__(self, path: Path, options: BackendOptions, providers: Sequence[str] = ("CPUExecutionProvider",)):
        self._options = options
        try:
            self._session = ort.InferenceSession(str(path), sess_options=session_options(options), providers=list(providers))
        except Exception as exc:
            raise ModelLoadError(f"ONNX Runtime cannot load {path}: {exc}") from None

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        try:
            return self._session.run(list(output_names), dict(feeds))
        except ort_state.InvalidArgument as exc:
            raise EngineInputError(str(exc)) from None
        except Exception as exc:
            raise EngineRunError(f"{type(exc).__name__}: {exc}") from None

    def describe(self) -> str:
        o = self._options
        return (
            f"onnxruntime {ort.__version__} providers={self._session.get_providers()} "
            f"intra_op_threads={o.intra_op_thread_count or 'default'} inter_op_threads={o.inter_op_thread_count or 'default'} "
            f"execution_mode={o.execution_mode} graph_optimization_level={o.graph_optimization_level}"
        )

    def close(self) -> None:
        self._session = None
