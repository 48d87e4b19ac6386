"""The lowered-precision model cache: each lowering (int8 dynamic or static, fp16) is made once and reused by every
instance and every restart, instead of each instance quantizing again (seconds to minutes).

Owns `lowered_model`, what runtime/loader.py calls: it resolves int8's `quantization` (compile/precision.py), gets
the calibration samples (compile/calibration.py), and returns the cached file, building it on a miss.

Where: `<model's version folder>/.gebackend-cache/precision/` (of the file a symlinked model points to) when that
folder is writable, else `$GE_CACHE_DIR/<model>/
precision/`, then `$XDG_CACHE_HOME` or `~/.cache` `/gebackend/<model>/precision/`, then the temp folder (cache_dir.py).
An entry is `<model stem>.<mode>[-<quantization>].<key>.onnx` (plus `.data` for models over 1 GiB); its key is a
sha256 of the model file's bytes and its external data files, the precision options (mode, quantization, engine,
calibration sample count and a sha256 of the calibration files, and for int8 the CPU's `int8_range`, full or 7-bit
weights: compile/quantize_static.py), the onnx, onnxruntime and nncf versions, and `LOWERING_VERSION` (raised
when our own lowering writes a different file from the same inputs): a changed model, option, library, lowering or
kind of CPU is a new entry (a repository shared by machines of both kinds holds one of each). Old
entries are not removed: delete the folder to clear it.

Safe for instances loading at once: one lock file per entry (fcntl.lockf), held while checking and building; the build
goes to a temp folder beside the entry and is moved in with os.replace, so a reader sees a whole file or none. An
instance waiting on the lock then finds the entry and reuses it. An entry that does not load as ONNX is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx

from gebackend.cache_dir import candidates, first_writable
from gebackend.errors import ModelLoadError

LEAF = "precision"
_CHUNK = 1 << 20
# Raised whenever compile/precision.py or compile/quantize_static.py write a different file from the same model and
# options, so that entries made by the old lowering are not served. 2: Identity-shared constants untied before ONNX
# Runtime's quantizers (compile/untie.py); 3: Constant nodes made initializers too; 4: ONNX Runtime's static int8 of
# an attention graph quantizes only Conv/MatMul/Gemm (compile/quantize_static.py); 5: dynamic int8 weights per channel,
# 7-bit where int8_range says so (compile/precision.py); 6: the rows of a sequence no output keeps are not computed
# (compile/unused_rows.py) in the file quantized; 7: nor the keys and values of a kept query
# (compile/kept_query_attention.py); 8: in a file of fixed dims, nor those of a projection in one weight, sequence
# first (compile/traced_projection.py); 9: a patch embedding's Conv quantized as a MatMul (compile/patch_convolution.py).
LOWERING_VERSION = "9"


@dataclass(frozen=True)
class Lowered:
    path: Path  # the lowered ONNX file (in the cache)
    quantization: str  # int8: "dynamic" | "static"; "" otherwise
    event: str  # "quantized" (built now) | "reused" (found in the cache)
    check_feeds: Mapping[str, np.ndarray] | None = None  # the first real calibration sample, for the accuracy check
    calibrated: str = ""  # static int8: what it was calibrated on ("32 seeded input(s)", "16 calibration_data sample(s)")


def _sha256_files(paths, h=None):
    h = h or hashlib.sha256()
    for path in paths:
        h.update(f"\0{Path(path).name}\0".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
    return h


def model_files(model_path: Path) -> list[Path]:
    """The model file and the external data files it names."""
    proto = onnx.load(str(model_path), load_external_data=False)
    locations = {entry.value for init in proto.graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL
                 for entry in init.external_data if entry.key == "location"}
    return [Path(model_path)] + [Path(model_path).parent / loc for loc in sorted(locations)]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cache_key(model_path: Path, options: Mapping[str, str], data: list[Path] = ()) -> str:
    """sha256 over the model's bytes, the precision options, the calibration files and the libraries' versions."""
    h = _sha256_files(model_files(model_path))
    versions = {f"version.{p}": _version(p) for p in ("onnx", "onnxruntime", "nncf")}
    for name, value in sorted({**options, **versions, "version.lowering": LOWERING_VERSION}.items()):
        h.update(f"\0{name}={value}".encode())
    h.update(f"\0calibration={_sha256_files(data).hexdigest() if data else 'none'}".encode())
    return h.hexdigest()


def _loads(path: Path) -> str:
    """Why the cached file is not a usable ONNX model, or "" when it is."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: any parse error
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    if not proto.graph.node or not proto.graph.output:
        return "it holds no graph"
    for location in {e.value for i in proto.graph.initializer for e in i.external_data if e.key == "location"}:
        if not (path.parent / location).is_file():
            return f"its external data {location} is missing"
    return ""


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _locked(lock: Path, log: Callable[[str], None], what: str):
    """The entry's lock: POSIX record locks (lockf) between processes, which a forked child does not inherit (a
    quantizer's helper process would hold a flock), and a thread lock within one process, which lockf does not give."""
    with _THREAD_LOCKS_GUARD:
        local = _THREAD_LOCKS.setdefault(str(lock), threading.Lock())
    with local:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # EAGAIN / EACCES: held by another process
                log(f"{what}: another instance is building {lock.name[:-5]}; waiting for it")
                fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def cached(model: str, model_path: Path, key: str, name: str, build: Callable[[Path, str], Path],
           log: Callable[[str], None], what: str, verb: str, environ=os.environ,
           leaf: tuple[str, str, str] = (LEAF, "the lowered-precision model cache", "set precision_mode=origin")
           ) -> tuple[Path, str]:
    """The cached file for `key` (`name` with the key in it), made by `build(folder, file name)` on a miss;
    (its path, "quantized" | "reused"). `leaf`: the cache's folder name, what it is and how to do without it (the
    error's words where no folder is writable)."""
    # beside the file a symlink points to: the repositories the bench and `gebackend tune` generate link one model
    # file into each candidate's folder, and every candidate then reuses one entry
    real = Path(os.path.realpath(model_path))
    folder = first_writable(candidates(real, model, leaf[0], environ), leaf[1], leaf[2])
    stem, _, suffix = name.rpartition(".")
    entry = folder / f"{stem}.{key[:20]}.{suffix}"
    with _locked(folder / f"{entry.name}.lock", log, what):
        if entry.exists():
            problem = _loads(entry)
            if not problem:
                log(f"{what}: reused the {what.split()[-1]} model cached at {entry}")
                return entry, "reused"
            log(f"{what}: the cached file {entry} does not load as ONNX ({problem}); rebuilding it")
            entry.unlink(missing_ok=True)
        started = time.perf_counter()
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=folder))
        try:
            built = build(building, entry.name)
            for part in sorted(building.iterdir(), key=lambda p: p == built):  # the .onnx last: it marks a whole entry
                os.replace(part, folder / part.name)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        log(f"{what}: {verb} in {time.perf_counter() - started:.1f} s, cached at {entry}")
        return entry, "quantized"


def lowered_model(model: str, model_path: Path, engines, engine_kind, batching: bool,
                  shapes: Mapping[str, tuple[int, ...]] | None, log: Callable[[str], None],
                  int8_op_types: tuple[str, ...] | None = None, environ=os.environ, home: Path | None = None,
                  fixed: Mapping[str, np.ndarray] | None = None, shapes_source: str = "") -> Lowered:
    """The model lowered to `engines.precision_mode` (options' EngineChoice) for `engine_kind`, from the cache.

    `home`: the model's file in its repository when `model_path` is a copy the engines load (config/model_copy.py):
    the cache and a relative `calibration_data` are beside it, so instances and restarts share them. `fixed`: the
    optional inputs' defaults, what calibration feeds them where its data leaves them out (in the key: the copy does
    not hold them). `shapes_source`: where the seeded samples' `shapes` came from (compile/seed_shapes.py), said."""
    home = home or model_path
    from gebackend.compile import calibration
    from gebackend.compile.int8_route import choose
    from gebackend.compile.precision import INT8_OP_TYPES, check_supported, lower_precision
    from gebackend.compile.seed_shapes import shapes_text

    mode = engines.precision_mode
    check_supported(mode)
    op_types = tuple(int8_op_types or INT8_OP_TYPES)
    quantization, why = choose(engines.quantization, engines.calibration_data, engine_kind, model_path) \
        if mode == "int8" else ("", "")
    if why:
        log(f"precision int8: quantization=auto -> {quantization} ({why})")
    calibrated = ""
    options = {"mode": mode, "quantization": quantization, "engine": engine_kind.name}
    samples, data, feeds = None, [], None
    if quantization:
        from gebackend.compile.quantize_static import int8_range

        options["int8_range"] = int8_range()  # full or 7-bit weights: both quantizations follow it
    if quantization == "static":
        options.update(quantizer=engine_kind.static_quantizer, samples=str(engines.calibration_samples))
        if engines.calibration_data:
            source = calibration.resolve(engines.calibration_data, home)
            samples = calibration.load_samples(model, model_path, source, batching, engines.calibration_samples, fixed)
            data, feeds = calibration.data_files(source), samples[0]
            options["calibration"] = "data"
            calibrated = f"{len(samples)} calibration_data sample(s)"
            log(f"precision int8: calibrating on {len(samples)} sample(s) from {source}")
        else:
            options.update(calibration="random", shapes=repr(sorted((shapes or {}).items())))
            calibrated = f"{engines.calibration_samples} seeded input(s)"
    elif quantization == "dynamic":
        options["op_types"] = ",".join(op_types)
    if fixed and quantization == "static":
        digest = hashlib.sha256()
        for name in sorted(fixed):
            digest.update(f"\0{name}\0{fixed[name].dtype}\0{fixed[name].shape}\0".encode() + fixed[name].tobytes())
        options["defaults"] = digest.hexdigest()

    def build(folder: Path, name: str) -> Path:
        chosen = samples
        if quantization == "static" and chosen is None:
            at = shapes_text(shapes or {})
            at = f" at {at}" + (f" ({shapes_source})" if shapes_source else "") if at else ""
            log(f"precision int8: calibrating on {engines.calibration_samples} seeded random sample(s){at} (no "
                f"calibration_data): real inputs give better scales, set calibration_data to a folder of .npy files")
            chosen = calibration.random_samples(model_path, engines.calibration_samples, shapes, fixed)
        return lower_precision(model_path, mode, folder, log, op_types, quantization=quantization,
                               quantizer=engine_kind.static_quantizer, samples=chosen, out_name=name)

    what = f"precision {mode}"
    name = f"{model_path.stem}.{mode}{'-' + quantization if quantization else ''}.onnx"
    try:
        key = cache_key(model_path, options, data)
    except OSError as exc:
        raise ModelLoadError(f"model '{model}': cannot read {model_path} to key the precision cache: {exc}") from None
    verb = "quantized" if mode == "int8" else f"lowered to {mode}"
    path, event = cached(model, home, key, name, build, log, what, verb, environ)
    return Lowered(path, quantization, event, feeds, calibrated)
