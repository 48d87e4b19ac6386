"""`gebackend bench` with `NAME+ensemble` scenarios through the real CLI, tritonserver and perf_analyzer: each CN_CLIP
stand-in encoder served as `ge_dynamic` inside its two-step ensemble (preprocessing -> encoder with its normalised
output), measured next to the bare encoder in one server.

Numbers are not asserted (a shared machine): what is asserted is that both the ensemble and the bare encoder were
measured at each concurrency and round, that the ensemble's wiring check found its unnormalised features equal to
the bare encoder's, that Triton's statistics name the two steps, and that the report has the side-by-side table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_bench_measures_each_ensemble_next_to_its_bare_encoder(tmp_path):
    cmd = [sys.executable, "-m", "gebackend.cli.main", "bench", "--models", "cnclip_image_standin,cnclip_text_standin",
           "--scenarios", "ge_dynamic+ensemble", "--concurrency", "1,2", "--rounds", "1", "--interval-ms", "1000",
           "--no-ceiling", "--out", str(tmp_path / "out"), "--cache", str(ROOT / "bench" / "models")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (run,) = (tmp_path / "out").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["cnclip_image_standin", "cnclip_text_standin"]
    for model, kind in zip(summary["models"], ("image", "text")):
        (result,) = model["scenarios"]
        assert result["name"] == "ge_dynamic+ensemble" and result["status"] == "ok", result.get("reason")
        info = result["ensemble"]
        assert info["steps"] == [f"cnclip_{kind}_preprocess", f"cnclip_{kind}_encoder"]
        assert info["agreement"]["max_abs_diff"] <= 1e-6 and info["agreement"]["cosine"] >= 0.999999, info["agreement"]
        measured = sorted((r["target"], r["concurrency"]) for r in info["runs"])
        assert measured == [("bare", 1), ("bare", 2), ("ensemble", 1), ("ensemble", 2)]
        for rows in (result["rows"], result["bare_rows"]):
            assert [r["concurrency"] for r in rows] == [1, 2] and all(r["throughput"] > 0 for r in rows)
        steps = info["stats"]["2"]["ensemble"]["steps"]
        assert set(steps) == set(info["steps"]), steps
        assert 0 < info["of_bare"]["2"] < 10 and 0 < info["of_bare_paired"]["2"] < 10
    table = (run / "summary.md").read_text()
    assert "CN_CLIP ensemble vs the bare encoder" in table and "| ge_dynamic+ensemble | 2 |" in table
