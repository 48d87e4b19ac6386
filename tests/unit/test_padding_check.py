"""bucket_paddable_dims checked at load (runtime/padding_check.py): a model that ignores its padding (a BERT, its
attention mask zero-padded too) pads requests up to their buckets and answers as the ONNX file; one that does not (a
mean over the sequence) is served without padding, saying why, so a request of another length gets the 400 or the
bucket_fallback instead of a wrong answer. Through ModelInstance, no Triton."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from gebackend.errors import InvalidRequest
from gebackend.modelzoo import build_bert

from test_padding_trim import _load

BERT_BUCKETS = {"static_model": "1", "bucket_paddable_dims": "sequence",
                "graph.ge.inputShape": "input_ids:-1,-1;attention_mask:-1,-1",
                "graph.ge.dynamicDims": "1,16,1,16;4,16,4,16;4,32,4,32"}
POOL_BUCKETS = {"static_model": "1", "bucket_paddable_dims": "seq", "graph.ge.inputShape": "x:-1,-1,8",
                "graph.ge.dynamicDims": "1,16;4,16"}


def build_mean_pool() -> onnx.ModelProto:
    """y = mean over the sequence of x @ w: zeros padded onto the sequence pull the mean towards 0."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _bert_request(rows: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(length)
    return {"input_ids": rng.integers(1, 1000, (rows, length)).astype(np.int64),
            "attention_mask": np.ones((rows, length), np.int64)}


def test_a_model_that_ignores_its_padding_is_padded_up_to_its_bucket(tmp_path):
    # bucket_plan=smallest: the smallest bucket holding a batch, always (bucket_plan=buckets measures each bucket's
    # cost at load and may split 2 rows into two runs of bucket 1 x 16 where that timed cheaper: a loaded machine did)
    instance, log, path = _load(tmp_path, "bert", build_bert(), bucket_plan="smallest", **BERT_BUCKETS)
    try:
        assert any("bucket_paddable_dims=sequence: checked at load: a request padded up to its bucket answers as "
                   "unpadded" in line for line in log.lines), log.lines
        feeds = _bert_request(2, 12)  # no bucket has 12 positions: padded to 16
        (result,) = instance.execute([feeds])
        runner = instance.executor.runner
        assert runner.runs_per_bucket == {1: 1} and runner.padded_rows == 2  # 2 x 12 padded up to the bucket 4 x 16
        expected = ort.InferenceSession(str(path)).run(None, feeds)
        np.testing.assert_allclose(result["pooler_output"], expected[1], rtol=1e-4, atol=1e-5)
        assert result["last_hidden_state"].shape == (2, 12, 64)
    finally:
        instance.close()


def test_a_lowered_model_is_checked_against_fp32(tmp_path):
    instance, log, _ = _load(tmp_path, "bert", build_bert(), precision_mode="int8", **BERT_BUCKETS)
    try:
        assert any("bucket_paddable_dims=sequence: checked at load" in line for line in log.lines), log.lines
    finally:
        instance.close()


def test_a_model_whose_answer_moves_when_padded_is_served_without_padding(tmp_path):
    instance, log, path = _load(tmp_path, "pool", build_mean_pool(), **POOL_BUCKETS)
    try:
        line = next(line for line in log.lines if line.startswith("gebackend: model 'pool': bucket_paddable_dims="))
        assert line.startswith("gebackend: model 'pool': bucket_paddable_dims=seq: not used, a request must match a "
                               "bucket's seq exactly (else bucket_fallback=error): output 'y' moves by ")
        assert "when x:[1, 12, 8] padded up to its bucket: the model does not ignore its padding" in line
        x = np.random.default_rng(1).standard_normal((1, 12, 8)).astype(np.float32)
        (result,) = instance.execute([{"x": x}])
        assert isinstance(result, InvalidRequest) and "match no compiled shape" in str(result)
        x16 = np.random.default_rng(2).standard_normal((1, 16, 8)).astype(np.float32)
        (exact,) = instance.execute([{"x": x16}])  # a bucket's own length still runs there
        np.testing.assert_allclose(exact["y"], ort.InferenceSession(str(path)).run(None, {"x": x16})[0], rtol=1e-5)
    finally:
        instance.close()


def test_without_padding_another_length_takes_the_dynamic_fallback(tmp_path):
    instance, log, path = _load(tmp_path, "pool", build_mean_pool(), bucket_fallback="dynamic", **POOL_BUCKETS)
    try:
        assert any("bucket_paddable_dims=seq: not used" in line and "bucket_fallback=dynamic" in line
                   for line in log.lines), log.lines
        x = np.random.default_rng(1).standard_normal((1, 12, 8)).astype(np.float32)
        (result,) = instance.execute([{"x": x}])
        np.testing.assert_allclose(result["y"], ort.InferenceSession(str(path)).run(None, {"x": x})[0], rtol=1e-5)
        assert instance.executor.runner.fallback_runs == 1 and instance.executor.runner.padded_rows == 0
    finally:
        instance.close()
