"""The watchdog learns the stubs while the server loads (before it is ready), so that a stub that dies before
`ready`, or on the first request, is restored; the stop counts a model with an unreaped stub as down; a stub that is
a script run by its interpreter is a stub too."""

from __future__ import annotations

import time

from gebackend.server.stubs import stub_identity
from gebackend.server import watchdog as wd

from test_server_control import stub, watchdog_with


def test_a_stub_that_died_while_the_server_loaded_is_restored_once_it_is_ready():
    dog, repo, said = watchdog_with({"m": "READY", "n": "READY"})
    dog._armed = False  # as `observe()` leaves it, without its thread
    dog.table.now = [stub(1, "m_0"), stub(2, "n_0", model="n")]
    assert dog.check() == []
    dog.table.now = [stub(1, "m_0", state="Z"), stub(2, "n_0", model="n")]  # dead before `ready`
    assert dog.check() == []
    assert repo.calls == [] and said == [], "nothing is done, nor Triton asked, before the server is ready"
    dog.start()
    try:
        deadline = time.monotonic() + 5
        while ("load", "m") not in repo.calls:
            assert time.monotonic() < deadline, (repo.calls, said)
            time.sleep(0.01)
    finally:
        dog.stop()
    assert repo.calls == [("unload", "m"), ("load", "m")]
    assert any("'m_0' (pid 1) died; reloading the model" in line for line in said)


def test_a_stub_that_died_while_its_load_failed_is_left_alone():
    dog, repo, said = watchdog_with({"m": "UNAVAILABLE"})
    dog._armed = False
    dog.table.now = [stub(1, "m_0")]
    dog.check()
    dog.table.now = []
    dog.check()
    dog._armed = True
    assert dog.check() == [] and repo.calls == [] and said == []


def test_the_stop_counts_a_model_whose_stub_was_never_reaped_as_down():
    """A zombie stub: a request met it, so tritonserver can never finish unloading that model; the drain must not
    wait for it, even where the watchdog never mourned it."""
    dog, _, _ = watchdog_with({"m": "READY", "n": "READY", "r": "READY"})
    dog.table.now = [stub(1, "m_0", state="Z"), stub(2, "n_0", model="n"), stub(3, "n", model="n", state="Z"),
                     stub(4, "r_0", model="r", state="Z"), stub(5, "r_0", model="r")]
    # n's zombie is its auto-complete stub, no instance; r was restored: a live process serves r_0 in its place
    assert dog.broken_models() == {"m"}


def test_a_stub_that_is_a_script_is_still_a_stub():
    args = ["/repo/m/1/model.py", "shm", "1048576", "1048576", "10", "/x/backends/python", "336", "m_0", "/x/ge"]
    assert stub_identity(["/bin/sh", "/repo/m/triton_python_backend_stub", *args]) == ("m", "m_0")
    assert stub_identity(["/x/backends/python/triton_python_backend_stub", *args]) == ("m", "m_0")
    assert stub_identity(["/bin/sh", "/repo/m/run.sh", *args]) is None


def test_the_supervisor_watches_from_the_start_of_the_server_and_then_arms_that_watchdog(monkeypatch, tmp_path):
    import os
    from types import SimpleNamespace

    from gebackend.server import supervisor as sup
    from gebackend.server.launcher import ServerSettings

    seen: dict = {}

    class Server:
        def __init__(self, settings):
            self.process = SimpleNamespace(pid=os.getpid())
            self.repository = SimpleNamespace(repository_index=lambda: [])
            self.control = SimpleNamespace(can_reload=True, mode="explicit")
            self.control_dir = None
            self.watchers = []

        def start(self):
            pass

        def watch_lines(self, callback):
            self.watchers.append(callback)

        def wait_ready(self, stop):
            seen["while loading"] = supervisor._observing  # the watchdog exists before the server is ready
            return [{"name": "m", "state": "READY"}]

    monkeypatch.setattr(sup, "TritonServer", Server)
    supervisor = sup.Supervisor(ServerSettings(model_repository=tmp_path), say=lambda line: None)
    server, index = supervisor.start(sup.SignalFlag())
    learning = seen["while loading"]
    assert learning is not None and not learning._armed and learning._thread.is_alive()
    assert server.watchers == [learning.notice_line]
    armed = supervisor.start_watchdog(server)
    try:
        assert armed is learning and armed._armed and supervisor._observing is None
    finally:
        armed.stop()
    assert not armed._thread.is_alive()


def test_a_child_caught_between_fork_and_exec_is_a_stub_once_it_has_exec_d(tmp_path, monkeypatch):
    """Triton forks (the child's command line is tritonserver's), runs `bash -c "exec <stub> ..."`, and the stub.
    The same process, the same start time: the first command line seen must not stick (seen: such a stub was never
    told, and its death on its first request never restored, while the watchdog scanned as models loaded)."""
    folder = tmp_path / "proc" / "11"
    folder.mkdir(parents=True)
    (folder / "stat").write_text("11 (x) S 10 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 1 1")
    monkeypatch.setattr(wd, "PROC", tmp_path / "proc")
    table = wd.ProcessTable(10)
    stub_argv = ["/b/triton_python_backend_stub", "/repo/m/1/model.py", "shm", "1", "1", "10", "/b", "1", "m_0", "/b/ge"]
    for argv in (["/x/bin/tritonserver", "--model-repository=/repo"], ["bash", "-c", " exec " + " ".join(stub_argv)]):
        (folder / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        assert table.stubs() == []
    (folder / "cmdline").write_bytes("\0".join(stub_argv).encode() + b"\0")
    assert [(s.pid, s.instance) for s in table.stubs()] == [(11, "m_0")]
    (folder / "cmdline").write_bytes(b"")  # dead: a zombie's command line is empty, the one read alive is kept
    (folder / "stat").write_text("11 (x) Z 10 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 1 1")
    assert [(s.instance, s.zombie) for s in table.stubs()] == [("m_0", True)]
