"""Lays out the backends directory tritonserver loads: Triton's Python backend plus our backends.

Our backends are `ge` / `npu_ge` (ONNX models) and the CN_CLIP preprocessing backends
`cnclip_image_preprocess` / `cnclip_text_preprocess` (gebackend.preprocess), each a folder holding its adapter
as `model.py`, so a model repository names them in `backend:` and never carries a model.py of its own.

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

BACKEND_NAMES = ("ge", "npu_ge")  # the ONNX backends, both served by ADAPTER
_TRITON = Path(__file__).resolve().parent.parent / "triton"
ADAPTER = _TRITON / "model.py"
# backend name -> the adapter laid out as backends/<name>/model.py
ADAPTERS = {
    **{name: ADAPTER for name in BACKEND_NAMES},
    "cnclip_image_preprocess": _TRITON / "cnclip_image_preprocess.py",
    "cnclip_text_preprocess": _TRITON / "cnclip_text_preprocess.py",
}


def lay_out_backends(triton: TritonDistribution, target: Path) -> Path:
    """Create `<target>/backends` and return it."""
    backends = target / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(triton.python_backend / name, python / name)
    (python / "triton_python_backend_stub").symlink_to(triton.stub())
    for name, adapter in ADAPTERS.items():
        (backends / name).mkdir()
        shutil.copy2(adapter, backends / name / "model.py")
    return backends
