"""tools/build_peer_backend.sh (`make peer`) says what is wrong in one line instead of failing halfway.

The build itself needs Triton's sources, which cannot be fetched here; it was run by hand (docs/benchmarks.md#the-peer).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "build_peer_backend.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_an_unknown_argument_is_refused_with_exit_2():
    done = _run("--bogus")
    assert done.returncode == 2
    assert "build_peer_backend: unknown argument --bogus" in done.stderr


def test_a_folder_without_the_checkouts_is_named(tmp_path):
    done = _run("--out", str(tmp_path / "out"), "--src", str(tmp_path), "--python", sys.executable)
    assert done.returncode == 1
    missing_tool = [line for line in done.stderr.splitlines() if "is not installed" in line or "is missing" in line]
    if not missing_tool:  # the machine has the build tools: the sources are what is missing
        assert f"build_peer_backend: {tmp_path}/onnxruntime_backend is not a checkout of onnxruntime_backend" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "onnxruntime" / "libtriton_onnxruntime.so").exists()
