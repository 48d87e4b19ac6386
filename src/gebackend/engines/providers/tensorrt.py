"""ONNX Runtime's TensorRT execution provider (NVIDIA GPUs; `onnxruntime-gpu` with TensorRT's libraries).

Selected for KIND_GPU instances whose config.pbtxt lists `gpu_execution_accelerator [ { name: "tensorrt" } ]`,
or by `execution_provider=tensorrt`. As in Triton's onnxruntime backend the list is TensorRT, then CUDA (for what
TensorRT cannot run, with config.pbtxt's cuda parameters), then the CPU. TensorRT's options:

* the accelerator's parameters as the peer turns them into provider options (config/accelerators.py), and the
  instance's `device_id`;
* precision: the accelerator's `precision_mode` (FP16 / BF16 / INT8) where it is not the peer's default FP32;
  otherwise the backend's `precision_mode`: fp16 -> `trt_fp16_enable`, bf16 -> `trt_bf16_enable`, int8 ->
  `trt_int8_enable` (with `int8_calibration_table_name` unless the model carries its own Q/DQ scales). TensorRT
  lowers the fp32 model itself, so the loader does not lower the file first (`lowers_precision`);
* optimization profiles: each static bucket's session gets min = opt = max = the bucket's input shapes
  (`trt_profile_{min,opt,max}_shapes`), so every engine is built for exactly the shape it serves; the dynamic
  graph (and `bucket_fallback=dynamic`) keeps TensorRT's own shape ranges. Profiles given as accelerator
  parameters win;
* engine and timing caches: on (`trt_engine_cache_enable`, `trt_timing_cache_enable`) unless a parameter turns
  them off, kept beside the model: `<model folder>/.gebackend-cache/tensorrt-<fingerprint>/`, where the
  fingerprint is the model file's name, size and mtime (TensorRT keys its engines by the graph's names, not its
  weights, so a replaced file must not find the old engines). Each static bucket's engines sit in their own
  `bucket-<shapes>/` subfolder (the bucket graphs share their node names); the timing cache is shared. Where the
  model folder is not writable, the other cache folders of gebackend/cache_dir.py: `$GE_CACHE_DIR/<model>/...`, else `$XDG_CACHE_HOME` (or `~/.cache`)
  `/gebackend/<model>/...`, else the system temp folder. A `trt_engine_cache_path` / `trt_timing_cache_path`
  parameter replaces the folder (buckets still get their subfolders). The server's own temp folder is not used:
  it is removed at shutdown, and a TensorRT engine takes minutes to build.

Static buckets whose shapes are all known are captured as CUDA graphs by TensorRT (`trt_cuda_graph_enable`),
with one RunOptions `gpu_graph_id` per bucket.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from gebackend.cache_dir import candidates, first_writable, fingerprint
from gebackend.config.accelerators import TensorRTAccelerator
from gebackend.engines.providers.base import CPU, ProviderKind, Shapes, Target, shape_list
from gebackend.engines.providers.cuda import cuda_entry

ORT_NAME = "TensorrtExecutionProvider"
INSTALL = ("pip uninstall -y onnxruntime && pip install onnxruntime-gpu tensorrt (TensorRT 10's libraries, "
           "libnvinfer, must be on LD_LIBRARY_PATH; onnxruntime-gpu also brings the CUDA provider TensorRT needs)")

# the backend's precision_mode -> TensorRT's flag (origin: none, TensorRT builds fp32 engines)
_PRECISION_FLAGS = {"fp16": "trt_fp16_enable", "bf16": "trt_bf16_enable", "int8": "trt_int8_enable"}
_PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")


def cache_candidates(target: Target, environ=os.environ) -> list[Path]:
    """Where the caches may go, in order of preference (see the module docstring)."""
    return candidates(target.path, target.model, f"tensorrt-{fingerprint(target.path)}", environ)


def cache_dir(target: Target, environ=os.environ) -> Path:
    """The first writable cache folder (made if missing)."""
    return first_writable(cache_candidates(target, environ), "TensorRT's engine cache", "the trt_engine_cache_path parameter")


def bucket_folder(shapes: Shapes) -> str:
    """The subfolder of one bucket's engines: `bucket-<12 hex digits of its shapes>`."""
    return "bucket-" + hashlib.sha1(shape_list(shapes).encode()).hexdigest()[:12]


def _on(options: dict[str, str], key: str) -> bool:
    """A cache switch: on unless the accelerator's parameter turned it off."""
    return options.get(key, "1") != "0"


def trt_entry(target: Target, shapes: Shapes | None = None) -> tuple[str, dict[str, str]]:
    """The TensorRT provider for the dynamic graph (`shapes` None) or for one static bucket."""
    accelerator = target.options.engines.accelerators.tensorrt or TensorRTAccelerator()
    options = accelerator.provider_options(target.device_id)
    if accelerator.precision_mode == "FP32" and target.options.engines.precision_mode in _PRECISION_FLAGS:
        options[_PRECISION_FLAGS[target.options.engines.precision_mode]] = "1"
    base = None
    if _on(options, "trt_engine_cache_enable"):
        base = Path(options["trt_engine_cache_path"]) if "trt_engine_cache_path" in options else cache_dir(target)
        engines = base / bucket_folder(shapes) if shapes else base
        engines.mkdir(parents=True, exist_ok=True)
        options.update(trt_engine_cache_enable="1", trt_engine_cache_path=str(engines))
    if _on(options, "trt_timing_cache_enable"):
        if "trt_timing_cache_path" not in options:
            options["trt_timing_cache_path"] = str(base if base is not None else cache_dir(target))
        options["trt_timing_cache_enable"] = "1"
    if shapes and not any(key in options for key in _PROFILE_KEYS) and shape_list(shapes):
        options.update(dict.fromkeys(_PROFILE_KEYS, shape_list(shapes)))
    return ORT_NAME, options


def entries(target: Target) -> list:
    return [trt_entry(target), cuda_entry(target), CPU]


def bucket(target: Target, index: int, shapes: Shapes) -> list:
    return [trt_entry(target, shapes), cuda_entry(target), CPU]


KIND = ProviderKind(
    "tensorrt", (ORT_NAME, "CUDAExecutionProvider"), package="onnxruntime-gpu", install=INSTALL, device="cuda",
    entries=entries, bucket=bucket, capture_key="trt_cuda_graph_enable", capture_label="cuda_graph", graph_ids=True,
    accelerator="tensorrt", lowers_precision=True,
)
