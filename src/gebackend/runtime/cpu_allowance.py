"""How many CPUs this process may really use, where that is fewer than the machine has: the engine threads of an
instance that is not pinned are sized to it.

ONNX Runtime's default (intra_op_num_threads=0) starts a thread per physical core of the machine and pins them one
per core itself: it ignores the process's CPU affinity (`taskset`, a cpuset such as Kubernetes' static CPU manager
gives a pod) and its cgroup's CPU quota (a pod's `resources.limits.cpu`). Under `taskset -c 0` on 2 cores its worker
thread was pinned to CPU 1, outside the mask; two processes under `taskset -c 0` and `-c 1` pinned their workers
to the same core. Measured on a 2-core EPYC, ResNet-50: those two processes made 4.8 runs/s together, with one
thread each 7.9; two `gebackend serve` replicas behind a proxy served 4.4 infer/s together against one replica's
8.4 (which had escaped onto both cores), and 8.4 against 4.3 once sized (bench/scale_out.py). An explicit thread
count is not pinned, so it stays in the mask: that is what sizing does.

The allowance is the smaller of the affinity's CPU count and the quota rounded up (cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`); None where neither is below the machine's CPU count, so an unconfined
server keeps each engine's own default.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Allowance:
    cpus: int  # how many CPUs the process may use
    why: str  # what confines it, for the log


def cgroup_quota(root: Path = CGROUP_ROOT, own: Callable[[], str] | None = None) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (1.5 for "150000 100000"), or None where there is none."""
    for folder in _own_folders(root, own):
        for read in (_v2_quota, _v1_quota):
            quota = read(folder)
            if quota is not None:
                return quota
    return None


def cpu_allowance(affinity: set[int] | None = None, machine_cpus: int | None = None,
                  quota: Callable[[], float | None] = cgroup_quota) -> Allowance | None:
    """The CPUs this process may use where fewer than the machine's (see the top), else None."""
    machine = machine_cpus if machine_cpus is not None else (os.cpu_count() or 1)
    mask = affinity if affinity is not None else os.sched_getaffinity(0)
    limits = []
    if len(mask) < machine:
        limits.append((len(mask), f"its CPU affinity is {len(mask)} of the machine's {machine} CPUs"))
    try:
        cpus = quota()
    except OSError:
        cpus = None
    if cpus is not None and math.ceil(cpus) < machine:
        limits.append((max(1, math.ceil(cpus)), f"its cgroup's CPU quota is {cpus:g} CPU(s)"))
    if not limits:
        return None
    count = min(n for n, _ in limits)
    return Allowance(count, " and ".join(why for _, why in limits))


def _own_folders(root: Path, own: Callable[[], str] | None) -> list[Path]:
    """The cgroup folders that may hold this process's limits: its own (from /proc/self/cgroup), then the root of
    the namespace (inside a container the process's cgroup is usually that root)."""
    folders: list[Path] = []
    for line in (own or _read_self_cgroup)().splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        controllers = parts[1].split(",") if parts[1] else []  # none: the v2 hierarchy
        if controllers and "cpu" not in controllers:
            continue
        base = root / ("cpu,cpuacct" if (root / "cpu,cpuacct").is_dir() else "cpu") if controllers else root
        for folder in (base / parts[2].lstrip("/"), base):
            if folder not in folders:
                folders.append(folder)
    return folders or [root]


def _read_self_cgroup() -> str:
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
