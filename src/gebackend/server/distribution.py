"""Finds the tritonserver binary, its Python backend and the backend stubs inside the installed nvidia-pytriton wheel.

The wheel's package (`pytriton`) is located with `importlib.util.find_spec`, which does not import it.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from gebackend.errors import GeBackendError


class TritonNotFound(GeBackendError):
    """The nvidia-pytriton wheel, or a part of it we need, is missing."""


@dataclass(frozen=True)
class TritonDistribution:
    root: Path  # .../site-packages/pytriton/tritonserver

    @property
    def server_binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    @property
    def libs(self) -> Path:
        """The shared libraries the wheel bundles (libcudart, libtritonserver, ...)."""
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def stub(self, python_version: str | None = None) -> Path:
        version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.root / "python_backend_stubs" / version / "triton_python_backend_stub"

    def check(self) -> "TritonDistribution":
        for path in (self.server_binary, self.python_backend / "libtriton_python.so", self.stub()):
            if not path.exists():
                raise TritonNotFound(
                    f"{path} is missing: the nvidia-pytriton wheel has no {path.name} for this platform/Python "
                    f"{sys.version_info.major}.{sys.version_info.minor}"
                )
        return self


def find_triton() -> TritonDistribution:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotFound("nvidia-pytriton is not installed in this Python environment (pip install nvidia-pytriton==0.7.0)")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    return TritonDistribution(package_dir / "tritonserver").check()
