"""Reading `/proc/<pid>/stat`: a process's state, parent and start time, and whether a pid is still the same process.

Shared by the watchdog (stub processes), the instances' heartbeats and the core ledger (both key their
records by pid and start time, so that a reused pid is told apart).
"""

from __future__ import annotations

import os

PROC = "/proc"


def read_stat(pid: int | str, proc: str | os.PathLike = PROC) -> str | None:
    """The text of `<proc>/<pid>/stat` (one small read, no buffering), or None when the process is gone."""
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1024).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def stat_fields(stat: str) -> list[str]:
    """The fields after the command name: [state, ppid, ...]; index 19 is the start time in clock ticks."""
    return stat[stat.rfind(")") + 2:].split()


def own_start_time() -> int:
    """This process's start time in clock ticks (with its pid, a name no later process can reuse)."""
    return int(stat_fields(read_stat("self") or "")[19])


def is_running(pid: int, started: int | str) -> bool:
    """Whether `pid` is still the process that started at `started` (not gone, reused or a zombie)."""
    stat = read_stat(pid)
    fields = stat_fields(stat) if stat else []
    return len(fields) > 19 and fields[19] == str(started) and fields[0] not in ("Z", "X")
