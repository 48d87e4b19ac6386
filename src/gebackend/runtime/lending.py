"""Lending idle cores: a pinned instance runs a batch on its siblings' cores too while they have nothing to do.

Pinned instances (runtime/pinning.py) keep each core busy with its own requests under load, but at low load a
single request runs on its instance's share of the cores while the rest idle: on 2 cores, 2 instances x 1 core
answer one request at a time at half the speed of one instance on both. With `lend_idle_cores`, each instance of
the model keeps a second engine whose extra intra-op threads are fixed to the cores the model's other instances are
planned on (ONNX Runtime's `session.intra_op_thread_affinities`), spinning within a run and stopping when it
returns. A batch runs on it when none of those instances is running one; otherwise on the instance's own cores.

Who is running is a byte per instance in `$GE_CONTROL_DIR/busy-<model>` (one file per model, mapped by each
instance's process; only the instance itself writes its byte). Racing instances can both see the other idle and
share a core for one batch; nothing waits on the board.

`plan_lending` is pure (what to borrow, and the affinity string); `BusyBoard` the shared bytes; `LendingRunner`
runs a batch on one engine or the other.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from gebackend.runtime.pinning import PinPlan, format_cpu_list, plan_cpus

Tensors = Mapping[str, np.ndarray]
BOARD_PREFIX = "busy-"
MAX_INSTANCES = 4096  # bytes in a board: one per instance index


@dataclass(frozen=True)
class Lending:
    """What one instance borrows: the cores of its model's other instances, and its index on the model's board."""

    index: int
    total: int
    own: tuple[int, ...]
    lent: tuple[int, ...]

    @property
    def threads(self) -> int:
        """Intra-op threads of the engine that runs on its own and the borrowed cores."""
        return len(self.own) + len(self.lent)

    def affinities(self) -> str:
        """ONNX Runtime's `session.intra_op_thread_affinities`: one entry per worker thread (the calling thread is the
        first of `threads` and stays on the instance's own cores), logical processors counted from 1."""
        workers = list(self.own[1:]) + list(self.lent)
        return ";".join(str(cpu + 1) for cpu in workers)

    def describe(self) -> str:
        return (f"lend_idle_cores: a batch runs on CPU(s) {format_cpu_list(self.own + self.lent)} "
                f"({self.threads} threads) while the model's other instances are idle, else on CPU(s) "
                f"{format_cpu_list(self.own)}")


def refused(why: str) -> str:
    """The log line of a `lend_idle_cores=on` that lends nothing, and why."""
    return f"lend_idle_cores=on: lends nothing: {why}"


def plan_lending(plan: PinPlan | None, cores_per_instance: int) -> tuple[Lending | None, str]:
    """What the instance pinned by `plan` (None: not pinned) may borrow, or None and why not.

    The other instances' cores are their planned ones (`pinning.plan_cpus`, the same for every instance of the model);
    an instance whose cores are not its planned ones (the server's core ledger moved it beside another model) or that
    shares a core lends nothing, since its neighbours' cores are then not the model's alone."""
    if plan is None:
        return None, ("only pinned instances lend (this one is not: one instance without cores_per_instance, or "
                      "pin_instances=off)")
    if plan.total < 2:
        return None, "a single instance has no other instance's cores to borrow"
    if plan.shared:
        return None, "instances share cores here, so none is idle while another runs"
    planned = plan_cpus(plan.index, plan.total, plan.usable, cores_per_instance)
    if set(planned.cpus) != set(plan.cpus):
        return None, (f"this instance runs on CPU(s) {format_cpu_list(plan.cpus)}, not its planned "
                      f"{format_cpu_list(planned.cpus)} (other models hold those)")
    others: list[int] = []
    for index in range(plan.total):
        if index != plan.index:
            others += [cpu for cpu in plan_cpus(index, plan.total, plan.usable, cores_per_instance).cpus
                       if cpu not in plan.cpus and cpu not in others]
    if not others:
        return None, "the other instances have no core of their own"
    return Lending(plan.index, plan.total, tuple(plan.cpus), tuple(sorted(others))), ""


class BusyBoard:
    """One byte per instance of a model, in a file every instance maps: 1 while that instance runs a batch."""

    def __init__(self, folder: Path, model: str, index: int, total: int):
        if not 0 <= index < total <= MAX_INSTANCES:
            raise ValueError(f"instance {index} of {total}: a board holds {MAX_INSTANCES} instances")
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{BOARD_PREFIX}{_safe(model)}"
        self.index, self.total = index, total
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < MAX_INSTANCES:
                os.ftruncate(fd, MAX_INSTANCES)  # every instance asks the same size: growing it twice is harmless
            self._map = mmap.mmap(fd, MAX_INSTANCES)
        finally:
            os.close(fd)
        self._map[index] = 0  # a restarted instance is idle, whatever its predecessor left

    def others_busy(self) -> bool:
        """Whether any other instance of the model is running a batch now."""
        row = self._map[:self.total]
        return any(row[:self.index]) or any(row[self.index + 1:])

    def mark(self, busy: bool) -> None:
        self._map[self.index] = 1 if busy else 0

    def close(self) -> None:
        try:
            self._map[self.index] = 0
            self._map.close()
        except (ValueError, OSError):
            pass  # already closed


def _safe(model: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in model)


class LendingRunner:
    """Runs each batch on `lent` (own and borrowed cores) while the model's other instances are idle, else on `own`.

    Both are runners of the same model (runtime/runners.py); `lent` holds the engine with the borrowed threads."""

    def __init__(self, own, lent, board: BusyBoard):
        self.own, self.lent, self.board = own, lent, board
        self.lent_runs = 0
        self.own_runs = 0

    def run(self, feeds: Tensors) -> dict[str, np.ndarray]:
        self.board.mark(True)
        try:
            if self.board.others_busy():
                self.own_runs += 1
                return self.own.run(feeds)
            self.lent_runs += 1
            return self.lent.run(feeds)
        finally:
            self.board.mark(False)

    def engines(self) -> list:
        return self.own.engines() + self.lent.engines()

    def close(self) -> None:
        self.board.close()
        self.own.close()
        self.lent.close()


def why_not_lent(options, engine: str, provider: str, static: bool, control: Path | None) -> str:
    """Why a model served with `options` lends no core on this engine, provider and graph mode ("" when it does)."""
    if engine != "onnxruntime" or provider != "cpu":
        return f"ONNX Runtime's CPU provider only (this instance runs {engine} on {provider})"
    if static:
        return "the dynamic graph only (static_model=1 runs fixed bucket sessions)"
    if options.session.intra_op_thread_affinities:
        return "intra_op_thread_affinities is set: the threads are placed as it says"
    if control is None:
        return "the instances' shared board lives in the folder of `gebackend serve`, which did not start this server"
    return ""


def lending_options(options, lending: Lending):
    """The options of the engine that runs on the borrowed cores too: a thread per core, the workers fixed to them,
    spinning within a run (a borrowed core must be given back the moment the run returns)."""
    return options.replace(intra_op_thread_count=lending.threads, intra_op_thread_affinities=lending.affinities(),
                           allow_spinning="on", force_spinning_stop="on")


__all__ = ["BOARD_PREFIX", "BusyBoard", "Lending", "LendingRunner", "lending_options", "plan_lending", "refused",
           "why_not_lent"]
