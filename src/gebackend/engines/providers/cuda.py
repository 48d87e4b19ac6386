"""ONNX Runtime's CUDA execution provider (NVIDIA GPUs; the `onnxruntime-gpu` package).

Selected for KIND_GPU instances (unless config.pbtxt asks for TensorRT), or by `execution_provider=cuda`. Its
options are config.pbtxt's `gpu_execution_accelerator [ { name: "cuda" parameters { ... } } ]`, passed as given
(as Triton's onnxruntime backend passes them), and the instance's `device_id`.

Static graph mode: every bucket whose shapes are all known at compile time is captured as a CUDA graph
(`enable_cuda_graph=1`, switched off with the backend option `enable_cuda_graph=0`) on the fixed input and
output buffers the static engine binds in GPU memory once; each bucket's runs carry its own RunOptions
`gpu_graph_id` (the bucket's index), so the graph ONNX Runtime captured for a bucket is the one it replays.
"""

from __future__ import annotations

from gebackend.engines.providers.base import CPU, ProviderKind, Target

ORT_NAME = "CUDAExecutionProvider"
INSTALL = ("pip uninstall -y onnxruntime && pip install onnxruntime-gpu (it needs the CUDA 12 runtime and cuDNN 9: "
           "install them with the NVIDIA driver, or pip install 'onnxruntime-gpu[cuda,cudnn]')")


def cuda_entry(target: Target) -> tuple[str, dict[str, str]]:
    """The CUDA provider with config.pbtxt's cuda parameters and this instance's device."""
    accelerator = target.options.engines.accelerators.cuda
    if accelerator is not None:
        return ORT_NAME, accelerator.provider_options(target.device_id)
    return ORT_NAME, {"device_id": str(target.device_id)}


def entries(target: Target) -> list:
    return [cuda_entry(target), CPU]


KIND = ProviderKind(
    "cuda", (ORT_NAME,), package="onnxruntime-gpu", install=INSTALL, device="cuda", entries=entries,
    capture_key="enable_cuda_graph", capture_label="cuda_graph", graph_ids=True, accelerator="cuda",
    default_for=("GPU",),
)
