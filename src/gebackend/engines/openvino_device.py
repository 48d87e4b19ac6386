"""Which device the OpenVINO engine compiles for (the `device` option), checked against the devices this machine
has, and the properties each device's plugin is given; also the process's one OpenVINO Core.

`device` takes OpenVINO's device strings: `CPU` (the default), `GPU` or `GPU.1` (Intel GPUs), `NPU` (Intel NPUs),
`AUTO` (OpenVINO chooses among the devices it finds), and the virtual devices over a list: `AUTO:GPU,CPU` (the
first of the list that compiles the model), `HETERO:GPU,CPU` (layers split over them), `MULTI:GPU,CPU`,
`BATCH:GPU(4)`.

Checked against `ov.Core().available_devices` (the devices whose plugin finds its hardware and driver):
* a plain device that is missing fails the load naming it, why its plugin cannot open it (its own message,
  e.g. `libOpenCL.so.1: cannot open shared object file`) and what to install;
* `AUTO:` lists are the user's own order of acceptable devices: the missing ones are dropped and said in the load
  line, and the load fails only when none is left; `HETERO:`, `MULTI:` and `BATCH:` need every device they name;
* `device_fallback=cpu` compiles for the CPU instead of failing, and the load line says so. Off by default: a
  model asked to run on a GPU never runs on the CPU unasked.

Plugin properties (`plugin_config`): every device gets the LATENCY hint and `enable_profiling`; the CPU and GPU
one stream and the precision hint (the GPU plugin otherwise runs f16, the CPU one bf16 where it can); the NPU
the hint only when it is not f32 (it computes in f16; it has no streams and no dynamic shapes: serve it with
`static_model=1`); threads (`intra_op_thread_count`) only the CPU. AUTO, HETERO and MULTI pass each device its
own properties (`ov.properties.device.properties`) and take only the hints their own plugin knows; BATCH hands its
one device's properties on directly.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import openvino as ov
import openvino.properties as props
import openvino.properties.hint as hints

from gebackend.errors import ModelLoadError

VIRTUAL = ("AUTO", "HETERO", "MULTI", "BATCH")
KNOWN = ("CPU", "GPU", "NPU")

# What a missing device needs. The plugins come with the openvino wheel; the hardware's driver does not.
INSTALL = {
    "GPU": ("an Intel GPU with its compute runtime: the OpenCL loader and Intel's GPU driver (e.g. apt install "
            "ocl-icd-libopencl1 intel-opencl-icd, or Intel's compute-runtime packages), and /dev/dri visible to the "
            "server (docs.openvino.ai: Configurations for Intel Processor Graphics)"),
    "NPU": ("an Intel NPU (Core Ultra) with Intel's NPU driver (intel/linux-npu-driver), and /dev/accel visible to the "
            "server (docs.openvino.ai: Configurations for Intel NPU)"),
}

_core: ov.Core | None = None
_core_lock = threading.Lock()


def core() -> ov.Core:
    """One OpenVINO Core per process (it caches plugins; its methods are thread-safe)."""
    global _core
    with _core_lock:
        if _core is None:
            _core = ov.Core()
        return _core


def version() -> str:
    return ov.get_version().split("-")[0]


@dataclass(frozen=True)
class Device:
    """What a model compiles for: the string `compile_model` gets, and the hardware devices behind it."""

    name: str  # "CPU", "GPU.1", "AUTO:GPU,CPU", "BATCH:GPU(4)"
    virtual: str  # "" for a hardware device, else AUTO | HETERO | MULTI | BATCH
    targets: tuple[str, ...]  # the hardware devices: ("CPU",), ("GPU", "CPU"); plain AUTO: those found here
    note: str = ""  # what was dropped or replaced, for the load line

    @property
    def is_cpu(self) -> bool:
        return self.targets == ("CPU",) and self.virtual == ""


CPU_DEVICE = Device("CPU", "", ("CPU",))


def family(device: str) -> str:
    """`GPU.1` -> `GPU`; `BATCH`'s `GPU(4)` -> `GPU`."""
    return device.split("(")[0].split(".")[0]


def parse_device(text: str) -> tuple[str, tuple[str, ...]]:
    """(virtual prefix or "", the hardware devices it names); `ModelLoadError` for a string that is none."""
    text = text.strip().upper()
    head, sep, rest = text.partition(":")
    if head in VIRTUAL:
        listed = tuple(d for d in rest.split(",") if d) if sep else ()
        if head != "AUTO" and not listed:
            raise ModelLoadError(f"device={text}: {head} needs its devices, e.g. {head}:GPU,CPU")
        if any(family(d) in VIRTUAL for d in listed):
            raise ModelLoadError(f"device={text}: a virtual device cannot list another one")
        return head, tuple(d.split("(")[0] for d in listed)
    if sep or not text:
        raise ModelLoadError(f"device={text} is no OpenVINO device: expected CPU, GPU, GPU.1, NPU, AUTO, AUTO:GPU,CPU, "
                             f"HETERO:GPU,CPU, MULTI:GPU,CPU or BATCH:GPU(4)")
    return "", (text,)


def _present(device: str, available: Sequence[str]) -> bool:
    """`GPU` is any GPU; `GPU.0` is also the GPU OpenVINO lists as plain `GPU` when it has only one."""
    if device in available:
        return True
    if "." not in device:
        return any(family(a) == device for a in available)
    return device.endswith(".0") and family(device) in available


def _why(device: str) -> str:
    """What the device's plugin says when asked for it (the reason it is not available), or ''."""
    try:
        core().get_property(family(device), props.device.full_name)
    except Exception as exc:  # noqa: BLE001 - its message is the point
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return lines[-1] if lines else ""
    return ""


def _missing_text(missing: Sequence[str], available: Sequence[str], probe: bool, install: bool = True) -> str:
    parts = []
    for device in missing:
        name = family(device)
        if name not in KNOWN and name not in {family(a) for a in available}:
            parts.append(f"OpenVINO knows no device {device}")
            continue
        why = _why(device) if probe else ""
        need = INSTALL.get(name, f"the {name} device and its driver")
        parts.append(f"{device} is not available{f' ({why})' if why else ''}" + (f": it needs {need}" if install else ""))
    return "; ".join(parts) + f". This machine's OpenVINO devices: {', '.join(available) or 'none'}"


def resolve_device(text: str = "CPU", fallback: str = "none", available: Sequence[str] | None = None) -> Device:
    """The device a model compiles for; `ModelLoadError` naming what is missing unless `fallback` is "cpu".

    `available`: the devices found here (`core().available_devices` when None; a test passes a fake list, and then
    no plugin is asked why a device is missing)."""
    virtual, listed = parse_device(text)
    probe = available is None
    if available is None:
        available = list(core().available_devices)
    name = text.strip().upper()
    if virtual == "AUTO" and not listed:
        return Device(name, virtual, tuple(available))
    missing = [d for d in listed if not _present(d, available)]
    if not missing:
        return Device(name, virtual, listed)
    if virtual == "AUTO" and len(missing) < len(listed):
        kept = [d for d in listed if d not in missing]
        return Device(f"AUTO:{','.join(kept)}", virtual, tuple(kept),
                      f"device={name}: {', '.join(missing)} not available here, AUTO chooses among {', '.join(kept)}")
    if fallback == "cpu" and "CPU" in available:
        return Device("CPU", "", ("CPU",), f"device={name}: {_missing_text(missing, available, probe, install=False)}; "
                                           f"compiled for the CPU as device_fallback=cpu allows")
    raise ModelLoadError(f"device={name}: {_missing_text(missing, available, probe)}; or set device_fallback=cpu to run "
                         f"on the CPU")


def capabilities(device: Device) -> tuple[str, ...]:
    """The OPTIMIZATION_CAPABILITIES every device behind `device` has (what a precision hint may ask of all)."""
    found = None
    for target in device.targets:
        have = set(core().get_property(target, props.device.capabilities))
        found = have if found is None else found & have
    return tuple(sorted(found or ()))


def device_properties(device: str, hint: ov.Type, profile: bool, threads: int = 0) -> dict:
    """One hardware device's plugin properties for a compiled model (see the module docstring)."""
    name = family(device)
    config = {hints.performance_mode: hints.PerformanceMode.LATENCY, props.enable_profiling: profile}
    if name in ("CPU", "GPU"):
        config[props.num_streams] = 1
    if name in ("CPU", "GPU") or (name == "NPU" and hint != ov.Type.f32):
        config[hints.inference_precision] = hint
    if name == "CPU" and threads > 0:
        config[props.inference_num_threads] = threads
    return config


def plugin_config(device: Device, hint: ov.Type, profile: bool, threads: int = 0) -> dict:
    """The properties `compile_model(model, device.name, ...)` gets."""
    if not device.virtual:
        return device_properties(device.name, hint, profile, threads)
    per_device = {t: device_properties(t, hint, profile, threads) for t in device.targets}
    if device.virtual == "BATCH":
        return per_device[device.targets[0]]
    own = {str(p) for p in core().get_property(device.virtual, props.supported_properties)}
    config = {key: value for key, value in ((hints.performance_mode, hints.PerformanceMode.LATENCY),
                                            (props.enable_profiling, profile)) if str(key) in own}
    config.update([props.device.properties(per_device)])
    return config


def full_name(device: Device) -> str:
    """The hardware behind `device` as its plugins name it."""
    names = []
    for target in device.targets:
        try:
            names.append(str(core().get_property(target, props.device.full_name)))
        except Exception:  # noqa: BLE001
            names.append(target)
    return ", ".join(names)
