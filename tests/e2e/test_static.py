"""Static graph mode and shape buckets, end to end through real Triton."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from .conftest import TWINS
from .test_serving import client_for, example_feeds, infer, reference

pytestmark = pytest.mark.e2e


def assert_same(got, want):
    for name, expected in want.items():
        np.testing.assert_allclose(got.as_numpy(name), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("twin", sorted(TWINS))
@pytest.mark.parametrize("batch", [1, 3])
def test_static_outputs_equal_dynamic(server, twin, batch):
    original = TWINS[twin][0]
    feeds = example_feeds(original, np.random.default_rng(batch), batch=batch)
    static, dynamic = infer(server, "grpc", twin, feeds), infer(server, "grpc", original, feeds)
    for name in ("logits", "last_hidden_state", "pooler_output"):
        if dynamic.as_numpy(name) is not None:
            np.testing.assert_allclose(static.as_numpy(name), dynamic.as_numpy(name), rtol=1e-4, atol=1e-5)


def test_static_models_log_compilation_and_doctor(server):
    out = server.output()
    assert re.search(r"model 'bert_ge_static': compiled static graph 3/3 \[input_ids:4,32 attention_mask:4,32\]", out)
    assert re.search(r"model 'bert_ge_static': graph doctor: ", out)
    assert re.search(r"model 'resnet_ge_static' instance .* static graph, buckets \[image:\[1, 3, 64, 64\] \| image:\[2, 3, 64, 64\] "
                     r"\| image:\[4, 3, 64, 64\] \| image:\[8, 3, 64, 64\]\]", out)
    # In its stub the buckets share one ONNX Runtime thread pool (shared_thread_pool=auto), spinning as ORT's default
    loaded = re.search(r"model 'resnet_ge_static' instance '[^']+' loaded .*", out).group(0)
    assert re.search(r"intra_op_threads=\S+ on one thread pool shared by the buckets", loaded)
    assert "force_spinning_stop" not in loaded
    # Pad or split is measured per bucket at load (runtime/bucket_costs.py), and said.
    assert re.search(r"model 'resnet_ge_static': bucket run costs measured at load: \[image:1,3,64,64\] [0-9.]+ ms, "
                     r"\[image:2,3,64,64\] [0-9.]+ ms, \[image:4,3,64,64\] [0-9.]+ ms, \[image:8,3,64,64\] [0-9.]+ ms; ", out)


def test_a_batch_size_measured_faster_unspecialised_runs_on_the_dynamic_graph(server, repository):
    """Buckets 2 and 4 only: timed at load, one row runs faster on the dynamic graph than padded to bucket 2 (half
    its compute is padding), so it runs there, unpadded, and the metrics count it under bucket="dynamic"."""
    from .test_profiling import metric, scrape, scrape_when

    out = server.output()
    line = re.search(r"model 'resnet_ge_static_gaps': bucket run costs measured at load: .*", out).group(0)
    assert re.search(r"; run whole on the dynamic graph, measured faster: 1 \([0-9.]+ ms against [0-9.]+\)", line), line
    loaded = re.search(r"model 'resnet_ge_static_gaps' instance '[^']+' loaded .*", out).group(0)
    assert re.search(r"buckets \[image:\[2, 3, 64, 64\] \| image:\[4, 3, 64, 64\]\], fallback=error, batch sizes "
                     r"1(,[0-9])* on the dynamic graph", loaded), loaded
    time.sleep(1.5)  # what earlier tests ran is published
    before = scrape(server)
    runs, padded = (metric(before, "gebackend_bucket_runs_total", model="resnet_ge_static_gaps", bucket="dynamic"),
                    metric(before, "gebackend_padded_rows_total", model="resnet_ge_static_gaps"))
    feeds = example_feeds("resnet", np.random.default_rng(5), batch=1)
    assert_same(infer(server, "http", "resnet_ge_static_gaps", feeds), reference(repository, "resnet_ge", feeds))
    after = scrape_when(server, lambda t: metric(t, "gebackend_bucket_runs_total", model="resnet_ge_static_gaps",
                                                 bucket="dynamic") > runs)
    assert metric(after, "gebackend_bucket_runs_total", model="resnet_ge_static_gaps", bucket="dynamic") == runs + 1
    assert metric(after, "gebackend_padded_rows_total", model="resnet_ge_static_gaps") == padded  # nothing padded


def test_buckets_with_dynamic_batching_under_concurrency(server, repository):
    """Requests of many shapes, batched by Triton, padded to buckets: each answer equals onnxruntime on it alone."""
    rng = np.random.default_rng(11)
    requests = []
    for i in range(24):
        rows, length = int(rng.integers(1, 3)), int(rng.integers(3, 33))
        ids = rng.integers(0, 1000, size=(rows, length), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[:, length - int(rng.integers(0, 3)):] = 0
        requests.append({"input_ids": ids, "attention_mask": mask})

    def send(feeds):
        return infer(server, "grpc", "bert_ge_static", feeds)

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(send, requests))
    for feeds, result in zip(requests, results):
        assert_same(result, reference(repository, "bert_ge", feeds))
    _, client = client_for(server, "http")
    stats = client.get_inference_statistics("bert_ge_static")["model_stats"][0]
    assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shape_outside_every_bucket_is_a_400_naming_the_shapes(server, protocol):
    ids = np.zeros((1, 40), np.int64)
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, "bert_ge_static", {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert str(info.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
    message = str(info.value)
    assert "bert_ge_static" in message and "input_ids:[1, 40]" in message and "input_ids:[4, 32]" in message
    # still serving
    feeds = example_feeds("bert_ge", np.random.default_rng(0), batch=1)
    assert infer(server, protocol, "bert_ge_static", feeds).as_numpy("pooler_output").shape == (1, 64)


def test_fallback_runs_unmatched_shapes_dynamically(server, repository):
    feeds = example_feeds("bert_ge", np.random.default_rng(5), batch=2)  # 11 tokens: no 16-token padding allowed
    assert_same(infer(server, "http", "bert_ge_fallback", feeds), reference(repository, "bert_ge", feeds))
    ids = np.random.default_rng(6).integers(0, 1000, size=(3, 16), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}  # fits the 4x16 bucket
    assert_same(infer(server, "http", "bert_ge_fallback", feeds), reference(repository, "bert_ge", feeds))


def test_static_with_a_free_dim_serves_the_dynamic_graph_and_says_how_to_fix(server, repository):
    out = server.output()
    warned = re.search(r"model 'bert_static_unresolved': static graph mode: WARNING (.*)", out)
    assert warned, out[-3000:]
    assert "input 'input_ids' dim 1 ('sequence') is free and no bucket fixes it" in warned.group(1)
    assert "graph.ge.inputShape" in warned.group(1)
    assert re.search(r"model 'bert_static_unresolved' instance .* dynamic graph \(static graph not used", out), out[-3000:]
    feeds = example_feeds("bert_ge", np.random.default_rng(7), batch=2)
    assert_same(infer(server, "http", "bert_static_unresolved", feeds), reference(repository, "bert_ge", feeds))
