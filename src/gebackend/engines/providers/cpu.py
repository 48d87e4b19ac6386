"""ONNX Runtime's CPU execution provider: every onnxruntime package has it; the instances of kind KIND_CPU,
KIND_MODEL and KIND_AUTO run on it unless `execution_provider` names another one."""

from __future__ import annotations

from gebackend.engines.providers.base import CPU, ProviderKind, Target


def entries(target: Target) -> list:
    return [CPU]


KIND = ProviderKind(
    "cpu", (CPU,), package="onnxruntime", install="pip install onnxruntime", device="cpu", entries=entries,
    default_for=("CPU", "MODEL", "AUTO"),
)
