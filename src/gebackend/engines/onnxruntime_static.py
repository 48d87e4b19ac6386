"""The ONNX Runtime engine in static graph mode: one session per compiled shape, weights held once, buffers bound once.

Every compiled shape (bucket) gets its own session over its specialised, folded graph. Weights the
graphs share are handed to every session as the same OrtValue (`SessionOptions.add_initializer`),
so an instance holds them once, not once per bucket; each session is created from the graph's file
(written once to a private folder; on the CPU the shared weights once for all the graphs, in one file they name:
engines/static_weights.py), not from bytes, and the in-memory graph is dropped after the build, so neither the
serialized model nor its weights stay alive per bucket. Input and output buffers are allocated once per
shape and bound once (IOBinding): a run copies the feeds in, runs, and copies the outputs out. The
execution provider (engines/providers/) says how each bucket's session is configured and where its buffers
live: CUDA and TensorRT capture every fully static bucket as a CUDA graph on its buffers in GPU memory, each
bucket's runs carrying its own RunOptions `gpu_graph_id`; TensorRT builds each bucket's engine for exactly its
shapes; CANN switches its graph mode on. A capture ONNX Runtime refuses (a node it cannot place on the device)
is dropped for that bucket, which then runs uncaptured, and the load line says so.

An output whose shape is known only at run time (`compile/runtime_shapes.py`: NonZero, TopK with a tensor
k, a Reshape to request-given values, ...) is not bound to a buffer: it is re-bound before every run, so
ONNX Runtime allocates it at the size this run computes (IOBinding otherwise keeps the first run's value
and fails every later run whose size differs). Such graphs are not captured as CUDA graphs. Should a bound
output still come out at another size than compiled (a shape inference gone wrong), the run is redone
without IOBinding, the request gets that answer, and the output is allocated per run from then on.
Warm-up runs on zeros are best-effort (zeros may be no valid input), and skipped for a graph where an
input's values decide a shape (Resize scales, Col2Im block shape: zeros there can even crash an engine).
A graph with a string input or output (IOBinding takes none) runs through `session.run` on its session.

In a Triton backend stub (one instance per process) the buckets' sessions on the CPU share one intra-op thread
pool, ONNX Runtime's global pool for the process (`shared_thread_pool`, compile/ort_session.py), instead of a pool
each whose spinning threads would take the cores from the bucket running next.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
from onnx import numpy_helper

from gebackend.compile.graph import CompiledGraph
from gebackend.compile.ort_session import open_session, share_thread_pool, shared_thread_pool
from gebackend.config.light import tensor_bytes
from gebackend.config.options import BackendOptions
from gebackend.config.option_groups import OrtSessionOptions
from gebackend.engines.base import (
    EngineInputError,
    EngineRunError,
    ProfiledSession,
    ProfilingSwap,
    monotonic_from_wall_ns,
    StaticEngine,
    bucket_label,
    profiled_node_names,
    warm_up,
)
from gebackend.engines.onnxruntime import (arena_run_config, custom_ops_hint, describe_provider, describe_tuning,
                                           disabled_optimizers, owns_process, session_options)
from gebackend.engines.ort_binding import BoundSession
from gebackend.engines.static_weights import WeightsFile
from gebackend.engines.providers import as_selection, run_options_config
from gebackend.errors import ModelLoadError

SHARE_MIN_BYTES = 1024  # smaller initializers are not worth sharing


@dataclass
class _Prepared:
    """What the engine keeps of a compiled graph once its session is built: never the weights."""

    shapes: Mapping[str, tuple[int, ...]]
    path: Path  # the graph written once; sessions (and profiled twins) are built from it
    dim_overrides: Mapping[str, int]
    shared: dict[str, str]  # initializer name -> key of its held OrtValue
    output_shapes: dict[str, tuple[int, ...] | None]  # None: known only at run time
    node_order: list[str]
    static_nodes: list[str]
    fully_static: bool  # every node's output shape known at compile time: safe to capture as a device graph
    warm_up: bool  # zeros are a safe input: no input's values decide a shape
    index: int = 0  # the bucket's index (its gpu_graph_id when captured)

    @property
    def label(self) -> str:
        return bucket_label(self.shapes)


def _static_shape(value: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    dims = value.type.tensor_type.shape.dim
    shape = tuple(d.dim_value for d in dims)
    return shape if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims) else None


def _thread_pool(session: OrtSessionOptions, buckets: int, cpu: bool, owns_process: bool) -> str:
    """"shared": the buckets' sessions run on the process's one intra-op thread pool; "own": a pool per session.

    Once the process has a shared pool every session runs on it (ONNX Runtime allows nothing else). Otherwise
    `shared_thread_pool=auto` shares one among two or more buckets on the CPU, in a process that is this instance's
    alone (a Triton backend stub), where spinning is left to the engine: the shared pool spins as ONNX Runtime's
    default does, so pinned instances sharing cores, or a user's spinning settings, keep a pool per session."""
    if shared_thread_pool() is not None or session.shared_thread_pool == "on":
        return "shared"
    if session.shared_thread_pool == "off" or not (cpu and owns_process) or buckets < 2:
        return "own"
    return "shared" if session.allow_spinning == "auto" and session.force_spinning_stop == "auto" else "own"


class OrtStaticEngine(StaticEngine):
    name = "onnxruntime-static"

    def __init__(
        self,
        graphs: Sequence[CompiledGraph],
        options: BackendOptions,
        providers: Sequence = ("CPUExecutionProvider",),
        warmup_runs: int = 1,
        temp_parent: Path | None = None,
    ):
        """`temp_parent`: where to make the private folder of graph files (the system temp folder when None)."""
        super().__init__([g.shapes for g in graphs])
        self._pool = _thread_pool(options.session, len(graphs), as_selection(providers).kind.name == "cpu", owns_process())
        if self._pool == "shared":
            # One pool for every bucket, spinning as ONNX Runtime's default does: no bucket's threads spin on while
            # another's run, and none sleeps between runs. Served on a 2-core AMD EPYC (AVX2), one server, 3
            # interleaved rounds, medians against a pool per bucket: bert_small c=1/4/16 860/1556/2051 infer/s
            # against 692/1229/1687, resnet_small 474/523/748 against 348/551/689 (bench scenario ge_static_own_pools)
            share_thread_pool(options.session.intra_op_thread_count)
        elif options.session.allow_spinning == "auto" and len(graphs) > 1:
            # Every session has its own thread pool: a pool that spins on after its run steals the cores from the
            # bucket running next (measured: 3.3 ms alone vs 6.5 ms round-robin on 2 cores), and a pool that never
            # spins wakes its threads for every parallel operator. So the pools spin within a run and stop when it
            # returns (ResNet-50, 2-core EPYC, served c=1: +7 % over spinning off, per-round median of 4; c=4 level).
            # A user's force_spinning_stop=off keeps the pools from spinning at all, as before.
            stop = options.session.force_spinning_stop != "off"
            options = options.replace(allow_spinning="on" if stop else "off",
                                      **({"force_spinning_stop": "on"} if stop else {}))
        self._options = options
        self._selection = as_selection(providers)  # engines/providers/: each bucket's provider options
        self.device = self._selection.device  # where buffers are bound: "cuda" or "cpu"
        self._refused: list[str] = []  # buckets whose graph capture ONNX Runtime refused
        self._unshared: set[int] = set()  # buckets that failed on the shared weights and hold their own
        self._shared: dict[str, tuple[np.ndarray, ort.OrtValue]] = {}
        self._private_bytes = 0
        self._swap: ProfilingSwap[dict[int, BoundSession]] = ProfilingSwap({})  # bucket -> its bound session
        self._workdir = Path(tempfile.mkdtemp(prefix="gebackend-static-", dir=temp_parent))
        # on the CPU the graphs name the shared weights in one file of them (engines/static_weights.py); the device
        # providers (TensorRT builds engines from the graph) keep whole graphs, as measured and tested there
        self._weights = WeightsFile(self._workdir) if self.device == "cpu" else None
        weakref.finalize(self, shutil.rmtree, str(self._workdir), True)  # also when the engine is dropped, not closed
        try:
            self._start(graphs, warmup_runs)
        except BaseException:
            shutil.rmtree(self._workdir, ignore_errors=True)  # a model that fails to build leaves no folder behind
            raise

    def _start(self, graphs: Sequence[CompiledGraph], warmup_runs: int) -> None:
        self._graphs = [self._prepare(number, graph) for number, graph in enumerate(graphs, start=1)]
        self._disabled = disabled_optimizers(self._options.session, static=True, device=self.device)
        self._arena_config, self._arena_text = arena_run_config(self._options.session, self._selection)
        for number, graph in enumerate(self._graphs):
            runs = warmup_runs + (1 if self.device == "cuda" else 0) if graph.warm_up else 0
            bound = self._build(graph)
            if not self._warm_up(bound, runs) and graph.shared:
                # ONNX Runtime can fail a graph over weights handed in with add_initializer that it runs from its
                # own file (seen: a QDQ int8 ViT's QLinearAdd of the position embedding, "Attempting to broadcast
                # an axis by a dimension other than 1"): the bucket then holds its own copy, if that runs
                self._unshared.add(graph.index)
                private = self._build(graph)
                if self._warm_up(private, runs):
                    bound = private
                    self._private_bytes += sum(self._shared[key][0].nbytes for key in set(graph.shared.values()))
                else:
                    self._unshared.discard(graph.index)
            self._swap.serving[number] = bound

    @staticmethod
    def _warm_up(bound: "BoundSession", runs: int) -> bool:
        quiet = run_options_config(bound.run_config) or ort.RunOptions()  # the capture's gpu_graph_id too
        quiet.log_severity_level = 4  # a warm-up failing on zeros is no error worth a log line
        return warm_up(lambda: bound.run({n: v.copy() if isinstance(v, np.ndarray) else v.numpy() for n, v in bound.inputs.items()},
                                         bound.output_order, quiet), runs)

    def _prepare(self, number: int, graph: CompiledGraph) -> _Prepared:
        """Hold the graph's weights (once across graphs), write the graph to a file, keep its metadata."""
        shared: dict[str, str] = {}
        for init in graph.model.graph.initializer:
            if tensor_bytes(init) < SHARE_MIN_BYTES or (graph.source_weights is not None and init.name not in graph.source_weights):
                continue
            array = numpy_helper.to_array(init)
            if array.dtype == object:  # strings: no OrtValue to share
                continue
            key = init.name
            held = self._shared.get(key)
            if held is not None and not (held[0].dtype == array.dtype and held[0].shape == array.shape
                                         and np.array_equal(held[0], array)):
                key = f"{init.name}#{number}"  # same name, other value: this graph's own copy
                self._private_bytes += array.nbytes
                held = None
            if held is None:
                self._shared[key] = (array, ort.OrtValue.ortvalue_from_numpy(array))
            shared[init.name] = key
            if self._weights is not None:
                self._weights.place(key, init, array)
        path = self._workdir / f"static{number}.onnx"
        if self._weights is not None:
            self._weights.write_graph(graph.model, shared, path)  # shared weights once, in weights.bin
        else:
            onnx.save(graph.model, str(path))
        return _Prepared(
            shapes=dict(graph.shapes),
            path=path,
            dim_overrides=dict(graph.dim_overrides),
            shared=shared,
            output_shapes={v.name: None if v.name in graph.runtime_outputs else _static_shape(v)
                           for v in graph.model.graph.output},
            node_order=[n.name for n in graph.model.graph.node],
            static_nodes=list(graph.static_nodes),
            fully_static=graph.fully_static,
            warm_up=not graph.reads_shape_values,
            index=number - 1,
        )

    def _build(self, graph: _Prepared, profile_prefix: Path | None = None) -> BoundSession:
        capture = (self._options.static.enable_cuda_graph and profile_prefix is None and graph.fully_static
                   and self._selection.can_capture)
        try:
            session = self._open(graph, profile_prefix, capture)
        except Exception as exc:
            if not capture:
                hint = custom_ops_hint(str(exc), self._options.session.custom_op_libraries)
                raise ModelLoadError(f"ONNX Runtime cannot build the static graph for {dict(graph.shapes)}: {exc}"
                                     f"{hint}") from None
            try:  # e.g. "all compute graph nodes have not been partitioned to the CUDA EP": run it uncaptured
                session, capture = self._open(graph, profile_prefix, False), False
            except Exception:  # noqa: BLE001 - the captured build's failure says more
                raise ModelLoadError(f"ONNX Runtime cannot build the static graph for {dict(graph.shapes)}: {exc}") from None
            self._refused.append(f"{graph.label}: {str(exc).strip().splitlines()[-1][:200]}")
        self._selection.verify(session.get_providers())
        return BoundSession(session, graph, self.device, self._selection.device_id,
                      {**self._selection.run_config(graph.index, capture), **self._arena_config}, captured=capture)

    def companion_options(self, options: BackendOptions) -> BackendOptions:
        """A dynamic session beside buckets that each have a pool of their own spins as they do: within its run only.
        Left spinning on after its run (ONNX Runtime's default) it took the cores from the bucket running next:
        4-layer CN_CLIP text encoder, 2-core AVX2 EPYC, batches of 2 (a bucket) and 3 (the dynamic graph) in turn,
        40 rows/s against 53 for either alone. On the shared pool (or a pool per bucket with the user's spinning
        settings) the options are the buckets' already."""
        buckets = self._options.session
        return options.replace(allow_spinning=buckets.allow_spinning, force_spinning_stop=buckets.force_spinning_stop)

    def _open(self, graph: _Prepared, profile_prefix: Path | None, capture: bool) -> ort.InferenceSession:
        so = session_options(self._options.session)
        if profile_prefix is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(profile_prefix)
        for name, value in graph.dim_overrides.items():
            so.add_free_dimension_override_by_name(name, int(value))
        for name, key in graph.shared.items() if graph.index not in self._unshared else ():
            so.add_initializer(name, self._shared[key][1])
        return open_session(graph.path, so, self._selection.for_bucket(graph.index, graph.shapes, capture), self._disabled,
                            fallback=not self._selection.accelerated)

    def run_bucket(self, bucket: int, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        with self._swap.lock:
            bound = self._swap.serving[bucket]
            try:
                return bound.run(feeds, output_names)
            except Exception as exc:
                return self._rerun(bound, feeds, output_names, exc)

    @staticmethod
    def _rerun(bound: BoundSession, feeds, output_names, exc: Exception) -> list[np.ndarray]:
        """run_with_iobinding reports every failure as a RuntimeError; a plain run of the same feeds (on the
        error path only) tells the request's fault (INVALID_ARGUMENT, e.g. a token id outside the vocabulary)
        from ours. When the plain run succeeds, the bound buffers were at fault (an output at another size than
        compiled): the request gets the plain run's answer and those outputs are allocated per run from now on."""
        try:
            arrays = bound.run_plain(feeds, output_names)
        except ort_state.InvalidArgument as again:
            raise EngineInputError(str(again)) from None
        except Exception:  # noqa: BLE001 - report the bound run's own failure
            raise EngineRunError(f"{type(exc).__name__}: {exc}") from None
        bound.unbind_mismatched(output_names, arrays)
        return arrays

    def start_profiling(self, prefix: Path) -> None:
        profiled = {i: self._build(g, Path(f"{prefix}-static{i + 1}")) for i, g in enumerate(self._graphs)}
        self._swap.start(profiled)

    def stop_profiling(self) -> list[ProfiledSession]:
        swapped = self._swap.stop()
        if swapped is None:
            return []
        profiled, _ = swapped
        sessions = []
        for number, graph in enumerate(self._graphs):
            session = profiled[number].session
            start = monotonic_from_wall_ns(session.get_profiling_start_time_ns())
            file = Path(session.end_profiling())
            static = graph.static_nodes
            if len(static) == len(graph.node_order):  # every shape fixed at compile time: so are the nodes ORT fused
                static = list(dict.fromkeys(static + profiled_node_names(file)))
            sessions.append(ProfiledSession(file, "static", graph.label, start, node_order=graph.node_order,
                                            static_nodes=static))
        return sessions

    @property
    def shared_weight_bytes(self) -> int:
        return sum(array.nbytes for array, _ in self._shared.values())

    def _describe_sharing(self, buckets: int) -> str:
        """What the load decided about the weights: held once and shared, and whether ORT still prepacks them.

        ONNX Runtime prepacks a shared (user-added) initializer per session like any other constant (measured:
        each bucket's RSS grows by the MatMul weights' size, and disable_prepacking removes that growth and
        slows MatMul down), so sharing costs no prepacking: the packed copies are per bucket, the originals once."""
        prepack = "prepacking off: disable_prepacking=1" if self._options.session.disable_prepacking else "prepacking kept"
        own = (f"; {len(self._unshared)} bucket(s) failed on the shared weights and hold their own copy "
               f"({', '.join(self._graphs[i].label for i in sorted(self._unshared))})" if self._unshared else "")
        shared = f"{buckets - len(self._unshared)} of {buckets}" if self._unshared else f"{buckets}"
        return (f"weights held once and shared across {shared} bucket(s) "
                f"({self.shared_weight_bytes / 2**20:.1f} MiB, {prepack}{own})")

    def describe(self) -> str:
        o = self._options.session
        buckets = list(self._swap.serving.values())
        captured = sum(b.captured for b in buckets)
        capture = "on" if captured == len(buckets) else "off" if not captured else f"{captured} of {len(buckets)} buckets"
        refused = f" (refused: {'; '.join(self._refused)})" if self._refused else ""
        return (
            f"onnxruntime {ort.__version__} static graph: {len(buckets)} compiled shape(s), "
            f"providers={buckets[0].session.get_providers()}, {self._describe_sharing(len(buckets))}, "
            f"IOBinding on {self.device}, {self._selection.kind.capture_label}={capture}{refused}, "
            f"intra_op_threads={o.intra_op_thread_count or 'default'}"
            f"{' on one thread pool shared by the buckets' if self._pool == 'shared' else ''}"
            f"{describe_tuning(o, self._disabled)}"
            f"{describe_provider(self._selection)}"
            f"{' ' + self._arena_text if self._arena_text else ''}"
        )

    def close(self) -> None:
        self._swap.close()
        self._swap.serving.clear()
        self._shared.clear()
        shutil.rmtree(self._workdir, ignore_errors=True)
