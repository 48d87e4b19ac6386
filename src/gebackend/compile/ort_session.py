"""ONNX Runtime sessions for gebackend's own graph evaluation (constant evaluation, the doctor, dumps, accuracy
checks, the sizes the seed shapes probe) and the one place any ONNX Runtime session is made, the engines' included
(`open_session`): the options of gebackend's own runs (`internal_options`), and this process's one shared intra-op
thread pool (`share_thread_pool`), on which every session made after it exists runs (`on_the_pool`; the static
engine decides when to make it: engines/onnxruntime_static.py)."""

from __future__ import annotations

from typing import Mapping, Sequence

import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

#: The intra-op threads of this process's shared thread pool (ONNX Runtime's global pool), once it is made; None:
#: every session has a pool of its own. Once it exists, ONNX Runtime refuses any session in the process that asks
#: for a pool of its own, so every session made on options from here runs on it (`internal_options`, and through
#: `on_the_pool` the engines' `session_options`, engines/onnxruntime.py).
_shared_pool_threads: int | None = None


def share_thread_pool(threads: int) -> int:
    """Make every session of this process run on one intra-op thread pool of `threads` threads (0: ONNX Runtime's
    default, one per core). Once per process: a second call keeps the pool the first made; returns its size."""
    global _shared_pool_threads
    if _shared_pool_threads is None:
        ort_state.set_global_thread_pool_sizes(int(threads), 1)
        _shared_pool_threads = int(threads)
    return _shared_pool_threads


def shared_thread_pool() -> int | None:
    """The size of this process's shared thread pool (0: ONNX Runtime's default), or None when there is none."""
    return _shared_pool_threads


def on_the_pool(so: ort.SessionOptions) -> ort.SessionOptions:
    """`so` set to run on the shared thread pool, once the process has one (`share_thread_pool`)."""
    if _shared_pool_threads is not None:
        so.use_per_session_threads = False
    return so


def open_session(source, so: ort.SessionOptions | None = None, providers: Sequence = ("CPUExecutionProvider",),
                 disabled: Sequence[str] = (), fallback: bool = True) -> ort.InferenceSession:
    """The one place an ONNX Runtime session is made: `source` is a path, serialized bytes or a ModelProto.

    `fallback=False` switches ONNX Runtime's Python fallback off: a session whose accelerator fails to start (or
    refuses a graph capture) raises instead of being made on the CPU unasked; the engines serving on an accelerator
    pass it (`device_fallback=cpu` is the user's way to ask for the CPU; engines/providers/)."""
    if isinstance(source, onnx.ModelProto):
        source = source.SerializeToString()
    elif not isinstance(source, bytes):
        source = str(source)
    return ort.InferenceSession(source, sess_options=so if so is not None else internal_options(),
                                providers=list(providers), disabled_optimizers=list(disabled),
                                **({} if fallback else {"enable_fallback": 0}))


def internal_options(optimize: bool = True, threads: int | None = None, spinning: bool | None = None,
                     config: Mapping[str, str] | None = None) -> ort.SessionOptions:
    """Session options for gebackend's own runs (constant evaluation, the doctor, dumps, accuracy checks): errors
    only in the log; `optimize=False` runs the graph as written; `threads`/`spinning` when the caller decides them."""
    so = on_the_pool(ort.SessionOptions())
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads is not None:
        so.intra_op_num_threads = threads
    if spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    for key, value in (config or {}).items():
        so.add_session_config_entry(key, value)
    return so
