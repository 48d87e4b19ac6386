"""The OpenVINO engines' profiles: each profiled compiled model's runs and per-node counters, written as ONNX
Runtime-style Chrome-trace events (`gebackend.profiling.report` reads them unchanged). Moved out of
engines/openvino.py unchanged; see its docstring for how profiling swaps a profiled twin in."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import openvino as ov

if TYPE_CHECKING:
    from gebackend.engines.openvino import _Compiled

PROVIDER = "OpenVINO-CPU"  # the "provider" the profile's node events name


def _node_times(request: ov.InferRequest) -> dict[str, tuple[float, object]]:
    """The request's executed nodes in execution order: name -> (µs, ProfilingInfo)."""
    return {i.node_name: (i.real_time.total_seconds() * 1e6, i) for i in request.profiling_info
            if i.status == ov.ProfilingInfo.Status.EXECUTED}


@dataclass
class _Profile:
    """One profiled compiled model: its runs as they happen, its per-node counters.

    OpenVINO's CPU counters are running averages since compile, in whole µs: there is no per-run reading.
    They are read after the first run (exact: that run's own times, the cold one) and once at the end; every
    later run gets the nodes' average over runs 2..N (within 1 µs). Node events are laid end to end from
    their run's start; `model_run` durations are the measured ones. Per-op totals and averages are right;
    per-run variation after the first run (min/max per op) is not available.
    """

    file: Path
    start_ns: int  # time.monotonic_ns() when profiling started
    compiled: "_Compiled"
    runs: list[tuple[float, float, int]] = field(default_factory=list)  # (ts µs, dur µs, thread id)
    first: dict[str, tuple[float, object]] = field(default_factory=dict)

    def record(self, t0_ns: int, t1_ns: int) -> None:
        """After each run, under the engine's run lock."""
        self.runs.append(((t0_ns - self.start_ns) / 1000, (t1_ns - t0_ns) / 1000, threading.get_native_id()))
        if len(self.runs) == 1:
            self.first = _node_times(self.compiled.request)

    def events(self) -> tuple[list[dict], list[str]]:
        if not self.runs:
            return [], []
        n = len(self.runs)
        last = _node_times(self.compiled.request) if n > 1 else self.first
        later = {name: max((avg * n - self.first.get(name, (0.0,))[0]) / (n - 1), 0.0) if n > 1 else avg
                 for name, (avg, _) in last.items()}
        pid = os.getpid()
        events = []
        for number, (ts, dur, tid) in enumerate(self.runs):
            events.append({"cat": "Session", "pid": pid, "tid": tid, "dur": dur, "ts": ts, "ph": "X",
                           "name": "model_run", "args": {}})
            offset = 0.0
            for name, (_, info) in (self.first if number == 0 else last).items():
                node_us = self.first[name][0] if number == 0 else later[name]
                events.append({
                    "cat": "Node", "pid": pid, "tid": tid, "dur": node_us, "ts": ts + min(offset, dur), "ph": "X",
                    "name": f"{name}_kernel_time",
                    "args": {"op_name": info.node_type, "provider": PROVIDER, "exec_type": info.exec_type,
                             "input_type_shape": [], "output_type_shape": []},
                })
                offset += node_us
        return events, list(dict.fromkeys([*self.first, *last]))

    def write(self) -> tuple[Path, list[str]]:
        """Write the profile; return its path and the executed nodes in execution order."""
        events, nodes = self.events()
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps(events))
        return self.file, nodes


def _profile_file(prefix: Path) -> Path:
    return Path(f"{prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json")
