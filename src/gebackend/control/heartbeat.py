"""Heartbeats from model instances to the watchdog: how `gebackend serve` tells a hung instance from a busy one.

A stub process that is alive but stuck is invisible in `/proc` and, when it is stuck inside a run (a
request that makes the engine loop for hours, a deadlock in native code), Triton's own health check
calls it healthy: its requests wait forever. Facts measured on tritonserver 2.51: killing such a stub
makes Triton answer the requests it held with 500 "Stub process ... is not healthy" within about a
second, and the watchdog then restores the model as for any dead stub. A stub frozen whole (SIGSTOP,
a thread holding the GIL forever) is called unhealthy by Triton, which answers 500 to every request,
but it is never restarted either.

So each instance, once loaded, starts a daemon thread that writes a 32-byte record every second to
`$GE_CONTROL_DIR/heartbeat/<pid>-<start time>` (the start time tells a reused pid apart): when it last
beat, since when it has been inside `execute()` (0 when idle), and its `hang_timeout_s`. The watchdog reads the records of the stubs it knows; an
instance that has been inside one `execute()` for longer than its timeout, or has not beaten for that
long, is hung, and the watchdog kills it (SIGKILL) so that it is restored like a dead one.
Both sides use CLOCK_MONOTONIC (`time.monotonic()`), which is one clock for every process of a machine.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gebackend.control.procfs import own_start_time

FOLDER = "heartbeat"
BEAT_SECONDS = 1.0
_RECORD = struct.Struct("<dddd")  # beat, busy_since, timeout, checksum (their sum: a torn read is ignored)


def heartbeat_file(control_dir: Path, pid: int, started: int) -> Path:
    """`started`: the process's start time in clock ticks, field 22 of `/proc/<pid>/stat`."""
    return Path(control_dir) / FOLDER / f"{pid}-{started}"


@dataclass(frozen=True)
class Beat:
    """One instance's last record. Times are `time.monotonic()` seconds; `busy_since` is 0 when idle."""

    beat: float
    busy_since: float
    timeout: float

    def pack(self) -> bytes:
        return _RECORD.pack(self.beat, self.busy_since, self.timeout, self.beat + self.busy_since + self.timeout)

    @classmethod
    def unpack(cls, data: bytes) -> "Beat | None":
        if len(data) != _RECORD.size:
            return None
        beat, busy_since, timeout, checksum = _RECORD.unpack(data)
        if checksum != beat + busy_since + timeout:
            return None
        return cls(beat, busy_since, timeout)

    def hung(self, now: float) -> str | None:
        """Why the instance counts as hung at `now`, or None. A timeout of 0 never hangs."""
        if self.timeout <= 0:
            return None
        if self.busy_since and now - self.busy_since > self.timeout:
            return f"inside one execute() for {now - self.busy_since:.0f}s (hang_timeout_s={self.timeout:g})"
        if now - self.beat > self.timeout:
            return f"silent for {now - self.beat:.0f}s, its process frozen (hang_timeout_s={self.timeout:g})"
        return None


def read_beat(path: Path) -> Beat | None:
    """The record in `path`, or None when there is none (yet) or it was caught half-written."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return Beat.unpack(os.pread(fd, _RECORD.size, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


class Heartbeat:
    """The instance side: `enter()` / `leave()` around each execute; a daemon thread writes the record every second."""

    def __init__(self, control_dir: Path, timeout: float, interval: float = BEAT_SECONDS):
        self.timeout = float(timeout)
        self.interval = interval
        self.busy_since = 0.0
        self.path = heartbeat_file(control_dir, os.getpid(), own_start_time())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="gebackend-heartbeat", daemon=True)
        self._thread.start()

    def enter(self) -> None:
        self.busy_since = time.monotonic()

    def leave(self) -> None:
        self.busy_since = 0.0

    def _write(self) -> None:
        os.pwrite(self._fd, Beat(time.monotonic(), self.busy_since, self.timeout).pack(), 0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._write()
            except OSError:
                return  # the control folder went away: the server is stopping

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self._fd)
        try:
            self.path.unlink()
        except OSError:
            pass
