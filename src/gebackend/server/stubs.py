"""What a backend stub process is, read from `/proc`: which model instance it serves (`Stub`, `stub_identity`,
`parse_stub`), and from successive lists of them, which instances lost their process (`StubTracker`).

The watchdog (watchdog.py) lists them; `gebackend bench --soak` reads their identity too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from gebackend.control.procfs import stat_fields

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    """One stub process: which model instance it serves. `started` (clock ticks) tells a reused pid apart."""

    pid: int
    started: int
    model: str
    instance: str
    zombie: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.model, self.instance

    @property
    def serves_instance(self) -> bool:
        """False for the short-lived stub Triton starts to auto-complete a config (its instance name is the model's)."""
        return self.instance != self.model


def parse_stub(pid: int, stat: str, argv: list[str]) -> Stub | None:
    """A stub from its `/proc/<pid>/stat` text and command line, or None if it is not a stub.

    The stub's command line is: stub, <repo>/<model>/<version>/model.py, shm region, shm sizes (2),
    parent pid, backend folder, IPC handle, instance name, model folder of the backend.
    """
    served = stub_identity(argv)
    if served is None:
        return None
    fields = stat_fields(stat)
    return Stub(pid, int(fields[19]), *served, fields[0] in ("Z", "X"))


def stub_identity(argv: list[str]) -> tuple[str, str] | None:
    """(model, instance) from a process's command line, or None if it is not a stub (see `parse_stub`).

    A stub that is a script, run by its interpreter (`/bin/sh <model folder>/triton_python_backend_stub ...`:
    Triton 2.51 starts a `triton_python_backend_stub` found in a model's folder instead of its own), counts too."""
    if len(argv) > 1 and not argv[0].endswith(STUB_NAME) and argv[1].endswith(STUB_NAME):
        argv = argv[1:]
    if len(argv) < 9 or not argv[0].endswith(STUB_NAME):
        return None
    return Path(argv[1]).parent.parent.name, argv[8]


class StubTracker:
    """Pure bookkeeping: from successive lists of stubs, which model instances lost their process."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, int], Stub] = {}

    def update(self, stubs: Iterable[Stub]) -> list[Stub]:
        """Record the live stubs; return the instances whose process died since (at most once each)."""
        stubs = [s for s in stubs if s.serves_instance]
        alive = {s.key for s in stubs if not s.zombie}
        current = {(s.pid, s.started): s for s in stubs}
        dead = []
        for ident, stub in list(self.known.items()):
            gone = ident not in current or current[ident].zombie
            if gone:
                del self.known[ident]
                if stub.key not in alive:
                    dead.append(stub)
        for ident, stub in current.items():
            if not stub.zombie:
                self.known[ident] = stub
        return dead

    def forget_model(self, model: str) -> None:
        for ident in [i for i, s in self.known.items() if s.model == model]:
            del self.known[ident]
