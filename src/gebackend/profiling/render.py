"""Writing a profiling capture's ``op_summary.csv``, ``trace.json`` and ``summary.txt`` (`render`), and the text of
``summary.txt``. What a capture holds and how it is read (the sessions, runs, requests, per-op rows and trace events)
is `report.py`'s.
"""

from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

from gebackend.profiling.report import (CSV_COLUMNS, TOP_OPS, Capture, OpRow, Run, Session, _session_span_ns, is_wall_clock,
                                        load_capture, op_rows, trace_events)

# ---------------------------------------------------------------- summary.txt


def summary_lines(capture: Capture, rows: list[OpRow], top: int = TOP_OPS) -> list[str]:
    runs = capture.runs()
    return [*_header_lines(capture, runs), "", *_top_ops_lines(rows, top), "", *_bubble_lines(capture, runs), "",
            *_execute_lines(capture, runs), "", *_static_lines(capture, rows)]


def _header_lines(capture: Capture, runs: list[Run]) -> list[str]:
    lo, hi = _span_us(capture, runs)
    per_graph = ", ".join(f"{g!r}: {sum(r.session.graph == g for r in runs)}" for g in capture.graphs())
    reqs = capture.requests
    return [
        f"gebackend profiling summary: {capture.title}",
        f"capture:   {_fmt_time(lo)} -> {_fmt_time(hi)} ({(hi - lo) / 1e6:.3f} s)",
        f"instances: {len(capture.instances)} ({', '.join(capture.instances)})",
        f"runs:      {len(runs)} model_run ({per_graph})",
        f"requests:  {sum(r.requests for r in reqs)} in {len(reqs)} execute() calls, "
        f"{sum(r.rows for r in reqs)} rows, {sum(r.errors for r in reqs)} errors",
        f"clocks:    {capture.clock_note}",
    ]


def _span_us(capture: Capture, runs: list[Run]) -> tuple[float, float]:
    spans = [(s / 1000, e / 1000) for s, e in map(_session_span_ns, capture.sessions)]
    spans += [(r.start_us, r.start_us + r.dur_us) for r in runs]
    spans += [(r.start_ns / 1000, r.end_ns / 1000) for r in capture.requests]
    return min(s for s, _ in spans), max(e for _, e in spans)


def _fmt_time(us: float) -> str:
    if is_wall_clock(int(us * 1000)):
        return datetime.datetime.fromtimestamp(us / 1e6).isoformat(sep=" ", timespec="milliseconds")
    return f"t={us / 1e6:.6f} s (monotonic)"


def _top_ops_lines(rows: list[OpRow], top: int) -> list[str]:
    lines = [f"top {min(top, len(rows))} ops by total time (share = of that graph's model_run time)",
             f"  {'#':>3}  {'name':<32} {'op type':<18} {'mode':<8} {'calls':>7} {'total ms':>10} {'share':>7}  graph"]
    for i, r in enumerate(rows[:top], 1):
        lines.append(f"  {i:>3}  {_clip(r.name, 32):<32} {_clip(r.op_type, 18):<18} {r.mode:<8} {r.calls:>7} "
                     f"{r.total_us / 1000:>10.3f} {r.share_pct:>6.2f}%  {r.graph}")
    return lines


def _bubble_lines(capture: Capture, runs: list[Run]) -> list[str]:
    lines = ["per run: model_run time vs summed kernel time (host-side = the bubbles between kernels)",
             f"  {'runs':>6} {'model_run us':>13} {'kernels us':>11} {'host us':>10} {'host %':>7}  graph"]
    groups = [(g, [r for r in runs if r.session.graph == g]) for g in capture.graphs()]
    for label, group in [*groups, ("all runs", runs)]:
        if group:
            run_us = sum(r.dur_us for r in group) / len(group)
            kernel_us = sum(r.kernel_us for r in group) / len(group)
            host = run_us - kernel_us
            pct = 100 * host / run_us if run_us else 0.0
            lines.append(f"  {len(group):>6} {run_us:>13.1f} {kernel_us:>11.1f} {host:>10.1f} {pct:>6.1f}%  {label}")
    return lines


def _execute_lines(capture: Capture, runs: list[Run]) -> list[str]:
    lines = ["per execute(): Triton request batch time vs ONNX Runtime time inside it (the rest is Python-side)"]
    spans = [(r.end_ns - r.start_ns) / 1000 for r in capture.requests]
    if not spans:
        return [*lines, "  no request boundaries recorded"]
    inside = [sum(run.dur_us for run in runs if run.session.instance == r.instance
                  and r.start_ns / 1000 <= run.start_us <= r.end_ns / 1000) for r in capture.requests]
    mean_span, mean_ort = sum(spans) / len(spans), sum(inside) / len(inside)
    outside = mean_span - mean_ort
    pct = 100 * outside / mean_span if mean_span else 0.0
    return [*lines, f"  {len(spans)} execute() calls: mean {mean_span:.1f} us, ORT {mean_ort:.1f} us, "
                    f"outside ORT {outside:.1f} us ({pct:.1f}%)"]


def first_dynamic_op(session: Session) -> tuple[int, str] | None:
    """(1-based position in node_order, node name) of the first node not in static_nodes, or None."""
    for i, name in enumerate(session.node_order, 1):
        if name not in session.static_nodes:
            return i, name
    return None


def static_mode_line(session: Session, op_types: dict[str, str]) -> str:
    if session.mode != "static":
        return "dynamic graph: shapes resolved per run"
    found = first_dynamic_op(session)
    if found is None:
        return "first dynamic op of the static model: none, every op ran with shapes fixed at compile time"
    index, name = found
    return f"first dynamic op of the static model: #{index} {op_types.get(name, '?')} {name!r}"


def _static_lines(capture: Capture, rows: list[OpRow]) -> list[str]:
    op_types = {r.name: r.op_type for r in rows}
    first = {}
    for s in capture.sessions:
        first.setdefault(s.graph, s)
    lines = ["static graph mode", *(f"  graph {g!r}: {static_mode_line(s, op_types)}" for g, s in first.items())]
    return lines + _unlisted_lines(capture, rows)


def _unlisted_lines(capture: Capture, rows: list[OpRow]) -> list[str]:
    """Executed nodes of static graphs missing from node_order: made by ORT's graph optimizer (fusions)."""
    listed = {(s.graph, n) for s in capture.sessions for n in [*s.node_order, *s.static_nodes]}
    static_graphs = {s.graph for s in capture.sessions if s.mode == "static"}
    unlisted = [r.name for r in rows if r.graph in static_graphs and (r.graph, r.name) not in listed]
    if not unlisted:
        return []
    shown = ", ".join(repr(n) for n in unlisted[:5]) + (", ..." if len(unlisted) > 5 else "")
    return [f"  {len(unlisted)} executed node(s) are neither in node_order nor in static_nodes, so count as dynamic: {shown}",
            "  (ONNX Runtime's graph optimizer made them; list nodes of the optimized graph to classify them)"]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"




# ---------------------------------------------------------------- writing


def write_op_summary(path: Path, rows: list[OpRow]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(r.csv_record() for r in rows)
    return path


def write_trace(path: Path, capture: Capture) -> Path:
    path.write_text(json.dumps({"traceEvents": trace_events(capture), "displayTimeUnit": "ms"}))
    return path


def write_summary(path: Path, capture: Capture, rows: list[OpRow]) -> Path:
    path.write_text("\n".join(summary_lines(capture, rows)) + "\n")
    return path


def render(capture: str | Path) -> dict[str, Path]:
    """Write ``op_summary.csv``, ``trace.json`` and ``summary.txt`` into the capture folder; return their paths."""
    cap = load_capture(capture)
    rows = op_rows(cap)
    return {
        "op_summary": write_op_summary(cap.path / "op_summary.csv", rows),
        "trace": write_trace(cap.path / "trace.json", cap),
        "summary": write_summary(cap.path / "summary.txt", cap, rows),
    }
