"""The engines' names, what the options need of the engines: each engine by name with the module that declares its
`KIND` and the package it needs (engines/registry.py imports the module only when its engine is asked for: OpenVINO
may not be installed), the default engine, the other spellings users write, and the names config.pbtxt's
`cpu_execution_accelerator` takes. Adding an engine is one module under engines/ and one line in `MODULES`.
"""

from __future__ import annotations

MODULES = {  # name -> (its module, the package it needs)
    "onnxruntime": ("gebackend.engines.onnxruntime", "onnxruntime"),
    "openvino": ("gebackend.engines.openvino", "openvino"),
}
DEFAULT = "onnxruntime"  # engine= unset
# config.pbtxt `optimization { execution_accelerators { cpu_execution_accelerator [ { name } ] } }`, the names Triton's
# onnxruntime backend takes there -> the engine that runs them (config/accelerators.py checks the names)
CPU_ACCELERATORS = {"openvino": "openvino"}
ALIASES = {"ort": "onnxruntime"}  # other spellings of an engine's name


def names() -> tuple[str, ...]:
    return tuple(MODULES)


def spellings() -> dict[str, str]:
    """What `engine=` accepts -> the engine: every name, its other spellings, and auto."""
    return {**{name: name for name in MODULES}, **ALIASES, "auto": "auto"}
