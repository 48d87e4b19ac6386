"""control/timing_lock.py: instances of one server time their buckets one at a time, and a dead holder frees it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from gebackend.control.env import CONTROL_DIR
from gebackend.control.timing_lock import LOCK, timing_alone

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from gebackend.control.timing_lock import timing_alone
    folder = Path(sys.argv[1])
    with timing_alone({"GE_CONTROL_DIR": str(folder)}):
        (folder / "held").write_text("1")
        while not (folder / "let-go").exists():
            time.sleep(0.01)
        time.sleep(0.3)  # a lock that does not hold would let the other in meanwhile
        (folder / "released").write_text("1")
    time.sleep(60 if sys.argv[2] == "stay" else 0)
""")


def _holder(folder, mode="leave"):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), mode])
    deadline = time.monotonic() + 30
    while not (folder / "held").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.01)
    return process


def test_an_instance_times_only_once_the_other_has_finished(tmp_path):
    holder = _holder(tmp_path)
    (tmp_path / "let-go").write_text("1")
    with timing_alone({CONTROL_DIR: str(tmp_path)}) as waited:
        assert (tmp_path / "released").exists()  # the lock came only after the holder's block ended
        assert waited >= 0.0
    holder.wait(30)


def test_a_killed_holder_frees_the_lock(tmp_path):
    holder = _holder(tmp_path)
    holder.kill()
    holder.wait(30)
    with timing_alone({CONTROL_DIR: str(tmp_path)}):
        assert not (tmp_path / "released").exists()  # it never let go itself: its death did
    assert (tmp_path / LOCK).exists()


def test_without_a_control_folder_nothing_is_locked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with timing_alone({}) as waited:
        assert waited == 0.0
    assert list(tmp_path.iterdir()) == []
