"""One instance at a time times its bucket costs on a server (runtime/bucket_costs.py), under an exclusive `flock`
on `timing.lock` in the server's control folder.

Triton loads a repository's models side by side, each instance in its own stub process. Two instances timing
their buckets at once take each other's cores, and the longer runs are hit harder than the short ones (a run of 8
overlaps more of the other's work than a run of 1), so their costs say that splitting pays where it does not
(seen on a 2-core AMD EPYC, three static models loading in one server: bucket 2 timed at 2.55 ms against its quiet
1.4, so batches of 2 ran as 1 + 1). Under the lock an instance times alone among the timing ones; other models may
still compile meanwhile, which the least-of-many-rounds timing absorbs. The lock goes with the process that holds
it (a killed instance releases it); under a plain tritonserver (no control folder) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterator, Mapping

from gebackend.control.env import control_dir

LOCK = "timing.lock"


@contextlib.contextmanager
def timing_alone(environ: Mapping[str, str] = os.environ) -> Iterator[float]:
    """Hold the server's timing lock for the block; yields the seconds waited for it (0.0 where there is none)."""
    folder = control_dir(environ)
    if folder is None:
        yield 0.0
        return
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(folder / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - began
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
