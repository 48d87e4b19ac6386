"""Unit tests for gebackend.runtime.validation: every bad request is refused with a message a client can act on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec
from gebackend.errors import InvalidRequest
from gebackend.modelzoo import build_bert, build_identity_fixed, build_resnet
from gebackend.runtime.validation import broken_tie, validate_request


@pytest.fixture(scope="module")
def bert_spec():
    return build_model_spec({"name": "bert_ge", "max_batch_size": 4}, signature_of(build_bert()), Path("b.onnx"), BackendOptions())


@pytest.fixture(scope="module")
def resnet_spec():
    return build_model_spec({"name": "resnet_ge", "max_batch_size": 8}, signature_of(build_resnet()), Path("r.onnx"), BackendOptions())


@pytest.fixture(scope="module")
def fixed_spec():
    config = {"name": "ident", "max_batch_size": 0, "input": [{"name": "x", "dims": [2, 3]}]}
    return build_model_spec(config, signature_of(build_identity_fixed()), Path("i.onnx"), BackendOptions())


def _bert(rows=2, seq=7, ids_dtype=np.int64, mask_seq=None, mask_rows=None):
    return {
        "input_ids": np.ones((rows, seq), dtype=ids_dtype),
        "attention_mask": np.ones((mask_rows or rows, mask_seq or seq), dtype=np.int64),
    }


def _image(rows=1, shape=(3, 64, 64), dtype=np.float32):
    return {"image": np.zeros((rows, *shape), dtype=dtype)}


def _refused(spec, inputs) -> str:
    with pytest.raises(InvalidRequest) as info:
        validate_request(spec, inputs)
    return str(info.value)


def test_spec_shapes(bert_spec, resnet_spec):
    assert bert_spec.max_batch_size == 4 and bert_spec.batching
    assert [t.dims for t in bert_spec.inputs] == [(-1,), (-1,)]
    assert resnet_spec.input("image").dims == (3, 64, 64)


@pytest.mark.parametrize("rows,seq", [(1, 1), (2, 7), (4, 128)])
def test_valid_bert_requests_pass(bert_spec, rows, seq):
    assert validate_request(bert_spec, _bert(rows, seq)) is None


@pytest.mark.parametrize("rows", [1, 8])
def test_valid_resnet_requests_pass(resnet_spec, rows):
    assert validate_request(resnet_spec, _image(rows)) is None


def test_valid_non_batching_request_passes(fixed_spec):
    assert validate_request(fixed_spec, {"x": np.zeros((2, 3), np.float32)}) is None


def test_unknown_input(bert_spec):
    inputs = _bert()
    inputs["token_type_ids"] = np.zeros((2, 7), np.int64)
    message = _refused(bert_spec, inputs)
    assert "'bert_ge'" in message
    assert "'token_type_ids'" in message
    assert "['input_ids', 'attention_mask']" in message


def test_missing_input(bert_spec):
    inputs = _bert()
    del inputs["attention_mask"]
    message = _refused(bert_spec, inputs)
    assert "'bert_ge'" in message
    assert "'attention_mask'" in message and "missing" in message
    assert "['input_ids', 'attention_mask']" in message


def test_wrong_dtype(bert_spec):
    message = _refused(bert_spec, _bert(ids_dtype=np.int32))
    assert "'bert_ge'" in message
    assert "'input_ids'" in message
    assert "expected data type INT64" in message
    assert "got int32" in message


def test_wrong_dtype_resnet_and_bytes(resnet_spec):
    message = _refused(resnet_spec, _image(dtype=np.float64))
    assert "'resnet_ge'" in message and "'image'" in message
    assert "FP32" in message and "float64" in message
    message = _refused(resnet_spec, {"image": np.array([[b"a"]], dtype=object)})
    assert "FP32" in message and "got BYTES" in message


def test_wrong_rank(resnet_spec):
    message = _refused(resnet_spec, {"image": np.zeros((3, 64, 64), np.float32)})
    assert "'resnet_ge'" in message
    assert "'image'" in message
    assert "[batch, 3, 64, 64]" in message and "rank 4" in message
    assert "[3, 64, 64]" in message and "rank 3" in message


def test_wrong_rank_bert_uses_dim_names(bert_spec):
    message = _refused(bert_spec, {"input_ids": np.ones((2, 7, 1), np.int64), "attention_mask": np.ones((2, 7), np.int64)})
    assert "'input_ids'" in message
    assert "[batch, sequence]" in message
    assert "[2, 7, 1]" in message and "rank 3" in message


def test_wrong_fixed_dim(resnet_spec):
    message = _refused(resnet_spec, _image(rows=2, shape=(3, 224, 224)))
    assert "'resnet_ge'" in message
    assert "'image'" in message
    assert "[batch, 3, 64, 64]" in message
    assert "[2, 3, 224, 224]" in message
    assert "dim 2 must be 64" in message


def test_wrong_fixed_dim_non_batching(fixed_spec):
    message = _refused(fixed_spec, {"x": np.zeros((3, 3), np.float32)})
    assert "'ident'" in message and "'x'" in message
    assert "[2, 3]" in message and "[3, 3]" in message
    assert "dim 0 must be 2" in message


def test_batch_over_max_batch_size(resnet_spec, bert_spec):
    message = _refused(resnet_spec, _image(rows=9))
    assert "'resnet_ge'" in message and "'image'" in message
    assert "batch size 9" in message and "max_batch_size 8" in message
    message = _refused(bert_spec, _bert(rows=5))
    assert "'bert_ge'" in message and "'input_ids'" in message
    assert "batch size 5" in message and "max_batch_size 4" in message


def test_mismatched_batch_sizes(bert_spec):
    message = _refused(bert_spec, _bert(rows=2, mask_rows=3))
    assert "'bert_ge'" in message
    assert "'attention_mask'" in message
    assert "batch size 3" in message
    assert "'input_ids' (2)" in message


def test_a_dim_name_given_two_sizes_is_not_refused_but_named(bert_spec):
    # the file names both axes 'sequence': a hint, never a contract; the engine decides and broken_tie explains
    request = _bert(rows=2, seq=7, mask_seq=9)
    assert validate_request(bert_spec, request) is None
    note = broken_tie(bert_spec, request)
    assert "'attention_mask'" in note and "'input_ids'" in note
    assert "'sequence' = 9" in note and "'sequence' = 7" in note and "[2, 9]" in note
    assert broken_tie(bert_spec, _bert(rows=2, seq=7)) is None


def _placeholder_classifier(dim: str = "?", opset: int = 13) -> onnx.ModelProto:
    """paddle2onnx's direction classifier's signature: x: [?, 3, ?, ?], every free axis named '?'."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3, dim, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 3])
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)
    return helper.make_model(helper.make_graph([node], "cls", [x], [y]), opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dim", ["?", "unk__7", "p2o.DynamicDimension.0", "DynamicDimension.1"])
def test_placeholder_dim_names_tie_nothing(dim):
    spec = build_model_spec({"name": "ocr_cls", "max_batch_size": 4}, signature_of(_placeholder_classifier(dim)),
                            Path("c.onnx"), BackendOptions())
    assert spec.input("x").labels == (None, None, None)
    request = {"x": np.zeros((4, 3, 48, 192), np.float32)}
    assert validate_request(spec, request) is None and broken_tie(spec, request) is None


def test_the_configs_dims_win_over_the_files_names(bert_spec):
    config = {"name": "bert_ge", "max_batch_size": 4,
              "input": [{"name": "input_ids", "dims": [16]}, {"name": "attention_mask", "dims": [-1]}]}
    spec = build_model_spec(config, signature_of(build_bert()), Path("b.onnx"), BackendOptions())
    assert spec.input("input_ids").labels == (None,)  # fixed by the config: no name to tie
    assert spec.input("attention_mask").labels == ("sequence",)
    assert broken_tie(spec, _bert(rows=1, seq=16, mask_seq=9)) is None


def test_a_batch_of_no_rows_is_refused(bert_spec):
    message = _refused(bert_spec, _bert(rows=0))
    assert "'bert_ge'" in message and "'input_ids'" in message
    assert "batch size 0" in message and "[0, 7]" in message


def test_an_empty_image_batch_is_refused(resnet_spec):
    message = _refused(resnet_spec, _image(rows=0))
    assert "'resnet_ge'" in message and "'image'" in message
    assert "[0, 3, 64, 64]" in message


def test_an_empty_axis_the_model_leaves_free_is_a_request_like_any_other(bert_spec):
    validate_request(bert_spec, _bert(rows=2, seq=0))  # the engine decides (runtime/runners.py), as on the peer


def test_an_empty_axis_the_model_fixes_is_refused_as_any_other_wrong_dim(resnet_spec, fixed_spec):
    message = _refused(resnet_spec, _image(rows=1, shape=(3, 0, 64)))
    assert "'image'" in message and "dim 2 must be 64" in message
    message = _refused(fixed_spec, {"x": np.zeros((2, 0), np.float32)})
    assert "'x'" in message and "dim 1 must be 3" in message


def test_the_validator_remembers_each_signature_and_says_the_same(bert_spec, monkeypatch):
    from gebackend.runtime import validation

    checker = validation.RequestValidator(bert_spec)
    calls = []
    real = validation.validate_request
    monkeypatch.setattr(validation, "validate_request", lambda spec, inputs: calls.append(1) or real(spec, inputs))
    bad = _bert(rows=2, mask_rows=3)
    messages = []
    for _ in range(3):
        checker.check(_bert(2, 7))  # valid: no exception
        with pytest.raises(InvalidRequest) as info:
            checker.check(bad)
        messages.append(str(info.value))
    assert len(calls) == 2  # one check per signature, then remembered
    assert messages == [real_message(bert_spec, bad)] * 3
    with pytest.raises(InvalidRequest, match="int32"):  # another dtype is another signature
        checker.check(_bert(2, 7, ids_dtype=np.int32))
    checker.LIMIT = 3
    for seq in range(1, 6):  # the memory is bounded
        checker.check(_bert(1, seq))
    assert len(checker._verdicts) <= 3


def real_message(spec, inputs) -> str:
    return _refused(spec, inputs)
