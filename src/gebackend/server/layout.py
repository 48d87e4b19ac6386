"""Lays out the backends directory tritonserver loads: Triton's Python backend plus our `ge` / `npu_ge` backends.

Facts this layout is built on (tritonserver 2.51 from nvidia-pytriton 0.7.0):
- `libtriton_python.so` must be a real file inside the backends directory: a symlink is refused
  ("escapes backend directory");
- the stub binary must be a *symlink* to the wheel's copy: a copied stub cannot find the libraries
  the wheel ships next to it (its RPATH is relative) and the server then hangs;
- a Python-based backend is a folder named after the backend holding `model.py`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gebackend.server.distribution import TritonDistribution

BACKEND_NAMES = ("ge", "npu_ge")
ADAPTER = Path(__file__).resolve().parent.parent / "triton" / "model.py"


def lay_out_backends(triton: TritonDistribution, target: Path) -> Path:
    """Create `<target>/backends` and return it."""
    backends = target / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(triton.python_backend / name, python / name)
    (python / "triton_python_backend_stub").symlink_to(triton.stub())
    for name in BACKEND_NAMES:
        (backends / name).mkdir()
        shutil.copy2(ADAPTER, backends / name / "model.py")
    return backends
