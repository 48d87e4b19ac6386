"""Profiling reports from a real capture folder: ORT profiles of two small models in two fake instances."""

from __future__ import annotations

import csv
import json
import re
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.errors import GeBackendError
from gebackend.modelzoo import build_add_mul, build_nonzero
from gebackend.profiling import load_capture, render
from gebackend.profiling.render import static_mode_line
from gebackend.profiling.report import Session

GAP_S = 0.002  # between runs, so a request boundary on the wrong clock or run cannot pass the alignment check
#: instance -> (dynamic runs, static runs)
RUNS = {"tiny_0_0": (5, 3), "tiny_0_1": (3, 2)}
EXPECTED_CALLS = {"dynamic": 8, "static x:2,4": 5}
FEED = np.array([[1, 0, 2, 0], [0, 3, 0, 4]], np.float32)


def _models(tmp: Path) -> dict[str, dict]:
    """graph label -> how to run and describe it (the static one has every node static but the NonZero)."""
    add_mul, nonzero = build_add_mul(), build_nonzero()
    onnx.save(add_mul, tmp / "add_mul.onnx")
    onnx.save(nonzero, tmp / "nonzero.onnx")
    nodes = [n.name for n in nonzero.graph.node]
    return {
        "dynamic": {"path": tmp / "add_mul.onnx", "feeds": {"x": FEED, "y": FEED}, "mode": "dynamic",
                    "static_nodes": [], "node_order": [n.name for n in add_mul.graph.node]},
        "static x:2,4": {"path": tmp / "nonzero.onnx", "feeds": {"x": FEED}, "mode": "static",
                         "static_nodes": [n for n in nodes if n != "nz"], "node_order": nodes},
    }


def _capture_session(folder: Path, tag: str, graph: str, model: dict, runs: int, clock: str):
    """Profile ``runs`` runs the way an instance would; return its sessions.json entry and requests.json entries."""
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(folder / f"ort_{tag}")
    session = ort.InferenceSession(str(model["path"]), so, providers=["CPUExecutionProvider"])
    start_ns = session.get_profiling_start_time_ns()  # on time.time_ns()'s clock
    if clock == "monotonic":  # what the capture side does to keep the whole folder on time.monotonic_ns()
        start_ns += time.monotonic_ns() - time.time_ns()
    requests = []
    for i in range(runs):
        time.sleep(GAP_S)
        t0 = time.monotonic_ns()
        session.run(None, model["feeds"])
        requests.append({"start_ns": t0, "end_ns": time.monotonic_ns(), "requests": i % 3 + 1, "rows": 2,
                         "errors": int(i == 1)})
    entry = {"file": Path(session.end_profiling()).name, "mode": model["mode"], "graph": graph,
             "static_nodes": model["static_nodes"], "node_order": model["node_order"], "start_ns": start_ns}
    return entry, requests


def _build_capture(root: Path, clock: str) -> Path:
    models = _models(root)
    capture = root / "profiling" / "tiny" / "20261129-163000"
    for instance, counts in RUNS.items():
        folder = capture / "instances" / instance
        folder.mkdir(parents=True)
        sessions, requests = [], []
        for (graph, model), runs in zip(models.items(), counts):
            entry, reqs = _capture_session(folder, graph.split()[0], graph, model, runs, clock)
            sessions.append(entry)
            requests += reqs
        (folder / "sessions.json").write_text(json.dumps(sessions))
        (folder / "requests.json").write_text(json.dumps(requests))
    return capture


@pytest.fixture(scope="module", params=["monotonic", "wall"])
def rendered(request, tmp_path_factory):
    """A rendered capture; ``wall`` leaves ORT's start times on time.time_ns() so the report must convert."""
    capture = _build_capture(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, capture, render(capture)


def _csv_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_render_writes_the_three_files(rendered):
    _, capture, paths = rendered
    assert paths == {"op_summary": capture / "op_summary.csv", "trace": capture / "trace.json",
                     "summary": capture / "summary.txt"}
    assert all(p.stat().st_size > 0 for p in paths.values())


def test_op_summary_counts_every_run_of_every_instance(rendered):
    _, capture, paths = rendered
    rows = _csv_rows(paths["op_summary"])
    models = _models(capture.parent)
    names = {(r["graph"], r["name"]) for r in rows}
    assert names == {(g, n) for g, m in models.items() for n in m["node_order"]}
    assert len(rows) == len(names)  # one row per (node, graph)
    for row in rows:
        assert int(row["calls"]) == EXPECTED_CALLS[row["graph"]], row
        assert float(row["min_us"]) <= float(row["avg_us"]) <= float(row["max_us"])
        assert row["provider"] == "CPUExecutionProvider" and row["op_type"]
    totals = [float(r["total_us"]) for r in rows]
    assert totals == sorted(totals, reverse=True)
    share = defaultdict(float)
    for row in rows:
        share[row["graph"]] += float(row["share_pct"])
    assert all(0 < s <= 100 for s in share.values()), share


def test_op_summary_modes_and_shapes(rendered):
    _, _, paths = rendered
    rows = {(r["graph"], r["name"]): r for r in _csv_rows(paths["op_summary"])}
    assert {r["mode"] for (g, _), r in rows.items() if g == "dynamic"} == {"dynamic"}
    assert rows[("static x:2,4", "nz")]["mode"] == "dynamic"
    assert rows[("static x:2,4", "doubled")]["mode"] == "static"
    assert rows[("static x:2,4", "indices")]["mode"] == "static"
    assert rows[("dynamic", "sum")]["input_shapes"] == "float32[2,4], float32[2,4]"
    assert rows[("static x:2,4", "nz")]["output_shapes"] == "int64[2,4]"  # 4 non-zeros, 2 dims


def test_trace_is_a_well_formed_chrome_trace(rendered):
    _, _, paths = rendered
    trace = json.loads(paths["trace"].read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= e.keys(), e
        assert e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(RUNS) and len(set(names)) == len(RUNS)
    threads = [e for e in events if e["name"] == "thread_name" and e["args"]["name"] == "requests"]
    assert len(threads) == len(RUNS)
    requests = [e for e in events if e.get("cat") == "request"]
    assert len(requests) == sum(sum(c) for c in RUNS.values())
    assert all(re.fullmatch(r"execute: \d requests?, 2 rows(, 1 error)?", e["name"]) for e in requests)
    assert {e["tid"] for e in requests} == {threads[0]["tid"]}


def test_trace_runs_are_ordered_and_inside_their_requests(rendered):
    _, _, paths = rendered
    events = json.loads(paths["trace"].read_text())["traceEvents"]
    for pid in {e["pid"] for e in events}:
        runs = sorted((e for e in events if e["pid"] == pid and e["name"] == "model_run"), key=lambda e: e["ts"])
        reqs = sorted((e for e in events if e["pid"] == pid and e.get("cat") == "request"), key=lambda e: e["ts"])
        nodes = [e for e in events if e["pid"] == pid and e.get("cat") == "Node"]
        assert len(runs) == len(reqs) == sum(RUNS[_instance(events, pid)])
        for run, req in zip(runs, reqs):
            inside = [e["ts"] for e in nodes if run["ts"] <= e["ts"] <= run["ts"] + run["dur"]]
            assert inside and inside == sorted(inside)
            # the i-th request brackets the i-th run; runs are GAP_S apart, so 1 ms of slack still pins the pair
            assert req["ts"] - 1000 <= run["ts"] and run["ts"] + run["dur"] <= req["ts"] + req["dur"] + 1000


def _instance(events: list[dict], pid: int) -> str:
    return next(e["args"]["name"] for e in events if e["name"] == "process_name" and e["pid"] == pid)


def test_summary_names_first_dynamic_op_and_host_time(rendered):
    clock, _, paths = rendered
    text = paths["summary"].read_text()
    assert "gebackend profiling summary: tiny (20261129-163000)" in text
    assert "runs:      13 model_run ('dynamic': 8, 'static x:2,4': 5)" in text
    assert "graph 'static x:2,4': first dynamic op of the static model: #2 NonZero 'nz'" in text
    assert "graph 'dynamic': dynamic graph: shapes resolved per run" in text
    assert ("share one clock" if clock == "monotonic" else "converted between") in text
    match = re.search(r"13\s+([\d.]+)\s+([\d.]+)\s+([-\d.]+)\s+([-\d.]+)%  all runs", text)
    run_us, kernel_us, host_us, host_pct = map(float, match.groups())
    assert kernel_us > 0 and host_us > 0 and run_us == pytest.approx(kernel_us + host_us, abs=0.2)
    assert 0 < host_pct < 100
    assert re.search(r"13 execute\(\) calls: mean [\d.]+ us, ORT [\d.]+ us", text)
    assert "neither in node_order" not in text  # no fusions in these graphs


def test_load_capture_assigns_every_kernel_to_its_run(rendered):
    _, capture, _ = rendered
    cap = load_capture(capture)
    runs = cap.runs()
    assert len(runs) == 13 and len(cap.requests) == 13
    assert all(len(r.kernels) == len(r.session.node_order) for r in runs)


def test_a_fully_static_graph_says_so():
    session = Session("i", Path("x.json"), "static", "static x:1", frozenset({"a", "b"}), ("a", "b"), 0, ())
    assert static_mode_line(session, {}) == "first dynamic op of the static model: none, every op ran with shapes fixed at compile time"


def test_errors_on_a_folder_without_a_capture(tmp_path):
    with pytest.raises(GeBackendError, match="no instances"):
        render(tmp_path)
    folder = tmp_path / "instances" / "m_0_0"
    folder.mkdir(parents=True)
    (folder / "sessions.json").write_text("[]")
    with pytest.raises(GeBackendError, match="no ONNX Runtime profile files"):
        render(tmp_path)


def test_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from gebackend.profiling.plot import plot_timeline, plot_top_ops

    capture = _build_capture(tmp_path, "monotonic")
    for path, name in ((plot_top_ops(capture), "top_ops.png"), (plot_timeline(capture), "timeline.png")):
        assert path == capture / name and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5 * 1024
