"""Finds a model's ONNX file in a Triton model repository, the way ge-backend does."""

from __future__ import annotations

import os
from pathlib import Path

from gebackend.control import env
from gebackend.errors import ConfigError

REPOSITORY_ENV_VAR = env.MODEL_REPOSITORY  # where the CLI says the repositories are (control/env.py)


def find_model_file(version_dir: str | Path, default_model_filename: str = "") -> Path:
    """`default_model_filename` from config.pbtxt if set, else `model.onnx`, else the first `*.onnx`. A folder of
    that name holds the model as `<folder>/model.onnx` (its external weights beside it), as Triton's onnxruntime
    backend reads it."""
    version_dir = Path(version_dir)
    if not version_dir.is_dir():
        raise ConfigError(f"model version folder {version_dir} does not exist")
    names = [default_model_filename] if default_model_filename else ["model.onnx"]
    for name in names:
        candidate = version_dir / name
        if candidate.is_dir():
            if (candidate / "model.onnx").is_file():
                return candidate / "model.onnx"
            raise ConfigError(f"{candidate} is a folder without model.onnx in it; a model kept in a folder is "
                              f"<folder>/model.onnx, with its weights beside it")
        if candidate.is_file():
            return candidate
    others = sorted(p for p in version_dir.glob("*.onnx") if p.is_file())
    if others and not default_model_filename:
        return others[0]
    wanted = default_model_filename or "model.onnx or any *.onnx"
    raise ConfigError(f"no ONNX file in {version_dir} (looked for {wanted})")


def latest_version_dir(model_dir: str | Path) -> Path:
    """The highest numeric version folder of a model, as Triton's default version policy picks it."""
    model_dir = Path(model_dir)
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()] if model_dir.is_dir() else []
    if not versions:
        raise ConfigError(f"model folder {model_dir} has no numeric version folder (e.g. {model_dir}/1)")
    return max(versions, key=lambda p: int(p.name))


def version_dir_of_stub(stub_model_path: str | None) -> Path | None:
    """The version folder a Python-backend stub serves, or None where `stub_model_path` names none. Triton starts each
    stub, one per version and the auto-complete stub included, with `<model folder>/<version>/model.py` as its first
    argument, while the auto-complete hook itself is told neither the folder nor the version.

    So each version of a model is completed from its own file, as Triton's onnxruntime backend completes it (a model
    with `version_policy: { all { } }` whose versions differ in their tensors loads every version), and a model loaded
    through the model-control API with its files in the request (`file:1/model.onnx`), which Triton keeps in a
    folder of its own outside the repository, is completed from those files."""
    if not stub_model_path:
        return None
    folder = Path(stub_model_path).parent
    return folder if folder.name.isdigit() and folder.is_dir() else None


def model_dir_in_repositories(model_name: str, environ=os.environ) -> Path:
    """The folder of `model_name` in the repositories the CLI announced in `GE_MODEL_REPOSITORY`.

    Triton's auto-complete hook does not say where the model lives, so the launcher tells us.
    """
    repositories = [p for p in environ.get(REPOSITORY_ENV_VAR, "").split(os.pathsep) if p]
    for repo in repositories:
        candidate = Path(repo) / model_name
        if candidate.is_dir():
            return candidate
    raise ConfigError(
        f"model '{model_name}' not found in the repositories named by {REPOSITORY_ENV_VAR} "
        f"({repositories or 'unset'}); start the server with `gebackend serve`"
    )
