"""The soak through the real CLI: `gebackend bench --soak` holds perf_analyzer load on a static and a bucketed model.

The CI version is short (90 s; `gebackend bench --soak 10` is the real one, docs/operations.md#soak): no
failed request, no restarted process, and RSS growth under 5% after the warm-up in every process. A second run
kills a stub half-way to show the soak notices (it must be able to fail). perf_analyzer is installed on first use
(tools/install_perf_analyzer.sh, as `make tools`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gebackend.server.stubs import stub_identity

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def soak(tmp_path: Path, minutes: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gebackend.cli.main", "bench", "--soak", str(minutes),
           "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "models")]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, limit: float) -> str:
    try:
        out, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        raise AssertionError(f"the soak ran over {limit:.0f}s:\n{out[-3000:]}")
    return out


def result_of(tmp_path: Path) -> tuple[Path, dict]:
    (folder,) = (tmp_path / "out").glob("soak-*")
    return folder, json.loads((folder / "soak.json").read_text())


def test_short_soak_meets_the_target(tmp_path):
    process = soak(tmp_path, 1.5)
    out = finish(process, 600)
    folder, result = result_of(tmp_path)
    print("\n" + (folder / "soak.md").read_text())
    assert process.returncode == 0, out[-3000:]
    assert result["passed"] and result["problems"] == []
    assert set(result["models"]) == {"resnet_small", "bert_small"}
    for name, model in result["models"].items():
        assert model["failed"] == 0 and model["errors"] == []
        # Triton's own count of answered requests agrees with the load perf_analyzer reported (it also counts the
        # requests between runs and the ones in its warm-up, so it is at least most of it)
        measured = sum(r["throughput"] * (r["ended"] - r["started"]) for r in model["runs"])
        assert model["succeeded"] > 0.5 * measured > 100, (name, model["succeeded"], measured)
    names = set(result["processes"])
    assert {"gebackend serve", "tritonserver", "stub resnet_small_0_0", "stub bert_small_0_0"} <= names
    for name, process_entry in result["processes"].items():
        assert process_entry["restarts"] == 0, name
        assert process_entry["memory"]["samples_after_warmup"] >= 10, name
        assert process_entry["memory"]["growth"] < 0.05, (name, process_entry["memory"])
    assert result["meta"]["elapsed_s"] >= 85
    for plot in ("soak_rss.png", "soak_throughput.png"):
        assert (folder / plot).stat().st_size > 10_000


def stub_of(root: psutil.Process, model: str) -> psutil.Process | None:
    for child in root.children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        identity = stub_identity(argv)  # None for a stub caught mid-exec, whose command line is not all there yet
        if identity is not None and identity[0] == model:
            return child
    return None


def test_a_soak_reports_a_dead_stub_and_fails(tmp_path):
    process = soak(tmp_path, 1.0)
    root = psutil.Process(process.pid)
    deadline = time.monotonic() + 300
    victim = None
    while time.monotonic() < deadline and process.poll() is None:
        logs = list((tmp_path / "out").glob("soak-*/perf/resnet_small/run*.log"))
        victim = stub_of(root, "resnet_small")
        if victim is not None and logs:  # one perf_analyzer run has finished: the load is on
            break
        time.sleep(0.5)
    assert victim is not None, "the soak's server never came up"
    victim.kill()
    out = finish(process, 600)
    _, result = result_of(tmp_path)
    assert process.returncode == 1, out[-3000:]
    assert not result["passed"]
    problems = "\n".join(result["problems"])
    assert "stub resnet_small_0_0: its process was replaced 1 time(s)" in problems
    assert "the watchdog restored a model 1 time(s)" in problems
    assert result["models"]["bert_small"]["failed"] == 0  # the other model never noticed
