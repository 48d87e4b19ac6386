"""Triton's response cache at `gebackend serve` start: a model's `response_cache { enable: true }` caches its answers
only when tritonserver runs with a cache (`--cache-config`); without one Triton serves the model uncached and says
nothing, so the CLI names the models that asked and how to give them the cache. The cache is Triton's own and
works for `ge` models as for the onnxruntime backend's (tests/e2e/test_response_cache.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gebackend.server.repository_client import flag_values


def asking_models(repository: Path) -> list[str]:
    """The models of `repository` whose config.pbtxt enables the response cache (one that does not parse: skipped,
    Triton reports it)."""
    from gebackend.config.pbtxt import load_model_config

    found = []
    try:
        folders = sorted(p for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:  # no such folder, or unreadable: the server says so, with its own words
        return []
    for folder in folders:
        path = folder / "config.pbtxt"
        try:
            config = load_model_config(path) if path.is_file() else {}
        except Exception:  # noqa: BLE001 - a broken config is Triton's to report, with its line
            continue
        if (config.get("response_cache") or {}).get("enable") in (True, "true"):
            found.append(folder.name)
    return found


def cache_note(repository: Path, tritonserver_args: Sequence[str]) -> str | None:
    """The line to say when models ask for the response cache and tritonserver is given none, else None."""
    if flag_values(tritonserver_args, "--cache-config") or flag_values(tritonserver_args, "--response-cache-byte-size"):
        return None
    models = asking_models(repository)
    if not models:
        return None
    return (f"model(s) {models} enable response_cache but tritonserver has no cache, so Triton serves them uncached: "
            f"start with `gebackend serve {repository} -- --cache-config local,size=BYTES`")
