"""The engine interface: something that runs a compiled ONNX graph on numpy feeds."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping, Sequence

import numpy as np

from gebackend.errors import GeBackendError, InvalidRequest


class EngineInputError(InvalidRequest):
    """The engine refused the inputs themselves (shape, type): the client's fault."""


class EngineRunError(GeBackendError):
    """The engine failed while running: an internal error."""


class Engine(ABC):
    """Runs one model. Implementations raise `EngineInputError` or `EngineRunError`, nothing else."""

    name: str = "engine"

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Run once; return the outputs in the order of `output_names`."""

    def describe(self) -> str:
        """One line for the load log: engine, device, main settings."""
        return self.name

    def close(self) -> None:
        """Release the engine's resources."""
