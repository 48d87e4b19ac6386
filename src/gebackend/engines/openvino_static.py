"""The OpenVINO engine in static graph mode (`OvStaticEngine`); what it shares with the dynamic engine is in
engines/openvino.py.

Static graph mode: one compiled model per compiled shape (bucket), reshaped to its input shapes and
warmed up once at load. Each bucket keeps one infer request whose input tensors are allocated once; a
run copies the feeds into them and looks its bucket up by the exact input shapes. Outputs are read from
the request after each run, so one whose shape depends on the data (NonZero) comes at this run's size.
The warm-up on zeros is best-effort, and skipped where an input's values decide a shape (zeros there are
no valid input; OpenVINO's Col2Im even dies of SIGFPE on a zero block shape).

Weights are NOT shared between buckets. The CPU plugin repacks the weights of every compiled model into
buffers of its own, and the model it was compiled from keeps its constants alive. Measured with psutil on
a BERT-type encoder with 51 MiB of weights (RSS after loading the engine, f32):

    buckets                                   1          2          8
    each bucket's graph read on its own    +121 MiB   +227 MiB   +878 MiB   (~2.1x the weights per bucket)
    `source=`: original read once, cloned  +122 MiB   +179 MiB   +525 MiB   (~1.1x the weights per bucket)
    (ONNX Runtime's static engine, same)   +153 MiB   +257 MiB   +898 MiB

By default each bucket's specialised, folded graph (`CompiledGraph.model`) is read. Given the original
ONNX file as `source`, the engine reads it once and reshapes a clone per bucket (OpenVINO does its own
shape inference and folding): the clones share their constants, only the repacked copies are per bucket.
Keep the bucket count small with OpenVINO.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import openvino as ov

from gebackend.compile.bfloat16 import from_ov
from gebackend.config.options import BackendOptions
from gebackend.engines.base import EngineRunError, ProfiledSession, ProfilingSwap, StaticEngine, bucket_label, warm_up
from gebackend.engines.openvino import _Compiled, _describe, _message, _read, resolve_device, resolve_precision
from gebackend.engines.openvino_profile import _Profile, _profile_file
from gebackend.errors import ModelLoadError


class _Bucket:
    """One compiled shape: its compiled model and input tensors allocated once, bound once."""

    def __init__(self, compiled: _Compiled, shapes: Mapping[str, Sequence[int]]):
        self.compiled = compiled
        self.buffers: dict[str, np.ndarray] = {}
        for name in compiled.input_names:
            port = compiled.inputs[name]
            tensor = ov.Tensor(compiled.compiled.inputs[port.index].element_type, list(shapes[name]))
            compiled.request.set_input_tensor(port.index, tensor)
            self.buffers[name] = from_ov(tensor.data, port.dtype)  # a writable view of the tensor's memory
        self.output_names = [p.any_name for p in compiled.compiled.outputs]

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str], profile: _Profile | None):
        for name, buffer in self.buffers.items():
            np.copyto(buffer, feeds[name])
        t0 = time.monotonic_ns()
        self.compiled.request.infer()
        t1 = time.monotonic_ns()
        if profile is not None:
            profile.record(t0, t1)
        return self.compiled.fetch(output_names)


def _reshaped(model: ov.Model, shapes: Mapping[str, Sequence[int]], what: str) -> ov.Model:
    """The model with its inputs fixed to one bucket's shapes (OpenVINO infers and folds the rest when compiling)."""
    names = {n for port in model.inputs for n in port.get_names()}
    missing = [n for n in shapes if n not in names]
    if missing:
        raise ModelLoadError(f"{what}: the graph has no input(s) {missing}")
    try:
        model.reshape({name: ov.PartialShape([int(d) for d in shape]) for name, shape in shapes.items()})
    except Exception as exc:
        raise ModelLoadError(f"OpenVINO cannot reshape {what}: {_message(exc)}") from None
    return model


class OvStaticEngine(StaticEngine):
    """Static graph mode: one compiled model per compiled shape (bucket)."""

    name = "openvino-static"

    def __init__(self, graphs: Sequence, options: BackendOptions, warmup_runs: int = 1, source: Path | None = None):
        """`graphs`: one `CompiledGraph` per bucket. With `source` (the original ONNX file) OpenVINO reads it once
        and reshapes a copy per bucket instead of reading each bucket's graph: the copies share their constants."""
        super().__init__([g.shapes for g in graphs])
        self._options = options
        self.device = resolve_device(options.engines.device, options.engines.device_fallback)
        self.precision = resolve_precision(options.engines.precision_mode, device=self.device)
        self._graphs = list(graphs)
        if not self._graphs:
            raise ModelLoadError("the OpenVINO static engine needs at least one compiled graph")
        self._shared_source = source is not None
        if source is not None:
            base = _read(str(source), str(source))
            self._models = [_reshaped(base.clone(), g.shapes, f"{source} for {dict(g.shapes)}") for g in self._graphs]
        else:
            self._models = [_reshaped(_read(g.model.SerializeToString(), f"the static graph for {dict(g.shapes)}"),
                                      g.shapes, f"the static graph for {dict(g.shapes)}") for g in self._graphs]
        # one bucket per compiled shape; state: their _Profile by key while profiling
        self._swap: ProfilingSwap[dict[int, _Bucket]] = ProfilingSwap(self._build())
        for number, graph in enumerate(self._graphs):
            bucket = self._swap.serving[number]
            # zeros where an input's values decide a shape may be no input at all (Col2Im: SIGFPE on a zero block)
            warm_up(lambda: bucket.run({n: np.zeros_like(b) for n, b in bucket.buffers.items()}, bucket.output_names, None),
                    0 if graph.reads_shape_values else warmup_runs)

    def _build(self, profile: bool = False) -> dict[int, _Bucket]:
        return {
            number: _Bucket(_Compiled(m, self._options, self.precision, f"the static graph for {dict(g.shapes)}",
                                              profile, known_inputs=list(g.shapes), device=self.device), g.shapes)
            for number, (g, m) in enumerate(zip(self._graphs, self._models))
        }

    def run_bucket(self, number: int, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        with self._swap.lock:
            bucket = self._swap.serving[number]
            bucket.compiled.check(feeds, output_names)
            try:
                return bucket.run(feeds, output_names, self._swap.state[number] if self._swap.state else None)
            except Exception as exc:
                raise EngineRunError(f"{type(exc).__name__}: {_message(exc)}") from None

    def start_profiling(self, prefix: Path) -> None:
        def profiles(profiled: dict[int, _Bucket]) -> dict[int, _Profile]:
            start = time.monotonic_ns()
            return {i: _Profile(_profile_file(Path(f"{prefix}-static{i + 1}")), start, profiled[i].compiled)
                    for i in range(len(self._graphs))}

        self._swap.start(self._build(profile=True), profiles)

    def stop_profiling(self) -> list[ProfiledSession]:
        swapped = self._swap.stop()
        if swapped is None:
            return []
        _, profiles = swapped
        sessions = []
        for number, graph in enumerate(self._graphs):
            file, nodes = profiles[number].write()
            # every shape is fixed at compile time: so is every node
            sessions.append(ProfiledSession(file, "static", bucket_label(graph.shapes), profiles[number].start_ns,
                                            node_order=nodes, static_nodes=nodes))
        return sessions

    def describe(self) -> str:
        first = next(iter(self._swap.serving.values())).compiled
        held = "constants shared, repacked weights per shape" if self._shared_source else "weights held per shape"
        return _describe(first, self.precision, f" static graph, {len(self._swap.serving)} compiled shape(s), {held}",
                         self.device)

    def close(self) -> None:
        self._swap.close()
        self._swap.serving.clear()
        self._models = []


