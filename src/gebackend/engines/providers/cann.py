"""ONNX Runtime's CANN execution provider (Huawei Ascend NPUs; the `onnxruntime-cann` package).

Triton has no NPU instance kind (its kinds are KIND_AUTO, KIND_CPU, KIND_GPU and KIND_MODEL, and a KIND_GPU group
needs CUDA devices), and Ascend ge-backend's own configs use KIND_CPU or KIND_MODEL with its `device_ids` option,
so CANN is asked for by name: `execution_provider=cann`. The NPU is this instance's entry of `device_ids`
(instance i of the model takes `device_ids[i % len(device_ids)]`, as ge-backend spreads its execution blocks over
them), or device 0 when `device_ids` is unset.

Options: `device_id`; `precision_mode` from the backend's `precision_mode` (also set by ge-backend's
`session.ge.exec.precision_mode_v2` and `ge.exec.precision_mode`): origin -> `must_keep_origin_dtype`,
fp16 -> `allow_mix_precision_fp16`, bf16 -> `allow_mix_precision_bf16`; int8 needs a model quantized with
Ascend's AMCT and is refused. `enable_cann_graph` (CANN's graph engine, on by default in the provider) is switched
on for static buckets whose every shape is known at compile time (`enable_cuda_graph=0` switches it off) and off
for dynamic graphs, which run operator by operator instead of compiling a graph per new shape. The static engine
binds its fixed buffers in host memory; the provider copies them to the NPU.
"""

from __future__ import annotations

from gebackend.engines.providers.base import CPU, ProviderKind, Shapes, Target
from gebackend.errors import ModelLoadError

ORT_NAME = "CANNExecutionProvider"
INSTALL = ("install Ascend's CANN toolkit and source its set_env.sh (ASCEND_HOME_PATH, LD_LIBRARY_PATH) before "
           "gebackend serve, then pip uninstall -y onnxruntime && pip install onnxruntime-cann")

# precision_mode -> the CANN provider's precision_mode (GE's precision_mode values)
PRECISION = {"origin": "must_keep_origin_dtype", "fp16": "allow_mix_precision_fp16", "bf16": "allow_mix_precision_bf16"}


def cann_entry(target: Target) -> tuple[str, dict[str, str]]:
    mode = target.options.engines.precision_mode
    if mode not in PRECISION:
        raise ModelLoadError(
            f"precision_mode={mode} is not available on the CANN provider (it needs a model quantized with Ascend's "
            f"AMCT); use precision_mode {', '.join(PRECISION)}")
    return ORT_NAME, {"device_id": str(target.device_id), "precision_mode": PRECISION[mode], "enable_cann_graph": "0"}


def entries(target: Target) -> list:
    return [cann_entry(target), CPU]


def bucket(target: Target, index: int, shapes: Shapes) -> list:
    return entries(target)  # graph mode is switched on by the capture (capture_key) where the bucket allows it


KIND = ProviderKind(
    "cann", (ORT_NAME,), package="onnxruntime-cann", install=INSTALL, device="cpu", entries=entries, bucket=bucket,
    capture_key="enable_cann_graph", capture_label="cann_graph", lowers_precision=True,
)
