"""Which cores the pinned instances of every model on one server hold, so that a new instance takes the least-used.

`runtime/pinning.py` plans an instance's cores from its own model's config only: two models with pinned
instances would both start at the first core. Under `gebackend serve` each pinned instance therefore
claims its cores in a ledger shared by the server's instances, `$GE_CONTROL_DIR/cores.json`, read and
rewritten under an exclusive `flock` on `cores.lock` (instances load in parallel, in separate
processes). An instance takes the `k` cores held by the fewest live instances of its own model, then of
other models, preferring its model's plan where counts tie: a single model is pinned exactly as
planned, its instances never share a core while another is free, and a second model lands on the cores
the first left free. Entries of processes that are gone (killed, crashed) are dropped at
the next claim; an instance releases its entry when it unloads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.control.procfs import is_running, own_start_time

LEDGER = "cores.json"
LOCK = "cores.lock"


def choose(planned: Sequence[int], usable: Sequence[int], own: Mapping[int, int], others: Mapping[int, int]) -> tuple[int, ...]:
    """`len(planned)` cores of `usable`: the fewest instances of the same model on them (`own`), then of other
    models (`others`), then those of the plan, then in `usable` order."""
    planned_set = set(planned)
    order = {cpu: position for position, cpu in enumerate(usable)}
    ranked = sorted(usable, key=lambda cpu: (own.get(cpu, 0), others.get(cpu, 0), cpu not in planned_set, order[cpu]))
    return tuple(sorted(ranked[:len(planned)]))


def _alive(key: str) -> bool:
    pid, _, started = key.partition("-")
    return pid.isdigit() and is_running(int(pid), started)


@dataclass(frozen=True)
class Claim:
    cpus: tuple[int, ...]
    neighbours: tuple[str, ...]  # "model/instance" of the live instances that hold some of the same cores


class CoreLedger:
    """One server's ledger of pinned cores (in its control folder)."""

    def __init__(self, control_dir: Path):
        self.folder = Path(control_dir)
        self.key = f"{os.getpid()}-{own_start_time()}"

    @contextlib.contextmanager
    def _locked(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                path = self.folder / LEDGER
                try:
                    entries = json.loads(path.read_text())
                except (OSError, ValueError):
                    entries = {}
                live = {k: v for k, v in entries.items() if k == self.key or _alive(k)}
                yield live
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(live))
                tmp.replace(path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def claim(self, model: str, instance: str, planned: Sequence[int], usable: Sequence[int]) -> Claim:
        """Record and return this process's cores: `len(planned)` of `usable`, the least used by other instances."""
        with self._locked() as entries:
            entries.pop(self.key, None)
            own: dict[int, int] = {}
            others: dict[int, int] = {}
            for entry in entries.values():
                counts = own if entry["model"] == model else others
                for cpu in entry["cpus"]:
                    counts[cpu] = counts.get(cpu, 0) + 1
            cpus = choose(planned, usable, own, others)
            neighbours = tuple(sorted(f"{e['model']}/{e['instance']}" for e in entries.values() if set(e["cpus"]) & set(cpus)))
            entries[self.key] = {"model": model, "instance": instance, "cpus": list(cpus)}
        return Claim(cpus, neighbours)

    def release(self) -> None:
        with contextlib.suppress(OSError), self._locked() as entries:
            entries.pop(self.key, None)
