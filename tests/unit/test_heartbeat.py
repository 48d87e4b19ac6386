"""Unit tests for instance heartbeats (control/heartbeat.py) and the watchdog killing a hung stub (no server started)."""

from __future__ import annotations

import os
import signal
import time

from gebackend.server import watchdog as wd
from gebackend.control.heartbeat import Beat, Heartbeat, heartbeat_file, own_start_time, read_beat

from test_server_control import stub, watchdog_with


def test_a_record_survives_the_round_trip_and_a_torn_one_is_ignored():
    beat = Beat(100.5, 99.0, 30.0)
    assert Beat.unpack(beat.pack()) == beat
    torn = bytearray(beat.pack())
    torn[3] ^= 0xFF
    assert Beat.unpack(bytes(torn)) is None
    assert Beat.unpack(beat.pack()[:16]) is None


def test_hung_means_too_long_inside_execute_or_silent_too_long():
    assert Beat(100.0, 0.0, 30.0).hung(129.0) is None  # idle, beating
    assert Beat(100.0, 90.0, 30.0).hung(119.0) is None  # busy 29 s
    assert "inside one execute() for 31s (hang_timeout_s=30)" in Beat(120.0, 90.0, 30.0).hung(121.0)
    assert "silent for 31s" in Beat(100.0, 0.0, 30.0).hung(131.0)
    assert Beat(0.0, 1.0, 0.0).hung(1e9) is None  # hang_timeout_s=0: never


def test_heartbeat_beats_marks_execute_and_removes_its_file(tmp_path):
    heart = Heartbeat(tmp_path, timeout=5.0, interval=0.02)
    path = heartbeat_file(tmp_path, os.getpid(), own_start_time())
    try:
        assert heart.path == path
        first = read_beat(path)
        assert first is not None and first.busy_since == 0.0 and first.timeout == 5.0
        heart.enter()
        time.sleep(0.1)
        busy = read_beat(path)
        assert busy.beat > first.beat and busy.busy_since == heart.busy_since > 0
        heart.leave()
        time.sleep(0.1)
        assert read_beat(path).busy_since == 0.0
    finally:
        heart.close()
    assert not path.exists()
    assert read_beat(path) is None


def write_beat(control, s, beat: Beat) -> None:
    path = heartbeat_file(control, s.pid, s.started)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(beat.pack())


def test_watchdog_kills_a_hung_stub_once_then_restores_its_model(tmp_path, monkeypatch):
    dog, repo, said = watchdog_with({"m": "READY", "n": "READY"})
    dog.control_dir = tmp_path
    killed = []
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    hung, fine = stub(1, "m_0"), stub(2, "n_0", model="n")
    now = time.monotonic()
    write_beat(tmp_path, hung, Beat(now, now - 31, 30.0))  # inside execute() for 31 s
    write_beat(tmp_path, fine, Beat(now, now - 29, 30.0))  # a long run, still within its timeout
    dog.table.now = [hung, fine]
    assert dog.check() == []
    assert killed == [(1, signal.SIGKILL)]
    assert dog.check() == [] and killed == [(1, signal.SIGKILL)]  # killed once
    dog.table.now = [fine]  # it died of the kill
    assert dog.check() == ["m"]
    assert repo.calls == [("unload", "m"), ("load", "m")]
    assert any("instance 'm_0' (pid 1) is hung: inside one execute() for 31s" in line and "killing it" in line
               for line in said)
    assert any("'m_0' (pid 1) was killed (hung); reloading the model" in line for line in said)
    assert not heartbeat_file(tmp_path, 1, hung.started).exists()  # its record went with it
    dog.check()
    assert dog._hung == {}


def test_watchdog_ignores_stubs_without_a_record_and_with_healing_off_only_reports(tmp_path, monkeypatch):
    dog, repo, said = watchdog_with({"m": "READY"})
    dog.control_dir = tmp_path
    dog.heal, dog.why_not = False, "--no-self-healing"
    killed = []
    monkeypatch.setattr(wd.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    loading, frozen = stub(1, "m_0"), stub(2, "m_1")
    now = time.monotonic()
    write_beat(tmp_path, frozen, Beat(now - 200, 0.0, 120.0))
    dog.table.now = [loading, frozen]
    dog.check()
    dog.check()
    assert killed == [] and repo.calls == []
    lines = [line for line in said if "is hung" in line]
    assert len(lines) == 1 and "'m_1' (pid 2) is hung: silent for 200s" in lines[0]
    assert "not killing it (--no-self-healing)" in lines[0]
