"""Where gebackend keeps what is expensive to rebuild across restarts (TensorRT engines, quantized models).

A cache sits beside the model when the model's folder is writable: `<model folder>/.gebackend-cache/<leaf>/`.
Where it is not (a read-only volume in a container): `$GE_CACHE_DIR/<model>/<leaf>`, else `$XDG_CACHE_HOME`
(or `~/.cache`) `/gebackend/<model>/<leaf>`, else the system temp folder. The server's own temp folder is never
used: it is removed at shutdown. Each user names its leaf after what its cache depends on (`fingerprint`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from gebackend.errors import ModelLoadError

CACHE_ENV_VAR = "GE_CACHE_DIR"
CACHE_FOLDER = ".gebackend-cache"


def fingerprint(path: Path | None) -> str:
    """12 hex digits naming this version of the model file (its name, size and mtime)."""
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        stat = None
    text = f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}" if stat is not None else "no-model-file"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def safe_name(name: str) -> str:
    """A model name usable as one folder name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"


def candidates(model_path: Path | None, model: str, leaf: str, environ=os.environ) -> list[Path]:
    """Where a cache may go, in order of preference (see the module docstring)."""
    found = []
    if model_path is not None:
        found.append(Path(model_path).parent / CACHE_FOLDER / leaf)
    if environ.get(CACHE_ENV_VAR):
        found.append(Path(environ[CACHE_ENV_VAR]) / safe_name(model) / leaf)
    home = environ.get("XDG_CACHE_HOME") or (str(Path.home() / ".cache") if environ.get("HOME") else "")
    if home:
        found.append(Path(home) / "gebackend" / safe_name(model) / leaf)
    found.append(Path(tempfile.gettempdir()) / "gebackend-cache" / safe_name(model) / leaf)
    return found


def first_writable(folders: list[Path], what: str, instead: str = "") -> Path:
    """The first of `folders` that is (or can be made) writable; `what` and `instead` word the error."""
    tried = []
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK | os.X_OK):
                return folder
        except OSError:
            pass
        tried.append(str(folder))
    raise ModelLoadError(f"no writable folder for {what} (tried {', '.join(tried)}): set {CACHE_ENV_VAR} to one"
                         + (f", or {instead}" if instead else ""))
