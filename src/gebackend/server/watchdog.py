"""Notices a model instance whose backend stub process died and restores the model.

Facts this is built on (tritonserver 2.51, Python-based backends): when an instance's
`triton_python_backend_stub` dies (crash, OOM kill, `kill -9`), Triton keeps the model READY,
answers every later request to it with 500 "Stub process '<instance>' is not healthy" (after ~1 s),
and never restarts it; the dead stub stays a zombie child of tritonserver. Unloading the model and
loading it again (explicit model-control mode) serves it from fresh stubs. Once a request has met
the dead stub, that old model version never finishes unloading (the request is never released),
but the new load does not wait for it.

So twice a second the watchdog looks at tritonserver's stub children in `/proc` (no extra
dependency: ~70 us re-reading the stubs it knows; a full scan, ~2 ms, every 15 s and at once
whenever Triton logs a model loading), remembers which model instance each one serves, and when one is
gone or a zombie while no other live stub serves that instance, and Triton still calls the model
READY, it unloads the model and loads it again through the CLI's model-repository access, and
logs both. A model that keeps dying is reloaded after a growing pause (1 s, 2 s, 4 s ... 60 s).

It learns the stubs from the first model load on (`observe()`: a full scan ten times a second while
the server loads, and at each line Triton logs of a model loading; `start()`, once it is ready, then
acts): a zombie's command line is empty, so a stub first looked at once dead could never be told, and
one that died before the server said ready (or on a request sent as soon as Triton answered) was never
restored, and held the stop for the whole exit timeout.

A stub that is alive but hung (inside one run, or frozen, for longer than its model's
`hang_timeout_s`) is told by its heartbeat (control/heartbeat.py): the watchdog kills it, and it is
then restored like any dead stub.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol

from gebackend.control.heartbeat import heartbeat_file, read_beat
from gebackend.control.procfs import read_stat, stat_fields as _fields
from gebackend.server.stubs import Stub, StubTracker, parse_stub

PROC = Path("/proc")
LEARN_INTERVAL = 0.1  # seconds between full scans while the server loads its models (~2 ms each)


def _stat(pid: int) -> str | None:
    return read_stat(pid, PROC)


class ProcessTable:
    """Lists the stub children of one process from `/proc`, reading each stub's command line once.

    `stubs()` scans every process (a few milliseconds); `refresh()` re-reads only the stubs the last scan
    found (microseconds), which is all it takes to see one die.
    """

    def __init__(self, parent_pid: int):
        self.parent_pid = parent_pid
        self._argv: dict[tuple[int, int], list[str]] = {}
        self._last: list[Stub] = []

    def stubs(self) -> list[Stub]:
        found = []
        seen = set()
        parent = str(self.parent_pid)
        for entry in os.scandir(PROC):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _stat(pid)
            if stat is None:
                continue
            fields = _fields(stat)
            if len(fields) < 20 or fields[1] != parent:
                continue
            ident = (pid, int(fields[19]))
            seen.add(ident)
            argv = self._argv.get(ident)
            if argv is None:
                try:
                    raw = (PROC / str(pid) / "cmdline").read_bytes()
                except OSError:
                    continue
                if not raw:  # a zombie has no command line left; we cannot tell whose it was
                    continue
                argv = raw.rstrip(b"\0").decode(errors="replace").split("\0")
            stub = parse_stub(pid, stat, argv)
            if stub is not None:
                # Only a stub's command line is kept: a child caught between Triton's fork and its exec of the stub
                # (tritonserver's own command line, then `bash -c "exec ..."`) is the same process, read again next time.
                self._argv[ident] = argv
                found.append(stub)
        for ident in set(self._argv) - seen:
            del self._argv[ident]
        self._last = found
        return found

    def refresh(self) -> list[Stub]:
        """The stubs of the last scan still running as the same process, each with its current state."""
        found = []
        for stub in self._last:
            stat = _stat(stub.pid)
            if stat is None:
                continue
            fields = _fields(stat)
            if len(fields) < 20 or int(fields[19]) != stub.started:
                continue  # gone, and the pid reused
            found.append(Stub(stub.pid, stub.started, stub.model, stub.instance, fields[0] in ("Z", "X")))
        return found


class ModelRepository(Protocol):
    def repository_index(self) -> list[dict]: ...
    def load_model(self, name: str, timeout: float = ...) -> None: ...
    def unload_model(self, name: str, timeout: float = ...) -> None: ...


def backoff(failures: int, first: float = 1.0, limit: float = 60.0) -> float:
    """Seconds to wait before reloading a model that died `failures` times in a row (0 the first time)."""
    return 0.0 if failures <= 0 else min(limit, first * 2 ** (failures - 1))


class Watchdog:
    """A daemon thread that restores models whose stub died. `start()` after the server is ready, `stop()` before stopping it."""

    def __init__(
        self,
        server_pid: int,
        repository: ModelRepository,
        say: Callable[[str], None],
        interval: float = 0.5,
        stable_after: float = 60.0,
        heal: bool = True,
        why_not: str = "",
        control_dir: Path | None = None,
    ):
        self.table = ProcessTable(server_pid)
        self.tracker = StubTracker()
        self.repository = repository
        self.say = say
        self.interval = interval
        self.stable_after = stable_after  # a model that ran this long since its last restore starts afresh
        self.heal = heal  # False: only notice and report (self-healing off, or impossible in this mode)
        self.why_not = why_not
        self.control_dir = control_dir  # where instances beat (None: hung stubs go unnoticed)
        self._hung: dict[tuple[int, int], str] = {}  # stubs found hung (killed, or only reported): why
        self._expected: dict[str, set[str]] = {}  # model -> its instances, remembered across its restores
        self._pending: list[Stub] = []  # deaths seen while a restore looked at the stubs, for the next round
        self.restores: dict[str, int] = {}  # model -> restores done
        self.unrestored: set[str] = set()  # models that lost a stub and are not serving from fresh ones (yet)
        self._failures: dict[str, tuple[int, float]] = {}  # model -> (consecutive deaths, when restored)
        self.full_scan_every = 15.0  # seconds; a load Triton logs asks for one at once
        self._rescan = threading.Event()
        self._last_full = 0.0
        self._armed = True  # False while `observe()`s: stubs are learnt, deaths kept for `start()`
        self._wake = threading.Event()  # a model loading: look now, not at the next tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = threading.Lock()  # held while stubs are checked and models restored, or by `paused()`

    def notice_line(self, line: str) -> None:
        """Fed every line tritonserver prints: a model (re)loading means new stubs, so look at all processes next."""
        if "successfully loaded" in line or "loading: " in line or "successfully unloaded" in line:
            self._rescan.set()
            self._wake.set()

    def _stubs(self) -> list[Stub]:
        now = time.monotonic()
        if self._rescan.is_set() or now - self._last_full >= self.full_scan_every:
            self._rescan.clear()
            self._last_full = now
            return self.table.stubs()
        return self.table.refresh()

    def observe(self) -> "Watchdog":
        """While the server loads its models: learn every stub as it comes, restore nothing yet (`start()` acts on
        the deaths seen meanwhile, of the models then READY)."""
        self._armed = False
        self._launch()
        return self

    def start(self) -> "Watchdog":
        with self.busy:
            self._rescan.set()
            self._pending += self.tracker.update(self._stubs())
            self._armed = True
        if self._pending:
            self._wake.set()
        if self._thread is None:
            self._launch()
        return self

    def _launch(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gebackend-watchdog", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop checking. A restore blocked in a model load Triton never finishes is not waited for (the thread
        is a daemon; the server's shutdown ends that load)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def broken_models(self) -> set[str]:
        """After `stop()`: the models serving with a dead stub right now (a last look, nothing restored): those
        that lost one and were not restored, and those with an instance whose only process is one Triton has not
        reaped (a zombie: a request met it, and the model can never finish unloading). A restored model's old
        zombie has a live process in its place."""
        stubs = self.table.stubs()
        dead, self._pending = self._pending + self.tracker.update(stubs), []
        alive = {s.key for s in stubs if not s.zombie}
        dead += [s for s in stubs if s.zombie and s.serves_instance and s.key not in alive]
        if dead:
            try:
                states = {e.get("name"): e.get("state") for e in self.repository.repository_index()}
            except Exception:  # noqa: BLE001 - the server going away: count them all
                states = {}
            self.unrestored |= {s.model for s in dead if states.get(s.model, "READY") in ("READY", "UNLOADING")}
        return set(self.unrestored)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval if self._armed else min(self.interval, LEARN_INTERVAL))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception as exc:  # the watchdog must never take the CLI down
                self.say(f"watchdog: check failed: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def paused(self):
        """Hold the watchdog off while models are (re)loaded on purpose; stubs that come and go meanwhile
        (a reload's new instances, a failed load's) are not deaths."""
        with self.busy:
            try:
                yield
            finally:
                self._rescan.set()
                self.tracker.update(self._stubs())  # what changed meanwhile is known, not mourned

    def check(self) -> list[str]:
        """One look at the stubs; restores the models that lost one. Returns the models restored."""
        if not self.busy.acquire(blocking=False):
            return []  # paused: a reload is under way
        try:
            if not self._armed:  # the server is still loading: learn its stubs, keep their deaths for `start()`
                self._rescan.set()  # every process, every time: a new stub is looked at while it is alive
                self._pending += self.tracker.update(self._stubs())
                return []
            return self._check()
        finally:
            self.busy.release()

    def _check(self) -> list[str]:
        self._hung = {ident: why for ident, why in self._hung.items() if ident in self.tracker.known}  # mourned
        dead, self._pending = self._pending + self.tracker.update(self._stubs()), []
        for stub in dead:
            self._forget_beat(stub)
        self._kill_hung()
        if not dead:
            return self._retry_failed()
        by_model: dict[str, list[Stub]] = {}
        for stub in dead:
            by_model.setdefault(stub.model, []).append(stub)
        states = {e.get("name"): e.get("state") for e in self.repository.repository_index()}
        restored = []
        for model, stubs in sorted(by_model.items()):
            what = ", ".join(f"'{s.instance}' (pid {s.pid})" for s in stubs)
            how = "was killed (hung)" if all((s.pid, s.started) in self._hung for s in stubs) else "died"
            if states.get(model) != "READY":
                continue  # being unloaded or reloaded on purpose: its stubs end normally
            self.unrestored.add(model)
            if not self.heal:
                self.say(f"model '{model}': stub process of instance {what} {how}; not reloading it ({self.why_not}): "
                         "requests to it fail until it is reloaded")
                continue
            if self._stop.is_set():
                return restored
            self.say(f"model '{model}': stub process of instance {what} {how}; reloading the model")
            if self._restore(model, instances={s.instance for s in stubs}):
                restored.append(model)
        return restored

    def _retry_failed(self) -> list[str]:
        """Models whose restore failed (a new stub that died while loading, say) are tried again, each after its
        backoff (1 s, 2 s, 4 s ... 60 s since the failed attempt), until one works; no new death is needed."""
        if not self.heal or self._stop.is_set():
            return []
        now = time.monotonic()
        due = [m for m in sorted(self.unrestored)
               if m in self._failures and now - self._failures[m][1] >= backoff(self._failures[m][0])]
        restored = []
        for model in due:
            self.say(f"model '{model}': its last restore failed; trying again")
            if self._restore(model, wait=False):
                restored.append(model)
        return restored

    def _kill_hung(self) -> None:
        """Kill the known stubs whose heartbeat says they hang; the next look finds them dead and restores them."""
        if self.control_dir is None:
            return
        now = time.monotonic()
        for ident, stub in list(self.tracker.known.items()):
            if ident in self._hung:
                continue
            beat = read_beat(heartbeat_file(self.control_dir, stub.pid, stub.started))
            why = beat.hung(now) if beat is not None else None
            if why is None:
                continue
            self._hung[ident] = why
            if not self.heal:
                self.say(f"model '{stub.model}': instance '{stub.instance}' (pid {stub.pid}) is hung: {why}; "
                         f"not killing it ({self.why_not}): its requests wait until it is reloaded")
                continue
            self.say(f"model '{stub.model}': instance '{stub.instance}' (pid {stub.pid}) is hung: {why}; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(stub.pid, signal.SIGKILL)

    def _forget_beat(self, stub: Stub) -> None:
        if self.control_dir is not None:
            with contextlib.suppress(OSError):
                heartbeat_file(self.control_dir, stub.pid, stub.started).unlink()

    def _restore(self, model: str, wait: bool = True, instances: Iterable[str] = ()) -> bool:
        """Unload and load `model` again (the caller holds `busy`). False if it could not be restored.
        `wait`: pause for the backoff first (a retry has waited it out already). `instances`: the dead ones.

        A restore counts only once every instance the model had runs again: the stubs are looked at as soon
        as the load returns, so a new stub that dies at once (even before the next round) fails the restore,
        which is then tried again, instead of leaving the model serving from a stub nobody saw alive."""
        expected = set(instances) | {s.instance for s in self.tracker.known.values() if s.model == model}
        expected |= self._expected.get(model, set())
        self._expected[model] = expected
        started = time.monotonic()
        deaths, last = self._failures.get(model, (0, 0.0))
        if last and started - last > self.stable_after:
            deaths = 0
        try:
            # Not waiting for the unload to finish: once a request has met the dead stub, Triton 2.51 never
            # finishes unloading that model version (the request is never released), yet loading the model
            # again works at once and serves from fresh stubs.
            self.repository.unload_model(model)
            pause = backoff(deaths) if wait else 0.0
            if pause:
                self.say(f"model '{model}': died {deaths + 1} times in a row; loading it again in {pause:.0f}s")
                if self._stop.wait(pause):
                    return False
            self.tracker.forget_model(model)
            self.repository.load_model(model)
            self._rescan.clear()
            self._last_full = time.monotonic()
            stubs = self.table.stubs()  # its new stubs, at once
            self._pending += self.tracker.update(stubs)
            missing = expected - {s.instance for s in stubs if s.model == model and not s.zombie}
            if missing:
                raise RuntimeError(f"instance(s) {', '.join(sorted(missing))} died as soon as the model loaded")
        except Exception as exc:
            self.say(f"model '{model}': could not be restored: {exc}")
            self._failures[model] = (deaths + 1, time.monotonic())
            return False
        self._failures[model] = (deaths + 1, time.monotonic())
        self.restores[model] = self.restores.get(model, 0) + 1
        self.unrestored.discard(model)
        self.say(f"model '{model}': restored in {time.monotonic() - started:.1f}s")
        return True
