"""The OpenVINO engine: dynamic graph mode (`OvEngine`) and what both modes share; static graphs per bucket
(`OvStaticEngine`) are in engines/openvino_static.py.

OpenVINO reads the ONNX file itself (no conversion step) and compiles it for the device the `device` option
names: the CPU by default, or GPU, NPU, AUTO, HETERO:..., checked against the devices found here
(engines/openvino_device.py, which also says what each device's plugin is given). What follows is the CPU's case.

Precision is always explicit. On CPUs with AVX-512 BF16 or AMX the CPU plugin silently runs in bf16
unless told otherwise, so every compiled model gets `INFERENCE_PRECISION_HINT` from `precision_mode`:
origin -> f32, bf16 -> bf16, fp16 -> f16 (bf16, else f32, where the CPU cannot run f16; the fallback is
said in `describe()`). int8 is static only: NNCF writes a calibrated QDQ ONNX file first
(compile/quantize_static.py, through runtime/loader.py) and it is compiled with the f32 hint: OpenVINO runs the
quantized ops as int8 kernels itself and the rest in f32 (OpenVINO has no dynamic int8: quantization=dynamic is
refused). Threads: `INFERENCE_NUM_THREADS` = `intra_op_thread_count` when set, one stream, the LATENCY performance hint. The precision the compiled model reports back is what `describe()` shows.

Profiling: OpenVINO's per-node performance counters (`PERF_COUNT`) need a recompile, so
`start_profiling` compiles a profiled twin of every graph first and swaps it in under the run lock
(requests keep running meanwhile). The profile is written as ONNX Runtime-style Chrome-trace events (a
`model_run` per run, a `<node>_kernel_time` per executed node, laid end to end inside the run because
OpenVINO reports durations, not start times), so `gebackend.profiling.report` reads it unchanged.
OpenVINO's CPU counters are running averages since compile: the first profiled run gets its own node
times, every later run the nodes' average over the later runs (per-op totals and averages are right,
per-run min/max per op after the first run are not).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import openvino as ov
import openvino.properties as props
import openvino.properties.hint as hints

from gebackend.compile.bfloat16 import from_ov, ov_dtype, ov_tensor
from gebackend.config.index_bounds import first_outside
from gebackend.config.options import BackendOptions
from gebackend.cpu import PrecisionRun, fallback_note, int8_note
from gebackend.engines.base import Engine, EngineInputError, EngineRunError, ProfiledSession, ProfilingSwap
from gebackend.engines.openvino_device import (CPU_DEVICE, Device, capabilities as device_capabilities, core,  # noqa: F401
                                              full_name, plugin_config, resolve_device, version)
from gebackend.engines.openvino_profile import PROVIDER, _Profile, _profile_file  # noqa: F401 - PROVIDER: for callers
from gebackend.engines.registry import EngineKind
from gebackend.errors import ModelLoadError

DEVICE = "CPU"  # the device whose capabilities `openvino_capabilities` reports


# ------------------------------------------------------------------------------------------ precision


@dataclass(frozen=True)
class Precision:
    """The inference precision asked of the CPU plugin, and why it differs from `precision_mode` if it does."""

    mode: str  # precision_mode: origin | fp16 | bf16 | int8 (a QDQ file, compiled at f32)
    hint: ov.Type
    note: str = ""


INT8_NOTE = "int8 static (NNCF, QDQ): the quantized ops run as int8 kernels, the others in f32"
_WANTED = {"origin": ov.Type.f32, "bf16": ov.Type.bf16, "fp16": ov.Type.f16}
_CAPABILITY = {ov.Type.bf16: "BF16", ov.Type.f16: "FP16"}


def resolve_precision(mode: str, capabilities: Sequence[str] | None = None, device: Device = CPU_DEVICE) -> Precision:
    """The inference precision hint for a precision_mode on `device`; int8: f32 (the QDQ file says what is int8)."""
    if mode == "int8":
        return Precision(mode, ov.Type.f32, INT8_NOTE)
    if mode not in _WANTED:
        raise ModelLoadError(f"precision_mode={mode!r} is not known to the OpenVINO engine")
    wanted = _WANTED[mode]
    if capabilities is None:
        capabilities = openvino_capabilities() if device.is_cpu else device_capabilities(device)
    where = (lambda note: note) if device.is_cpu else (lambda note: note.replace("this CPU", f"device {device.name}"))
    if wanted == ov.Type.f16 and "FP16" not in capabilities:
        fallback = ov.Type.bf16 if "BF16" in capabilities else ov.Type.f32
        return Precision(mode, fallback, where(fallback_note("fp16", "FP16", _short(fallback))))
    if wanted == ov.Type.bf16 and "BF16" not in capabilities:
        return Precision(mode, ov.Type.f32, where(fallback_note("bf16", "BF16", "f32")))
    return Precision(mode, wanted)



def openvino_capabilities() -> tuple[str, ...]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES here (`FP32, INT8` on an AVX2-only CPU; `BF16`, `FP16` where it has them)."""
    return tuple(core().get_property(DEVICE, props.device.capabilities))


def _short(t: ov.Type) -> str:
    return {ov.Type.f32: "f32", ov.Type.bf16: "bf16", ov.Type.f16: "f16"}.get(t, str(t))


def compile_config(options: BackendOptions, precision: Precision, profile: bool = False, device: Device = CPU_DEVICE) -> dict:
    """The plugin properties for one compiled model on `device` (engines/openvino_device.py)."""
    return plugin_config(device, precision.hint, profile, options.session.intra_op_thread_count)


# ------------------------------------------------------------------------------------------ one compiled model


def _read(source, what: str) -> ov.Model:
    try:
        return core().read_model(source)
    except Exception as exc:
        raise ModelLoadError(f"OpenVINO cannot read {what}: {_message(exc)}") from None


def read_refusal(path: Path) -> str:
    """Why OpenVINO cannot read the ONNX file at `path` ("" where it reads it): engine=auto asks before it chooses
    OpenVINO for a model (engines/auto_choice.py)."""
    try:
        _read(str(path), Path(path).name)
    except ModelLoadError as exc:
        return str(exc)
    return ""


def _message(exc: Exception) -> str:
    """OpenVINO's messages start with source locations: its last lines say what went wrong. A conversion report
    holds a block per op that failed (`-- Dropout-20 with a message:` ... its reason on the block's last line,
    `Training mode is not supported for Dropout op`), then `Summary:`: each op is said with its reason."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if "Summary:" in lines:
        reasons, op = [], None
        for line in lines[:lines.index("Summary:")]:
            if line.startswith("-- ") and line.endswith("with a message:"):
                op = line[3:-len("with a message:")].strip()
                reasons.append([op, ""])
            elif op is not None:
                reasons[-1][1] = line
        said = "; ".join(f"{op}: {reason}" if reason else op for op, reason in reasons)
        return f"conversion failed for {said}" if said else " ".join(lines[-2:])
    return " ".join(lines[-2:]) if lines else type(exc).__name__


@dataclass
class _Port:
    name: str
    index: int
    dtype: np.dtype
    shape: ov.PartialShape
    rank: int | None = None  # None: any rank
    fixed: tuple[tuple[int, int], ...] = ()  # (axis, size) of every static dim

    def __post_init__(self):
        if self.shape.rank.is_static:
            self.rank = len(self.shape)
            self.fixed = tuple((axis, d.get_length()) for axis, d in enumerate(self.shape) if d.is_static)


class _Compiled:
    """One compiled model with its one infer request, its input checks and its output index."""

    def __init__(self, model: ov.Model, options: BackendOptions, precision: Precision, what: str, profile: bool = False,
                 known_inputs: Sequence[str] = (), device: Device = CPU_DEVICE):
        """`known_inputs`: the ONNX file's input names. OpenVINO merges tensor names when it folds (CN_CLIP's
        `image` port is also `/Cast_output_0`), so a port is called by the name the requests use."""
        try:
            self.compiled = core().compile_model(model, device.name, compile_config(options, precision, profile, device))
        except Exception as exc:
            raise ModelLoadError(f"OpenVINO cannot compile {what} for {device.name}: {_message(exc)}") from None
        self.request = self.compiled.create_infer_request()
        self.inputs: dict[str, _Port] = {}
        for index, port in enumerate(self.compiled.inputs):
            name = next((n for n in known_inputs if n in port.get_names()), port.any_name)
            spec = _Port(name, index, ov_dtype(port.element_type), port.partial_shape)
            for name in port.get_names():
                self.inputs[name] = spec
        self.input_names = list(dict.fromkeys(p.name for p in self.inputs.values()))
        # 64-bit inputs OpenVINO computes in 32 bits: their values are checked on every run (`_narrowed`)
        self._wide = {n: p.dtype for n, p in self.inputs.items() if p.dtype in _NARROWED}
        self.outputs: dict[str, int] = {}
        self._output_dtypes = [ov_dtype(port.element_type) for port in self.compiled.outputs]
        for index, port in enumerate(self.compiled.outputs):
            for name in port.get_names():
                self.outputs.setdefault(name, index)

    def property(self, key):
        """The compiled model's property; None where its device does not report it (AUTO reports no threads)."""
        try:
            return self.compiled.get_property(key)
        except Exception:  # noqa: BLE001
            return None

    def check(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> None:
        """Refuse inputs the model cannot take (names, types, ranks, fixed dims) before OpenVINO sees them."""
        unknown = [n for n in feeds if n not in self.inputs]
        if unknown:
            raise EngineInputError(f"unknown input(s) {unknown}; the model takes {self.input_names}")
        given = {self.inputs[n].index for n in feeds}
        missing = [n for n in self.input_names if self.inputs[n].index not in given]
        if missing:
            raise EngineInputError(f"missing input(s) {missing}")
        for name, array in feeds.items():
            port = self.inputs[name]
            if array.dtype != port.dtype:
                raise EngineInputError(f"input '{name}' has type {array.dtype}, the model expects {port.dtype}")
            if port.rank is not None and port.rank != array.ndim:
                raise EngineInputError(f"input '{name}' has shape {list(array.shape)}, the model expects rank "
                                       f"{port.rank} ({port.shape})")
            for axis, size in port.fixed:
                if array.shape[axis] != size:
                    raise EngineInputError(f"input '{name}' has shape {list(array.shape)}, the model expects "
                                           f"{port.shape} (dim {axis} must be {size})")
        bad = [n for n in output_names if n not in self.outputs]
        if bad:
            raise EngineInputError(f"unknown output(s) {bad}")
        for name, dtype in self._wide.items():
            array = feeds.get(name)
            if array is not None:
                _narrowed(name, array, dtype)

    def fetch(self, output_names: Sequence[str]) -> list[np.ndarray]:
        """Copies of the requested outputs: the request's buffers are reused by the next run."""
        return [from_ov(self.request.get_output_tensor(i).data, self._output_dtypes[i]).copy()
                for i in (self.outputs[n] for n in output_names)]


# OpenVINO's CPU plugin computes INT64 and UINT64 as 32-bit integers and FLOAT64 as FLOAT32, silently: 2**40 + 1
# comes back as 1 through an Identity, 1e300 as 3.4e38 (OpenVINO 2026.4). The values each such input may hold to come
# back right (a float64 keeps only about 7 significant digits even so; infinities and NaN pass, though some ops
# saturate an infinity to 3.4e38 on OpenVINO where a Cast keeps it).
_F32_MAX = float(np.finfo(np.float32).max)
_NARROWED = {np.dtype(np.int64): (-(2**31), 2**31 - 1, "a 32-bit integer"),
             np.dtype(np.uint64): (0, 2**31 - 1, "a 32-bit integer"),
             np.dtype(np.float64): (-_F32_MAX, _F32_MAX, "a 32-bit float")}


def _narrowed(name: str, array: np.ndarray, dtype: np.dtype) -> None:
    """Refuse (`EngineInputError`: the request's fault) an input holding a value OpenVINO would narrow wrongly."""
    low, high, as_what = _NARROWED[dtype]
    # floats: finite values only, an infinity narrows to itself (a Cast keeps it, an Add saturates it)
    found = first_outside(array, low, high, finite_only=dtype.kind == "f")
    if found is None:
        return
    value, where = found
    raise EngineInputError(
        f"input '{name}' holds {value} at {list(where)}: OpenVINO computes {dtype.name.upper()} as {as_what}, "
        f"so values outside [{low}, {high}] would come back wrong; serve the model with engine=onnxruntime, which "
        f"computes them exactly")


# ------------------------------------------------------------------------------------------ dynamic engine


def _shareable(array: np.ndarray) -> np.ndarray:
    """The array itself where OpenVINO can wrap its memory (C-contiguous, writable), else a C-contiguous copy.

    A tensor made with shared_memory=True does not keep its array alive: the caller must, until the run ends.
    """
    return array if array.flags.c_contiguous and array.flags.writeable else np.array(array, order="C")


class OvEngine(Engine):
    """Dynamic graph mode: the ONNX file compiled once with its dynamic dims kept; one infer request reused."""

    name = "openvino"

    def __init__(self, path: Path, options: BackendOptions):
        self._path = Path(path)
        self._options = options
        self.device = resolve_device(options.engines.device, options.engines.device_fallback)
        self.precision = resolve_precision(options.engines.precision_mode, device=self.device)
        self._model = _read(str(self._path), str(self._path))
        self._swap: ProfilingSwap[_Compiled] = ProfilingSwap(self._compile())  # state: the _Profile while profiling

    def _compile(self, profile: bool = False) -> _Compiled:
        return _Compiled(self._model, self._options, self.precision, str(self._path), profile,
                         known_inputs=[port.any_name for port in self._model.inputs], device=self.device)

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        with self._swap.lock:
            current = self._swap.serving
            current.check(feeds, output_names)
            try:
                held = {name: _shareable(array) for name, array in feeds.items()}  # alive until the run ends
                for name, array in held.items():
                    current.request.set_input_tensor(current.inputs[name].index, ov_tensor(array))
                t0 = time.monotonic_ns()
                current.request.infer()
                t1 = time.monotonic_ns()
                if self._swap.state is not None:
                    self._swap.state.record(t0, t1)
                return current.fetch(output_names)
            except Exception as exc:
                raise EngineRunError(f"{type(exc).__name__}: {_message(exc)}") from None

    def start_profiling(self, prefix: Path) -> None:
        profiled = self._compile(profile=True)  # compiled before the swap: requests keep running meanwhile
        self._swap.start(profiled, lambda twin: _Profile(_profile_file(prefix), time.monotonic_ns(), twin))

    def stop_profiling(self) -> list[ProfiledSession]:
        swapped = self._swap.stop()
        if swapped is None:
            return []
        _, profile = swapped
        file, nodes = profile.write()
        return [ProfiledSession(file, "dynamic", "dynamic", profile.start_ns, node_order=nodes)]

    def describe(self) -> str:
        return _describe(self._swap.serving, self.precision, "", self.device)

    def lost_inputs(self, names: Sequence[str]) -> str:
        """OpenVINO's reader names a port after an output where it folds a graph down to an input (the onnx wheel's
        `sequence_model` cases: `SequenceAt` of a constructed sequence), and the input's own name is gone."""
        compiled = self._swap.serving
        lost = [name for name in names if name not in compiled.inputs]
        return f"input(s) {lost} (its ports are named {compiled.input_names})" if lost else ""

    def close(self) -> None:
        self._swap.close()
        self._swap.serving = None
        self._model = None


def _describe(compiled: _Compiled, precision: Precision, extra: str, device: Device = CPU_DEVICE) -> str:
    ran = compiled.property(hints.inference_precision)  # None: a virtual device's compiled model does not say
    running = _short(ran) if ran is not None else f"{_short(precision.hint)} asked"
    note = "; ".join(n for n in (precision.note, device.note) if n)
    if ran is not None and running != _short(precision.hint):
        note = (note + "; " if note else "") + f"asked for {_short(precision.hint)}, the {family_of(device)} plugin runs {running}"
    on = compiled.property(props.execution_devices)
    settings = [f"{label}={value}" for label, value in (
        ("threads", compiled.property(props.inference_num_threads)), ("streams", compiled.property(props.num_streams)),
        ("hint", compiled.property(hints.performance_mode)), ("running on", ",".join(on) if on and device.virtual else None))
        if value is not None]
    settings = [s.replace("PerformanceMode.", "") for s in settings]  # AUTO reports the enum, the CPU its name
    return (f"OpenVINO {version()} engine on {device.name} ({full_name(device)}){extra}: "
            f"precision={running} (precision_mode={precision.mode}{'; ' + note if note else ''}), {', '.join(settings)}")


def family_of(device: Device) -> str:
    return device.targets[0].split(".")[0] if len(device.targets) == 1 else device.name


def _static_engine(graphs, options: BackendOptions, source: Path):
    from gebackend.engines.openvino_static import OvStaticEngine

    return OvStaticEngine(graphs, options, source=source)


def precision_run(mode: str) -> PrecisionRun:
    """The precision OpenVINO compiles `mode` at on this CPU (`resolve_precision`); int8: the NNCF QDQ file's int8."""
    chosen = resolve_precision(mode)
    if mode == "int8":
        return PrecisionRun(mode, "int8", "; ".join(n for n in (chosen.note, int8_note(mode)) if n))
    return PrecisionRun(mode, chosen.hint.get_type_name(), chosen.note)


KIND = EngineKind(
    "openvino",
    dynamic=lambda path, options, providers: OvEngine(path, options),
    # the source file read once, reshaped per bucket: the buckets share its constants
    static=lambda graphs, options, providers, source, temp_parent: _static_engine(graphs, options, source),
    lowers_in_engine=frozenset({"bf16", "fp16"}),  # the precision hint; int8 is a QDQ file lowered first (NNCF)
    precision_run=precision_run,
    quantizations=("static",),
    static_quantizer="nncf",
)
