"""Unit tests for gebackend.runtime.executor: batched runs match single runs, and failures stay with their request."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec
from gebackend.engines.base import Engine, EngineInputError, EngineRunError
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.errors import InvalidRequest
from gebackend.modelzoo import build_add_mul, build_bert, build_identity_fixed, build_resnet
from gebackend.runtime.executor import Executor, InternalError

TOL = dict(rtol=1e-5, atol=1e-6)


class _Served:
    """A model saved to disk with its spec, the real OrtEngine executor and a plain onnxruntime reference."""

    def __init__(self, tmp: Path, name: str, model: onnx.ModelProto, config: dict):
        path = tmp / name / "1" / "model.onnx"
        path.parent.mkdir(parents=True)
        onnx.save(model, path)
        self.spec = build_model_spec({"name": name, **config}, signature_of(model), path, BackendOptions())
        self.executor = Executor.dynamic(self.spec, OrtEngine(path, BackendOptions()))
        self.reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.reference.get_outputs()]

    def alone(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.reference.run(self.output_names, dict(inputs))))

    def assert_matches_alone(self, inputs, result) -> None:
        assert isinstance(result, dict), f"expected outputs, got {result!r}"
        expected = self.alone(inputs)
        assert set(result) == set(expected)
        for name, value in expected.items():
            assert result[name].shape == value.shape, name
            assert result[name].dtype == value.dtype, name
            np.testing.assert_allclose(result[name], value, **TOL, err_msg=name)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    served = _Served(tmp_path_factory.mktemp("bert"), "bert_ge", build_bert(), {"max_batch_size": 8})
    yield served
    served.executor.close()


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    served = _Served(tmp_path_factory.mktemp("resnet"), "resnet_ge", build_resnet(), {"max_batch_size": 8})
    yield served
    served.executor.close()


def _bert_request(rng, rows: int, seq: int) -> dict[str, np.ndarray]:
    mask = np.ones((rows, seq), dtype=np.int64)
    for i in range(rows):  # each row padded differently
        mask[i, seq - i:] = 0
    return {"input_ids": rng.integers(0, 1000, (rows, seq), dtype=np.int64), "attention_mask": mask}


def _image(rng, rows: int) -> dict[str, np.ndarray]:
    return {"image": rng.standard_normal((rows, 3, 64, 64)).astype(np.float32)}


def test_bert_batch_mixed_sizes_and_sequence_lengths(bert):
    rng = np.random.default_rng(0)
    requests = [
        _bert_request(rng, 1, 12),
        _bert_request(rng, 3, 7),
        _bert_request(rng, 2, 12),
        _bert_request(rng, 1, 7),
        _bert_request(rng, 2, 20),
    ]
    results = bert.executor.execute(requests)
    assert len(results) == len(requests)
    for request, result in zip(requests, results):
        bert.assert_matches_alone(request, result)
        rows, seq = request["input_ids"].shape
        assert result["last_hidden_state"].shape == (rows, seq, 64)
        assert result["pooler_output"].shape == (rows, 64)


def test_resnet_batch_mixed_sizes(resnet):
    rng = np.random.default_rng(1)
    requests = [_image(rng, n) for n in (1, 3, 2, 1)]
    results = resnet.executor.execute(requests)
    assert len(results) == 4
    for request, result in zip(requests, results):
        resnet.assert_matches_alone(request, result)
        assert result["logits"].shape == (request["image"].shape[0], 10)
    # the outputs differ between requests: nothing was mixed up or broadcast
    assert not np.allclose(results[0]["logits"], results[3]["logits"])


def test_bad_request_fails_alone_bert(bert):
    rng = np.random.default_rng(2)
    good_a = _bert_request(rng, 2, 9)
    bad = _bert_request(rng, 1, 9)
    bad["attention_mask"] = bad["attention_mask"].astype(np.int32)
    good_b = _bert_request(rng, 1, 9)
    results = bert.executor.execute([good_a, bad, good_b])
    assert isinstance(results[1], InvalidRequest)
    assert "'bert_ge'" in str(results[1]) and "'attention_mask'" in str(results[1])
    assert "INT64" in str(results[1]) and "int32" in str(results[1])
    bert.assert_matches_alone(good_a, results[0])
    bert.assert_matches_alone(good_b, results[2])


def test_bad_request_fails_alone_resnet(resnet):
    rng = np.random.default_rng(3)
    good = [_image(rng, 2), _image(rng, 1)]
    too_big = _image(rng, 9)
    wrong_size = {"image": np.zeros((1, 3, 32, 32), np.float32)}
    results = resnet.executor.execute([good[0], too_big, wrong_size, good[1]])
    assert isinstance(results[1], InvalidRequest) and "max_batch_size 8" in str(results[1])
    assert isinstance(results[2], InvalidRequest) and "dim 2 must be 64" in str(results[2])
    resnet.assert_matches_alone(good[0], results[0])
    resnet.assert_matches_alone(good[1], results[3])


def test_all_requests_bad(resnet):
    results = resnet.executor.execute([{"img": np.zeros((1, 3, 64, 64), np.float32)}, {}])
    assert [type(r) for r in results] == [InvalidRequest, InvalidRequest]
    assert "'img'" in str(results[0])
    assert "missing" in str(results[1])


def test_empty_call(resnet):
    assert resnet.executor.execute([]) == []


# ---------------------------------------------------------------- fake engines

MARKER = -999.0


class MarkerEngine(Engine):
    """add_mul in numpy; fails the whole run whenever a row of x starts with MARKER."""

    name = "marker"

    def __init__(self, error=EngineRunError):
        self.error = error
        self.calls: list[int] = []  # rows per run
        self.closed = False

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        x, y = feeds["x"], feeds["y"]
        self.calls.append(int(x.shape[0]))
        if np.any(x[:, 0] == MARKER):
            raise self.error("marker row present")
        computed = {"sum": x + y, "product": x * y}
        return [computed[n] for n in output_names]

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def add_mul_spec():
    return build_model_spec({"name": "add_mul", "max_batch_size": 8}, signature_of(build_add_mul()), Path("a.onnx"), BackendOptions())


def _xy(rows: int, seed: int, marked: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    if marked:
        x[-1, 0] = MARKER
    return {"x": x, "y": rng.standard_normal((rows, 4)).astype(np.float32)}


def test_failed_batch_is_retried_one_by_one(add_mul_spec):
    engine = MarkerEngine()
    executor = Executor.dynamic(add_mul_spec, engine)
    requests = [_xy(2, 0), _xy(1, 1), _xy(3, 2, marked=True), _xy(1, 3)]
    results = executor.execute(requests)
    assert engine.calls == [7, 2, 1, 3, 1]  # one batched run, then each request alone
    assert isinstance(results[2], InternalError)
    assert not isinstance(results[2], InvalidRequest)
    assert "'add_mul'" in str(results[2]) and "marker row present" in str(results[2])
    for index in (0, 1, 3):
        result = results[index]
        assert isinstance(result, dict), result
        np.testing.assert_array_equal(result["sum"], requests[index]["x"] + requests[index]["y"])
        np.testing.assert_array_equal(result["product"], requests[index]["x"] * requests[index]["y"])
    executor.close()
    assert engine.closed


def test_batch_without_marker_runs_once(add_mul_spec):
    engine = MarkerEngine()
    requests = [_xy(1, 4), _xy(3, 5), _xy(2, 6)]
    results = Executor.dynamic(add_mul_spec, engine).execute(requests)
    assert engine.calls == [6]
    for request, result in zip(requests, results):
        np.testing.assert_array_equal(result["sum"], request["x"] + request["y"])


def test_single_marked_request_fails_without_retry(add_mul_spec):
    engine = MarkerEngine()
    results = Executor.dynamic(add_mul_spec, engine).execute([_xy(2, 7, marked=True)])
    assert engine.calls == [2]
    assert isinstance(results[0], InternalError)


def test_engine_input_error_maps_to_invalid_request(add_mul_spec):
    engine = MarkerEngine(error=EngineInputError)
    requests = [_xy(1, 8), _xy(2, 9, marked=True)]
    results = Executor.dynamic(add_mul_spec, engine).execute(requests)
    assert type(results[1]) is InvalidRequest
    assert not isinstance(results[1], InternalError)
    assert "model 'add_mul'" in str(results[1])
    assert "marker row present" in str(results[1])
    np.testing.assert_array_equal(results[0]["product"], requests[0]["x"] * requests[0]["y"])


class LostBatchEngine(Engine):
    def run(self, feeds, output_names):
        return [np.zeros((1, 4), np.float32) for _ in output_names]


def test_output_without_batch_axis_is_an_error_not_a_crash(add_mul_spec):
    results = Executor.dynamic(add_mul_spec, LostBatchEngine()).execute([_xy(2, 10), _xy(3, 11)])
    assert len(results) == 2
    for result in results:
        assert not isinstance(result, dict)
        assert "'sum'" in str(result)


# ---------------------------------------------------------------- non-batching model


def test_non_batching_model_runs_each_request(tmp_path):
    model = build_identity_fixed()
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    config = {"name": "ident", "max_batch_size": 0, "input": [{"name": "x", "dims": [2, 3]}]}
    spec = build_model_spec(config, signature_of(model), path, BackendOptions())
    assert spec.batching is False

    calls = []

    class Counting(OrtEngine):
        def run(self, feeds, output_names):
            calls.append({k: v.shape for k, v in feeds.items()})
            return super().run(feeds, output_names)

    executor = Executor.dynamic(spec, Counting(path, BackendOptions()))
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * i for i in range(3)]
    bad = np.zeros((1, 2, 3), np.float32)
    results = executor.execute([{"x": xs[0]}, {"x": bad}, {"x": xs[1]}, {"x": xs[2]}])
    assert calls == [{"x": (2, 3)}] * 3
    assert isinstance(results[1], InvalidRequest) and "'ident'" in str(results[1])
    for x, result in zip(xs, [results[0], results[2], results[3]]):
        assert list(result) == ["y"]
        np.testing.assert_array_equal(result["y"], x)
    executor.close()


# ---------------------------------------------------------------- empty tensors


def _boxes_model(op: str) -> onnx.ModelProto:
    """boxes [n, k, 4] -> per box: the sum of its k corners (ReduceSum), or its first corner (Gather index 0)."""
    from onnx import TensorProto, helper

    if op == "sum":
        node = helper.make_node("ReduceSum", ["boxes", "axis"], ["out"], keepdims=0)
        init = [helper.make_tensor("axis", TensorProto.INT64, [1], [1])]
    else:
        node = helper.make_node("Gather", ["boxes", "first"], ["out"], axis=1)
        init = [helper.make_tensor("first", TensorProto.INT64, [], [0])]
    graph = helper.make_graph([node], "boxes", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["n", "k", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 4])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_an_empty_tensor_runs_when_the_model_computes_on_it(tmp_path):
    served = _Served(tmp_path, "boxes_sum", _boxes_model("sum"), {"max_batch_size": 8})
    requests = [{"boxes": np.zeros((2, 0, 4), np.float32)}, {"boxes": np.zeros((1, 0, 4), np.float32)}]
    results = served.executor.execute(requests)
    for inputs, result in zip(requests, results):
        assert isinstance(result, dict), result
        assert result["out"].shape == (inputs["boxes"].shape[0], 4)
        served.assert_matches_alone(inputs, result)  # zeros: the sum of no corners


def test_an_empty_tensor_the_model_cannot_run_on_is_the_requests_fault_and_named(tmp_path):
    served = _Served(tmp_path, "boxes_first", _boxes_model("first"), {"max_batch_size": 8})
    good = {"boxes": np.arange(24, dtype=np.float32).reshape(2, 3, 4)}
    results = served.executor.execute([{"boxes": np.zeros((1, 0, 4), np.float32)}, good])
    assert isinstance(results[0], InvalidRequest) and not isinstance(results[0], InternalError)
    message = str(results[0])
    assert "'boxes_first'" in message and "'boxes'" in message and "empty tensor" in message and "[1, 0, 4]" in message
    served.assert_matches_alone(good, results[1])


def test_a_request_giving_one_dim_name_two_sizes_runs_and_a_failure_names_them(bert):
    rng = np.random.default_rng(5)
    request = _bert_request(rng, 2, 9)
    request["attention_mask"] = request["attention_mask"][:, :7]  # 'sequence' 9 and 7: the model cannot add them
    result = bert.executor.execute([request])[0]
    assert isinstance(result, InvalidRequest), result
    message = str(result)
    assert "'bert_ge'" in message and "'sequence' = 7" in message and "'sequence' = 9" in message
    good = _bert_request(rng, 1, 9)
    bert.assert_matches_alone(good, bert.executor.execute([good])[0])


def test_the_engine_share_of_each_batch_is_counted_once_per_run(add_mul_spec, monkeypatch):
    """executor.clock counts the engine's runs only: a batched run that fails and is retried one by one counts each
    run it made (a fake clock: every run takes 1,000 ns a row)."""
    from gebackend.runtime import executor as executor_module

    now = [0]
    monkeypatch.setattr(executor_module.time, "perf_counter_ns", lambda: now[0])

    class TimedEngine(MarkerEngine):
        def run(self, feeds, output_names):
            now[0] += 1000 * int(feeds["x"].shape[0])
            return super().run(feeds, output_names)

    executor = Executor.dynamic(add_mul_spec, TimedEngine())
    executor.execute([_xy(2, 0), _xy(3, 1)])
    assert executor.clock.ns["engine"] == 5000
    executor.execute([_xy(1, 2), _xy(2, 3, marked=True)])  # 3 rows batched, then 1 and 2 alone
    assert executor.clock.ns["engine"] == 5000 + 3000 + 1000 + 2000
    assert executor.clock.executions == 0  # an execution is counted by its caller (triton/bridge.py), with its phases
