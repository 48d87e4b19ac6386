"""What a container imposes on `gebackend serve`, checked at start rather than met at the first large request:
a temp folder that allows exec (the backends folder is laid out there) and, through `shm.py`, a /dev/shm large
enough for the repository. The log format a collector reads is `log_format.py`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

from gebackend.server.shm import check_shm, estimate_shm

STATVFS = os.statvfs  # tests replace it


__all__ = ["check_temp_exec", "preflight"]


def check_temp_exec(temp_dir: str | None = None, statvfs: Callable[[str], os.statvfs_result] | None = None) -> str | None:
    """Why the temp folder cannot hold the backends directory (None when it can).

    tritonserver loads `libtriton_python.so` from the backends directory the launcher lays out in the temp folder
    (a symlink is refused): on a `noexec` mount every model fails to load with "failed to map segment from shared
    object". Docker's `--tmpfs /tmp` is noexec unless given `:exec`; podman's and Kubernetes' emptyDir are not.
    """
    import tempfile

    folder = temp_dir or tempfile.gettempdir()
    try:
        flags = (statvfs or STATVFS)(folder).f_flag
    except OSError as exc:
        return f"the temp folder {folder} is not usable ({exc}); set TMPDIR to a writable folder"
    if flags & getattr(os, "ST_NOEXEC", 8):
        return (f"the temp folder {folder} is mounted noexec, and tritonserver loads the Python backend's library from "
                f"the backends folder laid out there. Mount it with exec (docker run --tmpfs /tmp:exec; podman's "
                f"--tmpfs and a Kubernetes emptyDir allow it) or set TMPDIR to a writable folder that allows exec")
    if flags & getattr(os, "ST_RDONLY", 1):
        return f"the temp folder {folder} is read-only; mount a writable one there (--tmpfs /tmp) or set TMPDIR"
    return None


def preflight(repository: Path, global_options: Mapping[str, str], backend_configs: Iterable[str],
              fail: Callable[[str], None], say_ok: Callable[[str], None], shm: bool = True,
              shm_dir: Path = Path("/dev/shm"), statvfs: Callable[[str], os.statvfs_result] | None = None) -> bool:
    """At `gebackend serve` start, before tritonserver: the temp folder allows exec, and (`shm`) /dev/shm holds
    what the repository needs. Each finding goes to `say_ok` or, when the server cannot work, to `fail` (then
    False)."""
    problem = check_temp_exec(statvfs=statvfs)
    if not repository.is_dir():  # nothing to estimate: say that first and only
        problem = f"model repository {repository} is not a folder"
    if problem:
        fail(problem)
        return False
    if not shm:
        return True
    try:
        need = estimate_shm(repository, global_options, backend_configs)
    except Exception as exc:  # noqa: BLE001 - an estimator bug must not stop a server that can start
        say_ok(f"could not estimate what the repository needs in {shm_dir} ({type(exc).__name__}: {exc}); not checked")
        return True
    result = check_shm(need, shm_dir, statvfs or STATVFS)
    (say_ok if result.ok else fail)(result.message)
    return result.ok
