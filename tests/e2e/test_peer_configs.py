"""Configs written for the peers, served through `gebackend serve` and the real tritonserver: Ascend ge-backend's own
example (example/resnet/config.pbtxt, verbatim, with its layout), Triton onnxruntime-backend sections
(`optimization { graph, execution_accelerators }`, `session.use_device_allocator_for_initializers`), Triton's `model_warmup`, ge-backend's device and `ge.*` keys
and `dump_data`, and a config.pbtxt that does not parse beside models that do."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from gebackend.modelzoo import build_add_mul

from .conftest import add_model, params
from .server import start_server
from .test_serving import infer

pytestmark = pytest.mark.e2e

# hicann/triton-inference-server-ge-backend, example/resnet/config.pbtxt, as published (comments included).
GE_BACKEND_RESNET_CONFIG = """name: "resnet"
backend: "npu_ge"
max_batch_size: 64

# input output 可以不填，由程序自行解析
input [
  {
    name: "data"
    data_type: TYPE_FP32
    dims: [3, 224, 224 ]
  }
]
output [
  {
    name: "resnetv24_dense0_fwd"
    data_type: TYPE_FP32
    dims: [1000 ]
  }
]

#初始测试建议1，后续性能调优可以参考相关文档调整
instance_group [{
  count: 1
}
]

#动态batch合并，静态图场景下需删除
# dynamic_batching { 
#   max_queue_delay_microseconds: 1000  # 等待合并的最大延迟（微秒），可调整
#   preferred_batch_size: [2, 4, 8]    # 优先合并成这些batch_size（可选）
# }

# 选择运行在哪些卡上
parameters: [
{
  key: "device_ids",
  value: {string_value: "4,5"}
}
]

# 静态图开关，仅在所有shape均为固定值时生效
# parameters: [
# {
#   key: "static_model",
#   value: {string_value: "1"} # GE静态图开关，此配置与 dynamic_batching 互斥
# }
# ]
"""

ONE_CPU = "instance_group [ { kind: KIND_CPU, count: 1 } ]\n"

ORT_PEER_SECTIONS = """optimization {
  graph { level: 2 }
  execution_accelerators {
    cpu_execution_accelerator [ { name: "openvino" } ]
    gpu_execution_accelerator [ {
      name: "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" }
      parameters { key: "trt_engine_cache_enable" value: "true" }
    } ]
  }
}
"""

WARMUP = """model_warmup [ {
  name: "zeros_and_random"
  batch_size: 2
  inputs { key: "x" value: { data_type: TYPE_FP32, dims: [ 4 ], zero_data: true } }
  inputs { key: "y" value: { data_type: TYPE_FP32, dims: [ 4 ], random_data: true } }
} ]
"""

CLASSIFIED_OUTPUT = ('output [ { name: "sum", data_type: TYPE_FP32, dims: [ 4 ], label_filename: "labels.txt" },\n'
                     '         { name: "product", data_type: TYPE_FP32, dims: [ 4 ] } ]\n')
LABELS = ["猫", "狗", "一只鸟", "bird"]

VERSIONS = {"1": (4, "Add"), "2": (6, "Mul")}  # version -> width of x, y and out; the op


def elementwise(width: int, op: str) -> onnx.ModelProto:
    tensors = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width]) for name in ("x", "y", "out")]
    graph = helper.make_graph([helper.make_node(op, ["x", "y"], ["out"])], op.lower(), tensors[:2], tensors[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SCALE = np.arange(1, 7, dtype=np.float32).reshape(6, 1) / 4  # the weight kept outside the ONNX file


def scaled_rows() -> onnx.ModelProto:
    """out = x * weight for x [batch, 6, 1] and a stored weight [6, 1]."""
    tensors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 6, 1]) for n in ("x", "out")]
    graph = helper.make_graph([helper.make_node("Mul", ["x", "weight"], ["out"])], "scaled", tensors[:1], tensors[1:],
                              [numpy_helper.from_array(SCALE, "weight")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def string_identity() -> onnx.ModelProto:
    tensors = [helper.make_tensor_value_info(name, TensorProto.STRING, ["batch", 2]) for name in ("text", "same")]
    graph = helper.make_graph([helper.make_node("Identity", ["text"], ["same"])], "strings", tensors[:1], tensors[1:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def three_outputs() -> onnx.ModelProto:
    """sum = a + b, prod = a * b, neg = -a, for a and b [batch, 3]; the outputs in neither name order nor config order."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 3]) for n in ("a", "b")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 3]) for n in ("sum", "prod", "neg")]
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"]),
             helper.make_node("Neg", ["a"], ["neg"])]
    return helper.make_model(helper.make_graph(nodes, "three", ins, outs), opset_imports=[helper.make_opsetid("", 17)])


TWO_OF_THREE = ('output [ { name: "sum", data_type: TYPE_FP32, dims: [ 3 ] },\n'
                '         { name: "neg", data_type: TYPE_FP32, dims: [ 3 ] } ]\n')
THREE_OUTPUTS = {"three_dynamic": "", "three_static": params(static_model="1"), "three_openvino": params(engine="openvino")}

BROKEN_CONFIG = 'backend: "ge"\nmax_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\nmax_batch_size: eight\n'


def resnet18_like() -> onnx.ModelProto:
    """resnet18-v1-7's boundary (input `data` [N,3,224,224], output `resnetv15_dense0_fwd` [N,1000], opset 7)
    around a small random-weight CNN: conv/BN/relu/pool, a strided conv, global pooling and the dense layer."""
    rng = np.random.default_rng(18)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype(np.float32), name)

    inits = [weight("conv0_weight", 8, 3, 7, 7), weight("conv1_weight", 16, 8, 3, 3), weight("dense0_weight", 1000, 16),
             numpy_helper.from_array(np.zeros(1000, np.float32), "dense0_bias")]
    inits += [numpy_helper.from_array(v.astype(np.float32), f"bn_{k}") for k, v in
              {"gamma": np.ones(8), "beta": np.zeros(8), "mean": rng.standard_normal(8) * 0.1, "var": np.ones(8)}.items()]
    nodes = [
        helper.make_node("Conv", ["data", "conv0_weight"], ["resnetv15_conv0_fwd"], kernel_shape=[7, 7], strides=[4, 4], pads=[3, 3, 3, 3]),
        helper.make_node("BatchNormalization", ["resnetv15_conv0_fwd", "bn_gamma", "bn_beta", "bn_mean", "bn_var"],
                         ["resnetv15_batchnorm0_fwd"]),
        helper.make_node("Relu", ["resnetv15_batchnorm0_fwd"], ["resnetv15_relu0_fwd"]),
        helper.make_node("MaxPool", ["resnetv15_relu0_fwd"], ["resnetv15_pool0_fwd"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["resnetv15_pool0_fwd", "conv1_weight"], ["resnetv15_conv1_fwd"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["resnetv15_conv1_fwd"], ["resnetv15_relu1_fwd"]),
        helper.make_node("GlobalAveragePool", ["resnetv15_relu1_fwd"], ["resnetv15_pool1_fwd"]),
        helper.make_node("Flatten", ["resnetv15_pool1_fwd"], ["resnetv15_flatten0_reshape0"], axis=1),
        helper.make_node("Gemm", ["resnetv15_flatten0_reshape0", "dense0_weight", "dense0_bias"], ["resnetv15_dense0_fwd"],
                         transB=1),
    ]
    # IR 3, as the model-zoo file: every weight is also listed as a graph input.
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, 224, 224])]
    inputs += [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "resnet18-like", inputs,
                              [helper.make_tensor_value_info("resnetv15_dense0_fwd", TensorProto.FLOAT, ["N", 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    repo, dumps = root / "models", root / "profiling"
    resnet = repo / "resnet" / "1" / "resnet18-v1-7.onnx"  # ge-backend's layout: not model.onnx
    resnet.parent.mkdir(parents=True)
    onnx.save(resnet18_like(), str(resnet))
    (repo / "resnet" / "config.pbtxt").write_text(GE_BACKEND_RESNET_CONFIG, encoding="utf-8")
    add_model(repo, "ort_peer", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + ORT_PEER_SECTIONS, build_add_mul())
    add_model(repo, "ort_peer_engine_param", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + ORT_PEER_SECTIONS
              + params(engine="onnxruntime", **{"session.use_device_allocator_for_initializers": "1"}), build_add_mul())
    add_model(repo, "warmed_up", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + WARMUP
              + params(dump_data="1", profiling_dir=str(dumps)), build_add_mul())
    add_model(repo, "ge_keys", 'backend: "npu_ge"\nmax_batch_size: 4\n' + ONE_CPU + params(**{
        "device_ids": "0,1", "device_exec_blocks": "8", "instance_exec_blocks": "2", "dump_data": "1",
        "profiling_dir": str(dumps), "ge.exec.deviceId": "3", "session.ge.exec.atomicCleanPolicy": "1",
        "graph.ge.exec.precision_mode": "must_keep_origin_dtype"}), build_add_mul())
    add_model(repo, "bad_accelerator", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU
              + 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "mkldnn" } ] } }\n', build_add_mul())
    add_model(repo, "badcfg", BROKEN_CONFIG, build_add_mul())
    # an onnxruntime-backend config without instance_group, its backend switched: Triton gives the peer 2 instances
    add_model(repo, "ort_peer_no_group", 'backend: "ge"\nmax_batch_size: 4\n', build_add_mul())
    # Triton's classification extension: an output with labels, the other output as it is
    add_model(repo, "classified", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + CLASSIFIED_OUTPUT, build_add_mul())
    (repo / "classified" / "labels.txt").write_text("\n".join(LABELS) + "\n", encoding="utf-8")
    # a STRING model; the batcher waits so that requests sent together run together
    add_model(repo, "strings", 'backend: "ge"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n'
              + ONE_CPU, string_identity())
    # the onnxruntime backend's layout for a model with external weights: 1/model.onnx/ is a folder holding model.onnx
    for name, extra in (("in_a_folder", ""), ("in_a_folder_static", params(static_model="1"))):
        folder = repo / name / "1" / "model.onnx"
        folder.mkdir(parents=True)
        onnx.save(scaled_rows(), str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                  location="weights.bin", size_threshold=0)
        (repo / name / "config.pbtxt").write_text('backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + extra)
    # the onnxruntime backend's configs as they are, backend and platform spelled its way: served by ge
    add_model(repo, "ort_by_backend", 'backend: "onnxruntime"\nmax_batch_size: 4\n', build_add_mul())
    add_model(repo, "ort_by_platform", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n' + ONE_CPU, build_add_mul())
    # every version served, each with its own tensors: auto-complete reads each version's own file, as the peer does
    (repo / "versions").mkdir()
    (repo / "versions" / "config.pbtxt").write_text('backend: "ge"\nmax_batch_size: 4\nversion_policy: { all { } }\n' + ONE_CPU)
    for version, (width, op) in VERSIONS.items():
        (repo / "versions" / version).mkdir()
        onnx.save(elementwise(width, op), str(repo / "versions" / version / "model.onnx"))
    # outputs come back in one order (the peer's: by name) on every engine and graph mode; a config listing some
    # outputs is served those alone, as the peer's auto-complete leaves such a list as it is
    for name, extra in THREE_OUTPUTS.items():
        add_model(repo, name, 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + extra, three_outputs())
    add_model(repo, "two_of_three", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_CPU + TWO_OF_THREE, three_outputs())
    # Triton's global default-max-batch-size, as a peer user passes it: ge's default too
    add_model(repo, "default_batch", 'backend: "onnxruntime"\n' + ONE_CPU, build_add_mul())
    server = start_server(repo, root / "serve.log", ["--backend-config", "default-max-batch-size=2",
                                                     "--backend-config", "onnxruntime,enable-global-threadpool=1"])
    yield server, repo, dumps
    assert server.stop() == 0


def add_mul_feeds(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 4)).astype(np.float32), "y": rng.standard_normal((rows, 4)).astype(np.float32)}


def load_line(out: str, model: str) -> str:
    match = re.search(rf"model '{model}' instance \S+ loaded .*", out)
    assert match, out[-5000:]
    return match.group(0)


def test_the_good_models_serve_and_the_broken_ones_are_named(peers):
    server, repo, _ = peers
    out = server.output()
    assert "gebackend: 19 of 21 models ready" in out, out[-5000:]
    config = repo / "badcfg" / "config.pbtxt"
    # Triton itself only logs "failed to read text proto"; the CLI names the model, the file, line and column.
    assert re.search(rf"gebackend: model 'badcfg' failed to load: cannot parse {re.escape(str(config))}:4:17: "
                     r".*Couldn't parse integer", out), out[-5000:]
    assert re.search(r"gebackend: model 'bad_accelerator' failed to load: .*model 'bad_accelerator': unknown Execution "
                     r"Accelerator 'mkldnn' is requested", out), out[-5000:]
    assert "Traceback" not in out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("rows", [1, 3])
def test_ge_backend_resnet_example_answers_like_onnxruntime(peers, protocol, rows):
    server, repo, _ = peers
    feeds = {"data": np.random.default_rng(rows).standard_normal((rows, 3, 224, 224)).astype(np.float32)}
    session = ort.InferenceSession(str(repo / "resnet" / "1" / "resnet18-v1-7.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(["resnetv15_dense0_fwd"], feeds)[0]
    got = infer(server, protocol, "resnet", feeds).as_numpy("resnetv24_dense0_fwd")  # the config's name, as ge-backend
    assert got.shape == (rows, 1000)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_ge_backend_resnet_example_load_log(peers):
    server, _, _ = peers
    out = server.output()
    assert "resnet18-v1-7.onnx" in load_line(out, "resnet")
    assert "max_batch_size=64" in load_line(out, "resnet")
    assert re.search(r"model 'resnet': device_ids 4,5 \(ge-backend: the NPUs the model spreads over\): this instance "
                     r"runs on the CPU", out), out[-5000:]
    assert re.search(r"model 'resnet': config.pbtxt output 'resnetv24_dense0_fwd' is not in the ONNX file: served as "
                     r"its output #0 'resnetv15_dense0_fwd'", out), out[-5000:]
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config("resnet")
    assert [o["name"] for o in config["output"]] == ["resnetv24_dense0_fwd"]
    assert config["parameters"]["device_ids"]["string_value"] == "4,5"


def test_onnxruntime_backend_sections(peers):
    server, _, _ = peers
    out = server.output()
    line = load_line(out, "ort_peer")
    assert re.search(r"OpenVINO \S+ engine on CPU", line), line  # cpu_execution_accelerator openvino
    assert "model 'ort_peer': cpu_execution_accelerator openvino: selects engine=openvino" in out
    assert ("model 'ort_peer': gpu_execution_accelerator tensorrt(precision_mode=FP16, max_workspace_size_bytes="
            "1073741824, trt_engine_cache_enable=True): for KIND_GPU instances; this CPU instance runs without it") in out, out[-5000:]
    line = load_line(out, "ort_peer_engine_param")
    assert "onnxruntime" in line and "graph_optimization_level=disable" in line, line  # level 2: disable all
    assert "session.use_device_allocator_for_initializers=1" in line, line  # the newer peers' key, carried
    assert "the config.pbtxt parameter engine=onnxruntime wins" in out
    for model in ("ort_peer", "ort_peer_engine_param"):
        feeds = add_mul_feeds(3)
        result = infer(server, "grpc", model, feeds)
        np.testing.assert_allclose(result.as_numpy("sum"), feeds["x"] + feeds["y"], rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("product"), feeds["x"] * feeds["y"], rtol=1e-6)


def test_a_config_without_instance_group_gets_one_instance_on_every_core(peers):
    """Triton's default count for a Python-based backend is 1 (the onnxruntime backend's is 2): one instance, not
    pinned, as docs/configs.md says."""
    server, _, _ = peers
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config("ort_peer_no_group")
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 1)]
    out = server.output()
    assert len(re.findall(r"model 'ort_peer_no_group' instance \S+ loaded ", out)) == 1
    assert not re.search(r"model 'ort_peer_no_group': instance \S+: instance \d+/\d+ pinned", out)  # every core
    feeds = add_mul_feeds(2)
    np.testing.assert_allclose(infer(server, "http", "ort_peer_no_group", feeds).as_numpy("sum"), feeds["x"] + feeds["y"],
                               rtol=1e-6)


def _dump_index(dumps: Path, model: str) -> dict:
    indexes = sorted((dumps / model / "dump").glob("*/index.json"))
    assert len(indexes) == 1, indexes
    return json.loads(indexes[0].read_text())


def _tensor(dumps: Path, model: str, index: dict, name: str) -> np.ndarray:
    entry = next(e for e in index["inputs"] + index["outputs"] if e["name"] == name)
    folder = next((dumps / model / "dump").glob("*/index.json")).parent
    return np.load(folder / entry["file"])


def test_model_warmup_runs_through_the_backend_then_it_answers(peers):
    server, _, dumps = peers
    # dump_data caught the first request after load: Triton's warmup request (batch 2, x zeros, y random).
    index = _dump_index(dumps, "warmed_up")
    x, y = _tensor(dumps, "warmed_up", index, "x"), _tensor(dumps, "warmed_up", index, "y")
    assert x.shape == (1, 4) and not x.any()  # Triton sends batch_size requests of one row each
    np.testing.assert_array_equal(_tensor(dumps, "warmed_up", index, "sum"), x + y)
    np.testing.assert_array_equal(_tensor(dumps, "warmed_up", index, "product"), x * y)
    feeds = add_mul_feeds(2, seed=7)
    result = infer(server, "http", "warmed_up", feeds)
    np.testing.assert_allclose(result.as_numpy("sum"), feeds["x"] + feeds["y"], rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("product"), feeds["x"] * feeds["y"], rtol=1e-6)


def test_ge_backend_keys_are_reported_once_and_dump_data_writes_every_node(peers):
    server, _, dumps = peers
    out = server.output()
    no_effect = re.findall(r"model 'ge_keys': ge-backend option\(s\) accepted, no effect on this engine: (.*)", out)
    assert len(no_effect) == 1, no_effect  # one instance: one load, one line
    assert "ge.exec.deviceId (set the device with instance_group { kind, gpus })" in no_effect[0]
    assert "session.ge.exec.atomicCleanPolicy" in no_effect[0]
    assert "graph.ge.exec.precision_mode" not in no_effect[0]  # mapped: precision_mode=origin
    assert "unknown option(s) ignored" not in "".join(re.findall(r"model 'ge_keys': .*", out))
    assert re.search(r"model 'ge_keys': device_exec_blocks=8, instance_exec_blocks=2: ge-backend would run 8 "
                     r"execution block\(s\) on each of 2 device\(s\); here each Triton instance runs one engine", out)
    feeds = add_mul_feeds(3, seed=11)
    result = infer(server, "grpc", "ge_keys", feeds)
    index = _dump_index(dumps, "ge_keys")
    assert [n["op_type"] for n in index["nodes"]] == [n.op_type for n in build_add_mul().graph.node]
    np.testing.assert_array_equal(_tensor(dumps, "ge_keys", index, "x"), feeds["x"])
    np.testing.assert_array_equal(_tensor(dumps, "ge_keys", index, "sum"), result.as_numpy("sum"))
    assert "model 'ge_keys': dump_data: wrote every node's inputs and outputs of the first request" in server.output()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_label_filename_and_class_count_answer_the_top_classes(peers, protocol):
    """An output with `label_filename` (a peer config's classification): a client asking for `class_count` gets
    "score:index:label" of the best classes, labels read from the file as UTF-8, the other output as it is."""
    import tritonclient.grpc as grpcclient

    server, _, _ = peers
    module, url = (httpclient, server.http_url) if protocol == "http" else (grpcclient, server.grpc_url)
    feeds = add_mul_feeds(3, seed=7)
    client = module.InferenceServerClient(url)
    inputs = []
    for name, array in feeds.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [module.InferRequestedOutput("sum", class_count=3), module.InferRequestedOutput("product")]
    result = client.infer("classified", inputs, outputs=outputs)
    total = feeds["x"] + feeds["y"]
    np.testing.assert_allclose(result.as_numpy("product"), feeds["x"] * feeds["y"], rtol=1e-6)
    top = result.as_numpy("sum")
    assert top.shape == (3, 3)
    for row, answer in zip(total, top):
        best = np.argsort(-row)[:3]
        parsed = [entry.decode("utf-8").split(":") for entry in answer]
        assert [int(index) for _, index, _ in parsed] == list(best), (row, answer)
        assert [label for _, _, label in parsed] == [LABELS[i] for i in best]
        np.testing.assert_allclose([float(score) for score, _, _ in parsed], row[best], rtol=1e-5)


def test_every_version_is_completed_from_its_own_file_and_answers(peers):
    """`version_policy: { all { } }` with versions whose tensors differ: both load, each with its own dims in its
    config, and each answers with its own graph (before, both were completed from the latest file and version 1
    failed to load: `input 'x' dim 0 is 6 in config.pbtxt but 4 in the ONNX file`)."""
    server, _, _ = peers
    client = httpclient.InferenceServerClient(server.http_url)
    for version, (width, op) in VERSIONS.items():
        assert client.get_model_config("versions", version)["input"][0]["dims"] == [width]
        x = np.full((2, width), 3.0, np.float32)
        y = np.arange(2 * width, dtype=np.float32).reshape(2, width)
        inputs = []
        for name, array in (("x", x), ("y", y)):
            tensor = httpclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        out = client.infer("versions", inputs, model_version=version).as_numpy("out")
        np.testing.assert_array_equal(out, x + y if op == "Add" else x * y)


def test_bytes_that_are_no_utf8_fail_their_request_alone(peers):
    """A STRING request carrying bytes that are no UTF-8 (which ONNX Runtime's Python API cannot take) is a 400 naming
    the model, the input and the element; the requests batched with it are answered (before: all of them got a 500
    with a Python traceback of the decoding)."""
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    server, _, _ = peers
    sent = [np.array([["猫 cat".encode(), b"ok"]], dtype=object), np.array([[b"fine", b"\xff\xfe bad"]], dtype=object),
            np.array([["一只鸟".encode(), b""]], dtype=object)]

    def send(array):
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("text", list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        try:
            return client.infer("strings", [tensor]).as_numpy("same")
        except InferenceServerException as exc:
            return exc
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(pool.map(send, sent))
    assert isinstance(answers[1], InferenceServerException) and str(answers[1].status()) == "400", answers[1]
    message = str(answers[1])
    assert "model 'strings', input 'text', element [0, 1]: expected UTF-8 text" in message and "At:" not in message
    for index in (0, 2):
        assert answers[index].tolist() == sent[index].tolist()
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("strings")["model_stats"][0]["batch_stats"]
    assert max(int(b["batch_size"]) for b in stats) >= 2, stats  # the bad request shared its execute with a good one


@pytest.mark.parametrize("model", ["in_a_folder", "in_a_folder_static"])
def test_a_model_folder_with_external_weights_is_served(peers, model):
    """`1/model.onnx/model.onnx` with its weights in `1/model.onnx/weights.bin`: the onnxruntime backend's layout for
    large models; served in both graph modes (before: `no ONNX file in …/1`)."""
    server, repo, _ = peers
    assert (repo / model / "1" / "model.onnx" / "weights.bin").stat().st_size == SCALE.nbytes
    x = np.random.default_rng(3).standard_normal((2, 6, 1)).astype(np.float32)
    np.testing.assert_allclose(infer(server, "http", model, {"x": x}).as_numpy("out"), x * SCALE, rtol=1e-6)


@pytest.mark.parametrize("model", ["ort_by_backend", "ort_by_platform"])
def test_the_onnxruntime_backends_configs_are_served_unchanged(peers, model):
    """`backend: "onnxruntime"` or `platform: "onnxruntime_onnx"`, not edited: served by ge (nvidia-pytriton ships no
    onnxruntime backend), with the 2 CPU instances Triton gives that backend's models where the config names none."""
    server, _, _ = peers
    feeds = add_mul_feeds(3, seed=5)
    result = infer(server, "http", model, feeds)
    np.testing.assert_allclose(result.as_numpy("sum"), feeds["x"] + feeds["y"], rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("product"), feeds["x"] * feeds["y"], rtol=1e-6)
    out = server.output()
    assert re.search(rf"model '{model}': config.pbtxt names Triton's onnxruntime backend, which this server does not "
                     r"have: served by ge", out), out[-3000:]
    assert ("gebackend: --backend-config onnxruntime,enable-global-threadpool=1: for Triton's onnxruntime backend, "
            "whose models ge serves here: not read") in out  # a peer user's command line, said what it does here
    loaded = set(re.findall(rf"model '{model}' instance '(\S+)' loaded", out))
    assert len(loaded) == (2 if model == "ort_by_backend" else 1), loaded


def test_tritons_global_default_max_batch_size_is_ours_too(peers):
    """`--backend-config default-max-batch-size=2` (Triton's global key, which the onnxruntime backend reads): a model
    that batches but sets no max_batch_size gets 2, as on the peer (ge's own default is 8)."""
    server, _, _ = peers
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_model_config("default_batch")["max_batch_size"] == 2
    feeds = add_mul_feeds(2, seed=9)
    np.testing.assert_allclose(infer(server, "http", "default_batch", feeds).as_numpy("sum"), feeds["x"] + feeds["y"])
    with pytest.raises(Exception, match="batch-size must be <= 2"):
        infer(server, "http", "default_batch", add_mul_feeds(3))


def test_a_config_broken_before_sighup_is_reported_with_its_line(peers):
    server, repo, _ = peers
    add_model(repo, "late_badcfg", 'backend: "ge"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay: 5 }\n', build_add_mul())
    server.process.send_signal(signal.SIGHUP)
    config = repo / "late_badcfg" / "config.pbtxt"
    pattern = rf"reload: model 'late_badcfg' failed: cannot parse {re.escape(str(config))}:3:20: .*max_queue_delay"
    deadline = time.monotonic() + 120
    while not re.search(pattern, server.output()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert re.search(pattern, server.output()), server.output()[-3000:]
    feeds = add_mul_feeds(1)
    np.testing.assert_allclose(infer(server, "http", "ort_peer_engine_param", feeds).as_numpy("sum"), feeds["x"] + feeds["y"])


def _three_feeds(module):
    a, b = np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = []
    for name, array in (("b", b), ("a", a)):
        tensor = module.InferInput(name, [2, 3], "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return a, b, inputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_come_back_in_name_order_on_every_engine_and_graph_mode(peers, protocol):
    import tritonclient.grpc as grpcclient

    server, _, _ = peers
    module, url = (httpclient, server.http_url) if protocol == "http" else (grpcclient, server.grpc_url)
    client = module.InferenceServerClient(url)
    a, b, inputs = _three_feeds(module)
    for model in THREE_OUTPUTS:
        for _ in range(3):
            result = client.infer(model, inputs)
            response = result.get_response() if protocol == "http" else result.get_response(as_json=True)
            assert [o["name"] for o in response["outputs"]] == ["neg", "prod", "sum"], model
            np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
            np.testing.assert_array_equal(result.as_numpy("prod"), a * b)
            np.testing.assert_array_equal(result.as_numpy("neg"), -a)
        asked = [module.InferRequestedOutput(n) for n in ("sum", "neg")]  # asked out of order: still by name
        response = client.infer(model, inputs, outputs=asked)
        response = response.get_response() if protocol == "http" else response.get_response(as_json=True)
        assert [o["name"] for o in response["outputs"]] == ["neg", "sum"], model


def test_a_config_that_lists_some_outputs_is_served_those_alone(peers):
    server, _, _ = peers
    client = httpclient.InferenceServerClient(server.http_url)
    assert [o["name"] for o in client.get_model_config("two_of_three")["output"]] == ["sum", "neg"]
    a, b, inputs = _three_feeds(httpclient)
    result = client.infer("two_of_three", inputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["neg", "sum"]
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(result.as_numpy("neg"), -a)
    with pytest.raises(Exception) as info:  # as on the peer: Triton refuses an output the config does not list
        client.infer("two_of_three", inputs, outputs=[httpclient.InferRequestedOutput("prod")])
    assert "unexpected inference output 'prod'" in str(info.value)
