"""The peer in the bench: Triton's own C++ onnxruntime backend, found where it is installed, never shipped here.

`gebackend bench --peer-backend-dir DIR` (or `$GE_PEER_BACKEND_DIR`, or NGC's `/opt/tritonserver/backends`) names
a Triton backends folder holding `onnxruntime/libtriton_onnxruntime.so` with the ONNX Runtime libraries it ships
next to it (`libonnxruntime.so*`), or that `onnxruntime` folder itself. The bench then serves the same model and
ONNX file on it (the `peer` scenarios of gebackend.bench.scenarios) and reports every scenario's throughput over
the peer's at the same concurrency (gebackend.bench.report).

What is checked here: the library is a file; where `ldd` is installed, which of its libraries the loader cannot
find and whether its ONNX Runtime is the folder's own. Those link findings are warnings (the server loads the
backend with the wheel's libraries on its path, and its own log says why a load failed); only a missing library
makes the peer unavailable. `libtritonserver.so` is never reported: a stock backend links against that name,
which the nvidia-pytriton wheel ships renamed, and the layout (gebackend.server.layout) aliases it.

What cannot be checked here is the ABI: a backend must come from the Triton release of the server. tritonserver
2.51 (nvidia-pytriton 0.7.0) is Triton release r24.10: use the backends of the `nvcr.io/nvidia/tritonserver:24.10-py3`
container, or a build of triton-inference-server/onnxruntime_backend at tag r24.10.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

BACKEND = "onnxruntime"  # the backend name in config.pbtxt, and the folder name under the backends directory
LIBRARY = f"libtriton_{BACKEND}.so"
ENV_VAR = "GE_PEER_BACKEND_DIR"
DEFAULT_DIRS = (Path("/opt/tritonserver/backends"),)
MATCHING_RELEASE = "r24.10"  # the Triton release whose backends match tritonserver 2.51
_PROVIDED = ("libtritonserver.so",)  # aliased by the layout, so never "missing"


class PeerMissing(LookupError):
    """No usable onnxruntime backend: the message says where it looked and what it expected."""


@dataclass(frozen=True)
class Peer:
    folder: Path  # the backend's folder (named after the backend once laid out)
    library: Path
    warnings: tuple[str, ...] = ()

    @property
    def extra_backends(self) -> dict[str, Path]:
        """The argument gebackend.server.layout.lay_out_backends takes for it."""
        return {BACKEND: self.folder}


def candidates(directory: Path | None = None, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders looked in: DIR when given, else `$GE_PEER_BACKEND_DIR` (when set) and NGC's backends folder."""
    if directory is not None:
        return [Path(directory)]
    env = environ.get(ENV_VAR, "").strip()
    return [*([Path(env)] if env else []), *DEFAULT_DIRS]


def backend_folder(directory: Path) -> Path | None:
    """`DIR/onnxruntime` when it holds the library, DIR itself when it does, else None."""
    for folder in (directory / BACKEND, directory):
        if (folder / LIBRARY).is_file():
            return folder
    return None


def find(directory: Path | None = None, environ: Mapping[str, str] = os.environ, check_links: bool = True) -> Peer:
    """The peer backend in DIR (or the default folders); raises PeerMissing saying what was expected where."""
    looked = candidates(directory, environ)
    for candidate in looked:
        folder = backend_folder(candidate)
        if folder is not None:
            library = folder / LIBRARY
            return Peer(folder, library, tuple(link_warnings(library)) if check_links else ())
    if directory is not None:
        raise PeerMissing(f"no {BACKEND} backend in {directory}: expected {Path(directory) / BACKEND / LIBRARY}")
    where = ", ".join(str(c) for c in looked)
    raise PeerMissing(f"no {BACKEND} backend found (looked in {where}): give --peer-backend-dir DIR, a Triton "
                      f"{MATCHING_RELEASE} backends folder holding {BACKEND}/{LIBRARY}")


def missing(directory: Path | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the peer cannot run (None when it can), as scenarios.feature_missing says it."""
    try:
        find(directory, environ, check_links=False)
    except PeerMissing as exc:
        return str(exc)
    return None


def parse_ldd(text: str) -> dict[str, str | None]:
    """`ldd` output -> {library name: resolved path, or None when "not found"} (the loader and vdso left out)."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if not arrow:
            continue
        target = rest.strip()
        out[name.strip()] = None if target.startswith("not found") else target.split(" (")[0].strip()
    return out


def link_warnings(library: Path, ldd: str | None = None) -> list[str]:
    """What `ldd` says is wrong with `library`'s links, as sentences (empty when ldd is absent or all is well)."""
    ldd = ldd if ldd is not None else shutil.which("ldd")
    if not ldd:
        return []
    try:
        done = subprocess.run([ldd, str(library)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"ldd could not check {library.name}: {exc}"]
    if done.returncode != 0 or "not a dynamic executable" in done.stdout + done.stderr:
        reason = (done.stderr or done.stdout).strip().splitlines()
        return [f"ldd could not read {library.name}: {reason[-1] if reason else 'exit ' + str(done.returncode)}"]
    return resolve_warnings(parse_ldd(done.stdout), library.parent)


def resolve_warnings(links: Mapping[str, str | None], folder: Path) -> list[str]:
    """The sentences for `links` (parse_ldd's result) of a backend library in `folder`."""
    warnings = []
    lost = sorted(n for n, path in links.items() if path is None and n not in _PROVIDED)
    if lost:
        warnings.append(f"{LIBRARY} links libraries the loader does not find: {', '.join(lost)}")
    ort = {n: p for n, p in links.items() if n.startswith("libonnxruntime") and p}
    foreign = sorted(f"{n} from {p}" for n, p in ort.items() if Path(p).resolve().parent != folder.resolve())
    if foreign:
        warnings.append(f"{LIBRARY} takes ONNX Runtime from outside its folder: {', '.join(foreign)}")
    if not any(n.startswith("libonnxruntime") for n in links):
        warnings.append(f"{LIBRARY} does not link libonnxruntime (is it Triton's onnxruntime backend?)")
    return warnings


def describe(peer: Peer | None, reason: str | None = None) -> dict:
    """What summary.json's meta records about the peer."""
    if peer is None:
        return {"backend": BACKEND, "available": False, "reason": reason or ""}
    return {"backend": BACKEND, "available": True, "folder": str(peer.folder), "warnings": list(peer.warnings),
            "matching_release": MATCHING_RELEASE}


def lookup(directory: Path | None, environ: Mapping[str, str] = os.environ) -> tuple[Peer | None, str | None]:
    """(peer, None) or (None, why not): never raises."""
    try:
        return find(directory, environ), None
    except PeerMissing as exc:
        return None, str(exc)


__all__: Sequence[str] = ["BACKEND", "DEFAULT_DIRS", "ENV_VAR", "LIBRARY", "MATCHING_RELEASE", "Peer", "PeerMissing",
                          "backend_folder", "candidates", "describe", "find", "link_warnings", "lookup", "missing",
                          "parse_ldd", "resolve_warnings"]
