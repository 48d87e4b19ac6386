"""Reading a profiling capture folder and writing ``op_summary.csv``, ``trace.json`` and ``summary.txt``.

A capture folder (written while serving) holds one folder per Triton model instance::

    <capture>/instances/<instance>/<ORT profile>.json   ONNX Runtime's own profiling output, one per session
    <capture>/instances/<instance>/sessions.json        [{"file", "mode", "graph", "static_nodes", "node_order", "start_ns"}]
    <capture>/instances/<instance>/requests.json        [{"start_ns", "end_ns", "requests", "rows", "errors"}]

This module owns that contract: parsing it (`load_capture`), the per-op table (`op_rows`) and the Chrome
trace (`trace_events`); `render.py` writes them, and the text summary, next to the capture.

Clocks: ``InferenceSession.get_profiling_start_time_ns()`` is on the wall clock (``time.time_ns()``,
C++ ``system_clock``), not on ``time.monotonic_ns()``. Every timestamp is read on the sessions' clock;
request boundaries recorded on the other clock are converted (see `align_requests`), and
``summary.txt`` says how.
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gebackend.errors import GeBackendError

KERNEL_SUFFIX = "_kernel_time"
RUN_EVENT = "model_run"
#: Nanosecond timestamps at or above this are wall-clock (after 2001-09-09); a monotonic clock would need 31 years of uptime.
WALL_CLOCK_MIN_NS = 10**18
#: ORT event args left out of trace.json: large, per-event, and not shown usefully by Perfetto.
DROPPED_ARGS = frozenset({"thread_scheduling_stats"})
#: The thread id request boundaries are drawn on in each instance's process (OS thread ids are never 0).
REQUESTS_TID = 0
TOP_OPS = 15
CSV_COLUMNS = ("name", "op_type", "provider", "mode", "graph", "calls", "total_us", "avg_us", "min_us", "max_us",
               "share_pct", "input_shapes", "output_shapes")
#: ORT's element type names -> numpy's.
_DTYPE_NAMES = {"float": "float32", "double": "float64"}


@dataclass(frozen=True)
class Session:
    """One ONNX Runtime session's profile and what the capture side recorded about its graph."""

    instance: str
    file: Path
    mode: str  # "static" | "dynamic"
    graph: str
    static_nodes: frozenset[str]
    node_order: tuple[str, ...]
    start_ns: int  # profiling start; ORT event "ts" values are µs after it
    events: tuple[dict, ...]

    def abs_us(self, ts: float) -> float:
        """An event's ``ts`` on the capture's shared µs timeline."""
        return self.start_ns / 1000 + ts

    def is_static(self, node: str) -> bool:
        return self.mode == "static" and node in self.static_nodes


@dataclass(frozen=True)
class Run:
    """One ``model_run`` of a session and the kernel events that ran inside it."""

    session: Session
    start_us: float  # absolute, on the shared timeline
    dur_us: float
    kernels: tuple[dict, ...] = ()

    @property
    def kernel_us(self) -> float:
        return float(sum(e["dur"] for e in self.kernels))

    @property
    def host_us(self) -> float:
        """Time inside ``model_run`` that no kernel accounts for (the "bubbles")."""
        return self.dur_us - self.kernel_us


@dataclass(frozen=True)
class Request:
    """One ``execute()`` call of an instance, on the sessions' clock."""

    instance: str
    start_ns: int
    end_ns: int
    requests: int
    rows: int
    errors: int

    @property
    def label(self) -> str:
        text = f"execute: {_plural(self.requests, 'request')}, {_plural(self.rows, 'row')}"
        return text + (f", {_plural(self.errors, 'error')}" if self.errors else "")


@dataclass(frozen=True)
class Capture:
    """A parsed capture folder."""

    path: Path
    instances: tuple[str, ...]
    sessions: tuple[Session, ...]
    requests: tuple[Request, ...]
    clock_note: str  # how request boundaries were put on the sessions' clock

    def runs(self) -> list[Run]:
        """Every ``model_run`` of every session, in time order."""
        return sorted((r for s in self.sessions for r in session_runs(s)), key=lambda r: r.start_us)

    @property
    def title(self) -> str:
        """``<model> (<timestamp>)`` from ``profiling/<model>/<timestamp>/``."""
        path = self.path.resolve()
        return f"{path.parent.name} ({path.name})"

    def graphs(self) -> list[str]:
        """Graph labels in first-seen order."""
        return list(dict.fromkeys(s.graph for s in self.sessions))


@dataclass
class OpRow:
    """One row of ``op_summary.csv``: a node of one graph, aggregated over runs and instances."""

    name: str
    graph: str
    static: bool
    calls: int = 0
    total_us: float = 0.0
    min_us: float = float("inf")
    max_us: float = 0.0
    share_pct: float = 0.0
    op_types: dict[str, None] = field(default_factory=dict)  # ordered sets
    providers: dict[str, None] = field(default_factory=dict)
    inputs: dict[str, None] = field(default_factory=dict)
    outputs: dict[str, None] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "static" if self.static else "dynamic"

    @property
    def op_type(self) -> str:
        return " | ".join(self.op_types)

    @property
    def avg_us(self) -> float:
        return self.total_us / self.calls if self.calls else 0.0

    def add(self, event: dict) -> None:
        dur = float(event["dur"])
        args = event.get("args") or {}
        self.calls += 1
        self.total_us += dur
        self.min_us = min(self.min_us, dur)
        self.max_us = max(self.max_us, dur)
        self.op_types[str(args.get("op_name", ""))] = None
        self.providers[str(args.get("provider", ""))] = None
        self.inputs[format_shapes(args.get("input_type_shape"))] = None
        self.outputs[format_shapes(args.get("output_type_shape"))] = None

    def csv_record(self) -> dict[str, Any]:
        return {
            "name": self.name, "op_type": self.op_type, "provider": " | ".join(self.providers), "mode": self.mode,
            "graph": self.graph, "calls": self.calls, "total_us": round(self.total_us, 3),
            "avg_us": round(self.avg_us, 3), "min_us": round(self.min_us, 3), "max_us": round(self.max_us, 3),
            "share_pct": round(self.share_pct, 3), "input_shapes": " | ".join(self.inputs),
            "output_shapes": " | ".join(self.outputs),
        }


# ---------------------------------------------------------------- loading


def load_capture(capture: str | Path) -> Capture:
    """Parse a capture folder; raise `GeBackendError` if it has no instances or no ORT profile files."""
    path = Path(capture)
    instance_dirs = _instance_dirs(path)
    sessions = tuple(s for d in instance_dirs for s in _load_sessions(d))
    if not sessions:
        raise GeBackendError(f"{path}: no ONNX Runtime profile files (instances/*/sessions.json lists none); "
                             "was profiling on while requests ran?")
    raw = {d.name: _read_list(d / "requests.json", required=False) for d in instance_dirs}
    requests, note = align_requests(raw, sessions)
    return Capture(path, tuple(d.name for d in instance_dirs), sessions, tuple(requests), note)


def _instance_dirs(path: Path) -> list[Path]:
    root = path / "instances"
    dirs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not dirs:
        raise GeBackendError(f"{path}: not a profiling capture (no instances/<instance>/ folders)")
    return dirs


def _read_list(path: Path, required: bool = True) -> list:
    if not path.is_file():
        if required:
            raise GeBackendError(f"{path}: missing")
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GeBackendError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, list):
        raise GeBackendError(f"{path}: expected a JSON list, got {type(data).__name__}")
    return data


def _load_sessions(instance_dir: Path) -> list[Session]:
    entries = _read_list(instance_dir / "sessions.json", required=False)
    return [_load_session(instance_dir, entry) for entry in entries]


def _load_session(instance_dir: Path, entry: dict) -> Session:
    where = f"{instance_dir / 'sessions.json'}"
    try:
        file = instance_dir / entry["file"]
        return Session(
            instance=instance_dir.name, file=file, mode=str(entry.get("mode", "dynamic")),
            graph=str(entry.get("graph", entry["file"])), static_nodes=frozenset(entry.get("static_nodes") or ()),
            node_order=tuple(entry.get("node_order") or ()), start_ns=int(entry["start_ns"]),
            events=tuple(e for e in _read_list(file) if isinstance(e, dict)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GeBackendError(f"{where}: bad entry {entry!r} ({exc!r})") from exc


# ---------------------------------------------------------------- clocks


def is_wall_clock(ns: int) -> bool:
    """Whether a nanosecond timestamp is from ``time.time_ns()`` rather than ``time.monotonic_ns()``."""
    return ns >= WALL_CLOCK_MIN_NS


def align_requests(raw: dict[str, list[dict]], sessions: Iterable[Session]) -> tuple[list[Request], str]:
    """Turn requests.json entries into `Request` objects on the sessions' clock, and say how.

    Same clock: kept as is. Different clocks: converted with this host's current ``time.time_ns() -
    time.monotonic_ns()`` (exact when rendered on the capture host before a reboot); if that puts the
    requests outside the profiled span, the first request is aligned with the first run (approximate).
    """
    sessions = list(sessions)
    entries = [(inst, e) for inst, es in raw.items() for e in es if isinstance(e, dict)]
    if not entries:
        return [], "no request boundaries recorded"
    if is_wall_clock(sessions[0].start_ns) == is_wall_clock(int(entries[0][1]["start_ns"])):
        return _requests(entries, 0), "request boundaries and ORT profiles share one clock"
    offset = time.time_ns() - time.monotonic_ns()
    offset = offset if is_wall_clock(sessions[0].start_ns) else -offset
    requests = _requests(entries, offset)
    if _overlaps(requests, sessions):
        return requests, ("request boundaries converted between time.monotonic_ns() and time.time_ns() "
                          "with this host's current offset")
    anchor = _first_run_ns(sessions) - min(r.start_ns for r in _requests(entries, 0))
    return _requests(entries, anchor), ("APPROXIMATE: request boundaries and ORT profiles use different clocks; "
                                        "the first request was aligned with the first run")


def _requests(entries: list[tuple[str, dict]], offset_ns: int) -> list[Request]:
    try:
        return [Request(inst, int(e["start_ns"]) + offset_ns, int(e["end_ns"]) + offset_ns, int(e.get("requests", 0)),
                        int(e.get("rows", 0)), int(e.get("errors", 0))) for inst, e in entries]
    except (KeyError, TypeError, ValueError) as exc:
        raise GeBackendError(f"requests.json: bad entry ({exc!r})") from exc


def _session_span_ns(session: Session) -> tuple[int, int]:
    timed = [e for e in session.events if "ts" in e]
    end_us = max((e["ts"] + e.get("dur", 0) for e in timed), default=0)
    return session.start_ns, session.start_ns + int(end_us * 1000)


def _overlaps(requests: list[Request], sessions: list[Session]) -> bool:
    spans = [_session_span_ns(s) for s in sessions]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    return any(r.start_ns <= hi and r.end_ns >= lo for r in requests)


def _first_run_ns(sessions: list[Session]) -> int:
    starts = [s.start_ns + int(e["ts"] * 1000) for s in sessions for e in s.events if _is_run(e)]
    return min(starts, default=min(s.start_ns for s in sessions))


# ---------------------------------------------------------------- events, runs and op rows


def _is_run(event: dict) -> bool:
    return event.get("cat") == "Session" and event.get("name") == RUN_EVENT and "ts" in event and "dur" in event


def is_kernel(event: dict) -> bool:
    """A node's kernel-time event (not its fences)."""
    name = event.get("name")
    return (event.get("cat") == "Node" and isinstance(name, str) and name.endswith(KERNEL_SUFFIX)
            and "ts" in event and "dur" in event)


def node_name(event: dict) -> str:
    return event["name"][: -len(KERNEL_SUFFIX)]


def session_runs(session: Session) -> list[Run]:
    """The session's ``model_run`` events, each with the kernel events whose start lies inside it."""
    runs = sorted((e for e in session.events if _is_run(e)), key=lambda e: e["ts"])
    starts = [e["ts"] for e in runs]
    kernels: list[list[dict]] = [[] for _ in runs]
    for event in (e for e in session.events if is_kernel(e)):
        i = bisect.bisect_right(starts, event["ts"]) - 1
        if i >= 0 and event["ts"] <= runs[i]["ts"] + runs[i]["dur"]:
            kernels[i].append(event)
    return [Run(session, session.abs_us(e["ts"]), float(e["dur"]), tuple(k)) for e, k in zip(runs, kernels)]


def format_shapes(value: Any) -> str:
    """ORT's ``[{"float": [1, 16, 64]}, {"int64": []}]`` -> ``"float32[1,16,64], int64[]"``."""
    parts = []
    for item in value if isinstance(value, list) else []:
        for dtype, dims in (item.items() if isinstance(item, dict) else ()):
            parts.append(f"{_DTYPE_NAMES.get(dtype, dtype)}[{','.join(str(d) for d in dims)}]")
    return ", ".join(parts)


def run_time_by_graph(capture: Capture) -> dict[str, float]:
    """Summed ``model_run`` µs per graph label, over every session of every instance."""
    totals: dict[str, float] = {g: 0.0 for g in capture.graphs()}
    for s in capture.sessions:
        totals[s.graph] += sum(float(e["dur"]) for e in s.events if _is_run(e))
    return totals


def op_rows(capture: Capture) -> list[OpRow]:
    """One row per (node, graph) that executed, summed over instances, sorted by total time descending."""
    rows: dict[tuple[str, str], OpRow] = {}
    for s in capture.sessions:
        for event in (e for e in s.events if is_kernel(e)):
            name = node_name(event)
            row = rows.setdefault((name, s.graph), OpRow(name, s.graph, static=s.is_static(name)))
            row.static = row.static and s.is_static(name)  # static only if static in every session
            row.add(event)
    run_us = run_time_by_graph(capture)
    for row in rows.values():
        row.share_pct = 100.0 * row.total_us / run_us[row.graph] if run_us[row.graph] else 0.0
    return sorted(rows.values(), key=lambda r: (-r.total_us, r.graph, r.name))


def trace_events(capture: Capture) -> list[dict]:
    """Chrome-trace events: every ORT event on the shared timeline (one pid per instance) plus request boundaries."""
    pids = {inst: i + 1 for i, inst in enumerate(capture.instances)}
    events = [m for inst, pid in pids.items() for m in _metadata(inst, pid)]
    for s in capture.sessions:
        events.extend(_trace_event(e, s, pids[s.instance]) for e in s.events)
    events.extend(_request_event(r, pids[r.instance]) for r in capture.requests)
    return [e for e in events if _well_formed(e)]


def _metadata(instance: str, pid: int) -> list[dict]:
    base = {"ph": "M", "ts": 0, "pid": pid}
    return [
        {**base, "name": "process_name", "tid": REQUESTS_TID, "args": {"name": instance}},
        {**base, "name": "process_sort_index", "tid": REQUESTS_TID, "args": {"sort_index": pid}},
        {**base, "name": "thread_name", "tid": REQUESTS_TID, "args": {"name": "requests"}},
    ]


def _trace_event(event: dict, session: Session, pid: int) -> dict:
    out = {k: v for k, v in event.items() if k != "args"}
    args = {k: v for k, v in (event.get("args") or {}).items() if k not in DROPPED_ARGS}
    if event.get("name") == RUN_EVENT:
        args["graph"] = session.graph
    out.update(pid=pid, args=args)
    if isinstance(event.get("ts"), (int, float)):
        out["ts"] = session.abs_us(event["ts"])
    return out


def _request_event(request: Request, pid: int) -> dict:
    return {"name": request.label, "cat": "request", "ph": "X", "ts": request.start_ns / 1000,
            "dur": max(request.end_ns - request.start_ns, 0) / 1000, "pid": pid, "tid": REQUESTS_TID,
            "args": {"requests": request.requests, "rows": request.rows, "errors": request.errors}}


def _well_formed(event: dict) -> bool:
    number = (int, float)
    ok = (isinstance(event.get("name"), str) and isinstance(event.get("ph"), str)
          and isinstance(event.get("ts"), number) and isinstance(event.get("pid"), int)
          and isinstance(event.get("tid"), int))
    return ok and (event["ph"] != "X" or isinstance(event.get("dur"), number))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
