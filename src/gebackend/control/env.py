"""The environment `gebackend serve` hands tritonserver and so every model instance: the names, and reading them.

Triton drops `--backend-config=<name>,k=v` for Python-based backends before it reaches `model.py`, and its
auto-complete hook does not say where a model lives, so the CLI passes what the instances need this way:
- `GE_BACKEND_CONFIG`: the server-wide `--backend-config ge,KEY=VALUE` options, as a JSON object;
- `GE_MODEL_REPOSITORY`: the model repository (or several, `os.pathsep` between them);
- `GE_CONTROL_DIR`: the server's control folder (control files such as `gebackend profile start`, the instances'
  heartbeats, the ledger of pinned cores), inside the server's own temp folder, which the CLI removes at shutdown
  even when an instance was killed. Absent under a plain tritonserver: then nothing here is watched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

BACKEND_CONFIG = "GE_BACKEND_CONFIG"
MODEL_REPOSITORY = "GE_MODEL_REPOSITORY"
CONTROL_DIR = "GE_CONTROL_DIR"


def control_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The control folder of the `gebackend serve` running this instance (None under a plain tritonserver)."""
    control = environ.get(CONTROL_DIR)
    return Path(control) if control else None


def server_temp_parent(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The server's own temp folder when served by `gebackend serve`, which it removes at shutdown even if
    this process is killed; None elsewhere (then the system temp folder is used)."""
    control = control_dir(environ)
    return control.parent if control is not None and control.parent.is_dir() else None
