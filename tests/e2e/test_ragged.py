"""Ragged batching through the real Triton, as Triton's onnxruntime backend serves it: an input with
`allow_ragged_batch: true` and `batch_input`s of every element-count kind. Requests of different lengths, sent at
once, must be batched together and each answered from its own elements."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from gebackend.modelzoo import RAGGED_SUM_CONFIG, build_ragged_sum

from .conftest import add_model, params
from .server import start_server

pytestmark = pytest.mark.e2e

OUTPUTS = ("SUM", "END", "COUNT", "LONGEST_OUT", "ITEM")
CONFIG = ('backend: "ge"\nmax_batch_size: 8\n' + RAGGED_SUM_CONFIG
          + "".join(f'output [ {{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n' for n in OUTPUTS)
          + "dynamic_batching { max_queue_delay_microseconds: 200000 }\n")


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ragged")
    add_model(repo, "rag", CONFIG, build_ragged_sum())
    add_model(repo, "rag_static", CONFIG + params(static_model="1"), build_ragged_sum())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server
    server.stop()


def test_requests_of_different_lengths_are_batched_and_each_answered_from_its_own_elements(ragged):
    lengths = [3, 1, 7, 2, 5, 4]
    answers: dict[int, dict] = {}
    errors: list[BaseException] = []

    def one(n: int) -> None:
        values = np.arange(1, n + 1, dtype=np.float32)[None, :] * 10
        tensor = grpcclient.InferInput("INPUT", [1, n], "FP32")
        tensor.set_data_from_numpy(values)
        try:
            with grpcclient.InferenceServerClient(ragged.grpc_url) as client:
                result = client.infer("rag", [tensor])
            answers[n] = {name: float(result.as_numpy(name)[0, 0]) for name in OUTPUTS} | {"sent": float(values.sum())}
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in lengths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[0]
    for n, got in answers.items():
        assert got["SUM"] == got["sent"], (n, got)
        assert got["COUNT"] == n and got["ITEM"] == n, (n, got)
        assert n <= got["LONGEST_OUT"] <= max(lengths) and got["LONGEST_OUT"] in lengths, (n, got)
        assert n <= got["END"] <= sum(lengths), (n, got)  # its end offset in whatever batch it ran in
    with grpcclient.InferenceServerClient(ragged.grpc_url) as client:
        stats = client.get_inference_statistics("rag").model_stats[0]
    # several requests of different lengths shared a run: flattened end to end, described by the batch inputs
    assert stats.inference_count == len(lengths) and stats.execution_count < len(lengths), stats
    batched = [got for got in answers.values() if got["END"] > got["COUNT"]]
    assert batched, answers  # some request's elements came after another's in one run


def test_the_config_lists_no_batch_input_and_a_static_ragged_model_is_refused_naming_why(ragged):
    with grpcclient.InferenceServerClient(ragged.grpc_url) as client:
        config = client.get_model_config("rag", as_json=True)["config"]
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    assert re.search(r"model 'rag_static' failed to load: .*ragged batching \(allow_ragged_batch, batch_input\) runs "
                     r"on the dynamic graph only", ragged.output()), ragged.output()[-3000:]
