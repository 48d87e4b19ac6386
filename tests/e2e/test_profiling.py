"""Profiling while serving, through the real CLI: start/stop without a restart, the capture files, metrics."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gebackend.modelzoo import build_add_mul

from .conftest import add_model, params
from .server import GEBACKEND, start_server
from .test_serving import infer

pytestmark = pytest.mark.e2e

BUCKET_1x16 = "static input_ids:1,16 attention_mask:1,16"


def profile(server, *args):
    return subprocess.run(GEBACKEND + ["profile", *args, "--url", server.http_url], capture_output=True, text=True, timeout=120)


def bert_feeds(rows, length, seed):
    ids = np.random.default_rng(seed).integers(0, 1000, size=(rows, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_profile_start_stop_on_a_running_server(server, tmp_path):
    stop_traffic = threading.Event()
    outcomes = []

    def traffic():  # keeps the 4x32 bucket busy during both switches
        seed = 0
        while not stop_traffic.is_set():
            seed += 1
            try:
                result = infer(server, "grpc", "bert_profiled", bert_feeds(3, 20, seed))
                outcomes.append(result.as_numpy("pooler_output").shape == (3, 64))
            except Exception as exc:  # any failure is a lost request
                outcomes.append(exc)

    with ThreadPoolExecutor(max_workers=2) as pool:
        workers = [pool.submit(traffic) for _ in range(2)]
        started = profile(server, "start", "--model", "bert_profiled", "--out", str(tmp_path))
        assert started.returncode == 0, started.stderr
        assert "capturing into" in started.stdout
        for i in range(5):  # exactly 5 runs on the 1x16 bucket
            assert infer(server, "http", "bert_profiled", bert_feeds(1, 10, 100 + i)).as_numpy("pooler_output").shape == (1, 64)
        stopped = profile(server, "stop", "--model", "bert_profiled")
        stop_traffic.set()
        for w in workers:
            w.result()
    assert stopped.returncode == 0, stopped.stderr
    assert outcomes and all(o is True for o in outcomes), [o for o in outcomes if o is not True][:3]

    capture = next(tmp_path.glob("bert_profiled/*"))
    rows = list(csv.DictReader((capture / "op_summary.csv").open()))
    bucket_rows = [r for r in rows if r["graph"] == BUCKET_1x16]
    assert bucket_rows, {r["graph"] for r in rows}
    assert {int(r["calls"]) for r in bucket_rows} == {5}
    assert {r["mode"] for r in bucket_rows} == {"static"}
    assert "Softmax" in {r["op_type"] for r in rows}
    trace = json.loads((capture / "trace.json").read_text())
    events = trace["traceEvents"]
    assert any(e["name"].startswith("execute:") for e in events)
    assert all({"name", "ph", "pid", "tid"} <= set(e) for e in events)
    summary = (capture / "summary.txt").read_text()
    assert "first dynamic op" in summary and "none" in summary
    assert (capture / "top_ops.png").stat().st_size > 5000

    # No capture is running any more: a new request is not recorded.
    before = (capture / "instances").stat().st_mtime_ns
    infer(server, "http", "bert_profiled", bert_feeds(1, 10, 7))
    assert (capture / "instances").stat().st_mtime_ns == before


def test_dump_graph_writes_every_compiled_bucket(server, repository):
    dumps = sorted((repository.parent / "dumps" / "bert_profiled" / "graphs").glob("*.onnx"))
    assert len(dumps) == 3
    import onnx

    shapes = [[d.dim_value for d in onnx.load(str(p)).graph.input[0].type.tensor_type.shape.dim] for p in dumps]
    assert sorted(shapes) == [[1, 16], [4, 16], [4, 32]]


def test_profiling_a_dynamic_model(server, tmp_path):
    assert profile(server, "start", "--model", "resnet_profiled", "--out", str(tmp_path)).returncode == 0
    for i in range(3):
        infer(server, "http", "resnet_profiled", {"image": np.ones((2, 3, 64, 64), np.float32) * i})
    assert profile(server, "stop", "--model", "resnet_profiled").returncode == 0
    capture = next(tmp_path.glob("resnet_profiled/*"))
    rows = list(csv.DictReader((capture / "op_summary.csv").open()))
    assert {r["mode"] for r in rows} == {"dynamic"} and {int(r["calls"]) for r in rows} == {3}
    assert "dynamic graph" in (capture / "summary.txt").read_text()


def scrape(server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def metric(text: str, name: str, **labels) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def scrape_when(server, ready, limit: float = 10.0) -> str:
    """The metrics text once `ready(text)` holds: the backend publishes its own metrics once a second."""
    deadline = time.monotonic() + limit
    while True:
        text = scrape(server)
        if ready(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_metrics_move_with_traffic(server):
    bucket = "input_ids:[4, 32]; attention_mask:[4, 32]"
    time.sleep(1.5)  # what earlier tests ran is published
    before = scrape(server)
    assert "gebackend_compile_seconds" in before
    assert metric(before, "gebackend_compile_seconds", model="bert_ge_static") > 0
    runs_before = metric(before, "gebackend_bucket_runs_total", model="bert_ge_static", bucket=bucket)
    for i in range(3):
        infer(server, "http", "bert_ge_static", bert_feeds(3, 20, i))  # 3 rows padded to the 4x32 bucket
    after = scrape_when(server, lambda t: metric(t, "gebackend_bucket_runs_total", model="bert_ge_static",
                                                 bucket=bucket) >= runs_before + 3)
    time.sleep(1.5)  # and nothing more comes
    after = scrape(server)
    assert metric(after, "gebackend_bucket_runs_total", model="bert_ge_static", bucket=bucket) - runs_before == 3
    assert metric(after, "gebackend_padded_rows_total", model="bert_ge_static") - \
        metric(before, "gebackend_padded_rows_total", model="bert_ge_static") == 3
    assert 0 < metric(after, "gebackend_padding_waste_ratio", model="bert_ge_static") < 1
    # The costs its plans come from: buckets 1x16 and 4x16 share an inner shape, so they were measured at load;
    # a smaller bucket never costs more than a larger one of the same inner shape.
    one, four = (metric(after, "gebackend_bucket_run_seconds", model="bert_ge_static",
                        bucket=f"input_ids:[{b}, 16]; attention_mask:[{b}, 16]") for b in (1, 4))
    assert 0 < one <= four < 1, (one, four)
    assert not [line for line in after.splitlines()  # the dynamic graph has no buckets to cost
                if line.startswith("gebackend_bucket_run_seconds{") and 'model="bert_ge"' in line]
    fallback_before = metric(after, "gebackend_fallback_runs_total", model="bert_ge_fallback")
    infer(server, "http", "bert_ge_fallback", bert_feeds(1, 9, 1))
    text = scrape_when(server, lambda t: metric(t, "gebackend_fallback_runs_total", model="bert_ge_fallback") > fallback_before)
    assert metric(text, "gebackend_fallback_runs_total", model="bert_ge_fallback") == fallback_before + 1


def test_execute_phases_count_every_batch_and_fit_inside_tritons_compute_time(server):
    """gebackend_execute_seconds_total{phase} and gebackend_executions_total: one execution per batch Triton ran
    (its nv_inference_exec_count), the engine's share above zero, and the four phases together within Triton's own
    compute time of those requests (one request a batch here: Triton's per-request time is the batch's)."""
    model = "bert_ge"
    time.sleep(1.5)  # what earlier tests ran is published
    before = scrape(server)

    def ours(text, phase=None):
        if phase is None:
            return metric(text, "gebackend_executions_total", model=model)
        return metric(text, "gebackend_execute_seconds_total", model=model, phase=phase)

    for i in range(4):
        infer(server, "http", model, bert_feeds(2, 16, i))
    after = scrape_when(server, lambda t: ours(t) >= ours(before) + 4)
    triton_runs = metric(after, "nv_inference_exec_count", model=model) - metric(before, "nv_inference_exec_count", model=model)
    assert ours(after) - ours(before) == triton_runs == 4
    spent = {phase: ours(after, phase) - ours(before, phase) for phase in ("read", "prepare", "engine", "respond")}
    assert spent["engine"] > 0 and all(v >= 0 for v in spent.values()), spent
    compute_us = sum(metric(after, f"nv_inference_compute_{p}_duration_us", model=model)
                     - metric(before, f"nv_inference_compute_{p}_duration_us", model=model)
                     for p in ("input", "infer", "output"))
    assert sum(spent.values()) <= compute_us / 1e6, (spent, compute_us)


def test_profiling_true_captures_from_load_until_stop(tmp_path):
    repo = tmp_path / "repo"
    out = tmp_path / "captures"
    add_model(repo, "add_mul", 'backend: "ge"\nmax_batch_size: 4\n' + params(profiling="true", profiling_dir=str(out)), build_add_mul())
    server = start_server(repo, tmp_path / "serve.log")
    try:
        for i in range(4):
            result = infer(server, "http", "add_mul", {"x": np.full((1, 4), i, np.float32), "y": np.ones((1, 4), np.float32)})
            np.testing.assert_array_equal(result.as_numpy("sum"), np.full((1, 4), i + 1, np.float32))
    finally:
        assert server.stop() == 0
    capture = next(out.glob("add_mul/*"))
    rows = list(csv.DictReader((capture / "op_summary.csv").open()))
    assert {r["op_type"] for r in rows} == {"Add", "Mul"}
    assert {int(r["calls"]) for r in rows} == {4}
    assert re.search(r"runs?\D+4", (capture / "summary.txt").read_text())
