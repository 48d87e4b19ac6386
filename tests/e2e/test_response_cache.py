"""Triton's response cache in front of a `ge` model, as in front of the onnxruntime backend's: a config written with
`response_cache { enable: true }` and `gebackend serve REPO -- --cache-config local,size=N` answer repeated requests
from the cache (Triton's statistics count the hits), and the answers are the model's."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from gebackend.modelzoo import build_add_mul

from .conftest import add_model
from .server import start_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache")
    add_model(repo, "am", 'backend: "ge"\nmax_batch_size: 8\nresponse_cache { enable: true }\n', build_add_mul())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log",
                          ["--", "--cache-config", "local,size=1048576"])
    yield server
    server.stop()


def test_repeated_requests_are_answered_from_triton_s_cache(served):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    answers = []
    with httpclient.InferenceServerClient(served.http_url) as client:
        for _ in range(3):
            inputs = [httpclient.InferInput(name, [1, 4], "FP32") for name in ("x", "y")]
            for tensor in inputs:
                tensor.set_data_from_numpy(x)
            answers.append(client.infer("am", inputs))
        stats = client.get_inference_statistics("am")["model_stats"][0]
    assert stats["inference_stats"]["cache_hit"]["count"] == 2 and stats["execution_count"] == 1, stats
    session = ort.InferenceSession(build_add_mul().SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(names, {"x": x, "y": x})))
    for answer in answers:  # the cached ones too
        for name in names:
            np.testing.assert_array_equal(answer.as_numpy(name), want[name])
    assert "enable response_cache but tritonserver has no cache" not in served.output()
