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


def create_engine(spec, providers: Sequence = ("CPUExecutionProvider",)) -> Engine:
    """The dynamic graph engine for a model."""
    from gebackend.engines.onnxruntime import OrtEngine

    return OrtEngine(spec.path, spec.options, providers)


__all__ = ["Engine", "create_engine", "providers_for"]
