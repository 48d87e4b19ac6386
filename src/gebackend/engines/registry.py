"""The engines by name: what builds a model's dynamic engine and its static engine, and how each runs a precision.

Each engine module declares one `KIND = EngineKind(...)`; this table names the modules, which are imported
only when their engine is asked for (OpenVINO may not be installed). Adding an engine is one module and one
line in `_MODULES`. Everything that used to ask "is it OpenVINO?" asks its `EngineKind` instead.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from gebackend.config.options import BackendOptions
    from gebackend.engines.base import Engine
    from gebackend.engines.cpu import PrecisionRun

_MODULES = {
    "onnxruntime": "gebackend.engines.onnxruntime",
    "openvino": "gebackend.engines.openvino",
}


@dataclass(frozen=True)
class EngineKind:
    name: str
    # (ONNX file, options, ONNX Runtime providers) -> the dynamic graph engine
    dynamic: Callable[[Path, "BackendOptions", Sequence], "Engine"]
    # (compiled graphs, options, providers, the source ONNX file, temp folder parent) -> the static graph engine
    static: Callable[[Sequence, "BackendOptions", Sequence, Path, Path | None], "Engine"]
    # True: the engine itself compiles at `precision_mode` (OpenVINO's precision hint); False: the model file is
    # lowered first (compile/precision.py) and the engine runs the lowered file
    lowers_in_engine: bool
    # precision_mode -> what it runs at on this CPU (engines/cpu.py asks here)
    precision_run: Callable[[str], "PrecisionRun"]


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def kind(name: str) -> EngineKind:
    """The engine registered as `name`; `ImportError` when its package is not installed."""
    try:
        module = _MODULES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}: expected one of {', '.join(_MODULES)}") from None
    return importlib.import_module(module).KIND
