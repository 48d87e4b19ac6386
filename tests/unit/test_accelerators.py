"""Unit tests for gebackend.config.accelerators: execution_accelerators read as Triton's onnxruntime backend reads them."""

from __future__ import annotations

import pytest

from gebackend.config.accelerators import Accelerators, CudaAccelerator, TensorRTAccelerator, parse_accelerators
from gebackend.errors import ConfigError


def _config(cpu=None, gpu=None) -> dict:
    section = {}
    if cpu is not None:
        section["cpu_execution_accelerator"] = cpu
    if gpu is not None:
        section["gpu_execution_accelerator"] = gpu
    return {"optimization": {"execution_accelerators": section}}


def _trt(**params) -> TensorRTAccelerator:
    accelerators = parse_accelerators("m", _config(gpu=[{"name": "tensorrt", "parameters": params}]))
    assert accelerators.gpu == (accelerators.tensorrt,)
    return accelerators.tensorrt


@pytest.mark.parametrize("config", [{}, {"optimization": {}}, {"optimization": None}, _config(),
                                    {"optimization": {"execution_accelerators": None}}])
def test_nothing_asked_for(config):
    accelerators = parse_accelerators("m", config)
    assert accelerators == Accelerators() and not accelerators
    assert accelerators.tensorrt is None and accelerators.cuda is None


def test_openvino_on_the_cpu():
    accelerators = parse_accelerators("m", _config(cpu=[{"name": "openvino", "parameters": {}}]))
    assert accelerators.cpu == ("openvino",) and accelerators.gpu == ()
    assert accelerators.describe() == "cpu_execution_accelerator openvino"


@pytest.mark.parametrize("where,name", [("cpu", "mkldnn"), ("cpu", "tensorrt"), ("gpu", "openvino"), ("gpu", "TensorRT"),
                                        ("gpu", "")])
def test_unknown_name_fails_with_the_peers_message(where, name):
    config = _config(**{where: [{"name": name}]})
    with pytest.raises(ConfigError) as info:
        parse_accelerators("my_model", config)
    assert f"model 'my_model': unknown Execution Accelerator '{name}' is requested" in str(info.value)


def test_tensorrt_defaults():
    trt = _trt()
    assert trt.precision_mode == "FP32" and trt.max_workspace_size_bytes is None
    assert trt.settings() == {"precision_mode": "FP32"}
    assert trt.provider_options(0) == {"device_id": "0"}


def test_tensorrt_parameters_typed_and_turned_into_provider_options_as_the_peer_does():
    trt = _trt(precision_mode="FP16", max_workspace_size_bytes="1073741824", trt_engine_cache_enable="true",
               trt_engine_cache_path="/cache", trt_builder_optimization_level="3", trt_dla_enable="OFF",
               int8_calibration_table_name="", trt_profile_min_shapes="x:1x4")
    assert trt.max_workspace_size_bytes == 1073741824
    assert trt.trt_engine_cache_enable is True and trt.trt_dla_enable is False
    assert trt.trt_builder_optimization_level == 3 and trt.trt_engine_cache_path == "/cache"
    assert trt.provider_options(2) == {
        "trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824", "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/cache", "trt_builder_optimization_level": "3", "trt_dla_enable": "0",
        "trt_profile_min_shapes": "x:1x4", "device_id": "2",  # the empty calibration table name is dropped
    }
    assert trt.describe().startswith("tensorrt(precision_mode=FP16, max_workspace_size_bytes=1073741824, ")


@pytest.mark.parametrize("mode,key", [("BF16", "trt_bf16_enable"), ("INT8", "trt_int8_enable")])
def test_precision_modes(mode, key):
    assert _trt(precision_mode=mode).provider_options() == {key: "1", "device_id": "0"}


@pytest.mark.parametrize("params,message", [
    ({"precision_mode": "fp16"}, "unsupported precision mode 'fp16' is requested"),  # the peer is case-sensitive
    ({"max_workspace_size_bytes": "-1"}, "failed to convert '-1' to unsigned long long integral number"),
    ({"max_workspace_size_bytes": "lots"}, "failed to convert 'lots' to unsigned long long integral number"),
    ({"trt_engine_cache_enable": "yes"}, "failed to convert 'yes' to boolean"),
    ({"trt_dla_core": "one"}, "failed to convert 'one' to integral number"),
    ({"workspace": "1"}, "unknown parameter 'workspace' is provided for TensorRT Execution Accelerator"),
])
def test_bad_tensorrt_parameter_fails_naming_it(params, message):
    with pytest.raises(ConfigError) as info:
        _trt(**params)
    assert "model 'm'" in str(info.value) and message in str(info.value)


def test_cuda_parameters_pass_through_with_two_booleans_checked():
    accelerators = parse_accelerators("m", _config(gpu=[{"name": "cuda", "parameters": {
        "cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": "0", "empty": ""}}]))
    cuda = accelerators.cuda
    assert isinstance(cuda, CudaAccelerator)
    assert cuda.provider_options(1) == {"cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": "0",
                                        "device_id": "1"}
    assert cuda.describe() == "cuda(cudnn_conv_algo_search=HEURISTIC, do_copy_in_default_stream=0)"
    with pytest.raises(ConfigError, match="CUDA Execution Accelerator parameter use_ep_level_unified_stream: "
                                          "failed to convert 'sometimes' to boolean"):
        parse_accelerators("m", _config(gpu=[{"name": "cuda", "parameters": {"use_ep_level_unified_stream": "sometimes"}}]))


def test_both_lists_in_order():
    accelerators = parse_accelerators("m", _config(cpu=[{"name": "openvino"}],
                                                   gpu=[{"name": "cuda"}, {"name": "tensorrt"}]))
    assert [a.name for a in accelerators.gpu] == ["cuda", "tensorrt"]
    assert accelerators.describe() == ("cpu_execution_accelerator openvino; "
                                       "gpu_execution_accelerator cuda(), tensorrt(precision_mode=FP32)")


def test_a_malformed_list_is_a_config_error():
    with pytest.raises(ConfigError, match="cpu_execution_accelerator must be a list"):
        parse_accelerators("m", _config(cpu={"name": "openvino"}))
