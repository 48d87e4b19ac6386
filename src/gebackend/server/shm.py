"""What Triton's Python backend needs of /dev/shm, estimated from a model repository and checked at start.

Shared memory (/dev/shm). Triton's Python backend gives every model instance (one stub process each) one
region in /dev/shm. Measured on tritonserver 2.51 (nvidia-pytriton 0.7.0), default settings
`shm-default-byte-size` = `shm-growth-byte-size` = 1 MiB (the stub's command line shows both):

- a region starts at shm-default-byte-size; an instance whose region cannot be made fails to load ("Unable to
  initialize shared memory key ... Each Python backend model instance requires at least 1 MB");
- an execute whose input and output tensors do not fit grows the region in steps of shm-growth-byte-size, and it
  never shrinks; where /dev/shm is full that request fails with 500 "Failed to increase the shared memory pool
  size ... No space left on device" (the server goes on serving smaller ones);
- one 64 MiB request (64 MiB in, 64 MiB out) grew a fresh region to 131 MiB; requests of 1, 2, 4, 16, 64 and
  200 MiB in a row grew it to 577 MiB, 2.9x the largest input + output (the pool fragments).

- tensors of up to 0.8 MiB per execute (in + out) fit in the default 1 MiB region without growing it.

So each instance needs a region of `default` when the inputs + outputs of its largest execute fit in 3/4 of it,
else `default + round_up(in + out, growth) + 2 x growth`: the sum over instances is the floor, and `gebackend
serve` refuses to start below it. The recommendation counts 3 x (in + out) per instance (requests of mixed sizes)
plus the largest model's regions once more (a reload, SIGHUP or self-healing, loads the new version beside the
old). The largest
execute of a batching model is `max_batch_size` samples (Triton's dynamic batcher never forms a larger batch,
and no request may be larger). A dim with no bound (-1 that no shape bucket limits) counts as 1: the estimate is
then a floor for that model, and says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from gebackend.config.instance_groups import default_instance_count, instance_total
from gebackend.server.layout import adapters, backend_of, extra_backends_from_env

MiB = 1024 * 1024
# tritonserver 2.51's Python backend defaults (the stub's command line: "... 1048576 1048576 ...")
SHM_DEFAULT_BYTES = 1 * MiB
SHM_GROWTH_BYTES = 1 * MiB
FRAGMENTATION = 3  # measured 2.9x: requests of mixed sizes leave the pool fragmented
STATVFS = os.statvfs  # tests replace it


# -- /dev/shm ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShm:
    name: str
    instances: int
    io_bytes: int  # inputs + outputs of the largest execute (max_batch_size samples)
    unbounded: tuple[str, ...] = ()  # tensors with a dim of no known bound (counted as 1)
    note: str = ""  # why the sizes are unknown, if they are

    def floor(self, default: int, growth: int) -> int:
        return self.instances * _region(self.io_bytes, default, growth)

    def recommended(self, default: int, growth: int) -> int:
        return self.instances * _region(FRAGMENTATION * self.io_bytes, default, growth)


def _region(io_bytes: int, default: int, growth: int) -> int:
    """One instance's region for executes of `io_bytes` (inputs + outputs): the default region holds up to 3/4 of
    its size in tensors (measured: 0.8 MiB of 1 MiB did not grow it); beyond that it grows by the tensors rounded
    up to the growth step, plus two steps (measured: one 64 MiB in + 64 MiB out request made a 131 MiB region)."""
    if io_bytes <= default * 3 // 4:
        return default
    return default + _round_up(io_bytes, growth) + 2 * growth


@dataclass(frozen=True)
class ShmNeed:
    models: tuple[ModelShm, ...]
    default_bytes: int = SHM_DEFAULT_BYTES
    growth_bytes: int = SHM_GROWTH_BYTES

    @property
    def instances(self) -> int:
        return sum(m.instances for m in self.models)

    @property
    def floor(self) -> int:
        return sum(m.floor(self.default_bytes, self.growth_bytes) for m in self.models)

    @property
    def recommended(self) -> int:
        reload = max((m.recommended(self.default_bytes, self.growth_bytes) for m in self.models), default=0)
        return sum(m.recommended(self.default_bytes, self.growth_bytes) for m in self.models) + reload

    def describe(self) -> str:
        parts = [f"{m.name} {m.instances}x{_mib(_region(m.io_bytes, self.default_bytes, self.growth_bytes))}"
                 for m in self.models]
        unbounded = [m.name for m in self.models if m.unbounded]
        unknown = [m.name for m in self.models if m.note]
        text = f"{self.instances} instance(s): {', '.join(parts) or 'none'}"
        if unbounded:
            text += f"; dims without a bound counted as 1 in {', '.join(unbounded)} (longer requests need more)"
        if unknown:
            text += f"; tensor sizes unknown for {', '.join(unknown)} (counted as 0)"
        return text


@dataclass(frozen=True)
class ShmCheck:
    path: Path
    total: int
    free: int
    need: ShmNeed
    ok: bool
    message: str


def python_backend_shm_settings(backend_configs: Iterable[str]) -> tuple[int, int]:
    """(shm-default-byte-size, shm-growth-byte-size) from tritonserver `--backend-config python,KEY=VALUE` values."""
    default, growth = SHM_DEFAULT_BYTES, SHM_GROWTH_BYTES
    for value in backend_configs:
        backend, _, setting = value.partition(",")
        key, _, number = setting.partition("=")
        if backend.strip() != "python":
            continue
        try:
            if key.strip() == "shm-default-byte-size":
                default = int(number)
            elif key.strip() == "shm-growth-byte-size":
                growth = int(number)
        except ValueError:
            pass
    return default, max(1, growth)


def estimate_shm(repository: Path, global_options: Mapping[str, str] | None = None,
                 backend_configs: Iterable[str] = ()) -> ShmNeed:
    """What the Python-based models of `repository` need in /dev/shm (see the module's doc for the rule)."""
    default, growth = python_backend_shm_settings(backend_configs)
    models = []
    folders = sorted(p for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if Path(repository).is_dir() else []
    for folder in folders:
        model = _model_shm(folder, dict(global_options or {}))
        if model is not None:
            models.append(model)
    return ShmNeed(tuple(models), default, growth)


def check_shm(need: ShmNeed, shm_dir: Path = Path("/dev/shm"),
              statvfs: Callable[[str], os.statvfs_result] | None = None) -> ShmCheck:
    """Compare `need` with the space in `shm_dir`; `ok` is False when even the floor does not fit."""
    try:
        stat = (statvfs or STATVFS)(str(shm_dir))
        total, free = stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
    except OSError as exc:
        message = (f"cannot read the size of {shm_dir} ({exc}); Triton's Python backend keeps each model instance's "
                   f"tensors there (this repository needs at least {_mib(need.floor)})")
        return ShmCheck(shm_dir, 0, 0, need, need.floor == 0, message)
    advice = _advice(need.recommended)
    found = f"{shm_dir} has {_mib(free)} free of {_mib(total)}"
    if free < need.floor:
        message = (f"{found}, but this model repository needs at least {_mib(need.floor)} there "
                   f"({need.describe()}; recommended {_mib(need.recommended)}). {advice}; or lower max_batch_size or "
                   f"the instance counts. (--no-shm-check starts anyway: requests that do not fit then fail with 500 "
                   f"'Failed to increase the shared memory pool size', and instances that do not fit fail to load.)")
        return ShmCheck(shm_dir, total, free, need, False, message)
    message = f"{found}; the repository needs at least {_mib(need.floor)} ({need.describe()})"
    if free < need.recommended:
        message += (f"; recommended {_mib(need.recommended)} for requests of mixed sizes and reloads. {advice}")
    return ShmCheck(shm_dir, total, free, need, True, message)


def _advice(size: int) -> str:
    mib = max(64, 64 * math.ceil(size / (64 * MiB)))
    return (f"Give the container more: podman/docker run --shm-size={mib}m; Kubernetes: an emptyDir volume "
            f"{{medium: Memory, sizeLimit: {mib}Mi}} mounted at /dev/shm")


def python_based_backends() -> set[str]:
    """Backends whose instances are Python backend stubs: ours (every adapter the layout installs) and `python`."""
    return set(adapters(extra_backends_from_env())) | {"python"}


def _round_up(value: int, step: int) -> int:
    return 0 if value <= 0 else step * math.ceil(value / step)


def _mib(value: int) -> str:
    return f"{value / MiB:.1f} MiB"


def _model_shm(folder: Path, global_options: dict[str, str]) -> ModelShm | None:
    from gebackend.config.pbtxt import load_model_config
    from gebackend.errors import GeBackendError

    config_path = folder / "config.pbtxt"
    if not config_path.is_file():
        return None  # Triton cannot auto-complete a backend without one: not ours
    try:
        config = load_model_config(config_path)
    except GeBackendError:
        return ModelShm(folder.name, 1, 0, note="config.pbtxt does not parse")
    if backend_of(config) not in python_based_backends():
        return None
    name = config.get("name") or folder.name
    instances = instance_total(config.get("instance_group"), default_instance_count(backend_of(config)))
    try:
        max_batch, tensors = _tensors(folder, config, global_options)
    except Exception as exc:  # noqa: BLE001 - sizing must never be why a model that Triton can load is refused
        return ModelShm(name, instances, 0, note=str(exc) if isinstance(exc, GeBackendError) else f"{type(exc).__name__}: {exc}")
    io_bytes = 0
    unbounded = []
    for tensor_name, itemsize, dims in tensors:
        if any(d < 0 for d in dims):
            unbounded.append(tensor_name)
        io_bytes += itemsize * math.prod(max(1, d) for d in dims) * max(1, max_batch)
    return ModelShm(name, instances, io_bytes, tuple(unbounded))


def _tensors(folder: Path, config: Mapping, global_options: Mapping[str, str]) -> tuple[int, list[tuple[str, int, tuple[int, ...]]]]:
    """(max_batch_size, [(tensor, bytes per element, dims of one sample with bucket bounds applied)])."""
    from gebackend.config import dtypes
    from gebackend.config.model_file import find_model_file, latest_version_dir
    from gebackend.config.onnx_signature import read_signature
    from gebackend.config.options import model_parameters, parse_options
    from gebackend.config.spec import reconcile
    from gebackend.config.static_shapes import compiled_shapes
    from gebackend.errors import ConfigError

    name = config.get("name") or folder.name
    options = parse_options(name, global_options, model_parameters(config), config).options
    try:
        signature = read_signature(find_model_file(latest_version_dir(folder), config.get("default_model_filename", "")))
        result = reconcile(name, config, signature, options.default_max_batch_size)
    except ConfigError:
        # npu_ge configs may name tensors differently from the ONNX file (paired by position): use config.pbtxt
        declared = [*(config.get("input") or []), *(config.get("output") or [])]
        if not declared or not all(e.get("dims") for e in declared):
            raise
        tensors = [(e.get("name", "?"), _itemsize(dtypes.from_triton(e.get("data_type", "TYPE_FP32"))),
                    tuple(int(d) for d in e["dims"])) for e in declared]
        return int(config.get("max_batch_size") or 0), tensors
    bounds: dict[str, list[int]] = {}
    try:
        shapes = compiled_shapes(name, result.max_batch_size, result.inputs, options)
    except ConfigError:
        shapes = []
    for shape in shapes:  # the largest bucket bounds each input dim; named dims carry the bound to the outputs
        for tensor in result.inputs:
            dims = list(shape.get(tensor.name, ()))
            dims = dims[1:] if result.max_batch_size > 0 else dims
            previous = bounds.get(tensor.name, [-1] * len(dims))
            bounds[tensor.name] = [max(a, b) for a, b in zip(previous, dims)] if len(previous) == len(dims) else dims
    by_label: dict[str, int] = {}
    for tensor in result.inputs:
        for label, bound in zip(tensor.labels, bounds.get(tensor.name, [])):
            if label and bound > 0:
                by_label[label] = max(by_label.get(label, 0), bound)
    tensors = []
    for tensor in (*result.inputs, *result.outputs):
        dims = list(bounds.get(tensor.name) or tensor.dims)
        if len(dims) != len(tensor.dims):
            dims = list(tensor.dims)
        dims = [d if d > 0 else by_label.get(label or "", -1) for d, label in zip(dims, tensor.labels + (None,) * len(dims))]
        tensors.append((tensor.name, _itemsize(tensor.dtype), tuple(dims)))
    return result.max_batch_size, tensors


def _itemsize(dtype) -> int:
    return 8 if dtype.numpy.kind == "O" else int(dtype.numpy.itemsize)  # BYTES: at least the 4-byte length each


