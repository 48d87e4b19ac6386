"""What an execution-provider module declares (`ProviderKind`), what it builds ONNX Runtime's provider options
from (`Target`: the instance's model, options, accelerator parameters and device), and the helpers the modules share.

A provider list ("entries") is what `onnxruntime.InferenceSession(providers=...)` takes: names, or
(name, {option: text}) pairs, the provider that runs the model first and the CPU provider last.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

if TYPE_CHECKING:
    from gebackend.config.options import BackendOptions

Entry = Union[str, tuple[str, dict[str, str]]]
Shapes = Mapping[str, Sequence[int]]

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Target:
    """The instance a provider is configured for."""

    model: str
    path: Path | None  # the model file as the repository has it (TensorRT keeps its caches beside it)
    options: "BackendOptions"
    device_id: int = 0  # the device this instance runs on (Triton's GPU id, or its entry of device_ids)


@dataclass(frozen=True)
class ProviderKind:
    """One execution provider, as its module declares it (`KIND = ProviderKind(...)`)."""

    name: str  # our name: execution_provider=<name>
    ort_names: tuple[str, ...]  # the ONNX Runtime providers it needs; the first is the one the model runs on
    package: str  # the pip package that brings them
    install: str  # how to install it, said when it is missing
    device: str  # where the static engine binds its fixed buffers: "cpu" | "cuda"
    # the provider list of a dynamic-graph session (also the static engine's when `bucket` is None)
    entries: Callable[[Target], list]
    # (target, bucket index, the bucket's input shapes) -> the provider list of that bucket's session
    bucket: Callable[[Target, int, Shapes], list] | None = None
    # the option of the first entry that captures a whole static graph once and replays it (CUDA graph, CANN
    # graph mode); the static engine sets it to "1" for buckets whose every shape is known at compile time
    capture_key: str | None = None
    capture_label: str = "graph_capture"  # how the load line names the capture: cuda_graph=on
    graph_ids: bool = False  # captured buckets are told apart by RunOptions `gpu_graph_id` (one per bucket)
    accelerator: str | None = None  # the config.pbtxt gpu_execution_accelerator name that selects it for KIND_GPU
    default_for: tuple[str, ...] = ()  # the Triton instance kinds it serves when execution_provider=auto
    # it compiles at precision_mode itself (TensorRT's fp16/int8 flags, CANN's precision_mode), so the loader
    # hands it the fp32 file instead of lowering it first (compile/precision.py)
    lowers_precision: bool = False


def provider_name(entry: Entry) -> str:
    return entry[0] if isinstance(entry, tuple) else entry


def with_option(entries: Sequence[Entry], key: str, value: str) -> list:
    """The list with `key`=`value` set on its first entry (the provider the model runs on)."""
    if not entries:
        return []
    first = entries[0]
    name, opts = first if isinstance(first, tuple) else (first, {})
    return [(name, {**opts, key: value}), *entries[1:]]


def shape_list(shapes: Shapes) -> str:
    """Shapes as TensorRT's profile options write them: `input_ids:4x32,attention_mask:4x32` (scalars left out)."""
    return ",".join(f"{name}:{'x'.join(str(int(d)) for d in shape)}" for name, shape in shapes.items() if len(shape))
