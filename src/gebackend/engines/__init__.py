"""Graph engines behind one small interface, and which execution providers an instance gets."""

from __future__ import annotations

from typing import Sequence

from gebackend.engines.base import Engine


def providers_for(instance_kind: str = "CPU", device_id: int = 0) -> list:
    """ONNX Runtime execution providers for a Triton instance: CUDA for KIND_GPU where installed, else CPU."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if instance_kind.upper().endswith("GPU") and "CUDAExecutionProvider" in available:
        return [("CUDAExecutionProvider", {"device_id": str(device_id)}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def engine_name(requested: str) -> str:
    """The engine that runs: `auto` picks OpenVINO where it is installed (fastest on x86 CPUs), else ONNX Runtime."""
    if requested != "auto":
        return requested
    import importlib.util

    return "openvino" if importlib.util.find_spec("openvino") is not None else "onnxruntime"


def create_engine(spec, providers: Sequence = ("CPUExecutionProvider",)) -> Engine:
    """The dynamic graph engine for a model."""
    if engine_name(spec.options.engine) == "openvino":
        from gebackend.engines.openvino import OvEngine

        return OvEngine(spec.path, spec.options)
    from gebackend.engines.onnxruntime import OrtEngine

    return OrtEngine(spec.path, spec.options, providers)


def create_static_engine(spec, graphs: Sequence, providers: Sequence = ("CPUExecutionProvider",), temp_parent=None) -> Engine:
    """The static graph engine for a model: one compiled graph per shape (bucket)."""
    if engine_name(spec.options.engine) == "openvino":
        from gebackend.engines.openvino import OvStaticEngine

        return OvStaticEngine(graphs, spec.options)
    from gebackend.engines.onnxruntime_static import OrtStaticEngine

    return OrtStaticEngine(graphs, spec.options, providers, temp_parent=temp_parent)


__all__ = ["Engine", "create_engine", "create_static_engine", "engine_name", "providers_for"]
