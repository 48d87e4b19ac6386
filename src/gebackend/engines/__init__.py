"""Graph engines behind one small interface (registered by name in `registry.py`), which one a model's options
name, and which execution providers an instance gets (registered by name in `providers/`)."""

from __future__ import annotations

from typing import Sequence

from gebackend.engines.base import Engine
from gebackend.engines.providers import Selection, default_providers, select_providers
from gebackend.engines.registry import kind


def providers_for(instance_kind: str = "CPU", device_id: int = 0) -> list:
    """ONNX Runtime execution providers for a Triton instance without a model spec: CUDA for KIND_GPU where
    installed, else CPU. Instances of a model get theirs from `select_providers(spec, kind, device_id)`, which also
    reads the model's accelerators and options and refuses a provider that is missing (engines/providers/)."""
    return list(default_providers(instance_kind, device_id))


def engine_name(choice) -> str:
    """The engine that runs a model's options (their `engines` group, config/option_groups.EngineChoice).

    `auto` follows what was measured on x86 CPUs: OpenVINO for bf16/fp16 (ONNX Runtime's CPU provider
    has no bf16 path, and OpenVINO's is 2.3-5.9x faster than its f32 on ResNet-style models), ONNX
    Runtime for exact fp32 and int8 (OpenVINO f32 is slower than ONNX Runtime on small models and only
    1.1-1.5x faster on large ones) and whenever OpenVINO is not installed.
    """
    if choice.engine != "auto":
        return choice.engine
    import importlib.util

    if choice.precision_mode in ("bf16", "fp16") and importlib.util.find_spec("openvino") is not None:
        return "openvino"
    return "onnxruntime"


def create_engine(spec, providers: Sequence = ("CPUExecutionProvider",)) -> Engine:
    """The dynamic graph engine for a model."""
    return kind(engine_name(spec.options.engines)).dynamic(spec.path, spec.options, providers)


def create_static_engine(spec, graphs: Sequence, providers: Sequence = ("CPUExecutionProvider",), temp_parent=None) -> Engine:
    """The static graph engine for a model: one compiled graph per shape (bucket)."""
    return kind(engine_name(spec.options.engines)).static(graphs, spec.options, providers, spec.path, temp_parent)


__all__ = ["Engine", "Selection", "create_engine", "create_static_engine", "engine_name", "providers_for",
           "select_providers"]
