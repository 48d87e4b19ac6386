"""Bucket costs one instance timed at load, shared with the other instances of its model that load beside it.

An instance of a static model times its buckets after compiling them (runtime/bucket_costs.py), alone on the
server's cores (control/timing_lock.py), so N instances of one model meant N timings one after another, each as
long as the first, answering the same question with different noise: two pinned ResNet-50 instances on a 2-core
AMD EPYC timed 12 s each (the server was ready after 33 s), and one ran batches of 4 on the dynamic graph (298 ms
against its buckets' 314) where the other did not (307 against 308). Under `gebackend serve` the first instance to
time writes what it measured to the server's control folder (`bucket_costs/<model>-<key>.json`); an instance whose
timing asks the same question reads it instead and routes as the first does. The same question: the same model
file (name, size, modification time), options, compiled shapes, outputs, providers, number of cores and whether
the dynamic graph is timed too (`key`). A record older than `MAX_AGE_SECONDS` is not used, so a reload of the
model later on times afresh, as a restart does: a timing says what this machine costs now. Under a plain
tritonserver (no control folder) every instance times its own, as before. Reading or writing a record never fails
a load: without one, the instance times as it always did.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from gebackend.cache_dir import safe_name
from gebackend.control.env import control_dir

FOLDER = "bucket_costs"
MAX_AGE_SECONDS = 600.0  # the instances of one load time within minutes of each other


def key(parts: Mapping[str, Any]) -> str:
    """16 hex digits naming the question a timing answers (`parts`: what the costs depend on, JSON-able)."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Shared:
    """What another instance measured: its record's payload, the cores it timed on and how long ago."""

    payload: dict
    cores: tuple[int, ...]
    age_seconds: float

    def describe(self) -> str:
        cores = ",".join(map(str, self.cores)) or "?"
        return f"timed {self.age_seconds:.0f}s ago by another instance of this model (on cores {cores})"


class CostRecord:
    """The record of one timing question in one server's control folder (a no-op where there is none)."""

    def __init__(self, folder: Path | None, model: str, parts: Mapping[str, Any],
                 clock: Callable[[], float] = time.time):
        self.path = folder / FOLDER / f"{safe_name(model)}-{key(parts)}.json" if folder is not None else None
        self._clock = clock

    @classmethod
    def here(cls, model: str, parts: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> "CostRecord":
        """The record in the control folder of the `gebackend serve` running this instance."""
        return cls(control_dir(environ), model, parts)

    def read(self) -> Shared | None:
        """The shared timing, or None: no control folder, none written yet, too old, or unreadable."""
        if self.path is None:
            return None
        try:
            data = json.loads(self.path.read_text())
            age = self._clock() - float(data["written_at"])
            shared = Shared(dict(data["payload"]), tuple(int(c) for c in data.get("cores", ())), age)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return shared if 0 <= age <= MAX_AGE_SECONDS else None

    def write(self, payload: Mapping[str, Any]) -> bool:
        """Share `payload` (JSON-able) with the instances that ask the same question; False where it could not be."""
        if self.path is None:
            return False
        try:
            cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = []
        data = {"written_at": self._clock(), "cores": cores, "payload": dict(payload)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            partial.write_text(json.dumps(data))
            os.replace(partial, self.path)  # a reader sees the whole record or none
        except (OSError, TypeError, ValueError):
            return False
        return True
