"""Where a running `gebackend serve` can be found by other gebackend commands on this machine.

Each server registers its HTTP port with the folder its backend instances watch for control
files (e.g. `gebackend profile start`); the entry is removed when the server stops.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gebackend.errors import GeBackendError

CONTROL_ENV_VAR = "GE_CONTROL_DIR"


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
