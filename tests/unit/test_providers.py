"""The execution providers (engines/providers/) and OpenVINO's devices (engines/openvino_device.py).

Every option mapping is checked against fake lists of available providers or devices, so it runs on a machine
without the accelerator; the real runs at the end are skipped, with the reason, where the provider is absent.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import parse_options
from gebackend.config.spec import build_model_spec
from gebackend.engines import create_engine, create_static_engine, select_providers
from gebackend.engines.providers import Selection, as_selection, kind, names
from gebackend.engines.providers import tensorrt as trt_module
from gebackend.errors import ModelLoadError
from gebackend.modelzoo import build_add_mul

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
CANN = "CANNExecutionProvider"
CPU_ONLY = [CPU]
NVIDIA = [TRT, CUDA, CPU]
ASCEND = [CANN, CPU]
BUCKETS = {"static_model": "1", "graph.ge.inputShape": "x:-1,4;y:-1,4", "graph.ge.dynamicDims": "1,1;4,4"}


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "am" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(build_add_mul(), str(path))
    return path


def spec_of(path: Path, params: dict | None = None, config: dict | None = None, name: str = "am"):
    """A real ModelSpec of the add-mul model with these config.pbtxt parameters (and other config sections)."""
    config = {"name": name, "max_batch_size": 4, **(config or {})}
    options = parse_options(name, {}, params or {}, config).options
    return build_model_spec(config, signature_of(onnx.load(str(path))), path, options)


def accelerators(*entries) -> dict:
    """config.pbtxt `optimization { execution_accelerators { gpu_execution_accelerator [...] } }` as Triton's JSON."""
    return {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": list(entries)}}}


def trt_folder(path: Path) -> Path:
    stat = path.stat()
    digest = hashlib.sha1(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return path.parent / ".gebackend-cache" / f"tensorrt-{digest}"


# ------------------------------------------------------------------------------------------ the table


def test_every_provider_is_one_module_and_one_line_declaring_what_it_needs():
    assert names() == ("tensorrt", "cuda", "cann", "cpu")  # table order is auto's preference order
    for name in names():
        provider = kind(name)
        assert provider.name == name and provider.ort_names and provider.package and provider.install
    assert kind("cuda").ort_names == (CUDA,) and kind("cuda").package == "onnxruntime-gpu"
    assert kind("tensorrt").ort_names == (TRT, CUDA) and kind("tensorrt").package == "onnxruntime-gpu"
    assert kind("cann").ort_names == (CANN,) and kind("cann").package == "onnxruntime-cann"
    assert kind("cuda").default_for == ("GPU",) and "CPU" in kind("cpu").default_for and kind("cann").default_for == ()


def test_an_unknown_provider_is_named_with_the_known_ones(model_file):
    with pytest.raises(ModelLoadError, match="unknown execution_provider 'rocm': expected auto or one of tensorrt, cuda, cann, cpu"):
        select_providers(spec_of(model_file, {"execution_provider": "rocm"}), available=NVIDIA)


# ------------------------------------------------------------------------------------------ which provider


@pytest.mark.parametrize("instance_kind", ["CPU", "KIND_CPU", "MODEL", "KIND_MODEL", "AUTO"])
def test_cpu_kinds_run_on_the_cpu_even_where_gpus_are(model_file, instance_kind):
    chosen = select_providers(spec_of(model_file), instance_kind, 0, available=NVIDIA)
    assert isinstance(chosen, Selection) and list(chosen) == [CPU] and chosen.device == "cpu"
    assert chosen.for_bucket(0, {"x": (1, 4)}, capture=True) == [CPU] and chosen.run_config(0, True) == {}


def test_a_gpu_instance_gets_cuda_on_its_device(model_file):
    chosen = select_providers(spec_of(model_file), "GPU", 1, available=NVIDIA)
    assert list(chosen) == [(CUDA, {"device_id": "1"}), CPU]
    assert chosen.kind.name == "cuda" and chosen.device == "cuda" and chosen.device_id == 1
    assert chosen.describe() == "execution_provider=cuda device_id=1"


def test_a_gpu_instance_without_cuda_fails_naming_the_package(model_file):
    with pytest.raises(ModelLoadError) as error:
        select_providers(spec_of(model_file), "KIND_GPU", 0, available=CPU_ONLY)
    message = str(error.value)
    assert "instance_group kind KIND_GPU asks for the cuda execution provider" in message
    assert "no CUDAExecutionProvider (it has CPUExecutionProvider)" in message
    assert "pip install onnxruntime-gpu" in message and "device_fallback=cpu" in message


def test_device_fallback_cpu_runs_on_the_cpu_and_says_so(model_file):
    chosen = select_providers(spec_of(model_file, {"device_fallback": "cpu"}), "GPU", 0, available=CPU_ONLY)
    assert list(chosen) == [CPU] and chosen.kind.name == "cpu"
    assert "no CUDAExecutionProvider in this onnxruntime (it comes with onnxruntime-gpu)" in chosen.note
    assert "device_fallback=cpu" in chosen.describe()
    engine = create_engine(spec_of(model_file, {"device_fallback": "cpu"}), chosen)
    assert "device_fallback=cpu" in engine.describe()  # the load line says it
    engine.close()


def test_cuda_parameters_from_config_pbtxt_are_passed_as_given(model_file):
    config = accelerators({"name": "cuda", "parameters": {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "1024"}})
    chosen = select_providers(spec_of(model_file, config=config), "GPU", 2, available=NVIDIA)
    assert list(chosen) == [(CUDA, {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "1024", "device_id": "2"}), CPU]


def test_cuda_static_buckets_are_captured_one_gpu_graph_id_each(model_file):
    spec = spec_of(model_file, BUCKETS)
    chosen = select_providers(spec, "GPU", 0, available=NVIDIA)
    for index, shapes in enumerate(spec.static_shapes):
        assert chosen.for_bucket(index, shapes, capture=True) == [(CUDA, {"device_id": "0", "enable_cuda_graph": "1"}), CPU]
        assert chosen.run_config(index, captured=True) == {"gpu_graph_id": str(index)}
        assert chosen.for_bucket(index, shapes, capture=False) == [(CUDA, {"device_id": "0"}), CPU]
        assert chosen.run_config(index, captured=False) == {}
    assert chosen.kind.capture_label == "cuda_graph" and not chosen.lowers_precision


def test_engine_openvino_needs_no_onnxruntime_provider(model_file):
    spec = spec_of(model_file, {"engine": "openvino", "device": "GPU"})
    assert list(select_providers(spec, "GPU", 0, available=CPU_ONLY)) == [CPU]  # OpenVINO's `device` decides


def test_an_openvino_device_on_onnxruntime_is_said(model_file):
    chosen = select_providers(spec_of(model_file, {"device": "GPU"}), "CPU", 0, available=CPU_ONLY)
    assert list(chosen) == [CPU] and "device=GPU is the OpenVINO engine's option" in chosen.note


def test_a_plain_list_is_a_selection_too():
    plain = as_selection([(TRT, {"device_id": "1"}), (CUDA, {"device_id": "1"}), CPU])
    assert plain.kind.name == "tensorrt" and plain.device == "cuda" and plain.device_id == 1
    assert plain.for_bucket(2, {"x": (1, 4)}, capture=True)[0] == (TRT, {"device_id": "1", "trt_cuda_graph_enable": "1"})
    assert as_selection(()).kind.name == "cpu" and list(as_selection(())) == [CPU]


def test_a_session_made_without_its_provider_fails_the_load(model_file):
    chosen = select_providers(spec_of(model_file), "GPU", 0, available=NVIDIA)
    with pytest.raises(ModelLoadError, match=r"made the session without CUDAExecutionProvider \(it runs on CPUExecutionProvider\)"):
        chosen.verify([CPU])
    chosen.verify([CUDA, CPU])
    select_providers(spec_of(model_file), "CPU", 0, available=CPU_ONLY).verify([CPU])


def test_caches_are_kept_beside_the_repositorys_file_not_a_temporary_copy(model_file, tmp_path):
    copy = tmp_path / "copy" / "model.onnx"  # npu_ge's renamed tensors make such a copy (config/io_names.py)
    copy.parent.mkdir()
    copy.write_bytes(model_file.read_bytes())
    spec = spec_of(copy, config=accelerators({"name": "tensorrt"}))
    chosen = select_providers(spec, "GPU", 0, available=NVIDIA, model_path=model_file)
    assert chosen[0][1]["trt_engine_cache_path"] == str(trt_folder(model_file))


def _fake_capture_engine(model_file, monkeypatch, refuse: str | None):
    """A static engine on a provider that captures (a fake one on the CPU); ONNX Runtime refuses the capture of the
    bucket whose graph file is `refuse` (static2.onnx: the second), as it refuses a CUDA graph with a node on the CPU."""
    from gebackend.compile.pipeline import compile_static
    from gebackend.engines import onnxruntime_static
    from gebackend.engines.providers import ProviderKind

    fake = ProviderKind("fake", (CPU,), "fake-pkg", "pip install fake-pkg", device="cpu", entries=lambda t: [CPU],
                        capture_key="enable_fake_graph", capture_label="fake_graph", graph_ids=True)
    opened = []
    real_open = onnxruntime_static.open_session

    def open_session(path, so, entries, disabled, **kwargs):
        opened.append(entries)
        if refuse and isinstance(entries[0], tuple) and Path(path).name == refuse:
            raise RuntimeError("This session cannot use the graph capture feature as requested by the user as all "
                               "compute graph nodes have not been partitioned to the fake EP")
        return real_open(path, so, entries, disabled, **kwargs)

    monkeypatch.setattr(onnxruntime_static, "open_session", open_session)
    spec = spec_of(model_file, BUCKETS)
    graphs, _ = compile_static(model_file, spec.static_shapes, 1 << 20)
    return create_static_engine(spec, graphs, Selection(fake, [CPU])), opened


def test_captured_buckets_run_with_their_gpu_graph_id(model_file, monkeypatch):
    engine, opened = _fake_capture_engine(model_file, monkeypatch, refuse=None)
    try:
        assert opened == [[(CPU, {"enable_fake_graph": "1"})]] * 2
        assert "fake_graph=on" in engine.describe()
        feeds = {"x": np.ones((4, 4), np.float32), "y": np.ones((4, 4), np.float32)}
        assert engine.run_bucket(1, feeds, [o.name for o in build_add_mul().graph.output])
        assert [b.run_config for b in engine._swap.serving.values()] == [{"gpu_graph_id": "0"}, {"gpu_graph_id": "1"}]
    finally:
        engine.close()


def test_a_refused_capture_runs_that_bucket_uncaptured_and_says_so(model_file, monkeypatch):
    engine, opened = _fake_capture_engine(model_file, monkeypatch, refuse="static2.onnx")
    try:
        assert opened[-2:] == [[(CPU, {"enable_fake_graph": "1"})], [CPU]]  # refused, then built without
        line = engine.describe()
        assert "fake_graph=1 of 2 buckets (refused: static x:4,4 y:4,4: This session cannot use the graph capture" in line
        assert [b.run_config for b in engine._swap.serving.values()] == [{"gpu_graph_id": "0"}, {}]
    finally:
        engine.close()


# ------------------------------------------------------------------------------------------ TensorRT


def test_tensorrt_from_config_pbtxt_with_caches_beside_the_model(model_file):
    config = accelerators({"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}},
                          {"name": "cuda", "parameters": {"do_copy_in_default_stream": "1"}})
    chosen = select_providers(spec_of(model_file, config=config), "GPU", 1, available=NVIDIA)
    folder = trt_folder(model_file)
    assert list(chosen) == [
        (TRT, {"trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824", "device_id": "1",
               "trt_engine_cache_enable": "1", "trt_engine_cache_path": str(folder),
               "trt_timing_cache_path": str(folder), "trt_timing_cache_enable": "1"}),
        (CUDA, {"do_copy_in_default_stream": "1", "device_id": "1"}),
        CPU,
    ]
    assert folder.is_dir() and chosen.lowers_precision and chosen.device == "cuda"


def test_tensorrt_profiles_per_bucket_from_a_bucketed_static_spec(model_file):
    spec = spec_of(model_file, BUCKETS, accelerators({"name": "tensorrt"}))
    assert spec.static_shapes == ({"x": (1, 4), "y": (1, 4)}, {"x": (4, 4), "y": (4, 4)})
    chosen = select_providers(spec, "GPU", 0, available=NVIDIA)
    assert not any(k.startswith("trt_profile") for k in chosen[0][1])  # the dynamic graph keeps TensorRT's ranges
    for index, shapes in enumerate(spec.static_shapes):
        entries = chosen.for_bucket(index, shapes, capture=True)
        options = entries[0][1]
        batch = shapes["x"][0]
        profile = f"x:{batch}x4,y:{batch}x4"
        assert entries[0][0] == TRT and entries[1] == (CUDA, {"device_id": "0"}) and entries[2] == CPU
        assert (options["trt_profile_min_shapes"], options["trt_profile_opt_shapes"], options["trt_profile_max_shapes"]) == (
            profile, profile, profile)
        engines = Path(options["trt_engine_cache_path"])
        assert engines.parent == trt_folder(model_file) and engines.name.startswith("bucket-") and engines.is_dir()
        assert options["trt_timing_cache_path"] == str(trt_folder(model_file))  # shared by the buckets
        assert options["trt_cuda_graph_enable"] == "1" and chosen.run_config(index, True) == {"gpu_graph_id": str(index)}
    first, second = (Path(chosen.for_bucket(i, s, False)[0][1]["trt_engine_cache_path"]) for i, s in enumerate(spec.static_shapes))
    assert first != second


@pytest.mark.parametrize("mode,flag", [("fp16", "trt_fp16_enable"), ("bf16", "trt_bf16_enable"), ("int8", "trt_int8_enable")])
def test_tensorrt_precision_from_precision_mode(model_file, mode, flag):
    spec = spec_of(model_file, {"precision_mode": mode}, accelerators({"name": "tensorrt"}))
    options = select_providers(spec, "GPU", 0, available=NVIDIA)[0][1]
    assert options[flag] == "1" and sum(k in options for k in ("trt_fp16_enable", "trt_bf16_enable", "trt_int8_enable")) == 1


def test_tensorrt_precision_ge_key_and_the_accelerators_own_precision_wins(model_file):
    spec = spec_of(model_file, {"session.ge.exec.precision_mode_v2": "mixed_float16"}, accelerators({"name": "tensorrt"}))
    assert select_providers(spec, "GPU", 0, available=NVIDIA)[0][1]["trt_fp16_enable"] == "1"
    spec = spec_of(model_file, {"precision_mode": "int8"},
                   accelerators({"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}))
    options = select_providers(spec, "GPU", 0, available=NVIDIA)[0][1]
    assert options["trt_fp16_enable"] == "1" and "trt_int8_enable" not in options
    origin = select_providers(spec_of(model_file, config=accelerators({"name": "tensorrt"})), "GPU", 0, available=NVIDIA)
    assert not any(k in origin[0][1] for k in ("trt_fp16_enable", "trt_bf16_enable", "trt_int8_enable"))


def test_tensorrt_cache_parameters_win(model_file, tmp_path):
    mine = tmp_path / "engines"
    spec = spec_of(model_file, BUCKETS, accelerators({"name": "tensorrt", "parameters": {
        "trt_engine_cache_path": str(mine), "trt_timing_cache_enable": "false"}}))
    chosen = select_providers(spec, "GPU", 0, available=NVIDIA)
    assert chosen[0][1]["trt_engine_cache_path"] == str(mine) and chosen[0][1]["trt_timing_cache_enable"] == "0"
    assert "trt_timing_cache_path" not in chosen[0][1]
    assert Path(chosen.for_bucket(0, spec.static_shapes[0], False)[0][1]["trt_engine_cache_path"]).parent == mine
    off = spec_of(model_file, config=accelerators({"name": "tensorrt", "parameters": {"trt_engine_cache_enable": "0"}}))
    options = select_providers(off, "GPU", 0, available=NVIDIA)[0][1]
    assert options["trt_engine_cache_enable"] == "0" and "trt_engine_cache_path" not in options
    assert options["trt_timing_cache_path"] == str(trt_folder(model_file))  # the timing cache is still kept
    profiles = spec_of(model_file, BUCKETS, accelerators({"name": "tensorrt", "parameters": {
        "trt_profile_min_shapes": "x:1x4,y:1x4", "trt_profile_opt_shapes": "x:4x4,y:4x4", "trt_profile_max_shapes": "x:4x4,y:4x4"}}))
    assert select_providers(profiles, "GPU", 0, available=NVIDIA).for_bucket(0, profiles.static_shapes[0], False)[0][1][
        "trt_profile_opt_shapes"] == "x:4x4,y:4x4"


def test_tensorrt_caches_go_to_ge_cache_dir_where_the_model_folder_is_read_only(model_file, tmp_path, monkeypatch):
    beside = trt_folder(model_file)
    real_access = os.access
    monkeypatch.setattr(trt_module.os, "access", lambda p, mode: False if Path(p) == beside else real_access(p, mode))
    monkeypatch.setenv("GE_CACHE_DIR", str(tmp_path / "cache"))
    chosen = select_providers(spec_of(model_file, config=accelerators({"name": "tensorrt"})), "GPU", 0, available=NVIDIA)
    assert chosen[0][1]["trt_engine_cache_path"] == str(tmp_path / "cache" / "am" / beside.name)


def test_tensorrt_cache_folder_follows_the_model_file(model_file):
    before = trt_folder(model_file)
    onnx.save(build_add_mul(), str(model_file))  # the same file written again: a new mtime
    os.utime(model_file, ns=(1, 1))
    assert trt_folder(model_file) != before and trt_module.fingerprint(model_file) == trt_folder(model_file).name[9:]


def test_tensorrt_missing_fails_naming_what_to_install(model_file):
    spec = spec_of(model_file, config=accelerators({"name": "tensorrt"}))
    with pytest.raises(ModelLoadError) as error:
        select_providers(spec, "GPU", 0, available=[CUDA, CPU])
    assert "gpu_execution_accelerator tensorrt asks for the tensorrt execution provider" in str(error.value)
    assert "no TensorrtExecutionProvider" in str(error.value) and "pip install onnxruntime-gpu tensorrt" in str(error.value)


# ------------------------------------------------------------------------------------------ CANN


def test_cann_by_name_on_its_device_ids_entry(model_file):
    spec = spec_of(model_file, {"execution_provider": "cann", "device_ids": "4,5"})
    assert select_providers(spec, "KIND_CPU", 0, available=ASCEND, instance_index=0)[0][1]["device_id"] == "4"
    chosen = select_providers(spec, "KIND_MODEL", 0, available=ASCEND, instance_index=3)
    assert list(chosen) == [(CANN, {"device_id": "5", "precision_mode": "must_keep_origin_dtype", "enable_cann_graph": "0"}), CPU]
    assert chosen.device == "cpu" and chosen.lowers_precision and chosen.describe() == "execution_provider=cann device_id=5"


@pytest.mark.parametrize("key,value,cann", [
    ("session.ge.exec.precision_mode_v2", "mixed_float16", "allow_mix_precision_fp16"),
    ("session.ge.exec.precision_mode_v2", "fp16", "allow_mix_precision_fp16"),
    ("ge.exec.precision_mode_v2", "mixed_bf16", "allow_mix_precision_bf16"),
    ("session.ge.exec.precision_mode_v2", "must_keep_origin_dtype", "must_keep_origin_dtype"),
    ("precision_mode", "bf16", "allow_mix_precision_bf16"),
])
def test_cann_precision_mode_from_the_ge_keys(model_file, key, value, cann):
    spec = spec_of(model_file, {"execution_provider": "cann", key: value})
    assert select_providers(spec, "CPU", 0, available=ASCEND)[0][1]["precision_mode"] == cann


def test_cann_graph_mode_for_static_buckets_only(model_file):
    spec = spec_of(model_file, {"execution_provider": "cann", **BUCKETS})
    chosen = select_providers(spec, "CPU", 0, available=ASCEND)
    assert chosen[0][1]["enable_cann_graph"] == "0"  # the dynamic graph: operator by operator
    assert chosen.for_bucket(1, spec.static_shapes[1], capture=True)[0][1]["enable_cann_graph"] == "1"
    assert chosen.for_bucket(1, spec.static_shapes[1], capture=False)[0][1]["enable_cann_graph"] == "0"
    assert chosen.run_config(1, True) == {}  # no gpu_graph_id: one session per bucket, one graph each


def test_cann_refuses_int8_and_fails_without_onnxruntime_cann(model_file):
    with pytest.raises(ModelLoadError, match="precision_mode=int8 is not available on the CANN provider"):
        select_providers(spec_of(model_file, {"execution_provider": "cann", "precision_mode": "int8"}), available=ASCEND)
    with pytest.raises(ModelLoadError) as error:
        select_providers(spec_of(model_file, {"execution_provider": "cann"}), "CPU", 0, available=NVIDIA)
    assert "execution_provider=cann asks for the cann execution provider" in str(error.value)
    assert "no CANNExecutionProvider" in str(error.value) and "pip install onnxruntime-cann" in str(error.value)
    fallback = select_providers(spec_of(model_file, {"execution_provider": "cann", "device_fallback": "cpu"}), available=CPU_ONLY)
    assert list(fallback) == [CPU] and "onnxruntime-cann" in fallback.note


# ------------------------------------------------------------------------------------------ OpenVINO devices

try:
    from gebackend.engines import openvino_device as ov_device
except ImportError:  # OpenVINO is not installed
    ov_device = None
needs_openvino = pytest.mark.skipif(ov_device is None, reason="OpenVINO is not installed")


@needs_openvino
@pytest.mark.parametrize("text,available,name,targets", [
    ("CPU", ["CPU"], "CPU", ("CPU",)),
    ("GPU", ["CPU", "GPU.0", "GPU.1"], "GPU", ("GPU",)),
    ("GPU.1", ["CPU", "GPU.0", "GPU.1"], "GPU.1", ("GPU.1",)),
    ("GPU.0", ["CPU", "GPU"], "GPU.0", ("GPU.0",)),  # one GPU is listed as plain GPU
    ("NPU", ["CPU", "NPU"], "NPU", ("NPU",)),
    ("AUTO", ["CPU", "GPU"], "AUTO", ("CPU", "GPU")),
    ("AUTO:GPU,CPU", ["CPU", "GPU"], "AUTO:GPU,CPU", ("GPU", "CPU")),
    ("HETERO:GPU,CPU", ["CPU", "GPU"], "HETERO:GPU,CPU", ("GPU", "CPU")),
    ("BATCH:GPU(4)", ["CPU", "GPU"], "BATCH:GPU(4)", ("GPU",)),
])
def test_openvino_devices_that_are_present(text, available, name, targets):
    device = ov_device.resolve_device(text, available=available)
    assert (device.name, device.targets, device.note) == (name, targets, "")


@needs_openvino
def test_a_missing_openvino_device_fails_naming_it_and_its_driver():
    with pytest.raises(ModelLoadError) as error:
        ov_device.resolve_device("GPU", available=["CPU"])
    message = str(error.value)
    assert message.startswith("device=GPU: GPU is not available: it needs an Intel GPU with its compute runtime")
    assert "intel-opencl-icd" in message and "devices: CPU" in message and message.endswith("device_fallback=cpu to run on the CPU")
    with pytest.raises(ModelLoadError, match="NPU is not available: it needs an Intel NPU .*linux-npu-driver"):
        ov_device.resolve_device("NPU", available=["CPU", "GPU"])
    with pytest.raises(ModelLoadError, match="GPU.2 is not available"):
        ov_device.resolve_device("GPU.2", available=["CPU", "GPU.0", "GPU.1"])
    with pytest.raises(ModelLoadError, match="HETERO:GPU,CPU: GPU is not available"):
        ov_device.resolve_device("HETERO:GPU,CPU", available=["CPU"])
    with pytest.raises(ModelLoadError, match="OpenVINO knows no device TPU"):
        ov_device.resolve_device("TPU", available=["CPU"])
    for bad in ("HETERO", "GPU:1", "AUTO:AUTO"):
        with pytest.raises(ModelLoadError, match=f"device={bad}"):
            ov_device.resolve_device(bad, available=["CPU"])


@needs_openvino
def test_openvino_fallback_only_where_asked():
    device = ov_device.resolve_device("GPU", "cpu", available=["CPU"])
    assert device.name == "CPU" and device.is_cpu and "compiled for the CPU as device_fallback=cpu allows" in device.note
    auto = ov_device.resolve_device("AUTO:GPU,CPU", available=["CPU"])  # the list is the user's own fallback
    assert auto.name == "AUTO:CPU" and auto.targets == ("CPU",) and "GPU not available here" in auto.note
    with pytest.raises(ModelLoadError, match="AUTO:GPU,NPU: GPU is not available.*NPU is not available"):
        ov_device.resolve_device("AUTO:GPU,NPU", available=["CPU"])
    assert ov_device.resolve_device("AUTO:GPU,NPU", "cpu", available=["CPU"]).name == "CPU"


@needs_openvino
def test_openvino_plugin_properties_per_device():
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    cpu = ov_device.device_properties("CPU", ov.Type.f32, False, threads=2)
    assert cpu == {hints.performance_mode: hints.PerformanceMode.LATENCY, props.enable_profiling: False,
                   props.num_streams: 1, hints.inference_precision: ov.Type.f32, props.inference_num_threads: 2}
    gpu = ov_device.device_properties("GPU.1", ov.Type.f16, True, threads=2)
    assert gpu == {hints.performance_mode: hints.PerformanceMode.LATENCY, props.enable_profiling: True,
                   props.num_streams: 1, hints.inference_precision: ov.Type.f16}  # no threads off the CPU
    assert hints.inference_precision not in ov_device.device_properties("NPU", ov.Type.f32, False)
    assert ov_device.device_properties("NPU", ov.Type.f16, False)[hints.inference_precision] == ov.Type.f16
    batch = ov_device.plugin_config(ov_device.Device("BATCH:CPU(2)", "BATCH", ("CPU",)), ov.Type.f32, False)
    assert batch[hints.inference_precision] == ov.Type.f32
    auto = ov_device.plugin_config(ov_device.Device("AUTO:CPU", "AUTO", ("CPU",)), ov.Type.f32, False, 1)
    assert auto[hints.performance_mode] == hints.PerformanceMode.LATENCY and len(auto) == 3  # + the CPU's own


@needs_openvino
@pytest.mark.parametrize("device", ["AUTO:CPU", "HETERO:CPU", "MULTI:CPU", "AUTO"])
def test_openvino_virtual_devices_run_exactly(model_file, device):
    spec = spec_of(model_file, {"engine": "openvino", "device": device})
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32), "y": np.ones((2, 4), np.float32)}
    want = ort.InferenceSession(str(model_file), providers=[CPU]).run(None, feeds)
    engine = create_engine(spec, select_providers(spec, available=CPU_ONLY))
    try:
        for got, expected in zip(engine.run(feeds, [o.name for o in build_add_mul().graph.output]), want):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        assert f"engine on {device.split(':')[0] if device == 'AUTO' else device} (" in engine.describe(), engine.describe()
    finally:
        engine.close()


@needs_openvino
def test_openvino_gpu_here_fails_with_the_plugins_reason_or_falls_back_where_asked(model_file):
    if any(d.startswith("GPU") for d in ov_device.core().available_devices):
        pytest.skip("this machine has an OpenVINO GPU")
    with pytest.raises(ModelLoadError) as error:
        create_engine(spec_of(model_file, {"engine": "openvino", "device": "GPU"}))
    assert "device=GPU: GPU is not available (" in str(error.value), str(error.value)  # the plugin's own reason
    spec = spec_of(model_file, {"engine": "openvino", "device": "GPU", "device_fallback": "cpu"})
    engine = create_engine(spec)
    assert "engine on CPU" in engine.describe() and "device_fallback=cpu" in engine.describe()
    engine.close()


# ------------------------------------------------------------------------------------------ real runs


def _run_on(provider: str, model_file: Path, params: dict, config: dict | None = None, instance_kind: str = "GPU"):
    """Serve the bucketed add-mul model on `provider` in both graph modes; compare with the CPU provider."""
    if provider not in ort.get_available_providers():
        reason = f"{provider} is not in this onnxruntime ({', '.join(ort.get_available_providers())})"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    from gebackend.compile.pipeline import compile_static

    spec = spec_of(model_file, {**BUCKETS, **params}, config)
    chosen = select_providers(spec, instance_kind, 0)
    assert chosen.kind.ort_names[0] == provider
    outputs = [o.name for o in build_add_mul().graph.output]
    graphs, _ = compile_static(model_file, spec.static_shapes, 1 << 20)
    engines = [create_engine(spec, chosen), create_static_engine(spec, graphs, chosen)]
    reference = ort.InferenceSession(str(model_file), providers=[CPU])
    rng = np.random.default_rng(0)
    try:
        for shapes in spec.static_shapes:
            for _ in range(3):  # replays of a captured graph see new inputs
                feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
                want = reference.run(outputs, feeds)
                for engine in engines:
                    for got, expected in zip(engine.run(feeds, outputs), want):
                        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
        return [engine.describe() for engine in engines]
    finally:
        for engine in engines:
            engine.close()


def test_real_cuda_run(model_file):
    dynamic, static = _run_on(CUDA, model_file, {})
    assert "execution_provider=cuda" in dynamic and "cuda_graph=" in static and "IOBinding on cuda" in static


def test_real_tensorrt_run(model_file):
    dynamic, static = _run_on(TRT, model_file, {}, accelerators({"name": "tensorrt"}))
    assert "execution_provider=tensorrt" in static
    assert any((trt_folder(model_file)).glob("bucket-*/*")), "TensorRT wrote no engine into the cache beside the model"


def test_real_cann_run(model_file):
    dynamic, static = _run_on(CANN, model_file, {"execution_provider": "cann"}, instance_kind="CPU")
    assert "execution_provider=cann" in static and "cann_graph=" in static


def test_real_cpu_selection_runs_here(model_file):
    """What every machine has: the CPU selection through both engines (the same path the accelerators take)."""
    spec = spec_of(model_file, BUCKETS)
    chosen = select_providers(spec)
    from gebackend.compile.pipeline import compile_static

    graphs, _ = compile_static(model_file, spec.static_shapes, 1 << 20)
    static = create_static_engine(spec, graphs, chosen)
    assert "graph_capture=off" in static.describe() and "execution_provider" not in static.describe()
    feeds = {"x": np.ones((4, 4), np.float32), "y": np.ones((4, 4), np.float32)}
    assert static.run(feeds, [o.name for o in build_add_mul().graph.output])
    static.close()


def test_selection_pickles_and_copies_with_its_provider(model_file):
    import copy
    import pickle

    chosen = select_providers(spec_of(model_file), "GPU", 1, available=NVIDIA)
    for again in (copy.copy(chosen), pickle.loads(pickle.dumps(chosen))):
        assert list(again) == list(chosen) and again.kind.name == "cuda" and again.device_id == 1


def test_option_keys_parse():
    options = parse_options("m", {}, {"execution_provider": " CANN ", "device": "auto: gpu, cpu", "device_fallback": "CPU"}).options
    assert (options.engines.execution_provider, options.engines.device,
            options.engines.device_fallback) == ("cann", "AUTO:GPU,CPU", "cpu")
    defaults = parse_options("m", {}, {}).options
    assert (defaults.engines.execution_provider, defaults.engines.device,
            defaults.engines.device_fallback) == ("auto", "CPU", "none")
    assert parse_options("m", {}, {"device_fallback": "off"}).options.engines.device_fallback == "none"
    from gebackend.errors import ConfigError

    for key, value in (("device_fallback", "gpu"), ("device", "G P U;"), ("execution_provider", "cuda-12")):
        with pytest.raises(ConfigError, match=f"option {key}="):
            parse_options("m", {}, {key: value})

