"""Unit tests for the launcher's model-control decisions and the watchdog's bookkeeping (no server started)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gebackend.server.stubs import StubTracker, parse_stub
from gebackend.server import watchdog as wd
from gebackend.server.launcher import ServerSettings, _waiting_on
from gebackend.server.repository_client import CONTROL_HEADER, ModelControl, flag_values, restriction_for


def settings(extra=(), allow=False) -> ServerSettings:
    return ServerSettings(model_repository=Path("/models"), extra_args=list(extra), allow_model_control=allow)


# -- tritonserver flags --------------------------------------------------------------------------------------------
def test_flag_values_reads_both_spellings():
    args = ["--http-address=127.0.0.1", "--log-verbose", "1", "--http-address", "::1", "--http-address"]
    assert flag_values(args, "--http-address") == ["127.0.0.1", "::1"]
    assert flag_values(args, "--log-verbose") == ["1"]
    assert flag_values(args, "--http") == []


def test_restriction_for_finds_the_header_guarding_the_api():
    assert restriction_for(["inference,model-repository:x-key=abc"]) == ("x-key", "abc")
    assert restriction_for(["inference:x-key=abc"]) is None
    assert restriction_for(["model-repository"]) is None  # malformed: no header
    assert restriction_for(["health:a=b", "model-repository:c=d=e"]) == ("c", "d=e")


def test_default_is_explicit_mode_with_repository_api_behind_a_secret():
    control = ModelControl.decide(settings(), "s3cret")
    assert control.mode == "explicit" and control.can_reload
    assert control.header == control.grpc_header == (CONTROL_HEADER, "s3cret")
    assert control.flags == (
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-restricted-api=model-repository:{CONTROL_HEADER}=s3cret",
        f"--grpc-restricted-protocol=model-repository:{CONTROL_HEADER}=s3cret",
    )


def test_allow_model_control_leaves_the_api_open():
    control = ModelControl.decide(settings(allow=True), "s3cret")
    assert control.header is None and control.grpc_header is None
    assert not any("restricted" in flag for flag in control.flags)
    assert control.can_reload


def test_users_own_mode_and_models_are_kept():
    control = ModelControl.decide(settings(["--model-control-mode=poll"]), "s")
    assert control.mode == "poll" and not control.can_reload
    assert not any(flag.startswith(("--model-control-mode", "--load-model")) for flag in control.flags)
    control = ModelControl.decide(settings(["--load-model", "a"]), "s")
    assert "--model-control-mode=explicit" in control.flags and "--load-model=*" not in control.flags


def test_users_own_restriction_is_reused_not_doubled():
    control = ModelControl.decide(settings(["--http-restricted-api=model-repository,inference:mine=42"]), "s")
    assert control.header == ("mine", "42") and control.grpc_header == (CONTROL_HEADER, "s")
    assert not any(flag.startswith("--http-restricted-api") for flag in control.flags)
    assert any(flag.startswith("--grpc-restricted-protocol") for flag in control.flags)
    control = ModelControl.decide(settings(["--grpc-restricted-protocol", "model-repository:theirs=7"]), "s")
    assert control.grpc_header == ("theirs", "7") and control.header == (CONTROL_HEADER, "s")
    assert not any(flag.startswith("--grpc-restricted-protocol") for flag in control.flags)


def test_waiting_on_reads_tritons_exit_countdown():
    assert _waiting_on('I1129 http_server.cc:248] "Timeout 29: Found 1 HTTP service connections"\n') == \
        "1 HTTP service connections"
    assert _waiting_on('I1129 server.cc:345] "Timeout 3: Found 1 live models and 0 in-flight non-inference requests"') \
        == "1 live models and 0 in-flight non-inference requests"
    assert _waiting_on("I1129 model_lifecycle.cc:624] \"successfully unloaded 'bert' version 1\"") is None


# -- watchdog --------------------------------------------------------------------------------------------------------
STAT = "{pid} (triton_python_b) {state} 10 10 10 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 9 0 {start} 100 200"


def stub(pid, instance, model="m", start=1000, state="S"):
    argv = ["/x/backends/python/triton_python_backend_stub", f"/repo/{model}/1/model.py", "shm", "1048576",
            "1048576", "10", "/x/backends/python", "336", instance, "/x/backends/ge"]
    return parse_stub(pid, STAT.format(pid=pid, state=state, start=start), argv)


def test_parse_stub_reads_model_instance_and_state():
    s = stub(42, "bert_0_1", model="bert", start=777, state="Z")
    assert (s.pid, s.started, s.model, s.instance, s.zombie) == (42, 777, "bert", "bert_0_1", True)
    assert s.serves_instance
    assert not stub(43, "bert", model="bert").serves_instance  # the auto-complete stub
    assert parse_stub(44, STAT.format(pid=44, state="S", start=1), ["/usr/bin/python3", "x.py"]) is None


def test_tracker_reports_a_dead_instance_once():
    tracker = StubTracker()
    a, b = stub(1, "m_0"), stub(2, "m_1")
    assert tracker.update([a, b]) == []
    assert tracker.update([a, b]) == []
    assert tracker.update([a]) == [b]  # b's process is gone
    assert tracker.update([a]) == []


def test_tracker_treats_a_zombie_as_dead():
    tracker = StubTracker()
    tracker.update([stub(1, "m_0")])
    assert tracker.update([stub(1, "m_0", state="Z")]) == [stub(1, "m_0")]


def test_tracker_ignores_a_replaced_instance_and_the_auto_complete_stub():
    tracker = StubTracker()
    tracker.update([stub(1, "m_0"), stub(9, "m")])
    # A reload: the new stub serving m_0 is up before the old one exits; the auto-complete stub ends.
    assert tracker.update([stub(1, "m_0"), stub(5, "m_0")]) == []
    assert tracker.update([stub(5, "m_0")]) == []


def test_tracker_tells_a_reused_pid_apart():
    tracker = StubTracker()
    tracker.update([stub(1, "m_0", start=100)])
    assert tracker.update([stub(1, "other_0", model="other", start=200)]) == [stub(1, "m_0", start=100)]


def test_backoff_grows_and_is_capped():
    assert [wd.backoff(n) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]


class FakeRepository:
    """Triton's repository API; a load starts a new stub for the model's instance `<model>_0` in `table`."""

    def __init__(self, states):
        self.states = dict(states)
        self.calls = []
        self.table = None
        self.next_pid = 5000

    def repository_index(self):
        return [{"name": k, "state": v} for k, v in self.states.items()]

    def unload_model(self, name, timeout=0):
        self.calls.append(("unload", name))

    def load_model(self, name, timeout=0):
        self.calls.append(("load", name))
        self.respawn(name)

    def respawn(self, name):
        if self.table is not None:
            self.next_pid += 1
            self.table.now.append(stub(self.next_pid, f"{name}_0", model=name, start=self.next_pid))


class FakeTable:
    def __init__(self):
        self.now = []

    def stubs(self):
        return list(self.now)

    refresh = stubs


def watchdog_with(states):
    repo, said = FakeRepository(states), []
    dog = wd.Watchdog(0, repo, said.append)
    dog.table = FakeTable()
    repo.table = dog.table
    return dog, repo, said


def test_watchdog_reloads_a_ready_model_that_lost_a_stub():
    dog, repo, said = watchdog_with({"m": "READY", "n": "READY"})
    dog.table.now = [stub(1, "m_0"), stub(2, "n_0", model="n")]
    assert dog.check() == []
    dog.table.now = [stub(2, "n_0", model="n")]
    assert dog.check() == ["m"]
    assert repo.calls == [("unload", "m"), ("load", "m")]
    assert dog.restores == {"m": 1} and dog.unrestored == set()
    assert any("'m_0' (pid 1) died" in line for line in said) and any("restored in" in line for line in said)


def test_watchdog_leaves_a_model_being_unloaded_alone():
    dog, repo, _ = watchdog_with({"m": "UNLOADING"})
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    dog.table.now = []
    assert dog.check() == [] and repo.calls == []


def test_watchdog_reports_a_failed_restore_and_backs_off(monkeypatch):
    dog, repo, said = watchdog_with({"m": "READY"})

    def fail(name, timeout=0):
        raise RuntimeError("load of model 'm' failed: boom")

    repo.load_model = fail
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    dog.table.now = []
    assert dog.check() == []
    assert any("could not be restored: load of model 'm' failed: boom" in line for line in said)
    assert dog.unrestored == {"m"} and dog._failures["m"][0] == 1
    waits = []
    monkeypatch.setattr(dog._stop, "wait", lambda seconds: waits.append(seconds) or False)
    repo.load_model = lambda name, timeout=0: (repo.calls.append(("load", name)), repo.respawn(name))
    dog.table.now = [stub(3, "m_0", start=5)]
    dog.check()
    dog.table.now = []
    assert dog.check() == ["m"] and waits == [1.0]


def test_broken_models_takes_a_last_look():
    dog, _, _ = watchdog_with({"m": "READY"})
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    dog.table.now = [stub(1, "m_0", state="Z")]
    assert dog.broken_models() == {"m"}


def test_process_table_lists_only_stub_children(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    for pid, ppid, argv in [(10, 1, ["tritonserver"]), (11, 10, None),
                            (12, 99, None), (13, 10, ["/bin/sh", "-c", "x"])]:
        folder = proc / str(pid)
        folder.mkdir(parents=True)
        (folder / "stat").write_text(f"{pid} (x) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 1 1")
        if argv is None:
            argv = ["/b/triton_python_backend_stub", "/repo/m/1/model.py", "shm", "1", "1", "10", "/b", "1",
                    f"m_{pid}", "/b/ge"]
        (folder / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    (proc / "self").mkdir()
    monkeypatch.setattr(wd, "PROC", proc)
    stubs = wd.ProcessTable(10).stubs()
    assert [(s.pid, s.model, s.instance, s.started) for s in stubs] == [(11, "m", "m_11", 555)]


def test_process_table_refresh_rereads_only_the_last_scan(tmp_path, monkeypatch):
    proc = tmp_path / "proc"

    def make(pid, state="S", start=555):
        folder = proc / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stat").write_text(f"{pid} (x) {state} 10 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1 1")
        argv = ["/b/triton_python_backend_stub", "/repo/m/1/model.py", "shm", "1", "1", "10", "/b", "1", f"m_{pid}", "/b/ge"]
        (folder / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")

    make(11)
    make(12)
    monkeypatch.setattr(wd, "PROC", proc)
    table = wd.ProcessTable(10)
    assert [s.pid for s in table.stubs()] == [11, 12]
    make(13)  # not seen by refresh: only a full scan finds new stubs
    make(11, state="Z")
    make(12, start=999)  # pid 12 died and was reused
    assert [(s.pid, s.zombie) for s in table.refresh()] == [(11, True)]
    assert sorted(s.pid for s in table.stubs()) == [11, 12, 13]


def test_watchdog_scans_everything_after_a_load_and_otherwise_refreshes():
    dog, _, _ = watchdog_with({})
    calls = []
    dog.table.stubs = lambda: calls.append("scan") or []
    dog.table.refresh = lambda: calls.append("refresh") or []
    dog.start()
    dog.stop()
    dog._check()
    dog.notice_line('I1129 model_lifecycle.cc:839] "successfully loaded \'m\'"')
    dog._check()
    dog._check()
    assert calls == ["scan", "refresh", "scan", "refresh"]


def test_process_table_on_this_machine_is_cheap_and_empty_for_a_childless_parent():
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc")
    assert wd.ProcessTable(os.getpid()).stubs() == []


def test_watchdog_thread_survives_a_failing_check():
    dog, _, said = watchdog_with({})
    dog.interval = 0.01
    done = threading.Event()

    def boom():
        done.set()
        raise OSError("no /proc")

    dog.check = boom
    dog.start()
    assert done.wait(5)
    dog.stop()
    assert any("watchdog: check failed: OSError: no /proc" in line for line in said)


def test_watchdog_with_healing_off_only_reports():
    dog, repo, said = watchdog_with({"m": "READY"})
    dog.heal, dog.why_not = False, "--no-self-healing"
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    dog.table.now = []
    assert dog.check() == [] and repo.calls == []
    assert dog.unrestored == {"m"}
    assert any("not reloading it (--no-self-healing)" in line for line in said)


def test_repository_fingerprints_change_with_any_file_of_a_model(tmp_path):
    from gebackend.server.repository_client import repository_fingerprints

    (tmp_path / "a" / "1").mkdir(parents=True)
    (tmp_path / "a" / "1" / "model.onnx").write_bytes(b"1")
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    first = repository_fingerprints(tmp_path)
    assert set(first) == {"a", "b"} and first["b"] == ()
    (tmp_path / "a" / "1" / "model.onnx").write_bytes(b"22")
    second = repository_fingerprints(tmp_path)
    assert second["a"] != first["a"] and second["b"] == first["b"]
    cache = tmp_path / "a" / "1" / ".gebackend-cache" / "tensorrt-x"
    cache.mkdir(parents=True)
    (cache / "engine.bin").write_bytes(b"trt")  # a cache written beside the model is not a change of the model
    assert repository_fingerprints(tmp_path) == second


def test_paused_watchdog_skips_checks_and_does_not_mourn_what_changed_meanwhile():
    dog, repo, said = watchdog_with({"m": "READY"})
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    with dog.paused():
        dog.table.now = [stub(2, "m_0", start=7)]  # a reload replaced the instance ...
        assert dog.check() == []  # ... and the watchdog stays out of the way meanwhile
        dog.table.now = []  # a failed reload attempt's stub came and went
    dog.table.now = [stub(2, "m_0", start=7)]
    assert dog.check() == [] and repo.calls == [] and not any("died" in line for line in said)


def test_sweep_removes_only_what_dead_servers_left(tmp_path, monkeypatch):
    from gebackend.control import registry

    monkeypatch.setenv("GE_RUNTIME_DIR", str(tmp_path / "run"))
    shm = tmp_path / "shm"
    shm.mkdir()
    dead_pid = 2**22 + 12345  # above any pid_max default: no such process
    for pid, port in ((dead_pid, 1), (os.getpid(), 2)):
        workdir = tmp_path / f"gebackend-{port}"
        (workdir / "control").mkdir(parents=True)
        (shm / f"gebackend{pid}xabc_1").write_text("")
        registry.register(port, workdir / "control")
        entry = registry.registry_dir() / f"{port}.json"
        entry.write_text(entry.read_text().replace(str(os.getpid()), str(pid)))
    (tmp_path / "run" / "gebackend" / "servers" / "3.json").write_text("not json")
    removed = registry.sweep_stale(shm)
    assert removed == [str(tmp_path / "gebackend-1"), str(shm / f"gebackend{dead_pid}xabc_1")]
    assert (tmp_path / "gebackend-2").is_dir() and (shm / f"gebackend{os.getpid()}xabc_1").exists()
    assert sorted(p.name for p in registry.registry_dir().iterdir()) == ["2.json", "3.json"]


def test_allowed_model_control_still_uses_the_users_own_restriction():
    control = ModelControl.decide(settings(["--grpc-restricted-protocol=model-repository:k=v"], allow=True), "s")
    assert control.grpc_header == ("k", "v") and control.header is None
    assert not any("restricted" in flag for flag in control.flags)


def test_tritonserver_crashes_back_off_and_a_stable_run_starts_the_count_afresh():
    from gebackend.server.supervisor import Crashes

    now = [0.0]
    crashes = Crashes(stable_after=60.0, clock=lambda: now[0])
    pauses = []
    for t in (100.0, 101.0, 103.0, 107.0):
        now[0] = t
        pauses.append(crashes.record())
    assert pauses == [0.0, 1.0, 2.0, 4.0]
    assert crashes.describe() == " (4 times in a row)"
    now[0] = 200.0  # ran 93 s since the last crash
    assert crashes.record() == 0.0 and crashes.describe() == "" and crashes.total == 5


def test_a_failed_restore_is_tried_again_after_its_backoff_without_a_new_death():
    import time as clock

    dog, repo, said = watchdog_with({"m": "READY"})
    attempts = []

    def load(name, timeout=0):
        attempts.append(name)
        if len(attempts) == 1:
            raise RuntimeError("load failed for model 'm': Stub process 'm_0' is not healthy")
        repo.calls.append(("load", name))
        repo.respawn(name)

    repo.load_model = load
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    dog.table.now = []
    assert dog.check() == [] and dog.unrestored == {"m"}  # the restore failed
    assert dog.check() == [] and len(attempts) == 1  # not yet: its backoff (1 s) has not passed
    deaths, _ = dog._failures["m"]
    dog._failures["m"] = (deaths, clock.monotonic() - 1.5)
    assert dog.check() == ["m"] and len(attempts) == 2
    assert dog.unrestored == set() and dog.restores == {"m": 1}
    assert any("its last restore failed; trying again" in line for line in said)
    dog.heal = False  # with healing off nothing is retried
    dog.unrestored, dog._failures["m"] = {"m"}, (1, 0.0)
    assert dog.check() == [] and len(attempts) == 2


def test_a_new_stub_that_dies_before_the_next_round_fails_the_restore_and_is_retried(monkeypatch):
    """The race seen under repeated kills: the restored model's new stub died before the watchdog ever saw it
    alive, and the model answered 500 'not healthy' for good."""
    import time as clock

    dog, repo, said = watchdog_with({"m": "READY", "n": "READY"})
    loads = []
    repo.load_model = lambda name, timeout=0: loads.append(name)  # its new stub is dead before anyone looks
    dog.table.now = [stub(1, "m_0"), stub(2, "n_0", model="n")]
    dog.check()
    dog.table.now = [stub(2, "n_0", model="n")]
    assert dog.check() == [] and loads == ["m"]
    assert dog.unrestored == {"m"}
    assert any("could not be restored: instance(s) m_0 died as soon as the model loaded" in line for line in said)
    repo.load_model = lambda name, timeout=0: (loads.append(name), repo.respawn(name))
    dog._failures["m"] = (dog._failures["m"][0], clock.monotonic() - 2)
    assert dog.check() == ["m"] and loads == ["m", "m"] and dog.unrestored == set()
    waits = []
    monkeypatch.setattr(dog._stop, "wait", lambda seconds: waits.append(seconds) or False)
    dog.table.now = [s for s in dog.table.now if s.model == "n"]  # the stub it restored dies later: seen, restored
    assert dog.check() == ["m"] and dog.restores["m"] == 2 and waits == [2.0]


def test_a_change_made_as_soon_as_the_server_is_ready_is_reloaded_by_the_next_sighup(tmp_path):
    """The files are read before the server loads them, not after it is ready: a change made right after "ready" (a
    user's, or a test's, on a loaded machine) is seen by the next SIGHUP (before: 'reloading nothing')."""
    import contextlib
    from types import SimpleNamespace

    from gebackend.server.supervisor import SignalFlag, Supervisor

    (tmp_path / "a" / "1").mkdir(parents=True)
    (tmp_path / "a" / "1" / "model.onnx").write_bytes(b"first")
    stop, reload = SignalFlag(), SignalFlag()
    loaded, said = [], []

    def load_model(name):
        loaded.append(name)
        stop.set()

    server = SimpleNamespace(
        process=SimpleNamespace(poll=lambda: None), control=SimpleNamespace(can_reload=True),
        settings=SimpleNamespace(model_repository=tmp_path), repository=SimpleNamespace(load_model=load_model),
        shutdown=lambda broken: 0)
    dog = SimpleNamespace(paused=contextlib.nullcontext, stop=lambda: None, broken_models=lambda: [])

    class Fake(Supervisor):
        def start(self, flag):
            return server, []

        def start_watchdog(self, started):
            return dog

    def ready(started, index):  # the user changes the model the moment the server says it is ready, then SIGHUP
        (tmp_path / "a" / "1" / "model.onnx").write_bytes(b"second, longer")
        reload.set()

    supervisor = Fake(ServerSettings(model_repository=tmp_path), say=said.append)
    timer = threading.Timer(10, stop.set)  # a reload that never comes must fail the test, not hang it
    timer.start()
    try:
        assert supervisor.serve(stop, reload, ready) == 0
    finally:
        timer.cancel()
    assert loaded == ["a"], said
    assert "SIGHUP: reloading a" in said
