"""Keeps one `gebackend serve` running until it is told to stop: starts tritonserver, starts it again when it
crashes (with a backoff), runs the watchdog that restores models whose backend process died or hung, reloads the
model folders that changed on SIGHUP, and stops in order.

`cli/serve.py` parses the arguments, installs the signal handlers (which only set a `SignalFlag`) and prints what
happened; the decisions are made here. The process itself is `launcher.py`'s, its model-repository API
`repository_client.py`'s.
"""

from __future__ import annotations

import time
from typing import Callable

from gebackend.errors import GeBackendError
from gebackend.server.launcher import ServerSettings, Shutdown, TritonServer
from gebackend.server.repository_client import failure_reason, repository_fingerprints
from gebackend.server.watchdog import Watchdog, backoff

Say = Callable[[str], None]


class SignalFlag:
    """Set by a signal handler: a plain attribute, no lock. A handler that takes a lock (threading.Event.set)
    deadlocks when the signal lands while the main thread holds that same lock inside Event.wait/clear: seen
    as a `gebackend serve` that ignored SIGTERM for good."""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def clear(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


class Crashes:
    """tritonserver crashes in a row (a run of `stable_after` seconds starts the count afresh) and the pause
    before the next start: 0 the first time, then 1 s, 2 s, 4 s ... at most 60 s (the watchdog's backoff)."""

    def __init__(self, stable_after: float = 60.0, clock=time.monotonic):
        self.stable_after, self.clock = stable_after, clock
        self.in_a_row = 0
        self.total = 0
        self._last = 0.0

    def record(self) -> float:
        now = self.clock()
        self.in_a_row = 1 if not self.total or now - self._last > self.stable_after else self.in_a_row + 1
        self.total += 1
        self._last = now
        return backoff(self.in_a_row - 1)

    def describe(self) -> str:
        return f" ({self.in_a_row} times in a row)" if self.in_a_row > 1 else ""


def sleep_unless(seconds: float, stop: SignalFlag) -> bool:
    """Wait `seconds` unless a stop signal comes first (then False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop.is_set():
            return False
        time.sleep(0.1)
    return not stop.is_set()


class Supervisor:
    """One server's life: `serve` returns the exit code, or the `Shutdown` of an ordered stop to report."""

    def __init__(self, settings: ServerSettings, self_healing: bool = True, watch_interval: float = 0.5,
                 say: Say = print, complain: Say = print):
        self.settings = settings
        self.self_healing = self_healing
        self.watch_interval = watch_interval
        self.say, self.complain = say, complain  # what happened / why it cannot go on
        self._observing: Watchdog | None = None  # the watchdog learning the stubs of a server not ready yet

    def start(self, stop: SignalFlag) -> "tuple[TritonServer, list[dict]] | int":
        """A started tritonserver and its repository index, or the exit code when it did not start (or was stopped).
        Its watchdog learns the stubs from the first model load on (`start_watchdog` then makes it act)."""
        server = TritonServer(self.settings)
        try:
            server.start()
            self._observing = self._watchdog(server).observe()
            index = server.wait_ready(stop)
        except GeBackendError as exc:
            self._stop_observing()
            server.stop(timeout=10)
            self.complain(f"cannot serve {self.settings.model_repository}: {exc}")
            return 1
        if stop.is_set():
            self._stop_observing()
            self.say("stopping before the server was ready")
            server.stop(timeout=10)
            self.say("stopped")
            return 0
        return server, index

    def _stop_observing(self) -> None:
        if self._observing is not None:
            self._observing.stop()
            self._observing = None

    def serve(self, stop: SignalFlag, reload: SignalFlag, ready: Callable[[TritonServer, list[dict]], None],
              restarted: Callable[[list[dict]], None] = lambda index: None) -> "int | Shutdown":
        """Run until `stop`: `ready(server, index)` once the first start is ready, `restarted(index)` after each
        restart of a crashed tritonserver; `reload` (SIGHUP) reloads the model folders that changed since the
        server started loading them: the files are read before each start, so a change made as soon as it is ready
        (or while it loads) is one the next SIGHUP sees."""
        fingerprints = repository_fingerprints(self.settings.model_repository)
        started = self.start(stop)
        if isinstance(started, int):
            return started
        server, index = started
        ready(server, index)
        watchdog = self.start_watchdog(server)
        crashes = Crashes()
        while True:
            if server.process.poll() is not None:
                watchdog.stop()
                code = server.stop()
                if not self.self_healing:
                    self.complain(f"tritonserver exited unexpectedly with code {code}")
                    return code or 1
                pause = crashes.record()
                self.say(f"tritonserver exited unexpectedly with code {code}{crashes.describe()}; starting it again"
                         + (f" in {pause:.0f}s" if pause else ""))
                if not sleep_unless(pause, stop):
                    self.say("stopped")
                    return 0
                fingerprints = repository_fingerprints(self.settings.model_repository)
                started = self.start(stop)
                if isinstance(started, int):
                    return started
                server, index = started
                restarted(index)
                watchdog = self.start_watchdog(server)
                continue
            time.sleep(0.25)  # a signal cuts the sleep short; the handler has already set its flag
            if stop.is_set():
                break
            if reload.is_set():
                reload.clear()
                fingerprints = self.reload(server, watchdog, fingerprints)
        self.say("stopping: finishing in-flight requests, refusing new ones")
        watchdog.stop()
        return server.shutdown(broken=watchdog.broken_models())

    def start_watchdog(self, server: TritonServer) -> Watchdog:
        """Self-healing, or (when off or impossible) a watchdog that only reports dead stubs: the one that has
        watched `server` load its models, acting from now on."""
        watchdog, self._observing = self._observing, None
        if watchdog is None or watchdog.table.parent_pid != server.process.pid:
            watchdog = self._watchdog(server)
        if self.self_healing and not watchdog.heal:
            self.say(f"self-healing is off: {watchdog.why_not}")
        return watchdog.start()

    def _watchdog(self, server: TritonServer) -> Watchdog:
        why_not = ""
        if not self.self_healing:
            why_not = "--no-self-healing"
        elif not server.control.can_reload:
            why_not = f"self-healing needs --model-control-mode=explicit, this server runs '{server.control.mode}'"
        watchdog = Watchdog(server.process.pid, server.repository, self.say, interval=self.watch_interval,
                            heal=not why_not, why_not=why_not, control_dir=server.control_dir)
        server.watch_lines(watchdog.notice_line)  # a model loading: look for its new stubs at once
        return watchdog

    def reload(self, server: TritonServer, watchdog: Watchdog, before: dict[str, tuple]) -> dict[str, tuple]:
        """SIGHUP: load the model folders that are new or whose files changed, unload the ones that are gone.

        Triton loads the new version beside the old one and switches over, so requests keep being answered;
        a failed load leaves the model as Triton then has it (reported). Needs explicit model control.
        """
        say = self.say
        if not server.control.can_reload:
            say(f"SIGHUP: cannot reload, this server runs --model-control-mode={server.control.mode}")
            return before
        now = repository_fingerprints(server.settings.model_repository)
        changed = sorted(name for name in now if before.get(name) != now[name])
        gone = sorted(set(before) - set(now))
        say(f"SIGHUP: reloading {', '.join(changed + gone) or 'nothing (no model folder changed)'}")
        with watchdog.paused():
            for name in changed:
                started = time.monotonic()
                try:
                    server.repository.load_model(name)
                except GeBackendError as exc:
                    reason = failure_reason(server.settings.model_repository, {"name": name, "reason": str(exc)})
                    say(f"reload: model '{name}' failed: {reason}")
                    continue
                verb = "reloaded" if name in before else "loaded"
                say(f"reload: model '{name}' {verb} in {time.monotonic() - started:.1f}s")
            for name in gone:
                try:
                    server.repository.unload_model(name)
                    say(f"reload: model '{name}' is gone from the repository; unloaded")
                except GeBackendError as exc:
                    say(f"reload: model '{name}' could not be unloaded: {exc}")
        return now
