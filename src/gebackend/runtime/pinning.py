"""Pinned instances: which CPU cores each Triton model instance gets, and pinning its stub process to them.

Triton runs every instance of a Python-based model in its own stub process, and names the instances
`<group name>_<n>` (`<model>_<group index>_<n>` when the group has no name of its own). From the
instance name and the model config's `instance_group` list, `instance_position` works out this
instance's index among all the model's instances and their total; `plan_cpus` chooses its CPU set:

* `cores_per_instance` > 0: that many cores per instance, instance i starting at core i * k of the
  usable cores;
* otherwise the usable cores (the server's affinity, which the stub inherits) divided evenly, in
  contiguous blocks, hyper-thread siblings kept together; the first `cores % instances` instances get
  one core more;
* never 0 cores: with more instances than cores (or k * instances > cores) instances share cores
  round-robin, and the plan says so (`shared`) so the load log can warn and the engine stops spinning.

`pin_process` is the one side effect: `os.sched_setaffinity` on every thread of this process, before
the engine creates its thread pool (threads inherit the affinity of the thread that creates them).

The plan is per model. Under `gebackend serve`, `control/core_ledger.py` then moves an instance onto the
cores other models' instances left free (`PinPlan.claimed`), so two pinned models do not both start at
the first core.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from gebackend.config.instance_groups import devices, group_sizes, per_device


class InstancePosition(NamedTuple):
    index: int  # 0-based among all the model's instances
    total: int


@dataclass(frozen=True)
class PinPlan:
    index: int
    total: int
    cpus: tuple[int, ...]
    usable: tuple[int, ...]
    shared: bool  # some core of this instance is also another instance's
    note: str = ""  # why cores are shared, for the log

    def claimed(self, cpus: Sequence[int], neighbours: Sequence[str]) -> "PinPlan":
        """This plan with the cores the server-wide ledger gave it, and the instances that hold them already.

        Still `shared` when the model's own plan says some of its instances must share (they may claim later)."""
        from dataclasses import replace

        if not neighbours:
            return replace(self, cpus=tuple(cpus))
        notes = [n for n in self.note.split("; ") if n and not n.startswith("this instance shares")]
        notes.append(f"this instance shares its core(s) with {', '.join(neighbours)}")
        return replace(self, cpus=tuple(cpus), shared=True, note="; ".join(notes))

    def describe(self) -> str:
        text = (f"instance {self.index + 1}/{self.total} pinned to CPU(s) {format_cpu_list(self.cpus)} "
                f"of {format_cpu_list(self.usable)}")
        return f"{text}; {self.note}" if self.note else text


def _group_name(model_name: str, group: Mapping[str, Any], number: int) -> str:
    return str(group.get("name") or f"{model_name}_{number}")


def instance_position(
    model_name: str, instance_name: str, instance_groups: Sequence[Mapping[str, Any]], device_id: int = 0
) -> InstancePosition:
    """This instance's index among all the model's instances, and how many there are.

    Groups are counted in config order; within a GPU-kind group, the instances on each listed GPU in
    turn. An instance name that matches no group is assumed to be the only one (index 0 of 1).
    """
    groups = list(instance_groups) or [{"count": 1, "kind": "KIND_CPU"}]
    sizes = group_sizes(groups)
    total = sum(sizes)
    start = 0
    for number, (group, size) in enumerate(zip(groups, sizes)):
        name = _group_name(model_name, group, number)
        match = re.fullmatch(re.escape(name) + r"_(\d+)", instance_name)
        if match and int(match.group(1)) < per_device(group):
            n = int(match.group(1))
            gpus = [int(g) for g in (group.get("gpus") or [])]
            device = gpus.index(device_id) if devices(group) > 1 and device_id in gpus else 0
            return InstancePosition(start + device * per_device(group) + n, total)
        start += size
    # Names Triton made itself end in _<group>_<n>, even when the config we were handed lacks group names.
    match = re.fullmatch(re.escape(model_name) + r"_(\d+)_(\d+)", instance_name)
    if match:
        number, n = int(match.group(1)), int(match.group(2))
        if number < len(groups) and n < per_device(groups[number]):
            return InstancePosition(sum(sizes[:number]) + n, total)
    return InstancePosition(0, 1)


def order_by_core(cpus: Iterable[int], siblings: Callable[[int], Iterable[int]] | None = None) -> tuple[int, ...]:
    """Usable CPUs ordered so that hyper-thread siblings (one physical core) are adjacent."""
    usable = sorted(set(cpus))
    if siblings is None:
        return tuple(usable)
    seen: set[int] = set()
    ordered: list[int] = []
    for cpu in usable:
        if cpu in seen:
            continue
        group = [c for c in sorted(set(siblings(cpu)) | {cpu}) if c in usable and c not in seen]
        ordered.extend(group)
        seen.update(group)
    return tuple(ordered)


def _cpus_of(index: int, total: int, cores: tuple[int, ...], cores_per_instance: int) -> tuple[int, ...]:
    n = len(cores)
    if cores_per_instance > 0:
        k = min(cores_per_instance, n)
        return tuple(sorted({cores[(index * k + j) % n] for j in range(k)}))
    if total > n:
        return (cores[index % n],)
    base, extra = divmod(n, total)
    begin = index * base + min(index, extra)
    return tuple(sorted(cores[begin:begin + base + (1 if index < extra else 0)]))


def plan_cpus(index: int, total: int, usable: Sequence[int], cores_per_instance: int = 0) -> PinPlan:
    """The CPU set of instance `index` of `total`, from the ordered usable CPUs."""
    cores = tuple(usable)
    n = len(cores)
    if n == 0:
        raise ValueError("no usable CPU cores")
    if total < 1 or not 0 <= index < total:
        raise ValueError(f"instance index {index} out of range for {total} instance(s)")
    mine = _cpus_of(index, total, cores, cores_per_instance)
    notes = []
    if cores_per_instance > n:
        notes.append(f"cores_per_instance={cores_per_instance} exceeds the {n} usable core(s): using {n}")
    k = min(cores_per_instance, n) if cores_per_instance > 0 else 1
    if k * total > n:
        what = f"{total} instances x {k} core(s)" if cores_per_instance > 0 else f"{total} instances"
        notes.append(f"{what} on {n} usable core(s): instances share cores round-robin")
    neighbours = [j for j in range(total) if j != index and set(_cpus_of(j, total, cores, cores_per_instance)) & set(mine)]
    if neighbours:
        notes.append(f"this instance shares its core(s) with instance(s) {', '.join(str(j + 1) for j in neighbours)}")
    return PinPlan(index, total, mine, cores, bool(neighbours), "; ".join(notes))


def should_pin(setting: str, total: int, cores_per_instance: int) -> bool:
    """pin_instances: "on" always, "off" never, "auto" when the model has several instances or sets its cores."""
    if setting == "on":
        return True
    if setting == "off":
        return False
    return total > 1 or cores_per_instance > 0


def sibling_reader(root: Path = Path("/sys/devices/system/cpu")) -> Callable[[int], tuple[int, ...]]:
    """Hyper-thread siblings of a CPU as Linux reports them (just the CPU itself where it does not)."""

    def read(cpu: int) -> tuple[int, ...]:
        try:
            text = (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        except OSError:
            return (cpu,)
        return parse_cpu_list(text) or (cpu,)

    return read


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Linux's CPU list format ("0-3,8,10-11") as a sorted tuple."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        cpus.update(range(int(low), int(high) + 1) if dash else (int(low),))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of `parse_cpu_list`: (0, 1, 2, 5) -> "0-2,5"."""
    values = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def usable_cpus() -> tuple[int, ...]:
    """This process's CPUs (the server's, before pinning), hyper-thread siblings adjacent."""
    return order_by_core(os.sched_getaffinity(0), sibling_reader())


def pin_process(cpus: Iterable[int]) -> None:
    """Pin every thread of this process to `cpus`; threads created later inherit it."""
    wanted = set(cpus)
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = []
    os.sched_setaffinity(0, wanted)
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def plan_for_instance(
    model_name: str,
    instance_name: str,
    model_config: Mapping[str, Any],
    setting: str,
    cores_per_instance: int,
    device_id: int = 0,
    usable: Sequence[int] | None = None,
) -> PinPlan | None:
    """The plan for one instance, or None when pinning is off for it."""
    position = instance_position(model_name, instance_name, model_config.get("instance_group") or [], device_id)
    if not should_pin(setting, position.total, cores_per_instance):
        return None
    return plan_cpus(position.index, position.total, usable if usable is not None else usable_cpus(), cores_per_instance)


def pinned_options(options, plan: PinPlan):
    """The backend options an instance pinned by `plan` runs with, and notes for the log.

    Engine threads are sized to the CPU set (intra-op = its cores, inter-op = 1) unless the user set them;
    intra-op spinning is switched off when the set is shared with another instance, since a spinning
    pool burns the core its neighbour needs.
    """
    notes: list[str] = []
    changes: dict[str, Any] = {}
    cores = len(plan.cpus)
    session = options.session
    if session.intra_op_thread_count == 0:
        changes["intra_op_thread_count"] = cores
    elif session.intra_op_thread_count > cores:
        notes.append(f"intra_op_thread_count={session.intra_op_thread_count} (set by the user) exceeds the "
                     f"{cores} pinned core(s): threads share cores")
    if session.inter_op_thread_count == 0:
        changes["inter_op_thread_count"] = 1
    if session.allow_spinning == "auto" and plan.shared:
        changes["allow_spinning"] = "off"
    return options.replace(**changes), notes
