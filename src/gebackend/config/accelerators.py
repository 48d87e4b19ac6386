"""config.pbtxt `optimization { execution_accelerators { ... } }`, read as Triton's onnxruntime backend reads it.

What the peer does (triton-inference-server/onnxruntime_backend, src/onnxruntime.cc, ModelInstanceState):
- `cpu_execution_accelerator`: `openvino` appends the OpenVINO execution provider on the CPU (no parameters
  read); any other name fails the load with "unknown Execution Accelerator '<name>' is requested".
- `gpu_execution_accelerator`: `tensorrt`, whose parameters it checks one by one (`precision_mode` FP32 / FP16 /
  BF16 / INT8, `max_workspace_size_bytes`, `trt_engine_cache_enable`, ...; an unknown one fails with "unknown
  parameter '<key>' is provided for TensorRT Execution Accelerator") and turns into TensorRT provider options;
  `cuda`, whose parameters go to the CUDA provider as given (`do_copy_in_default_stream` and
  `use_ep_level_unified_stream` must be booleans); any other name fails as above.

Here `openvino` selects our OpenVINO engine (`engine` option), and the GPU entries are parsed into typed
`TensorRTAccelerator` / `CudaAccelerator` values with the provider options the peer would pass; a KIND_GPU
instance runs on them (engines/providers/: tensorrt.py, cuda.py add the device, precision, caches, profiles and
graph capture); the load log reports them. Unlike the peer, which reads the GPU list only for GPU instances, names and
parameters are checked for every instance, so a typo fails the load on a CPU machine too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from gebackend.config import engine_names
from gebackend.errors import ConfigError

CPU_ACCELERATORS = tuple(engine_names.CPU_ACCELERATORS)
GPU_ACCELERATORS = ("tensorrt", "cuda")


def _bool(value: str) -> bool:
    """The peer's ParseBoolValue (triton backend_common.cc): true/on/1, false/off/0, any case."""
    low = value.lower()
    if low in ("true", "on", "1"):
        return True
    if low in ("false", "off", "0"):
        return False
    raise ValueError(f"failed to convert '{value}' to boolean")


def _int(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"failed to convert '{value}' to integral number") from None


def _unsigned(value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(f"failed to convert '{value}' to unsigned long long integral number")
    return number


def _precision(value: str) -> str:
    if value not in ("FP32", "FP16", "BF16", "INT8"):  # the peer compares case-sensitively
        raise ValueError(f"unsupported precision mode '{value}' is requested")
    return value


def _text(value: str) -> str:
    return value


# The TensorRT parameters the peer reads: parameter -> (parser, TensorRT provider option it sets).
_TRT_PARAMS: dict[str, tuple[Callable[[str], Any], str]] = {
    "precision_mode": (_precision, ""),  # FP16 -> trt_fp16_enable, BF16 -> trt_bf16_enable, INT8 -> trt_int8_enable
    "max_workspace_size_bytes": (_unsigned, "trt_max_workspace_size"),
    "trt_max_partition_iterations": (_int, "trt_max_partition_iterations"),
    "trt_min_subgraph_size": (_int, "trt_min_subgraph_size"),
    "int8_calibration_table_name": (_text, "trt_int8_calibration_table_name"),
    "int8_use_native_calibration_table": (_bool, "trt_int8_use_native_calibration_table"),
    "trt_dla_enable": (_bool, "trt_dla_enable"),
    "trt_dla_core": (_int, "trt_dla_core"),
    "trt_engine_cache_enable": (_bool, "trt_engine_cache_enable"),
    "trt_engine_cache_path": (_text, "trt_engine_cache_path"),
    "trt_engine_cache_prefix": (_text, "trt_engine_cache_prefix"),
    "trt_dump_subgraphs": (_bool, "trt_dump_subgraphs"),
    "trt_force_sequential_engine_build": (_bool, "trt_force_sequential_engine_build"),
    "trt_context_memory_sharing_enable": (_bool, "trt_context_memory_sharing_enable"),
    "trt_layer_norm_fp32_fallback": (_bool, "trt_layer_norm_fp32_fallback"),
    "trt_timing_cache_enable": (_bool, "trt_timing_cache_enable"),
    "trt_timing_cache_path": (_text, "trt_timing_cache_path"),
    "trt_force_timing_cache": (_bool, "trt_force_timing_cache"),
    "trt_detailed_build_log": (_bool, "trt_detailed_build_log"),
    "trt_build_heuristics_enable": (_bool, "trt_build_heuristics_enable"),
    "trt_sparsity_enable": (_bool, "trt_sparsity_enable"),
    "trt_builder_optimization_level": (_int, "trt_builder_optimization_level"),
    "trt_auxiliary_streams": (_int, "trt_auxiliary_streams"),
    "trt_tactic_sources": (_text, "trt_tactic_sources"),
    "trt_extra_plugin_lib_paths": (_text, "trt_extra_plugin_lib_paths"),
    "trt_profile_min_shapes": (_text, "trt_profile_min_shapes"),
    "trt_profile_max_shapes": (_text, "trt_profile_max_shapes"),
    "trt_profile_opt_shapes": (_text, "trt_profile_opt_shapes"),
    "trt_cuda_graph_enable": (_bool, "trt_cuda_graph_enable"),
    "trt_dump_ep_context_model": (_bool, "trt_dump_ep_context_model"),
    "trt_ep_context_file_path": (_text, "trt_ep_context_file_path"),
    "trt_ep_context_embed_mode": (_int, "trt_ep_context_embed_mode"),
}

_CUDA_BOOLS = ("do_copy_in_default_stream", "use_ep_level_unified_stream")


@dataclass(frozen=True)
class TensorRTAccelerator:
    """`gpu_execution_accelerator [ { name: "tensorrt" parameters {...} } ]`: None is the provider's default."""

    precision_mode: str = "FP32"
    max_workspace_size_bytes: int | None = None
    trt_max_partition_iterations: int | None = None
    trt_min_subgraph_size: int | None = None
    int8_calibration_table_name: str | None = None
    int8_use_native_calibration_table: bool | None = None
    trt_dla_enable: bool | None = None
    trt_dla_core: int | None = None
    trt_engine_cache_enable: bool | None = None
    trt_engine_cache_path: str | None = None
    trt_engine_cache_prefix: str | None = None
    trt_dump_subgraphs: bool | None = None
    trt_force_sequential_engine_build: bool | None = None
    trt_context_memory_sharing_enable: bool | None = None
    trt_layer_norm_fp32_fallback: bool | None = None
    trt_timing_cache_enable: bool | None = None
    trt_timing_cache_path: str | None = None
    trt_force_timing_cache: bool | None = None
    trt_detailed_build_log: bool | None = None
    trt_build_heuristics_enable: bool | None = None
    trt_sparsity_enable: bool | None = None
    trt_builder_optimization_level: int | None = None
    trt_auxiliary_streams: int | None = None
    trt_tactic_sources: str | None = None
    trt_extra_plugin_lib_paths: str | None = None
    trt_profile_min_shapes: str | None = None
    trt_profile_max_shapes: str | None = None
    trt_profile_opt_shapes: str | None = None
    trt_cuda_graph_enable: bool | None = None
    trt_dump_ep_context_model: bool | None = None
    trt_ep_context_file_path: str | None = None
    trt_ep_context_embed_mode: int | None = None

    name = "tensorrt"

    def settings(self) -> dict[str, Any]:
        """The parameters that were set (precision_mode always), by the peer's parameter names."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name == "precision_mode" or getattr(self, f.name) is not None}

    def provider_options(self, device_id: int = 0) -> dict[str, str]:
        """ONNX Runtime's TensorrtExecutionProvider options, as the peer builds them."""
        options: dict[str, str] = {}
        for key, value in self.settings().items():
            if key == "precision_mode":
                if value != "FP32":
                    options[f"trt_{value.lower()}_enable"] = "1"
            elif value != "":  # the peer skips empty values
                options[_TRT_PARAMS[key][1]] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        options["device_id"] = str(device_id)
        return options

    def describe(self) -> str:
        return f"tensorrt({_show(self.settings())})"


@dataclass(frozen=True)
class CudaAccelerator:
    """`gpu_execution_accelerator [ { name: "cuda" parameters {...} } ]`: CUDA provider options, as given."""

    options: tuple[tuple[str, str], ...] = ()

    name = "cuda"

    def provider_options(self, device_id: int = 0) -> dict[str, str]:
        return {**dict(self.options), "device_id": str(device_id)}

    def describe(self) -> str:
        return f"cuda({_show(dict(self.options))})"


@dataclass(frozen=True)
class Accelerators:
    """Both lists, in config order."""

    cpu: tuple[str, ...] = ()
    gpu: tuple[TensorRTAccelerator | CudaAccelerator, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.cpu or self.gpu)

    @property
    def tensorrt(self) -> TensorRTAccelerator | None:
        return next((a for a in self.gpu if isinstance(a, TensorRTAccelerator)), None)

    @property
    def cuda(self) -> CudaAccelerator | None:
        return next((a for a in self.gpu if isinstance(a, CudaAccelerator)), None)

    def describe(self) -> str:
        parts = []
        if self.cpu:
            parts.append("cpu_execution_accelerator " + ", ".join(self.cpu))
        if self.gpu:
            parts.append("gpu_execution_accelerator " + ", ".join(a.describe() for a in self.gpu))
        return "; ".join(parts)


def _show(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def _entries(section: Any, where: str, model: str) -> list[Mapping[str, Any]]:
    if section is None:
        return []
    if not isinstance(section, list) or not all(isinstance(e, Mapping) for e in section):
        raise ConfigError(f"model '{model}': optimization.execution_accelerators.{where} must be a list of entries")
    return list(section)


def _parameters(entry: Mapping[str, Any]) -> dict[str, str]:
    params = entry.get("parameters") or {}
    return {str(k): str(v) for k, v in params.items()} if isinstance(params, Mapping) else {}


def _tensorrt(model: str, params: Mapping[str, str]) -> TensorRTAccelerator:
    values: dict[str, Any] = {}
    for key, text in params.items():
        if key not in _TRT_PARAMS:
            raise ConfigError(f"model '{model}': unknown parameter '{key}' is provided for TensorRT Execution Accelerator")
        try:
            values[key] = _TRT_PARAMS[key][0](text)
        except ValueError as exc:
            raise ConfigError(f"model '{model}': TensorRT Execution Accelerator parameter {key}: {exc}") from None
    return TensorRTAccelerator(**values)


def _cuda(model: str, params: Mapping[str, str]) -> CudaAccelerator:
    for key in _CUDA_BOOLS:
        if key in params:
            try:
                _bool(params[key])
            except ValueError as exc:
                raise ConfigError(f"model '{model}': CUDA Execution Accelerator parameter {key}: {exc}") from None
    return CudaAccelerator(tuple((k, v) for k, v in params.items() if k and v))  # the peer drops empty values


def parse_accelerators(model: str, model_config: Mapping[str, Any]) -> Accelerators:
    """The execution accelerators config.pbtxt asks for (Triton's JSON shape); ConfigError names a bad one."""
    section = ((model_config.get("optimization") or {}).get("execution_accelerators") or {})
    if not isinstance(section, Mapping):
        return Accelerators()
    cpu: list[str] = []
    for entry in _entries(section.get("cpu_execution_accelerator"), "cpu_execution_accelerator", model):
        name = str(entry.get("name", ""))
        if name not in CPU_ACCELERATORS:
            raise ConfigError(f"model '{model}': unknown Execution Accelerator '{name}' is requested "
                              f"(cpu_execution_accelerator knows {', '.join(CPU_ACCELERATORS)})")
        cpu.append(name)
    gpu: list[TensorRTAccelerator | CudaAccelerator] = []
    for entry in _entries(section.get("gpu_execution_accelerator"), "gpu_execution_accelerator", model):
        name = str(entry.get("name", ""))
        if name == "tensorrt":
            gpu.append(_tensorrt(model, _parameters(entry)))
        elif name == "cuda":
            gpu.append(_cuda(model, _parameters(entry)))
        else:
            raise ConfigError(f"model '{model}': unknown Execution Accelerator '{name}' is requested "
                              f"(gpu_execution_accelerator knows {', '.join(GPU_ACCELERATORS)})")
    return Accelerators(tuple(cpu), tuple(gpu))
