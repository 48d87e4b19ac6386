"""Unit tests for ragged batching: gebackend.config.ragged (allow_ragged_batch and batch_input, reconciled with the
ONNX file) and gebackend.runtime.ragged (one batch of ragged requests, batch inputs as Triton's onnxruntime backend
computes them), run through the executor on ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gebackend.config import dtypes
from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions
from gebackend.config.pbtxt import load_model_config
from gebackend.config.ragged import BatchInput
from gebackend.config.spec import build_model_spec, reconcile
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.errors import ConfigError
from gebackend.modelzoo import RAGGED_SUM_CONFIG, build_ragged_sum
from gebackend.runtime.executor import Executor
from gebackend.runtime.ragged import batch_input_value

HEAD = 'name: "rag"\nbackend: "ge"\nmax_batch_size: 8\n'
OUTPUTS = "".join(f'output [ {{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n'
                  for n in ("SUM", "END", "COUNT", "LONGEST_OUT", "ITEM"))


@pytest.fixture(scope="module")
def signature():
    return signature_of(build_ragged_sum())


def config(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "config.pbtxt"
    path.write_text(text)
    return load_model_config(path)


def test_batch_inputs_are_what_the_onnxruntime_backend_computes():
    shapes = [(1, 3), (2, 2), (1, 5)]  # three requests; the second sends two rows of two elements

    def value(kind, triton="TYPE_INT32"):
        return batch_input_value(BatchInput(kind, "T", dtypes.from_triton(triton), "X"), shapes)

    np.testing.assert_array_equal(value("BATCH_ELEMENT_COUNT"), np.array([3, 4, 5], np.int32))
    np.testing.assert_array_equal(value("BATCH_ACCUMULATED_ELEMENT_COUNT", "TYPE_FP32"), np.array([3, 7, 12], np.float32))
    np.testing.assert_array_equal(value("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"), np.array([0, 3, 7, 12], np.int32))
    assert value("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE").shape == (5,)
    np.testing.assert_array_equal(value("BATCH_ITEM_SHAPE"), np.array([[3], [2], [2], [5]], np.int32))  # one per row
    np.testing.assert_array_equal(value("BATCH_ITEM_SHAPE_FLATTEN"), np.array([3, 2, 2, 5], np.int32))
    assert value("BATCH_ELEMENT_COUNT", "TYPE_FP32").dtype == np.float32


def test_auto_complete_leaves_the_batch_inputs_out_and_keeps_the_ragged_dims(tmp_path, signature):
    result = reconcile("rag", config(tmp_path, HEAD + RAGGED_SUM_CONFIG), signature, 8)
    assert [(t.name, t.dims) for t in result.inputs] == [("INPUT", (-1,))]
    assert result.max_batch_size == 8
    assert result.ragged.ragged_inputs == {"INPUT"}
    assert [(b.kind, b.target) for b in result.ragged.batch_inputs][:2] == [
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "OFFSETS"), ("BATCH_ACCUMULATED_ELEMENT_COUNT", "ENDS")]


@pytest.mark.parametrize("change, message", [
    (('target_name: "ENDS"', 'target_name: "FINISH"'), r"batch_input 'FINISH' is not an input of the ONNX file"),
    (('target_name: "ENDS" data_type: TYPE_FP32', 'target_name: "ENDS" data_type: TYPE_INT32'),
     r"batch_input 'ENDS' is TYPE_INT32 in config.pbtxt but TYPE_FP32 in the ONNX file"),
    (('target_name: "ENDS" data_type: TYPE_FP32', 'target_name: "ENDS" data_type: TYPE_FP16'),
     r"batch_input 'ENDS' \(BATCH_ACCUMULATED_ELEMENT_COUNT\) has data_type TYPE_FP16; a batch input is one of"),
    (("kind: BATCH_ITEM_SHAPE ", "kind: BATCH_ITEM_SHAPE_FLATTEN "),
     r"batch_input 'ITEMS' \(BATCH_ITEM_SHAPE_FLATTEN\) makes a tensor of rank 1 but the ONNX file's has rank 2"),
    (('source_input: "INPUT" },\n  { kind: BATCH_ELEMENT_COUNT', 'source_input: "DATA" },\n  { kind: BATCH_ELEMENT_COUNT'),
     r"batch_input 'ENDS' describes input 'DATA', which config.pbtxt does not declare"),
    (("max_batch_size: 8", "max_batch_size: 0"), r"ragged batching \(allow_ragged_batch, batch_input\) needs batching"),
])
def test_a_ragged_config_that_contradicts_the_file_is_refused_naming_what(tmp_path, signature, change, message):
    with pytest.raises(ConfigError, match=message):
        reconcile("rag", config(tmp_path, (HEAD + RAGGED_SUM_CONFIG).replace(*change)), signature, 8)


def test_static_graphs_refuse_ragged_batching(tmp_path, signature):
    text = HEAD + RAGGED_SUM_CONFIG + OUTPUTS + 'parameters { key: "static_model" value: { string_value: "1" } }\n'
    with pytest.raises(ConfigError, match="ragged batching .* runs on the dynamic graph only"):
        build_model_spec(config(tmp_path, text), signature, tmp_path / "model.onnx", BackendOptions.make(static_model=True))


def test_requests_of_different_lengths_run_as_one_batch_and_each_gets_its_own_answer(tmp_path, signature):
    spec = build_model_spec(config(tmp_path, HEAD + RAGGED_SUM_CONFIG + OUTPUTS), signature, tmp_path / "m.onnx",
                            BackendOptions())
    path = tmp_path / "model.onnx"
    path.write_bytes(build_ragged_sum().SerializeToString())
    engine = OrtEngine(path, BackendOptions())
    runs = []
    executor = Executor.dynamic(spec, engine)
    real = executor.runner.run
    executor.runner.run = lambda feeds: runs.append(feeds) or real(feeds)
    requests = [{"INPUT": np.arange(1, n + 1, dtype=np.float32)[None, :]} for n in (3, 1, 4)]
    results = executor.execute(requests)
    assert len(runs) == 1 and runs[0]["INPUT"].shape == (8,)  # one run, the elements laid end to end
    for result, n, end in zip(results, (3, 1, 4), (3, 4, 8)):
        assert float(result["SUM"][0, 0]) == n * (n + 1) / 2
        assert float(result["COUNT"][0, 0]) == n and float(result["ITEM"][0, 0]) == n
        assert float(result["END"][0, 0]) == end and float(result["LONGEST_OUT"][0, 0]) == 4


def test_tune_refuses_a_ragged_model_saying_why(tmp_path, capsys):
    import onnx

    from gebackend.cli.main import main

    folder = tmp_path / "rag"
    (folder / "1").mkdir(parents=True)
    onnx.save(build_ragged_sum(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(HEAD + RAGGED_SUM_CONFIG)
    assert main(["tune", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "gebackend tune: model 'rag' uses ragged batching" in capsys.readouterr().err
