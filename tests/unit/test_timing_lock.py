"""control/timing_lock.py: an instance times its buckets while no other instance of the server loads or times;
loads run side by side; two loads reaching their timing together take turns; a dead holder frees the lock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from gebackend.control.env import CONTROL_DIR
from gebackend.control.timing_lock import LOCK, loading, timing_alone

HOLDER = textwrap.dedent("""
    import contextlib, sys, time
    from pathlib import Path
    from gebackend.control.timing_lock import loading, timing_alone
    folder, what = Path(sys.argv[1]), sys.argv[2]
    env = {"GE_CONTROL_DIR": str(folder)}
    with loading(env) if what.startswith("load") else contextlib.nullcontext():
        (folder / "held").write_text("1")
        while not (folder / "let-go").exists():
            time.sleep(0.01)
        with timing_alone(env) if what in ("time", "load-then-time") else contextlib.nullcontext():
            (folder / "timing").write_text("1")
            time.sleep(0.3)  # a lock that does not hold would let the other in meanwhile
            (folder / "released").write_text("1")
    time.sleep(60 if what == "load-forever" else 0)
""")


def _holder(folder, what):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), what])
    deadline = time.monotonic() + 30
    while not (folder / "held").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.01)
    return process


def _env(folder):
    return {CONTROL_DIR: str(folder)}


def test_an_instance_times_only_once_the_other_has_finished_timing(tmp_path):
    holder = _holder(tmp_path, "time")
    (tmp_path / "let-go").write_text("1")
    while not (tmp_path / "timing").exists():
        time.sleep(0.01)
    with timing_alone(_env(tmp_path)) as wait:
        assert (tmp_path / "released").exists()  # the lock came only after the holder's block ended
        assert wait.alone and wait.seconds > 0.0
    assert holder.wait(30) == 0


def test_an_instance_times_only_once_another_has_finished_loading(tmp_path):
    holder = _holder(tmp_path, "load")
    with loading(_env(tmp_path)):  # loads go side by side: this one is in while the holder loads
        (tmp_path / "let-go").write_text("1")
        with timing_alone(_env(tmp_path)) as wait:
            assert (tmp_path / "released").exists()  # the holder's load ended before this timing began
            assert wait.alone
    assert holder.wait(30) == 0


def test_two_loads_reaching_their_timing_together_take_turns(tmp_path):
    holder = _holder(tmp_path, "load-then-time")
    with loading(_env(tmp_path)):
        (tmp_path / "let-go").write_text("1")
        time.sleep(0.3)  # the holder now waits for its timing, on this load's shared hold
        with timing_alone(_env(tmp_path), max_wait=30) as wait:
            assert wait.alone  # neither load waited on the other until the deadline
            finished = (tmp_path / "released").exists()
            assert (tmp_path / "timing").exists() == finished  # the holder timed before this, or not yet
            time.sleep(0.3)
            assert (tmp_path / "timing").exists() == finished  # ... and not during it
    assert holder.wait(30) == 0
    assert (tmp_path / "released").exists()


def test_a_timing_that_waited_too_long_times_anyway_and_says_so(tmp_path):
    holder = _holder(tmp_path, "load-forever")
    try:
        with timing_alone(_env(tmp_path), max_wait=0.3) as wait:
            assert not wait.alone
            assert wait.seconds >= 0.3
            assert not (tmp_path / "released").exists()
    finally:
        holder.kill()
        holder.wait(30)


def test_a_killed_holder_frees_the_lock(tmp_path):
    holder = _holder(tmp_path, "load")
    holder.kill()
    holder.wait(30)
    with timing_alone(_env(tmp_path), max_wait=30) as wait:
        assert wait.alone
        assert not (tmp_path / "released").exists()  # it never let go itself: its death did
    assert (tmp_path / LOCK).exists()


def test_without_a_control_folder_nothing_is_locked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with loading({}):
        with timing_alone({}) as wait:
            assert wait.seconds == 0.0 and wait.alone
    assert list(tmp_path.iterdir()) == []
