"""`gebackend bench --quick` through the real CLI, as a newcomer runs it after the README's setup: perf_analyzer is
installed on first use, every rung of the ladder is served and measured, and the table and plots are written. Its
measurement windows are shorter than --quick's (500 ms per perf_analyzer window, 0.5 s in process per level).

Numbers are not asserted (a shared machine; ratios are read from one run's report): what is asserted is that every
scenario ran, that the served answers were right (cosine similarity to fp32 onnxruntime), and that the in-process
ceiling was measured for every ge scenario.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gebackend.bench import scenarios
from gebackend import cpu
from gebackend.engines.registry import precision_run

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_writes_its_table_and_plots(tmp_path):
    # --quick's ladder and levels, with shorter windows (the test reads what ran, not how fast)
    cmd = [sys.executable, "-m", "gebackend.cli.main", "bench", "--quick", "--interval-ms", "500", "--ceiling-seconds", "0.5",
           "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "models")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (run,) = (tmp_path / "out").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    (model,) = summary["models"]
    assert model["name"] == "resnet_small"
    ran = {s["name"]: s for s in model["scenarios"]}
    assert list(ran) == list(scenarios.LADDER)
    for name, result in ran.items():
        assert result["status"] == "ok", (name, result["reason"])
        assert [r["concurrency"] for r in result["rows"]] == [1, 4], name
        assert all(r["throughput"] > 0 and r["p50_us"] > 0 for r in result["rows"]), name
        if name != "naive":
            assert [r["concurrency"] for r in result["ceiling"]] == [1, 4], name
            cosine = 0.999 if name in ("ge_bf16", "ge_int8") else 0.999999
            assert result["accuracy"]["cosine"] >= cosine, (name, result["accuracy"])
    table = (run / "summary.md").read_text()
    assert "| scenario | throughput | p50 | p99 | x naive | ceiling | % ceiling |" in table
    assert "ge_bf16" in table and "1.00x" in table  # naive's own row
    for plot in ("throughput_resnet_small.png", "latency_resnet_small.png"):
        assert (run / plot).stat().st_size > 10_000
    assert (run / "resnet_small_ge_static.csv").read_text().startswith("Concurrency,")
    assert summary["meta"]["duration_s"] < 600
    # The result names its CPU, and the bf16 rung says what it ran on this one (f32 where the CPU has no BF16).
    assert summary["meta"]["machine"].startswith(cpu.describe())
    bf16 = precision_run("bf16", "openvino")
    assert ran["ge_bf16"]["precision_ran"] == bf16.ran
    if bf16.note:
        assert bf16.note in ran["ge_bf16"]["notes"] and bf16.note in table
