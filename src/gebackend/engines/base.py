"""The engine interface: something that runs a compiled ONNX graph on numpy feeds.

Also what every engine shares: the run lock and profiling-twin swap (`ProfilingSwap`), best-effort warm-up
(`warm_up`), and for static graph mode the buckets (`StaticEngine`): graph i is the router's bucket i, a run
names its bucket, and the "no static graph was compiled" error is said here once.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

import numpy as np

from gebackend.errors import GeBackendError, InvalidRequest


class EngineInputError(InvalidRequest):
    """The engine refused the inputs themselves (shape, type): the client's fault."""


class EngineRunError(GeBackendError):
    """The engine failed while running: an internal error."""


@dataclass
class ProfiledSession:
    """One engine session's profile: the file the engine wrote and what the report needs to read it."""

    file: Path
    mode: str  # "static" | "dynamic"
    graph: str  # e.g. "dynamic" or "static input_ids:4,32 attention_mask:4,32"
    start_ns: int  # the engine's profiling start, on the time.monotonic_ns() clock
    node_order: list[str] = field(default_factory=list)
    static_nodes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"file": self.file.name, "mode": self.mode, "graph": self.graph, "start_ns": self.start_ns,
                "node_order": self.node_order, "static_nodes": self.static_nodes}


def monotonic_from_wall_ns(wall_ns: int) -> int:
    """Convert a time.time_ns() reading (ONNX Runtime's profiling clock) to the time.monotonic_ns() clock."""
    return wall_ns - time.time_ns() + time.monotonic_ns()


def profiled_node_names(profile_file: Path) -> list[str]:
    """The nodes an ONNX Runtime profile saw run, including those its graph optimizer created."""
    try:
        events = json.loads(profile_file.read_text())
    except (OSError, ValueError):
        return []
    names = [e["name"][: -len("_kernel_time")] for e in events
             if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    return list(dict.fromkeys(names))


def warm_up(run_once: Callable[[], Any], times: int) -> bool:
    """Run a compiled graph `times` times on zeros before it serves. Best effort: zeros are not a valid input for
    every model (Resize scales, a token-id table), so the first failure ends the warm-up, silently; False then."""
    for _ in range(times):
        try:
            run_once()
        except Exception:  # noqa: BLE001
            return False
    return True


Serving = TypeVar("Serving")


class ProfilingSwap(Generic[Serving]):
    """What an engine runs on (a session, a compiled model, or one per bucket) and its profiled twin while profiling.

    Every engine profiles the same way: the twin is built beside the serving one (requests keep running
    meanwhile), then the two are swapped between runs, and swapped back when profiling stops. `lock` is held by
    a run and by a swap, so they never overlap; a run reads `serving` (and `state`, what the engine records
    while profiling) under it.
    """

    def __init__(self, serving: Serving):
        self.lock = threading.Lock()
        self.serving = serving
        self.state: Any = None
        self._plain: Serving | None = None  # the unprofiled one while the twin serves

    def start(self, profiled: Serving, state: Callable[[Serving], Any] | None = None) -> None:
        """Serve `profiled` from the next run on (nothing changes if a twin already serves); `state(profiled)` is made
        at the swap."""
        with self.lock:
            if self._plain is None:
                self._plain, self.serving = self.serving, profiled
                self.state = state(profiled) if state is not None else None

    def stop(self) -> tuple[Serving, Any] | None:
        """Serve the plain one again; the twin and its state, or None when no twin was serving."""
        with self.lock:
            if self._plain is None:
                return None
            profiled, state = self.serving, self.state
            self.serving, self._plain, self.state = self._plain, None, None
        return profiled, state

    def close(self) -> None:
        self._plain = self.state = None


class Engine(ABC):
    """Runs one model. Implementations raise `EngineInputError` or `EngineRunError`, nothing else."""

    name: str = "engine"

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Run once; return the outputs in the order of `output_names`."""

    def describe(self) -> str:
        """One line for the load log: engine, device, main settings."""
        return self.name

    def lost_inputs(self, names: Sequence[str]) -> str:
        """Which of the model file's inputs `names` this engine takes under no name, and what it takes instead; ""
        when it takes them all (always, unless its reader renamed one: the loader refuses such an engine, which would
        refuse every request)."""
        return ""

    def start_profiling(self, prefix: Path) -> None:
        """Profile every run from now on, writing the engine's own profile files under `prefix`."""
        raise NotImplementedError(f"the {self.name} engine cannot profile")

    def stop_profiling(self) -> list[ProfiledSession]:
        """Stop profiling; return what was written."""
        raise NotImplementedError(f"the {self.name} engine cannot profile")

    def close(self) -> None:
        """Release the engine's resources."""


def bucket_label(shapes: Mapping[str, Sequence[int]]) -> str:
    """How a compiled shape is named in logs and profiles: `static input_ids:4,32 attention_mask:4,32`."""
    return "static " + " ".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())


def _shape_key(shapes: Mapping[str, Sequence[int]]) -> tuple:
    return tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items()))


class StaticEngine(Engine):
    """Static graph mode: one compiled graph per bucket, bucket i being the i-th compiled shape.

    The bucket router (`runtime/runners.py: BucketRunner`) has already chosen the bucket and padded the feeds to
    its shapes, so it calls `run_bucket` with that index. `run` (callers without a router: accuracy checks,
    benchmarks) finds the bucket by the feeds' exact shapes and refuses shapes no graph was compiled for.
    """

    def __init__(self, bucket_shapes: Sequence[Mapping[str, Sequence[int]]]):
        self.bucket_shapes = [{n: tuple(int(d) for d in s) for n, s in shapes.items()} for shapes in bucket_shapes]
        self._bucket_index = {_shape_key(shapes): i for i, shapes in enumerate(self.bucket_shapes)}

    def bucket_of(self, feeds: Mapping[str, np.ndarray]) -> int:
        """The bucket compiled for exactly these feeds' shapes; `EngineInputError` when there is none."""
        index = self._bucket_index.get(_shape_key({n: a.shape for n, a in feeds.items()}))
        if index is None:
            sent = {n: list(a.shape) for n, a in feeds.items()}
            compiled = [{n: list(s) for n, s in shapes.items()} for shapes in self.bucket_shapes]
            raise EngineInputError(f"no static graph was compiled for input shapes {sent}; compiled: {compiled}")
        return index

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        return self.run_bucket(self.bucket_of(feeds), feeds, output_names)

    def companion_options(self, options: Any) -> Any:
        """The backend options for a dynamic-graph engine that runs beside the buckets (the fallback, the batch sizes
        measured faster on it) so that it keeps to the buckets' threading; `options` as they are by default."""
        return options

    @abstractmethod
    def run_bucket(self, bucket: int, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Run bucket `bucket`'s graph on feeds of exactly its shapes; the outputs in the order of `output_names`."""
