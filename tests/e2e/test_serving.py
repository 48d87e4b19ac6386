"""End to end through the real CLI and tritonserver: correctness, batching, errors, isolation."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


def client_for(server, protocol):
    module = PROTOCOLS[protocol]
    return module, module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)


def infer(server, protocol, model, feeds: dict[str, np.ndarray]):
    module, client = client_for(server, protocol)
    inputs = []
    for name, array in feeds.items():
        wire = {np.float32: "FP32", np.int64: "INT64", np.int32: "INT32", np.float64: "FP64"}[array.dtype.type]
        tensor = module.InferInput(name, list(array.shape), wire)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def reference(repository, model, feeds):
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def example_feeds(model: str, rng: np.random.Generator, batch: int = 2) -> dict[str, np.ndarray]:
    if model.startswith("resnet"):
        return {"image": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    if model == "bert_ge":
        ids = rng.integers(0, 1000, size=(batch, 11), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[0, 7:] = 0
        return {"input_ids": ids, "attention_mask": mask}
    raise KeyError(model)


def test_example_models_ready_and_failures_reported(server):
    out = server.output()
    for model in ("resnet_ge", "bert_ge", "resnet_npu_ge", "add_mul"):
        assert re.search(rf"^  {model} v1: READY$", out, re.M), out[-3000:]
    # A broken file and a contradicting config fail alone, each with its reason.
    assert re.search(r"model 'broken' failed to load: .*cannot read ONNX file", out), out[-3000:]
    failed = re.search(r"model 'contradicts' failed to load: (.*)", out)
    assert failed, out[-3000:]
    assert "'x'" in failed.group(1) and "TYPE_INT32" in failed.group(1) and "TYPE_FP32" in failed.group(1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_batch_only_input_is_served_through_reshape(server, repository, protocol):
    """ONNX `scale: [batch]`: clients send [n, 1] (config dims [1]), the engine gets [n] (reshape: { shape: [] })."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    scale = rng.standard_normal((3, 1)).astype(np.float32)
    got = infer(server, protocol, "row_scale", {"x": x, "scale": scale}).as_numpy("y")
    want = reference(repository, "row_scale", {"x": x, "scale": scale[:, 0]})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, x * scale, rtol=1e-6)
    # Without the reshape in config.pbtxt, auto-complete writes it, as Triton's onnxruntime backend does.
    np.testing.assert_allclose(infer(server, protocol, "row_scale_auto", {"x": x, "scale": scale}).as_numpy("y"), want, rtol=1e-6)
    config = client_for(server, protocol)[1].get_model_config("row_scale_auto")
    config = config if protocol == "http" else json_format.MessageToDict(config.config, preserving_proto_field_name=True)
    entry = next(e for e in config["input"] if e["name"] == "scale")
    assert [int(d) for d in entry["dims"]] == [1] and entry.get("reshape", {}).get("shape", []) == [], entry


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["resnet_ge", "bert_ge", "resnet_npu_ge"])
def test_outputs_equal_onnxruntime(server, repository, protocol, model):
    feeds = example_feeds(model, np.random.default_rng(7), batch=3)
    result = infer(server, protocol, model, feeds)
    expected = reference(repository, model, feeds)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got is not None, name
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_auto_complete_fills_config_from_onnx(server):
    _, client = client_for(server, "http")
    config = client.get_model_config("bert_ge")
    assert config["max_batch_size"] == 8
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("input_ids", "TYPE_INT64", [-1]),
        ("attention_mask", "TYPE_INT64", [-1]),
    ]
    assert {o["name"]: o["dims"] for o in config["output"]} == {"last_hidden_state": [-1, 64], "pooler_output": [64]}


def test_backend_config_and_model_parameters_reach_the_engine(server):
    out = server.output()
    # Global --backend-config ge,intra_op_thread_count=2; resnet_npu_ge overrides it with 1 in config.pbtxt.
    assert re.search(r"model 'add_mul' instance .* intra_op_threads=2\b", out)
    assert re.search(r"model 'resnet_npu_ge' instance .* intra_op_threads=1\b", out)
    # Unknown keys are reported (once per model load), not silently ignored.
    assert re.search(r"model 'add_mul': unknown option\(s\) ignored: not_a_real_option", out)


def test_dynamic_batching_forms_batches(server):
    rng = np.random.default_rng(3)
    requests = [(rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((1, 4)).astype(np.float32)) for _ in range(24)]

    def send(pair):
        x, y = pair
        result = infer(server, "grpc", "add_mul", {"x": x, "y": y})
        return result.as_numpy("sum"), result.as_numpy("product")

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(send, requests))
    for (x, y), (total, product) in zip(requests, results):
        np.testing.assert_allclose(total, x + y, rtol=1e-6)
        np.testing.assert_allclose(product, x * y, rtol=1e-6)
    _, client = client_for(server, "http")
    stats = client.get_inference_statistics("add_mul")["model_stats"][0]
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert max(sizes) > 1, f"no batch larger than 1 formed: {sizes}"
    assert sum(size * count for size, count in sizes.items()) >= len(requests)


BAD_REQUESTS = [
    # (model, feeds, a fragment the error must contain)
    ("resnet_ge", {"image": np.zeros((1, 3, 32, 64), np.float32)}, "image"),
    ("resnet_ge", {"image": np.zeros((1, 3, 64, 64), np.float64)}, "image"),
    ("bert_ge", {"input_ids": np.zeros((1, 5), np.int64), "attention_mask": np.ones((1, 6), np.int64)}, "sequence"),
    ("bert_ge", {"input_ids": np.zeros((1, 5), np.int32), "attention_mask": np.ones((1, 5), np.int64)}, "input_ids"),
    ("add_mul", {"x": np.zeros((1, 4), np.float32)}, "y"),
    ("resnet_ge", {"image": np.zeros((9, 3, 64, 64), np.float32)}, "batch"),
    # a token id past the 1000-row vocabulary (ONNX Runtime's own error before; OpenVINO answered wrongly)
    ("bert_ge", {"input_ids": np.array([[1, 2, 1000]], np.int64), "attention_mask": np.ones((1, 3), np.int64)},
     "input_ids': value 1000 at [0, 2] is out of range"),
    ("bert_ge_static", {"input_ids": np.array([[1, -1001]], np.int64), "attention_mask": np.ones((1, 2), np.int64)},
     "[-1000, 999]"),
    # longer than its 128 positions (a 500 from the engine before)
    ("bert_ge", {"input_ids": np.ones((1, 129), np.int64), "attention_mask": np.ones((1, 129), np.int64)},
     "dim 1 is 129 (shape sent [1, 129]), longer than the model takes: at most 128"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model,feeds,fragment", BAD_REQUESTS)
def test_bad_requests_get_4xx_and_server_keeps_serving(server, repository, protocol, model, feeds, fragment):
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, model, feeds)
    status = str(info.value.status())
    assert status == "400" or status == "StatusCode.INVALID_ARGUMENT", (status, str(info.value))
    message = str(info.value)
    assert model in message and fragment in message, message
    # The same model still answers a good request correctly.
    good = example_feeds(model.removesuffix("_static"), np.random.default_rng(1), batch=1) if model != "add_mul" else {
        "x": np.ones((1, 4), np.float32), "y": np.full((1, 4), 2, np.float32)}
    result = infer(server, protocol, model, good)
    expected = reference(repository, model, good)
    for name, want in expected.items():
        np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-5, atol=1e-6)


def test_bad_request_inside_a_batch_fails_alone(server):
    """Requests batched together with a bad one still get their own correct answers."""
    def send(i):
        x = np.full((1, 4), i, np.float32)
        y = np.ones((1, 5 if i == 3 else 4), np.float32)  # request 3 is malformed
        try:
            return infer(server, "http", "add_mul", {"x": x, "y": y}).as_numpy("sum")
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(send, range(6)))
    for i, result in enumerate(results):
        if i == 3:
            assert isinstance(result, InferenceServerException) and str(result.status()) == "400"
        else:
            np.testing.assert_array_equal(result, np.full((1, 4), i + 1, np.float32))


def test_example_client_checks_every_model(server, repository):
    import subprocess
    import sys

    from .conftest import ROOT

    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "client.py"), "--http", server.http_url, "--grpc", server.grpc_url,
         "--repo", str(repository)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for model in ("resnet_ge", "bert_ge", "resnet_npu_ge", "add_mul"):
        for protocol in ("http", "grpc"):
            assert re.search(rf"^{model} \[{protocol}\]: .* matches onnxruntime", done.stdout, re.M), done.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_client_shared_memory(server, repository, protocol):
    """tritonclient's system shared memory (what `perf_analyzer --shared-memory system` uses): the input read from a
    region the client wrote, the output written into one it reads, equal to ONNX Runtime's answer."""
    import os

    import tritonclient.utils.shared_memory as shm

    module, client = client_for(server, protocol)
    image = np.random.default_rng(11).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = reference(repository, "resnet_ge", {"image": image})["logits"]
    tag = f"ge_test_{protocol}_{os.getpid()}"
    region_in = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", image.nbytes)
    region_out = shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", want.nbytes)
    try:
        shm.set_shared_memory_region(region_in, [image])
        client.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", image.nbytes)
        client.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", want.nbytes)
        tensor = module.InferInput("image", list(image.shape), "FP32")
        tensor.set_shared_memory(f"{tag}_in", image.nbytes)
        output = module.InferRequestedOutput("logits")
        output.set_shared_memory(f"{tag}_out", want.nbytes)
        client.infer("resnet_ge", [tensor], outputs=[output])
        got = shm.get_contents_as_numpy(region_out, np.float32, list(want.shape))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        for name in (f"{tag}_in", f"{tag}_out"):
            _unregister(client, name)
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def _unregister(client, name: str, attempts: int = 200) -> None:
    """Unregister a shared-memory region; over gRPC Triton may still hold it for a moment after the response has
    come ("currently in use"), so that answer is asked again until the region is let go."""
    import time

    for attempt in range(attempts):
        try:
            client.unregister_system_shared_memory(name)
            return
        except InferenceServerException as exc:
            if "currently in use" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.05)
