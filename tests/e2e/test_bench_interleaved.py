"""`gebackend bench --interleave` through the real CLI and server: one server holds every scenario of the model,
each served under its own name, measured in rounds whose medians the summary reports.

Numbers are not asserted (a shared machine): what is asserted is that the scenarios shared one server, that every
round measured every scenario, and that the medians are those of the rounds.
Where $GE_PEER_BACKEND_DIR names a built peer (`make peer`), Triton's onnxruntime backend joins the rounds and
every row gets its paired ratio; elsewhere the peer part is left out (it cannot be built without the network).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gebackend.bench import peer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_interleaved_rounds_share_one_server_and_report_medians(tmp_path):
    with_peer = peer.missing() is None and bool(os.environ.get(peer.ENV_VAR))
    names = ["naive", "ge_dynamic"] + (["peer"] if with_peer else [])
    cmd = [sys.executable, "-m", "gebackend.cli.main", "bench", "--models", "tiny", "--scenarios", ",".join(names),
           "--interleave", "--rounds", "2", "--concurrency", "1,2", "--headline", "2", "--no-ceiling",
           "--interval-ms", "500", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "models")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (run,) = (tmp_path / "out").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    (model,) = summary["models"]
    ran = {s["name"]: s for s in model["scenarios"]}
    assert list(ran) == names
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["tiny_interleaved.serve.log"]  # one server
    served = sorted(p.name for p in (run / "repos" / "tiny" / "interleaved").iterdir())
    assert served == sorted(f"tiny__{n}" for n in names)
    for name, result in ran.items():
        assert result["status"] == "ok", (name, result["reason"])
        assert result["served_as"] == f"tiny__{name}"
        assert f'name: "tiny__{name}"' in result["config"]
        assert [(x["round"], x["concurrency"]) for x in result["runs"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
        for level in (1, 2):
            measured = [x["row"]["throughput"] for x in result["runs"] if x["concurrency"] == level]
            (row,) = [r for r in result["rows"] if r["concurrency"] == level]
            assert row["throughput"] == pytest.approx(statistics.median(measured)) and row["rounds"] == 2
        if with_peer:
            assert set(result["x_peer_paired"]) == {"1", "2"}
    table = (run / "summary.md").read_text()
    assert "interleaved: medians of 2 round(s) in one server" in table
    if with_peer:
        assert "(paired " in table
