"""trim_padding through the real server: texts padded to the context, as CN_CLIP's tokenizer sends them, are answered
as the ONNX file answers them at full length, by both protocols and batched together; the server log says each batch
runs cut (dynamic graph, and static buckets of shorter lengths). A model that reads its padding is served uncut with
the reason in the log; an option naming no input fails that model's load, naming it, while the others serve."""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gebackend.modelzoo.cnclip_standin import build_cnclip_text_standin

from .conftest import add_model, params
from .server import start_server
from .test_profiling import metric, scrape, scrape_when
from .test_serving import client_for, infer, reference

pytestmark = pytest.mark.e2e

CONTEXT = 52
BATCHING = 'backend: "ge"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 50000 }\n'
STATIC_BUCKETS = {"static_model": "1", "bucket_plan": "smallest", "graph.ge.inputShape": "text:-1,-1",
                  "graph.ge.dynamicDims": "1,16;1,52;4,16;4,52;8,16;8,52"}


def _unmasked() -> onnx.ModelProto:
    """Mean of the token embeddings over all 52 positions: the padding counts, so cutting it moves the answer."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [500, 4], np.random.default_rng(0).random(2000).tolist())
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "text"], ["tokens"]),
         helper.make_node("ReduceMean", ["tokens"], ["mean"], axes=[1], keepdims=0)],
        "unmasked", [helper.make_tensor_value_info("text", TensorProto.INT64, ["batch", CONTEXT])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 4])], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def trim_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("trim") / "models"
    add_model(repo, "text_trim", BATCHING + params(trim_padding="text"), build_cnclip_text_standin())
    add_model(repo, "text_trim_static", BATCHING + params(trim_padding="text", **STATIC_BUCKETS),
              build_cnclip_text_standin())
    add_model(repo, "unmasked_trim", BATCHING + params(trim_padding="text"), _unmasked())
    add_model(repo, "text_bad_trim", BATCHING + params(trim_padding="input_ids"), build_cnclip_text_standin())
    running = start_server(repo, repo.parent / "serve.log")
    yield running, repo
    running.stop()


def _texts(lengths, seed):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), CONTEXT), np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, 500, n)
    return ids


@pytest.mark.parametrize("model, cut_to", [("text_trim", "cut after its last token other than 0"),
                                           ("text_trim_static", "cut after its last token other than 0, to compiled lengths [16, 52]")])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_padded_texts_are_answered_as_at_full_length_and_run_cut(trim_server, model, cut_to, protocol):
    server, repo = trim_server
    log = server.output()
    assert f"model '{model}': trim_padding: 'text' {cut_to}" in log and "checked at load" in log
    for lengths, seed in (([7], 1), ([3, 12, 40], 2), ([52], 3), ([0, 5], 4)):
        ids = _texts(lengths, seed)
        got = infer(server, protocol, model, {"text": ids}).as_numpy("unnorm_text_features")
        np.testing.assert_allclose(got, reference(repo, model, {"text": ids})["unnorm_text_features"],
                                   rtol=1e-5, atol=1e-6)


def test_requests_batched_together_each_get_their_own_answer(trim_server):
    server, repo = trim_server
    requests = [_texts([n], seed) for seed, n in enumerate((4, 9, 30, 2, 17, 11, 52, 6), start=10)]
    module, client = client_for(server, "grpc")

    def send(ids):
        tensor = module.InferInput("text", list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids)
        return client.infer("text_trim", [tensor]).as_numpy("unnorm_text_features")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, requests))
    for ids, got in zip(requests, answers):
        np.testing.assert_allclose(got, reference(repo, "text_trim", {"text": ids})["unnorm_text_features"],
                                   rtol=1e-5, atol=1e-6)


def test_a_model_that_reads_its_padding_is_served_uncut_with_the_reason(trim_server):
    server, repo = trim_server
    assert ("model 'unmasked_trim': trim_padding: not used, every batch runs at the full length: output 'mean' moves"
            in server.output())
    ids = _texts([5, 20], 7)
    got = infer(server, "http", "unmasked_trim", {"text": ids}).as_numpy("mean")
    np.testing.assert_allclose(got, reference(repo, "unmasked_trim", {"text": ids})["mean"], rtol=1e-6)


def test_an_option_naming_no_input_fails_that_load_naming_it(trim_server):
    server, _ = trim_server
    _, client = client_for(server, "http")
    assert not client.is_model_ready("text_bad_trim")
    assert "model 'text_bad_trim': trim_padding names input 'input_ids', but the model's inputs are ['text']" in server.output()
    assert client.is_model_ready("text_trim")


def test_the_static_graph_runs_short_texts_on_its_short_buckets(trim_server):
    """The event that the cut happened, as Triton's metrics endpoint shows it: 3 rows of at most 16 tokens run on the
    4x16 bucket, a full-length text on 1x52."""
    server, _ = trim_server
    time.sleep(1.5)  # what earlier tests ran is published
    before = scrape(server)
    short, full = "text:[4, 16]", "text:[1, 52]"
    runs = {b: metric(before, "gebackend_bucket_runs_total", model="text_trim_static", bucket=b) for b in (short, full)}
    infer(server, "grpc", "text_trim_static", {"text": _texts([3, 16, 9], 21)})
    infer(server, "grpc", "text_trim_static", {"text": _texts([52], 22)})
    after = scrape_when(server, lambda t: metric(t, "gebackend_bucket_runs_total", model="text_trim_static",
                                                 bucket=full) >= runs[full] + 1)
    assert metric(after, "gebackend_bucket_runs_total", model="text_trim_static", bucket=short) - runs[short] == 1
    assert metric(after, "gebackend_bucket_runs_total", model="text_trim_static", bucket=full) - runs[full] == 1


def test_the_metrics_endpoint_counts_the_positions_sent_and_cut(trim_server):
    server, _ = trim_server
    time.sleep(1.5)  # what earlier tests ran is published
    before = scrape(server)
    sent = metric(before, "gebackend_token_positions_total", model="text_trim")
    cut = metric(before, "gebackend_trimmed_positions_total", model="text_trim")
    infer(server, "http", "text_trim", {"text": _texts([7, 3], 31)})  # 2 rows of 52, cut to 7
    after = scrape_when(server, lambda t: metric(t, "gebackend_token_positions_total", model="text_trim") > sent)
    assert metric(after, "gebackend_token_positions_total", model="text_trim") - sent == 2 * CONTEXT
    assert metric(after, "gebackend_trimmed_positions_total", model="text_trim") - cut == 2 * (CONTEXT - 7)
    assert "gebackend_token_positions_total{" not in "".join(  # a model that is not cut has no such series
        line for line in after.splitlines() if 'model="unmasked_trim"' in line)
