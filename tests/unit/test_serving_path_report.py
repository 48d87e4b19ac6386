"""bench/serving_path.py's arithmetic without a server: medians over rounds, the hand-over (`transport`) as Triton's
compute time less gebackend's four phases, the stubs' CPU time and core wait summed, and the naive model's phases left
blank."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "serving_path.py"


@pytest.fixture(scope="module")
def serving_path():
    spec = importlib.util.spec_from_file_location("serving_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(config, throughput, compute, phases, waits):
    row = {"config": config, "concurrency": 4, "throughput": throughput, "executions": 100, "avg_batch": 1.5,
           "batch_sizes": {"1": 50, "2": 50}, "queue_us_per_request": 30.0, "compute_us_per_batch": compute,
           "core_wait_us_per_batch": waits, "cpu_us_per_batch": {k: 2 * v for k, v in waits.items()}, "threads": {"tritonserver": {"threads": 40, "cpu_sets": [(0, 1)]}}}
    for phase, value in zip(("read", "prepare", "engine", "respond"), phases or (None,) * 4):
        row[f"{phase}_us_per_batch"] = value
    row["transport_us_per_batch"] = None if phases is None else compute - sum(phases)
    return row


def test_the_table_takes_medians_and_leaves_the_naive_models_phases_blank(serving_path):
    rows = [_row("ge_dynamic", 900.0, 1000.0, (10.0, 40.0, 800.0, 20.0), {"stub 1": 100.0, "stub 2": 50.0, "tritonserver": 5.0}),
            _row("ge_dynamic", 1100.0, 1200.0, (10.0, 40.0, 1000.0, 20.0), {"stub 1": 300.0, "tritonserver": 15.0}),
            _row("ge_dynamic", 1000.0, 1100.0, (10.0, 40.0, 900.0, 20.0), {"stub 1": 200.0, "tritonserver": 10.0}),
            _row("naive", 800.0, 1300.0, None, {"stub 9": 400.0})]
    table = serving_path.summarize(rows)
    assert [r["config"] for r in table] == ["ge_dynamic", "naive"]  # in the order they were measured
    ge, naive = table
    assert ge["throughput"] == 1000.0 and ge["spread"] == pytest.approx(0.2)
    assert ge["engine_us_per_batch"] == 900.0 and ge["transport_us_per_batch"] == 130.0
    assert ge["stub_core_wait_us_per_batch"] == 200.0 and ge["server_core_wait_us_per_batch"] == 10.0
    assert naive["engine_us_per_batch"] is None and naive["transport_us_per_batch"] is None
    text = serving_path.report(table, {"model": "resnet_small", "machine": "AMD EPYC [avx2]", "rounds": 3, "interval_ms": 2000})
    assert ge["stub_cpu_us_per_batch"] == 400.0 and ge["server_cpu_us_per_batch"] == 20.0
    assert "| ge_dynamic | 4 | 1000.0 | 20% | 1.50 | 30 | 1100 | 130 | 10 | 40 | 900 | 20 | 400 | 20 | 200 | 10 |" in text
    assert "| naive | 4 | 800.0 | 0% | 1.50 | 30 | 1300 | – | – | – | – | – | 800 | 0 | 400 | 0 |" in text
    assert "Machine: AMD EPYC [avx2]" in text
