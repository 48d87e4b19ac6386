"""A modified copy of a model's ONNX file for the engines to load, written outside the user's repository: the npu_ge
boundary renames (config/io_names.py), optional inputs and the defaults served as constants (config/optional_inputs.py)
and trim_padding's freed sequence dim (runtime/padding_trim.py) write one.

Under `gebackend serve` (a server temp folder is given) one copy serves every instance of the server that asks for the
same bytes: it is named after them, so a model's second instance finds it written (measured on a 97 MiB ResNet-50,
writing a copy took 0.6 s and its size in the temp folder, which is memory where /tmp is a tmpfs). The last process
using a copy removes it when it ends (a model unloaded or replaced by a new version leaves nothing behind); the server
removes its temp folder at shutdown. Elsewhere each process writes its own, removed when the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from gebackend.control.registry import process_alive

_FICLONE = 0x40049409  # linux/fs.h: FICLONE, the ioctl behind `cp --reflink`


def _external_files(model, model_dir: Path) -> list[tuple[str, Path]]:
    """Each external data location of `model` and the file it names beside `model_dir` (each once)."""
    import onnx

    from gebackend.config.onnx_signature import all_tensors

    found: dict[str, Path] = {}
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            found.setdefault(location, Path(os.path.normpath(model_dir / location)))
    return sorted(found.items())


def _copy_external(copy_dir: Path, files: list[tuple[str, Path]]) -> None:
    """Each external data file copied beside the copy: a link will not do. onnx (1.23) refuses to load a file with
    more than one hard link (then the user's own model as well as the copy: "indicating a potential hardlink attack"),
    and onnx, ONNX Runtime and OpenVINO all refuse a symlink leading out of the model's folder. A clone where the file
    system can make one (btrfs, XFS: no bytes copied), else the bytes."""
    for location, source in files:
        target = Path(os.path.normpath(copy_dir / location))
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(source, "rb") as src, open(target, "wb") as dst:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        except OSError:  # no clones on this file system (tmpfs, ext4) or across file systems
            shutil.copyfile(source, target)


def _key(data: bytes, path: Path, files: list[tuple[str, Path]]) -> str:
    """What a shared copy is named after: its bytes, and which files (and which versions of them) it copies."""
    digest = hashlib.sha256(data)
    digest.update(f"\0{path.name}\0{path.resolve().parent}".encode())
    for location, source in files:
        stat = source.stat()
        digest.update(f"\0{location}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def write_model_copy(model, path: Path, temp_parent: Path | None, prefix: str) -> Path:
    """`model` (loaded from `path` without its external data) saved as a copy the engines load instead of `path`.

    The copy keeps the file name and sits in a folder of its own (under `temp_parent` when given, named with `prefix`);
    external data files are copied beside it (`_copy_external`). With `temp_parent`, a copy of the same bytes already
    there is reused (see the module docstring).
    """
    model_dir = path.resolve().parent
    files = _external_files(model, model_dir)
    data = model.SerializeToString()
    if temp_parent is None:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, str(root), True)
        return _write(root, model_dir, path.name, data, files)
    root = Path(temp_parent) / f"{prefix}{_key(data, path, files)}"
    # Keep <model>/<version>/<file>: external data may sit in the model folder ("../weights.bin").
    copy = root / model_dir.parent.name / model_dir.name / path.name
    with _lock(root):
        _use(root)  # before the copy is looked at: the last user leaving removes it (`_leave`)
        if copy.is_file():
            return copy
        building = Path(tempfile.mkdtemp(prefix=f".{prefix}", dir=temp_parent))
        try:
            _write(building, model_dir, path.name, data, files)
            os.rename(building, root)  # whole or not at all
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return copy


def served_copy(model, path: Path, temp_parent: Path | None, prefix: str, change: str) -> Path:
    """`write_model_copy` for a model's load: a copy it cannot write fails the load (`ModelLoadError`), naming the
    file and the `change` the copy holds ("with its defaults resolved")."""
    from gebackend.errors import ModelLoadError

    try:
        return write_model_copy(model, Path(path), temp_parent, prefix)
    except OSError as exc:
        raise ModelLoadError(f"cannot write the copy of {path} {change}: {exc}") from None


@contextlib.contextmanager
def _lock(root: Path):
    """The shared copy's lock (between the processes of one server): writing it, joining and leaving its users."""
    with open(f"{root}.lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


def _users(root: Path) -> Path:
    return Path(f"{root}.users")


def _use(root: Path) -> None:
    """This process uses the copy at `root` until it ends (its engines may read the file again: a profiling session)."""
    users = _users(root)
    users.mkdir(exist_ok=True)
    mine = users / str(os.getpid())
    if not mine.exists():
        mine.touch()
        atexit.register(_leave, root)


def _leave(root: Path) -> None:
    """At this process's end: no longer a user of the copy; the last user, dead ones aside, removes it."""
    try:
        with _lock(root):
            users = _users(root)
            (users / str(os.getpid())).unlink(missing_ok=True)
            if not any(process_alive(int(p.name)) for p in users.iterdir() if p.name.isdigit()):
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(users, ignore_errors=True)
    except OSError:  # the server's temp folder is already gone: nothing left to remove
        pass


def _write(root: Path, model_dir: Path, name: str, data: bytes, files: list[tuple[str, Path]]) -> Path:
    copy_dir = root / model_dir.parent.name / model_dir.name
    copy_dir.mkdir(parents=True, exist_ok=True)
    _copy_external(copy_dir, files)
    copy = copy_dir / name
    copy.write_bytes(data)
    return copy
