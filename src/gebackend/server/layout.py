"""Lays out the backends directory tritonserver loads: Triton's Python backend plus our backends.

Our backends are `ge` / `npu_ge` (ONNX models; also under Triton's `onnxruntime`, see PEER_NAMES) and the CN_CLIP
preprocessing backends `cnclip_image_preprocess` / `cnclip_text_preprocess` (gebackend.preprocess), each a folder
holding its adapter as `model.py`, so a model repository names them in `backend:` and never carries a model.py of its own.

Facts this layout is built on (tritonserver 2.51 from nvidia-pytriton 0.7.0):
- `libtriton_python.so` must be a real file inside the backends directory: a symlink is refused
  ("escapes backend directory");
- the stub binary must be a *symlink* to the wheel's copy: a copied stub cannot find the libraries
  the wheel ships next to it (its RPATH is relative) and the server then hangs;
- a Python-based backend is a folder named after the backend holding `model.py`.

Other backends (the bench's peer, Triton's C++ onnxruntime backend, gebackend.bench.peer) can be laid out
beside ours: `extra_backends` maps a backend name to a folder (or `$GE_EXTRA_BACKENDS` does, NAME=FOLDER entries
separated by `os.pathsep`, which is how `gebackend bench` reaches the `gebackend serve` it starts). Each is
*copied* (hard links where the file system allows, else copies), never linked as a folder: tritonserver
refuses a backend library whose real path escapes the backends directory, as it does a symlinked
`libtriton_python.so`. Symlinks inside the folder that stay inside it (libonnxruntime.so -> libonnxruntime.so.1)
are kept as they are. A backend built against a stock Triton links `libtritonserver.so`, which the wheel ships
renamed (auditwheel: `libtritonserver-<hash>.so`, its SONAME too): the copy gets a `libtritonserver.so` symlink to
the wheel's file, so the loader, searching the backend's `$ORIGIN`, maps the library tritonserver already runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from gebackend.files import link_or_copy
from gebackend.server.distribution import TritonDistribution

BACKEND_NAMES = ("ge", "npu_ge")  # the ONNX backends, both served by ADAPTER
# Triton's onnxruntime backend's name: a model whose config says `backend: "onnxruntime"` (or `platform:
# "onnxruntime_onnx"`, which Triton maps to it) is served by ADAPTER too, unchanged, unless the server is given that
# backend itself (an extra backend of the name: the bench's peer). nvidia-pytriton ships no onnxruntime backend.
PEER_NAMES = ("onnxruntime",)
_TRITON = Path(__file__).resolve().parent.parent / "triton"
ADAPTER = _TRITON / "model.py"
# backend name -> the adapter laid out as backends/<name>/model.py
ADAPTERS = {
    **{name: ADAPTER for name in BACKEND_NAMES},
    # gebackend.preprocess.models.KINDS (named here: importing them would load Pillow and tokenizers into the CLI)
    **{name: _TRITON / "preprocess_model.py" for name in ("cnclip_image_preprocess", "cnclip_text_preprocess")},
}


EXTRA_BACKENDS_ENV = "GE_EXTRA_BACKENDS"


def extra_backends_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, Path]:
    """`$GE_EXTRA_BACKENDS` (NAME=FOLDER entries separated by os.pathsep) as lay_out_backends takes it."""
    out = {}
    for entry in environ.get(EXTRA_BACKENDS_ENV, "").split(os.pathsep):
        name, sep, folder = entry.partition("=")
        if sep and name.strip() and folder.strip():
            out[name.strip()] = Path(folder.strip())
    return out


def extra_backends_env(extra: Mapping[str, Path]) -> dict[str, str]:
    """The environment entry that makes a `gebackend serve` lay out `extra` (empty when there is nothing)."""
    return {EXTRA_BACKENDS_ENV: os.pathsep.join(f"{n}={Path(f).resolve()}" for n, f in extra.items())} if extra else {}


def copy_backend(source: Path, target: Path, triton: TritonDistribution | None = None) -> Path:
    """Copy backend folder `source` to `target` (see the module's docstring for why a copy)."""
    source = source.resolve()
    shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)
    for link in [p for p in target.rglob("*") if p.is_symlink()]:
        real = Path(os.path.realpath(source / link.relative_to(target)))
        inside = real.is_relative_to(source)
        if real.exists() and (not inside or link.name.startswith("libtriton_")):
            link.unlink()  # a link out of the folder, or the backend library itself: a real file instead
            link_or_copy(str(real), str(link))
    if triton is not None and not (target / "libtritonserver.so").exists():
        server_lib = sorted(Path(triton.libs).glob("libtritonserver*.so*"))
        if server_lib:
            (target / "libtritonserver.so").symlink_to(server_lib[0].resolve())
    return target


def backend_of(config: Mapping) -> str:
    """The backend a model config names: `backend`, else the one Triton maps its `platform` to (onnxruntime_onnx)."""
    return config.get("backend") or ("onnxruntime" if config.get("platform") == "onnxruntime_onnx" else "")


def adapters(extra_backends: Mapping[str, Path]) -> dict[str, Path]:
    """Backend name -> adapter, for a server given `extra_backends`: ours, and the peer's names not given as extras."""
    return {**ADAPTERS, **{name: ADAPTER for name in PEER_NAMES if name not in extra_backends}}


def peer_config_note(backend_configs: list[str], extra_backends: Mapping[str, Path]) -> str | None:
    """What to say of `--backend-config onnxruntime,KEY=VALUE` arguments (a peer user's command line) when that name
    is ours (`adapters`): tritonserver gets them, and nothing reads them."""
    meant = [arg for arg in backend_configs if arg.partition(",")[0] in PEER_NAMES and arg.partition(",")[0] not in
             extra_backends]
    if not meant:
        return None
    return (f"--backend-config {' '.join(meant)}: for Triton's onnxruntime backend, whose models ge serves here: not "
            f"read; ge's options are --backend-config ge,KEY=VALUE (docs/configs.md)")


def lay_out_backends(triton: TritonDistribution, target: Path, extra_backends: Mapping[str, Path] | None = None) -> Path:
    """Create `<target>/backends` and return it; `extra_backends` (default: `$GE_EXTRA_BACKENDS`) are copied in."""
    backends = target / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(triton.python_backend / name, python / name)
    (python / "triton_python_backend_stub").symlink_to(triton.stub())
    extra = extra_backends_from_env() if extra_backends is None else extra_backends
    for name, adapter in adapters(extra).items():
        (backends / name).mkdir()
        shutil.copy2(adapter, backends / name / "model.py")
    for name, folder in extra.items():
        if name == "python" or name in ADAPTERS:
            raise ValueError(f"extra backend {name!r} would replace one of ours")
        copy_backend(Path(folder), backends / name, triton)
    return backends
