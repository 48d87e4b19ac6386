"""The engines by name: what builds a model's dynamic engine and its static engine, and how each runs a precision.

Each engine module declares one `KIND = EngineKind(...)`; the table of names (config/engine_names.py: the modules,
the package each needs, the default engine, the other spellings users write) says which module, imported only when
its engine is asked for (OpenVINO may not be installed). Adding an engine is one module and one line in that
table. Everything that used to ask "is it OpenVINO?" asks its `EngineKind` instead, and the engine names appear
only in that table, here (what `engine=auto` prefers for a precision) and in their own modules. What a
`precision_mode` runs at on this CPU on an engine is its kind's to say (`precision_run`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from gebackend.config.engine_names import ALIASES, DEFAULT, MODULES
from gebackend.cpu import PrecisionRun

if TYPE_CHECKING:
    from gebackend.config.options import BackendOptions
    from gebackend.engines.base import Engine

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
    # precision_mode -> what it runs at on this CPU (`precision_run` asks here)
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


def kind(name: str) -> EngineKind:
    """The engine registered as `name`; `ImportError` when its package is not installed."""
    try:
        module, _ = MODULES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}: expected one of {', '.join(MODULES)}") from None
    return importlib.import_module(module).KIND


def installed(name: str) -> bool:
    """Whether the package the engine needs is installed (without importing it)."""
    import importlib.util

    return importlib.util.find_spec(MODULES[ALIASES.get(name, name)][1]) is not None


def auto(precision_mode: str) -> str:
    """The engine `engine=auto` runs a precision_mode on: the preferred one where installed, else the default."""
    for name, precisions in _AUTO:
        if precision_mode in precisions and installed(name):
            return name
    return DEFAULT


def precision_run(mode: str, engine: str, quantization: str = "") -> PrecisionRun:
    """What `precision_mode` `mode` runs at on `engine` on this CPU: each engine says (its `KIND`).

    `quantization` (int8: "dynamic" | "static", as compile/precision.py resolved it) heads the note with how the
    int8 model was made: "int8 static (ONNX Runtime, QDQ)", "int8 static (NNCF, QDQ)", "int8 dynamic (ONNX Runtime)".
    """
    engine_kind = kind(engine)
    run = engine_kind.precision_run(mode)
    if mode != "int8" or quantization not in ("dynamic", "static") or run.note.startswith(f"int8 {quantization}"):
        return run
    tool = "NNCF, QDQ" if engine_kind.static_quantizer == "nncf" else "ONNX Runtime, QDQ"
    how = f"int8 static ({tool})" if quantization == "static" else "int8 dynamic (ONNX Runtime)"
    return PrecisionRun(mode, run.ran, "; ".join(n for n in (how, run.note) if n))
