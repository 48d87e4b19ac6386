"""The backend options as typed values, grouped by the part that reads them; `BackendOptions` holds one of each.

Each group is a frozen dataclass whose fields are options; every field name is unique across the groups, so a
key of config/options.py's key table names one flat field and the group holding it follows from these classes
(no second table). `BackendOptions.make(**flat)` builds options from flat field names, `options.replace(**flat)`
copies them with flat fields changed; readers take the group they need: `options.session.intra_op_thread_count`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from gebackend.config.accelerators import Accelerators
from gebackend.config import engine_names


@dataclass(frozen=True)
class OrtSessionOptions:
    """ONNX Runtime's session options (engines/onnxruntime*.py; OpenVINO reads the thread count too)."""

    intra_op_thread_count: int = 0  # 0: the engine's default
    inter_op_thread_count: int = 0
    execution_mode: str = "sequential"
    enable_mem_arena: bool = True
    enable_mem_pattern: bool = True
    graph_optimization_level: str = "all"
    # ONNX Runtime graph optimizers to switch off, e.g. SkipLayerNormFusion. None: the engine's default for the
    # graph mode (static ORT graphs: SkipLayerNormFusion, see engines/onnxruntime.py); "none": nothing disabled.
    disabled_optimizers: tuple[str, ...] | None = None
    disable_prepacking: bool = False  # ORT packs MatMul weights per session: off saves ~the MatMul weights per bucket
    # one copy of the weights for every instance: the dynamic graph loads a file of ONNX Runtime's prepacked weights,
    # mapped read-only and shared ("auto": models of 64 MiB or more, on the CPU; engines/ort_shared_weights.py)
    share_weights: str = "auto"
    # the arenas every ORT run shrinks back ("cpu:0", "cpu:0;gpu:0"; Triton's onnxruntime backend key
    # memory.enable_memory_arena_shrinkage): config/arena_shrinkage.py
    arena_shrinkage: str = ""
    # ORT's session.use_device_allocator_for_initializers (the peer's key since 2025): "1" allocates the initializers
    # with the device's allocator instead of the arena, "0" not; "": ORT's default (not)
    device_allocator_for_initializers: str = ""
    allow_spinning: str = "auto"  # ORT intra-op spinning: "auto" (off when pinned instances share cores) | "on" | "off"
    # ORT's session.force_spinning_stop: intra-op threads stop spinning as soon as a run returns ("on"), or spin on
    # for a while after it ("off"); "auto": ORT's default (off)
    force_spinning_stop: str = "auto"
    # static graphs on the CPU: every bucket's session runs on one intra-op thread pool of the process (ORT's global
    # pool) instead of one pool each, so the pools neither steal cores from each other nor need to stop spinning when a
    # run returns ("on"); "off": a pool per bucket, spinning only within a run; "auto": engines/onnxruntime_static.py
    shared_thread_pool: str = "auto"
    # ORT's session.intra_op_thread_affinities: the logical processors (from 1) of each intra-op worker thread, e.g.
    # "2;3" or "2,3;4"; empty: ORT's own placement. lend_idle_cores sets it for the engine on the borrowed cores
    intra_op_thread_affinities: str = ""
    # config.pbtxt model_operations { op_library_filename }: ONNX Runtime custom operator libraries every session of
    # the model registers (Triton's onnxruntime backend does the same); no key sets it
    custom_op_libraries: tuple[str, ...] = ()


@dataclass(frozen=True)
class StaticGraphOptions:
    """Static graph mode and the shapes batches run at (config/static_shapes.py, runtime/loader.py, compile/, the static
    engines, runtime/padding_trim.py)."""

    static_model: bool = False
    input_shape: str = ""  # ge-backend's graph.ge.inputShape, e.g. "image:-1,3,-1,-1"
    dynamic_dims: str = ""  # ge-backend's graph.ge.dynamicDims, e.g. "1,224,224;8,224,224"
    dynamic_node_type: str = ""  # ge-backend's graph.ge.dynamicNodeType: accepted, nothing to do on these engines
    bucket_fallback: str = "error"  # a request that fits no bucket: "error" (400) or "dynamic" (run unspecialised)
    bucket_paddable_dims: tuple[str, ...] = ()  # ONNX dim names (e.g. "sequence") a request may be zero-padded along
    # how a batch is covered: "measured" (each bucket's run and, on the CPU, the dynamic graph's at each batch size timed
    # at load; pad, split or run unspecialised, whichever costs less: runtime/bucket_costs.py), "buckets" (the same
    # without the dynamic graph) or "smallest" (always the smallest bucket that holds it, padded)
    bucket_plan: str = "measured"
    # (input, pad id): each batch cut to its longest row along that input's last axis (runtime/padding_trim.py); None: off
    trim_padding: tuple[str, int] | None = None
    fold_size_limit: int = 1 << 20  # bytes: a folded constant larger than this stays unfolded
    enable_cuda_graph: bool = True  # capture static graphs as CUDA graphs when the CUDA provider runs them


@dataclass(frozen=True)
class EngineChoice:
    """Which engine runs a model, at what precision, where (engines/, engines/providers/, compile/precision.py,
    compile/calibration.py)."""

    engine: str = engine_names.DEFAULT  # a name in config/engine_names.py, or "auto" (the fastest installed here)
    precision_mode: str = "origin"  # "origin" (exact, as given) | "fp16" | "bf16" | "int8" | "auto" (engines/auto_choice.py)
    # a lowered model (int8, fp16) whose cosine similarity to fp32 on the accuracy check is below this is not served:
    # fp32 is, and the log says so. 0: only a warning below 0.99; precision_mode=auto: 0.99 unless set
    precision_min_cosine: float = 0.0
    # precision_mode=int8 (compile/precision.py, compile/quantize_static.py): "dynamic" (ONNX Runtime, no calibration),
    # "static" (calibrated QDQ: ONNX Runtime's quantize_static, or NNCF for engine=openvino), or "auto": static when
    # calibration_data is set or the engine has no dynamic int8 (OpenVINO), else dynamic
    quantization: str = "auto"
    # static int8: a folder of <input>.npy / <input>/*.npy, or a perf_analyzer --input-data JSON file; relative to the
    # model's folder (the one holding config.pbtxt). Empty: seeded random samples (compile/calibration.py)
    calibration_data: str = ""
    calibration_samples: int = 32  # static int8: how many calibration samples (random ones, or the first of the data)
    # engine=onnxruntime: the execution provider; "auto": from instance_group kind and gpu_execution_accelerator
    # (engines/providers/: cpu, cuda, tensorrt, cann). CANN has no Triton instance kind, so it is asked for by name
    execution_provider: str = "auto"
    device: str = "CPU"  # engine=openvino: OpenVINO's device, e.g. GPU, GPU.1, NPU, AUTO, AUTO:GPU,CPU (engines/openvino_device.py)
    device_fallback: str = "none"  # "cpu": run on the CPU where the asked provider or device is absent; "none": the load fails
    # optimization { execution_accelerators } (config/accelerators.py): parsed, for the engines to run; no key sets it
    accelerators: Accelerators = field(default_factory=Accelerators)


@dataclass(frozen=True)
class InstanceOptions:
    """How instances are placed and watched (runtime/pinning.py, runtime/instance.py, control/heartbeat.py,
    config/ge_keys.py)."""

    pin_instances: str = "auto"  # "auto": pin when the model has several instances or sets cores_per_instance; "on" | "off"
    cores_per_instance: int = 0  # CPU cores each instance is pinned to; 0: the machine's cores divided evenly
    # "on": a pinned instance runs a batch on its model's other instances' cores too while they are idle, with a second
    # engine whose extra threads are fixed there (runtime/lending.py; ONNX Runtime's dynamic graph on the CPU); "off"
    lend_idle_cores: str = "off"
    # An instance inside one execute() this long, or frozen this long, is killed and its model restored (control/heartbeat.py); 0: never
    hang_timeout_s: float = 120.0
    device_ids: tuple[int, ...] = ()  # ge-backend's device_ids: parsed and reported (config/ge_keys.py)
    device_exec_blocks: int = -1  # ge-backend's execution blocks per device; -1: computed. Reported, no effect
    instance_exec_blocks: int = 1  # ge-backend's execution blocks per instance. Reported, no effect


@dataclass(frozen=True)
class DiagnosticOptions:
    """Profiling and dumps (profiling/, runtime/loader.py's dump_graph)."""

    profiling: str = "off"  # "true": from load until the server stops; "dynamic": `gebackend profile start/stop`
    profiling_dir: str = "profiling"  # where captures go: <profiling_dir>/<model>/<timestamp>/
    dump_graph: bool = False  # write every compiled static graph as ONNX under <profiling_dir>/<model>/graphs/
    dump_data: bool = False  # write the first request's every node input and output (profiling/dump_data.py)


@dataclass(frozen=True)
class BackendOptions:
    """Every option a model can set, typed, with its default: one group per part that reads them."""

    session: OrtSessionOptions = field(default_factory=OrtSessionOptions)
    static: StaticGraphOptions = field(default_factory=StaticGraphOptions)
    engines: EngineChoice = field(default_factory=EngineChoice)
    instances: InstanceOptions = field(default_factory=InstanceOptions)
    diagnostics: DiagnosticOptions = field(default_factory=DiagnosticOptions)
    default_max_batch_size: int = 8  # read where config.pbtxt is reconciled (config/spec.py), no group of its own

    @classmethod
    def make(cls, **flat: Any) -> BackendOptions:
        """Options from flat field names (`make(intra_op_thread_count=2, static_model=True)`); the rest default."""
        return _DEFAULT.replace(**flat)

    def replace(self, **flat: Any) -> BackendOptions:
        """A copy with flat fields changed; an unknown name raises TypeError, as a dataclass would."""
        top: dict[str, Any] = {}
        grouped: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            group = FIELDS.get(name)
            if group is None:
                raise TypeError(f"BackendOptions has no option {name!r}")
            if group:
                grouped.setdefault(group, {})[name] = value
            else:
                top[name] = value
        top.update({group: dataclasses.replace(getattr(self, group), **values) for group, values in grouped.items()})
        return dataclasses.replace(self, **top)

    def flat(self) -> dict[str, Any]:
        """Every option by its flat field name: `BackendOptions.make(**options.flat()) == options`."""
        return {name: getattr(getattr(self, group) if group else self, name) for name, group in FIELDS.items()}


def _fields() -> dict[str, str]:
    """Flat field name -> the BackendOptions group holding it ("" for a field of BackendOptions itself)."""
    out: dict[str, str] = {}
    for top in dataclasses.fields(BackendOptions):
        factory = top.default_factory
        if dataclasses.is_dataclass(factory):  # a group: its fields
            members = [(f.name, top.name) for f in dataclasses.fields(factory)]
        else:
            members = [(top.name, "")]
        for name, group in members:
            if name in out:
                raise TypeError(f"option field {name!r} is in two groups ({out[name] or 'BackendOptions'}, {group})")
            out[name] = group
    return out


FIELDS: Mapping[str, str] = _fields()
_DEFAULT = BackendOptions()
