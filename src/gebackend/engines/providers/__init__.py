"""The ONNX Runtime execution providers by name, and which one an instance runs on (`select_providers`).

Each provider module declares one `KIND = ProviderKind(...)` (base.py): the ONNX Runtime providers it needs, the
pip package that brings them, which Triton instance kinds it serves, and how it turns the model's options,
accelerator parameters and buckets into provider options. `_MODULES` names the modules, in the order `auto`
prefers them; adding a provider is one module and one line there.

Which provider an instance gets (`select_providers`), first match wins:
1. an engine other than onnxruntime (OpenVINO: its `device` option says where it runs) -> the CPU list, which
   only a dump or an accuracy check uses;
2. the backend option `execution_provider=<name>` (any instance kind): how CANN is asked for, Triton having no
   NPU instance kind;
3. a KIND_GPU instance: the first provider in table order whose `accelerator` config.pbtxt's
   `gpu_execution_accelerator` lists (tensorrt before cuda, as Triton's onnxruntime backend appends TensorRT
   first), else the provider that declares KIND_GPU its default (cuda);
4. otherwise the provider that declares the instance's kind its default: the CPU.

The device: Triton's device id for KIND_GPU instances; for the others this instance's entry of `device_ids`
(instance i takes `device_ids[i % len]`), or Triton's id (0) when `device_ids` is unset.

A provider missing from this onnxruntime (`onnxruntime.get_available_providers()`) fails the load naming it and
the package to install, unless `device_fallback=cpu`, which runs on the CPU and says so in the load line. ONNX
Runtime may also create a session without the provider it was given (a library missing at run time): `verify`
fails the load then, rather than serving on the CPU unasked.

The `Selection` returned is a tuple of provider entries, so it goes wherever a providers list goes; the engines
also ask it how to configure each static bucket's session (`for_bucket`: TensorRT's profiles and cache folder,
graph capture) and each bucket's RunOptions (`run_config`: `gpu_graph_id`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.engines.providers.base import CPU, Entry, ProviderKind, Shapes, Target, provider_name, with_option
from gebackend.errors import ModelLoadError

_MODULES = {
    "tensorrt": "gebackend.engines.providers.tensorrt",
    "cuda": "gebackend.engines.providers.cuda",
    "cann": "gebackend.engines.providers.cann",
    "cpu": "gebackend.engines.providers.cpu",
}


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def kind(name: str) -> ProviderKind:
    """The provider registered as `name`."""
    try:
        module = _MODULES[name]
    except KeyError:
        raise ModelLoadError(f"unknown execution_provider {name!r}: expected auto or one of {', '.join(_MODULES)}") from None
    return importlib.import_module(module).KIND


def _kind_of_entry(entry: Entry) -> ProviderKind:
    """The provider whose first ONNX Runtime name is this entry's (a plain list's first entry); the CPU otherwise."""
    name = provider_name(entry)
    return next((k for k in map(kind, _MODULES) if k.ort_names[0] == name), kind("cpu"))


class Selection(tuple):
    """The provider entries an instance's sessions get, and what the engines ask of the provider beyond them."""

    kind: ProviderKind
    target: Target | None  # None: made from a plain list (`as_selection`)
    note: str

    def __new__(cls, provider: ProviderKind, entries: Sequence[Entry], target: Target | None = None, note: str = ""):
        self = super().__new__(cls, entries)
        self.kind, self.target, self.note = provider, target, note
        return self

    def __getnewargs__(self):  # copy and pickle keep the attributes
        return self.kind, tuple(self), self.target, self.note

    @property
    def device(self) -> str:
        """Where the static engine binds its fixed buffers: "cpu" or "cuda"."""
        return self.kind.device

    @property
    def device_id(self) -> int:
        if self.target is not None:
            return self.target.device_id
        first = self[0] if self else CPU
        return int(first[1].get("device_id", 0)) if isinstance(first, tuple) else 0

    @property
    def lowers_precision(self) -> bool:
        """The provider compiles at precision_mode itself: the loader should hand it the fp32 file."""
        return self.kind.lowers_precision

    @property
    def accelerated(self) -> bool:
        """It runs on something else than the CPU provider (ONNX Runtime must not fall back to the CPU silently)."""
        return self.kind.ort_names[0] != CPU

    @property
    def can_capture(self) -> bool:
        return self.kind.capture_key is not None

    def for_bucket(self, index: int, shapes: Shapes, capture: bool) -> list:
        """The provider list of static bucket `index`'s session; `capture`: capture its graph whole."""
        entries = list(self)
        if self.target is not None and self.kind.bucket is not None:
            entries = self.kind.bucket(self.target, index, shapes)
        if capture and self.kind.capture_key is not None:
            entries = with_option(entries, self.kind.capture_key, "1")
        return entries

    def run_config(self, index: int, captured: bool) -> dict[str, str]:
        """RunOptions config entries for bucket `index`'s runs: its own `gpu_graph_id` where it was captured."""
        return {"gpu_graph_id": str(index)} if captured and self.kind.graph_ids else {}

    def verify(self, session_providers: Sequence[str]) -> None:
        """Refuse a session ONNX Runtime made without the provider it was asked for."""
        wanted = self.kind.ort_names[0]
        if wanted != CPU and wanted not in session_providers:
            raise ModelLoadError(
                f"ONNX Runtime made the session without {wanted} (it runs on {', '.join(session_providers)}): the "
                f"provider is installed but could not start; check its libraries and the device, or set "
                f"device_fallback=cpu to run on the CPU ({self.kind.install})")

    def describe(self) -> str:
        """The provider part of a load line."""
        text = f"execution_provider={self.kind.name}"
        if self.kind.name != "cpu":
            text += f" device_id={self.device_id}"
        return f"{text} ({self.note})" if self.note else text


def as_selection(providers: Sequence) -> Selection:
    """A Selection for a providers list (a plain list is taken as given: its first entry names the provider)."""
    if isinstance(providers, Selection):
        return providers
    entries = list(providers) or [CPU]
    return Selection(_kind_of_entry(entries[0]), entries)


def _instance_kind(instance_kind: str) -> str:
    return str(instance_kind or "CPU").upper().removeprefix("KIND_")


def _choose(choice, instance_kind: str) -> tuple[ProviderKind, str]:
    """The provider an instance asks for and why (for the messages); `choice`: the options' `engines` group."""
    from gebackend.engines import engine_name, registry

    engine = engine_name(choice)
    if not registry.kind(engine).onnxruntime_providers:
        return kind("cpu"), f"engine={engine}"
    if choice.execution_provider != "auto":
        return kind(choice.execution_provider), f"execution_provider={choice.execution_provider}"
    if instance_kind == "GPU":
        listed = [a.name for a in choice.accelerators.gpu]
        for provider in map(kind, _MODULES):
            if provider.accelerator in listed:
                return provider, f"gpu_execution_accelerator {provider.accelerator}"
    for provider in map(kind, _MODULES):
        if instance_kind in provider.default_for:
            return provider, f"instance_group kind KIND_{instance_kind}"
    return kind("cpu"), f"instance_group kind KIND_{instance_kind}"


def _device(device_ids: Sequence[int], instance_kind: str, device_id: int, instance_index: int) -> int:
    if instance_kind != "GPU" and device_ids:
        return device_ids[instance_index % len(device_ids)]
    return int(device_id)


def select_providers(spec, instance_kind: str = "CPU", device_id: int = 0, available: Sequence[str] | None = None,
                     instance_index: int = 0, model_path=None) -> Selection:
    """The execution providers one instance of `spec`'s model runs on (see the module docstring for the order).

    `instance_kind`, `device_id`: Triton's `model_instance_kind` and `model_instance_device_id`; `instance_index`:
    the instance's index among the model's instances (runtime/pinning.instance_position), which picks its entry
    of `device_ids`; `available`: the providers this onnxruntime has (asked of onnxruntime when None);
    `model_path`: the model file in the repository, beside which caches are kept (`spec.path` when None; pass the
    repository's file where `spec.path` is a temporary copy, as npu_ge's renamed tensors make one).
    """
    options = spec.options
    choice = options.engines
    where = _instance_kind(instance_kind)
    provider, why = _choose(choice, where)
    path = Path(model_path) if model_path is not None else spec.path
    target = Target(spec.name, path, options, _device(options.instances.device_ids, where, device_id, instance_index))
    notes = []
    if choice.device != "CPU" and not why.startswith("engine="):
        notes.append(f"device={choice.device} is the OpenVINO engine's option; ONNX Runtime runs on execution_provider")
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    missing = [name for name in provider.ort_names if name not in available]
    if missing:
        have = ", ".join(available)
        if choice.device_fallback != "cpu":
            raise ModelLoadError(
                f"{why} asks for the {provider.name} execution provider, but this onnxruntime has no "
                f"{', '.join(missing)} (it has {have}): {provider.install}; or set device_fallback=cpu to run on the "
                f"CPU instead")
        notes.append(f"{why}: no {', '.join(missing)} in this onnxruntime (it comes with {provider.package}), running "
                     f"on the CPU as device_fallback=cpu allows")
        provider = kind("cpu")
        target = Target(spec.name, path, options, 0)
    return Selection(provider, provider.entries(target), target, "; ".join(notes))


def run_options_config(config: Mapping[str, str]):
    """An onnxruntime.RunOptions carrying these config entries (None when there are none)."""
    if not config:
        return None
    import onnxruntime as ort

    run = ort.RunOptions()
    for key, value in config.items():
        run.add_run_config_entry(key, value)
    return run


__all__ = ["ProviderKind", "Selection", "Target", "as_selection", "kind", "names",
           "select_providers"]
