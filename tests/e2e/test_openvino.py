"""engine=openvino through the real CLI and tritonserver: dynamic and bucketed static models equal ONNX Runtime."""

from __future__ import annotations

import csv
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytest.importorskip("openvino")

from gebackend.modelzoo import build_bert, build_resnet  # noqa: E402

from .conftest import BERT_BUCKETS, add_model, params  # noqa: E402
from .server import start_server  # noqa: E402
from .test_serving import infer  # noqa: E402

pytestmark = pytest.mark.e2e

ONE_INSTANCE = 'instance_group [ { count: 1, kind: KIND_CPU } ]\n'
MODELS = {
    "resnet_ov": ('backend: "ge"\nmax_batch_size: 8\n' + ONE_INSTANCE + params(engine="openvino"), build_resnet),
    "bert_ov_static": (
        'backend: "ge"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 50000 }\n' + ONE_INSTANCE
        + params(engine="openvino", static_model="1", bucket_paddable_dims="sequence", **BERT_BUCKETS),
        build_bert,
    ),
    "counter_ov": ('backend: "ge"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100000 }\n'
                   + ONE_INSTANCE + params(engine="openvino"), lambda: counter()),
    "strings_ov": ('backend: "ge"\nmax_batch_size: 4\n' + ONE_INSTANCE + params(engine="openvino"), lambda: strings()),
    "strings_auto": ('backend: "ge"\nmax_batch_size: 4\n' + ONE_INSTANCE + params(engine="auto", precision_mode="auto"),
                     lambda: strings()),
}


def counter() -> onnx.ModelProto:
    """later [batch, 1] = stamp + 1000, for an INT64 time in milliseconds (past 2**31 since 1970-01-25)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["stamp", "second"], ["later"])], "counter",
                              [helper.make_tensor_value_info("stamp", TensorProto.INT64, ["b", 1])],
                              [helper.make_tensor_value_info("later", TensorProto.INT64, ["b", 1])],
                              [helper.make_tensor("second", TensorProto.INT64, [], [1000])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def strings() -> onnx.ModelProto:
    """text [batch, 2] STRING -> same, and whether each equals "猫"."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity", ["text"], ["same"]), helper.make_node("Equal", ["text", "cat"], ["is_cat"])]
    graph = helper.make_graph(nodes, "strings", [helper.make_tensor_value_info("text", TensorProto.STRING, ["b", 2])],
                              [helper.make_tensor_value_info("same", TensorProto.STRING, ["b", 2]),
                               helper.make_tensor_value_info("is_cat", TensorProto.BOOL, ["b", 2])],
                              [helper.make_tensor("cat", TensorProto.STRING, [], ["猫".encode()])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.fixture(scope="module")
def ov_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ov") / "models"
    sessions = {}
    for name, (config, build) in MODELS.items():
        path = add_model(repo, name, config, build())
        sessions[name] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    server = start_server(repo, tmp_path_factory.mktemp("ov_logs") / "serve.log",
                          ["--backend-config", "ge,intra_op_thread_count=2"])
    yield server, sessions
    assert server.stop() == 0


def assert_equal_to_ort(result, session, feeds):
    names = [o.name for o in session.get_outputs()]
    for name, want in zip(names, session.run(names, feeds)):
        got = result.as_numpy(name)
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)


def bert_feeds(rng, rows, length):
    ids = rng.integers(0, 1000, size=(rows, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[0, max(1, length - 2):] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_load_log_says_openvino_f32(ov_server):
    server, _ = ov_server
    out = server.output()
    for name, mode in (("resnet_ov", "dynamic graph"), ("bert_ov_static", "static graph")):
        line = re.search(rf"model '{name}' instance .* loaded .*", out)
        assert line, out[-4000:]
        assert mode in line.group(0) and re.search(r"OpenVINO \S+ engine on CPU", line.group(0)), line.group(0)
        assert "precision=f32 (precision_mode=origin)" in line.group(0), line.group(0)
    assert re.search(r"model 'bert_ov_static' instance .* 3 compiled shape\(s\)", out)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("batch", [1, 3])
def test_dynamic_resnet_equals_onnxruntime(ov_server, protocol, batch):
    server, sessions = ov_server
    feeds = {"image": np.random.default_rng(batch).standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    assert_equal_to_ort(infer(server, protocol, "resnet_ov", feeds), sessions["resnet_ov"], feeds)


@pytest.mark.parametrize("rows,length", [(1, 16), (1, 9), (2, 30), (4, 32)])
def test_static_bert_buckets_equal_onnxruntime(ov_server, rows, length):
    """Padded up to the 1x16, 4x16 or 4x32 bucket and sliced back: equal to onnxruntime on the request alone."""
    server, sessions = ov_server
    feeds = bert_feeds(np.random.default_rng(rows * 100 + length), rows, length)
    assert_equal_to_ort(infer(server, "http", "bert_ov_static", feeds), sessions["bert_ov_static"], feeds)


def test_static_bert_under_concurrency(ov_server):
    """Triton batches concurrent requests of several lengths; every answer still equals onnxruntime."""
    server, sessions = ov_server
    rng = np.random.default_rng(7)
    requests = [bert_feeds(rng, int(rng.integers(1, 3)), int(rng.integers(3, 33))) for _ in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda f: infer(server, "http", "bert_ov_static", f), requests))
    for result, feeds in zip(results, requests):
        assert_equal_to_ort(result, sessions["bert_ov_static"], feeds)


def test_wrong_shape_is_a_client_error(ov_server):
    from tritonclient.utils import InferenceServerException

    server, _ = ov_server
    with pytest.raises(InferenceServerException, match=r"(?i)shape|dim"):
        infer(server, "http", "resnet_ov", {"image": np.zeros((1, 3, 64), np.float32)})
    feeds = {"image": np.ones((1, 3, 64, 64), np.float32)}  # the model still serves
    assert infer(server, "http", "resnet_ov", feeds).as_numpy("logits").shape == (1, 10)


def test_token_ids_outside_the_vocabulary_are_refused_as_onnxruntime_refuses_them(ov_server):
    """OpenVINO answers a Gather index past its table with an empty row (silently wrong); `ge` refuses the request
    on every engine with one message, and the batch it came with is still answered."""
    from tritonclient.utils import InferenceServerException

    server, sessions = ov_server
    good = bert_feeds(np.random.default_rng(5), 1, 6)
    bad = {"input_ids": good["input_ids"].copy(), "attention_mask": good["attention_mask"]}
    bad["input_ids"][0, 4] = 1000
    with ThreadPoolExecutor(max_workers=4) as pool:  # sent together: the batcher may put them in one batch
        futures = [pool.submit(infer, server, "http", "bert_ov_static", feeds) for feeds in (good, bad, good, good)]
    with pytest.raises(InferenceServerException) as info:
        futures[1].result()
    message = str(info.value)
    assert "model 'bert_ov_static', input 'input_ids': value 1000 at [0, 4]" in message and "[-1000, 999]" in message
    for index in (0, 2, 3):
        assert_equal_to_ort(futures[index].result(), sessions["bert_ov_static"], good)


def test_profiling_true_with_openvino(tmp_path):
    """profiling=true on the OpenVINO engine: the capture rendered at shutdown has OpenVINO's per-op rows."""
    repo, out = tmp_path / "repo", tmp_path / "captures"
    add_model(repo, "resnet_ov_profiled", 'backend: "ge"\nmax_batch_size: 4\n' + ONE_INSTANCE
              + params(engine="openvino", profiling="true", profiling_dir=str(out)), build_resnet())
    server = start_server(repo, tmp_path / "serve.log")
    try:
        for i in range(4):
            feeds = {"image": np.full((1, 3, 64, 64), i, np.float32)}
            assert infer(server, "http", "resnet_ov_profiled", feeds).as_numpy("logits").shape == (1, 10)
    finally:
        assert server.stop() == 0
    capture = next(out.glob("resnet_ov_profiled/*"))
    rows = list(csv.DictReader((capture / "op_summary.csv").open()))
    assert rows and {r["provider"] for r in rows} == {"OpenVINO-CPU"}
    assert "Convolution" in {r["op_type"] for r in rows}
    assert max(int(r["calls"]) for r in rows) == 4
    assert onnx.load(str(repo / "resnet_ov_profiled" / "1" / "model.onnx"))  # the model file is left alone


def test_a_string_model_is_served_on_onnxruntime_and_refused_on_openvino_by_name(ov_server):
    """OpenVINO runs STRING tensors, but its string tensors corrupt the process's heap (after one run, freeing the
    compiled model aborts with `free(): invalid pointer`): engine=auto serves such a model on ONNX Runtime, and
    engine=openvino fails its load saying so, where before it loaded and refused every request."""
    import tritonclient.http as httpclient

    server, _ = ov_server
    out = server.output()
    assert "model 'strings_ov' failed to load" in out
    assert "STRING tensors ['text', 'same'] are served on ONNX Runtime only" in out and "set engine=onnxruntime" in out
    assert "model 'strings_auto': engine=auto -> onnxruntime (STRING tensors ['text', 'same']" in out
    client = httpclient.InferenceServerClient(server.http_url)
    text = np.array([["猫".encode(), b"dog"], [b"", "狗".encode()]], dtype=object)
    tensor = httpclient.InferInput("text", [2, 2], "BYTES")
    tensor.set_data_from_numpy(text)
    result = client.infer("strings_auto", [tensor])
    assert result.as_numpy("same").tolist() == text.tolist()
    assert result.as_numpy("is_cat").tolist() == [[True, False], [False, False]]


def test_an_int64_openvino_would_cut_to_32_bits_is_a_400_and_its_batch_is_answered(ov_server):
    """OpenVINO computes INT64 as 32-bit integers: a time in milliseconds came back wrong, silently. Now such a value
    is refused with a message saying why and which engine computes it; values that fit are answered exactly."""
    from tritonclient.utils import InferenceServerException

    server, _ = ov_server
    now, small = np.array([[1_764_950_400_000]], np.int64), np.array([[86_400_000]], np.int64)
    with ThreadPoolExecutor(max_workers=4) as pool:  # sent together: the batcher may put them in one batch
        futures = [pool.submit(infer, server, "http", "counter_ov", {"stamp": stamp}) for stamp in (small, now, small)]
    with pytest.raises(InferenceServerException) as info:
        futures[1].result()
    message = str(info.value)
    assert "400" in message and "'counter_ov'" in message and "input 'stamp' holds 1764950400000 at [0, 0]" in message
    assert "engine=onnxruntime" in message
    for index in (0, 2):
        np.testing.assert_array_equal(futures[index].result().as_numpy("later"), small + 1000)
