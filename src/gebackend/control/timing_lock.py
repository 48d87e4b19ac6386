"""An instance times its bucket costs (runtime/bucket_costs.py) while no other instance of the server loads or
times: one `flock` on `timing.lock` in the server's control folder, held shared for a load and exclusive for a
timing.

Triton loads a repository's models side by side, each instance in its own stub process. Costs timed while another
instance works on the same cores say that splitting pays where it does not, because the longer runs are hit harder
than the short ones (a run of 8 overlaps more of the other's work than a run of 1): seen on a 2-core AMD EPYC,
bucket 2 timed at 2.55 ms against its quiet 1.4 while two other static models timed theirs (batches of 2 ran as
1 + 1), and bucket 8 timed at 10.1 ms against bucket 4's 3.2 while the e2e server's other models compiled. So every
instance holds the lock shared from the start of its load (`loading`), and times with it exclusive
(`timing_alone`): the exclusive lock comes once no other instance is compiling, quantizing, warming up or timing.
Taking it gives up the shared one first, so two loads that reach their timing together
never wait on each other; a timing that waited `MAX_WAIT_SECONDS` (a neighbour building a TensorRT engine for
minutes) times anyway and says so. The lock goes with the process that holds it (a killed instance releases it);
under a plain tritonserver (no control folder) nothing is locked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from typing import IO, Iterator, Mapping

from gebackend.control.env import control_dir

LOCK = "timing.lock"
MAX_WAIT_SECONDS = 120.0
POLL_SECONDS = 0.02

_load: IO | None = None  # this process's load, holding the lock shared (`loading`)


@dataclasses.dataclass(frozen=True)
class Wait:
    """How a timing got its turn: the seconds it waited, and whether it then timed alone."""

    seconds: float = 0.0
    alone: bool = True


@contextlib.contextmanager
def loading(environ: Mapping[str, str] = os.environ) -> Iterator[None]:
    """Hold the server's timing lock shared while this instance loads: no other instance times meanwhile."""
    global _load
    folder = control_dir(environ)
    if folder is None or _load is not None:  # no server to share with, or a load in a load (held already)
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        _load = lock
        try:
            yield
        finally:
            _load = None
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def timing_alone(environ: Mapping[str, str] = os.environ, max_wait: float = MAX_WAIT_SECONDS) -> Iterator[Wait]:
    """Hold the server's timing lock exclusive for the block, once no other instance loads or times.

    Inside `loading` the load's own shared hold is converted (and not taken back: what is left of the load is not
    worth another wait); outside it the lock is taken for the block alone.
    """
    folder = control_dir(environ)
    if folder is None:
        yield Wait()
        return
    if _load is not None:
        yield _exclusive(_load, max_wait)
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a") as lock:
        try:
            yield _exclusive(lock, max_wait)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _exclusive(lock: IO, max_wait: float) -> Wait:
    """Take `lock` exclusive, polling up to `max_wait` seconds; a shared hold on it is given up first (by hand:
    whether a failed conversion keeps it is the kernel's business), so two converting loads never hold each other."""
    fcntl.flock(lock, fcntl.LOCK_UN)
    began = time.monotonic()
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Wait(time.monotonic() - began, True)
        except BlockingIOError:
            waited = time.monotonic() - began
            if waited >= max_wait:
                return Wait(waited, False)
            time.sleep(POLL_SECONDS)
