"""Where a running `gebackend serve` can be found by other gebackend commands on this machine.

Each server registers its HTTP port with the folder its backend instances watch for control
files (e.g. `gebackend profile start`); the entry is removed when the server stops. An entry whose
CLI died without stopping (`kill -9`) lets the next `gebackend serve` remove what that server left.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from gebackend.errors import GeBackendError


def registry_dir() -> Path:
    base = os.environ.get("GE_RUNTIME_DIR") or os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache"
    return Path(base) / "gebackend" / "servers"


def register(http_port: int, control_dir: Path) -> Path:
    entry = registry_dir() / f"{http_port}.json"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(json.dumps({"pid": os.getpid(), "http_port": http_port, "control_dir": str(control_dir)}))
    return entry


def unregister(http_port: int) -> None:
    (registry_dir() / f"{http_port}.json").unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Remove what servers whose CLI was killed (`kill -9`, a crash) left: their temp folder, their
    `/dev/shm` regions (`gebackend<pid>x*`) and their entry. Returns what was removed."""
    removed = []
    for entry in sorted(registry_dir().glob("*.json")) if registry_dir().is_dir() else []:
        try:
            data = json.loads(entry.read_text())
            pid, control = int(data["pid"]), Path(data["control_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if process_alive(pid):
            continue
        workdir = control.parent
        if control.name == "control" and workdir.name.startswith("gebackend-") and workdir.is_dir():
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(str(workdir))
        for region in sorted(shm_dir.glob(f"gebackend{pid}x*")) if shm_dir.is_dir() else []:
            region.unlink(missing_ok=True)
            removed.append(str(region))
        entry.unlink(missing_ok=True)
    return removed


def control_dir_for(http_port: int) -> Path:
    """The control folder of the server listening on `http_port`, if it is a live gebackend server."""
    entry = registry_dir() / f"{http_port}.json"
    try:
        data = json.loads(entry.read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError):
        raise GeBackendError(
            f"no running `gebackend serve` with HTTP port {http_port} on this machine (looked in {registry_dir()})"
        ) from None
    return Path(data["control_dir"])
