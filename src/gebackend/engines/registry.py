"""The engines by name: what builds a model's dynamic engine and its static engine, and how each runs a precision.

Each engine module declares one `KIND = EngineKind(...)`; this table names the modules, which are imported
only when their engine is asked for (OpenVINO may not be installed), and the package each needs. Adding an
engine is one module and one line in `_MODULES`. Everything that used to ask "is it OpenVINO?" asks its
`EngineKind` instead, and the engine names appear only here and in their own modules: the default engine, the
other spellings users write, and what `engine=auto` prefers for a precision are said here too.
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

_MODULES = {  # name -> (its module, the package it needs)
    "onnxruntime": ("gebackend.engines.onnxruntime", "onnxruntime"),
    "openvino": ("gebackend.engines.openvino", "openvino"),
}
DEFAULT = "onnxruntime"  # engine= unset
# config.pbtxt `optimization { execution_accelerators { cpu_execution_accelerator [ { name } ] } }`, the names Triton's
# onnxruntime backend takes there -> the engine that runs them (config/accelerators.py checks the names)
CPU_ACCELERATORS = {"openvino": "openvino"}
ALIASES = {"ort": "onnxruntime"}  # other spellings of an engine's name
# engine=auto, as measured on x86 CPUs: OpenVINO for bf16/fp16 (ONNX Runtime's CPU provider has no bf16 path, and
# OpenVINO's is 2.3-5.9x faster than its f32 on ResNet-style models); the default for exact fp32 and int8
# (OpenVINO f32 is slower than ONNX Runtime on small models and only 1.1-1.5x faster on large ones) and whenever
# the preferred engine is not installed. For int8, engine=auto also looks at the model (engines/auto_choice.py).
_AUTO = (("openvino", ("bf16", "fp16")),)


@dataclass(frozen=True)
class EngineKind:
    name: str
    # (ONNX file, options, ONNX Runtime providers) -> the dynamic graph engine
    dynamic: Callable[[Path, "BackendOptions", Sequence], "Engine"]
    # (compiled graphs, options, providers, the source ONNX file, temp folder parent) -> the static graph engine
    static: Callable[[Sequence, "BackendOptions", Sequence, Path, Path | None], "Engine"]
    # the precision_modes the engine itself compiles at (OpenVINO's precision hint for bf16/fp16); any other mode but
    # origin is lowered first (compile/precision.py) and the engine runs the lowered file (int8 on every engine)
    lowers_in_engine: frozenset[str]
    # precision_mode -> what it runs at on this CPU (engines/cpu.py asks here)
    precision_run: Callable[[str], "PrecisionRun"]
    # it runs ONNX Runtime sessions, which take execution providers (engines/providers/); else it runs on the CPU
    # provider list and places itself (OpenVINO's `device` option)
    onnxruntime_providers: bool = False
    # precision_mode=int8: the `quantization` values the engine runs (OpenVINO has no dynamic int8), and the tool
    # that makes the static (calibrated) QDQ file for it (compile/quantize_static.py)
    quantizations: tuple[str, ...] = ("dynamic", "static")
    static_quantizer: str = "onnxruntime"  # "onnxruntime" (quantize_static) | "nncf"

    def lowers(self, mode: str) -> bool:
        """Whether the engine compiles `mode` itself (no file lowering first)."""
        return mode in self.lowers_in_engine


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def kind(name: str) -> EngineKind:
    """The engine registered as `name`; `ImportError` when its package is not installed."""
    try:
        module, _ = _MODULES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}: expected one of {', '.join(_MODULES)}") from None
    return importlib.import_module(module).KIND


def installed(name: str) -> bool:
    """Whether the package the engine needs is installed (without importing it)."""
    import importlib.util

    return importlib.util.find_spec(_MODULES[ALIASES.get(name, name)][1]) is not None


def auto(precision_mode: str) -> str:
    """The engine `engine=auto` runs a precision_mode on: the preferred one where installed, else the default."""
    for name, precisions in _AUTO:
        if precision_mode in precisions and installed(name):
            return name
    return DEFAULT


def spellings() -> dict[str, str]:
    """What `engine=` accepts -> the engine: every name, its other spellings, and auto."""
    return {**{name: name for name in _MODULES}, **ALIASES, "auto": "auto"}
