"""Graph engines behind one small interface; `create_engine` picks the implementation for a spec."""

from __future__ import annotations

from gebackend.config.spec import ModelSpec
from gebackend.engines.base import Engine


def create_engine(spec: ModelSpec) -> Engine:
    from gebackend.engines.onnxruntime import OrtEngine

    return OrtEngine(spec.path, spec.options)


__all__ = ["Engine", "create_engine"]
