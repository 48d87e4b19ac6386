"""Unit tests for gebackend.config.spec: reconciling config.pbtxt with real ONNX signatures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gebackend.config import dtypes
from gebackend.config.index_bounds import IndexBound, LengthLimit
from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions
from gebackend.config.spec import ModelSpec, TensorSpec, build_model_spec, reconcile
from gebackend.errors import ConfigError
from gebackend.modelzoo import build_add_mul, build_bert, build_identity_fixed, build_resnet


@pytest.fixture(scope="module")
def bert_sig():
    return signature_of(build_bert())


@pytest.fixture(scope="module")
def resnet_sig():
    return signature_of(build_resnet())


@pytest.fixture(scope="module")
def fixed_sig():
    return signature_of(build_identity_fixed())


@pytest.fixture(scope="module")
def add_mul_sig():
    return signature_of(build_add_mul())


FP32 = dtypes.from_triton("TYPE_FP32")
INT64 = dtypes.from_triton("TYPE_INT64")
# the bundled BERT's token ids index its 1000-row embedding table, and their length its 128 positions
# (config/index_bounds.py)
IDS = {"bound": IndexBound(-1000, 999, "embeddings.word", "embeddings.tokens"),
       "limits": (LengthLimit(1, 128, "embeddings.position", "embeddings.positions"),)}


# ---------------------------------------------------------------- auto-complete


def test_empty_config_autocompletes_bert(bert_sig):
    r = reconcile("bert", {"name": "bert"}, bert_sig, default_max_batch_size=8)
    assert r.max_batch_size == 8
    assert r.enable_dynamic_batching is True
    assert r.inputs == (
        TensorSpec("input_ids", INT64, (-1,), ("sequence",), **IDS),
        TensorSpec("attention_mask", INT64, (-1,), ("sequence",)),
    )
    assert r.outputs == (
        TensorSpec("last_hidden_state", FP32, (-1, 64), ("sequence", None)),
        TensorSpec("pooler_output", FP32, (64,), (None,)),
    )
    assert [t.config_entry() for t in r.inputs] == [
        {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]},
        {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [-1]},
    ]


def test_empty_config_autocompletes_resnet(resnet_sig):
    r = reconcile("resnet", {}, resnet_sig, default_max_batch_size=4)
    assert r.max_batch_size == 4  # the default passed in, not a hard-coded one
    assert r.enable_dynamic_batching is True
    assert r.inputs == (TensorSpec("image", FP32, (3, 64, 64), (None, None, None)),)
    assert r.outputs == (TensorSpec("logits", FP32, (10,), (None,)),)


def test_empty_config_on_fixed_model_does_not_batch(fixed_sig):
    r = reconcile("fixed", {"name": "fixed"}, fixed_sig, default_max_batch_size=8)
    assert r.max_batch_size == 0
    assert r.enable_dynamic_batching is False
    assert r.inputs == (TensorSpec("x", FP32, (2, 3), (None, None)),)
    assert r.outputs == (TensorSpec("y", FP32, (2, 3), (None, None)),)


def test_partial_config_is_filled(bert_sig):
    config = {"max_batch_size": 16, "input": [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]}]}
    r = reconcile("bert", config, bert_sig, default_max_batch_size=8)
    assert r.max_batch_size == 16
    assert [t.name for t in r.inputs] == ["input_ids", "attention_mask"]
    assert [t.name for t in r.outputs] == ["last_hidden_state", "pooler_output"]


def test_triton_json_string_dims_and_invalid_type_are_accepted(resnet_sig):
    # Triton renders int64 dims as strings and an unset data_type as TYPE_INVALID.
    config = {"max_batch_size": 2, "input": [{"name": "image", "data_type": "TYPE_INVALID", "dims": ["3", "-1", "64"]}]}
    r = reconcile("resnet", config, resnet_sig, default_max_batch_size=8)
    assert r.inputs == (TensorSpec("image", FP32, (3, 64, 64), (None, None, None)),)


# ---------------------------------------------------------------- batching decisions


def test_full_rank_dims_with_max_batch_size_zero_means_no_batching(bert_sig):
    config = {
        "name": "bert",
        "max_batch_size": 0,
        "input": [
            {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1, -1]},
            {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [-1, -1]},
        ],
    }
    r = reconcile("bert", config, bert_sig, default_max_batch_size=8)
    assert r.max_batch_size == 0
    assert r.enable_dynamic_batching is False
    assert r.inputs[0] == TensorSpec("input_ids", INT64, (-1, -1), ("batch", "sequence"), **IDS)
    assert r.outputs[0] == TensorSpec("last_hidden_state", FP32, (-1, -1, 64), ("batch", "sequence", None))
    assert r.outputs[1].dims == (-1, 64)


def test_full_rank_dims_on_resnet_take_onnx_fixed_dims(resnet_sig):
    config = {"max_batch_size": 0, "input": [{"name": "image", "dims": [1, 3, -1, -1]}]}
    r = reconcile("resnet", config, resnet_sig, default_max_batch_size=8)
    assert r.max_batch_size == 0
    assert r.inputs[0].dims == (1, 3, 64, 64)
    assert r.outputs[0].dims == (-1, 10)


def test_max_batch_size_on_fixed_model_is_refused(fixed_sig):
    with pytest.raises(ConfigError) as info:
        reconcile("ident", {"max_batch_size": 4}, fixed_sig, default_max_batch_size=8)
    message = str(info.value)
    assert "'ident'" in message
    assert "'x'" in message
    assert "max_batch_size is 4" in message
    assert "dim 0 = 2" in message


@pytest.mark.parametrize("scheduler", ["dynamic_batching", "sequence_batching"])
def test_existing_scheduler_disables_auto_dynamic_batching(resnet_sig, scheduler):
    config = {"max_batch_size": 8, scheduler: {}}
    r = reconcile("resnet", config, resnet_sig, default_max_batch_size=8)
    assert r.max_batch_size == 8
    assert r.enable_dynamic_batching is False
    r2 = reconcile("resnet", {scheduler: {"max_queue_delay_microseconds": 100}}, resnet_sig, 8)
    assert r2.max_batch_size == 8
    assert r2.enable_dynamic_batching is False


def test_explicit_max_batch_size_without_scheduler_enables_dynamic_batching(resnet_sig):
    r = reconcile("resnet", {"max_batch_size": 32}, resnet_sig, default_max_batch_size=8)
    assert r.max_batch_size == 32
    assert r.enable_dynamic_batching is True


# ---------------------------------------------------------------- contradictions


def _refused(sig, config, model="mymodel"):
    with pytest.raises(ConfigError) as info:
        reconcile(model, config, sig, default_max_batch_size=8)
    return str(info.value)


def test_unknown_input_name(bert_sig):
    message = _refused(bert_sig, {"max_batch_size": 8, "input": [{"name": "token_ids", "data_type": "TYPE_INT64", "dims": [-1]}]})
    assert "'mymodel'" in message
    assert "'token_ids'" in message
    assert "input_ids" in message and "attention_mask" in message


def test_unknown_output_name(resnet_sig):
    message = _refused(resnet_sig, {"output": [{"name": "probs", "dims": [10]}]})
    assert "'mymodel'" in message
    assert "'probs'" in message
    assert "logits" in message


def test_wrong_data_type(bert_sig):
    message = _refused(bert_sig, {"max_batch_size": 8, "input": [{"name": "attention_mask", "data_type": "TYPE_INT32", "dims": [-1]}]})
    assert "'mymodel'" in message
    assert "'attention_mask'" in message
    assert "TYPE_INT32" in message and "TYPE_INT64" in message


def test_wrong_output_data_type(resnet_sig):
    message = _refused(resnet_sig, {"max_batch_size": 8, "output": [{"name": "logits", "data_type": "TYPE_FP16", "dims": [10]}]})
    assert "'mymodel'" in message and "'logits'" in message
    assert "TYPE_FP16" in message and "TYPE_FP32" in message


def test_wrong_rank(resnet_sig):
    message = _refused(resnet_sig, {"max_batch_size": 8, "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, 64]}]})
    assert "'mymodel'" in message
    assert "'image'" in message
    assert "[3, 64]" in message and "rank 2" in message
    assert "[3, 64, 64]" in message and "rank 3" in message
    assert "batch dim" in message


def test_wrong_rank_full_rank_config_counted_with_batch(resnet_sig):
    # max_batch_size > 0 excludes the batch dim, so a full-rank dims list is one too long.
    message = _refused(resnet_sig, {"max_batch_size": 8, "input": [{"name": "image", "dims": [-1, 3, 64, 64]}]})
    assert "rank 4" in message and "rank 3" in message


def test_wrong_fixed_dim(resnet_sig):
    message = _refused(resnet_sig, {"max_batch_size": 8, "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}]})
    assert "'mymodel'" in message
    assert "'image'" in message
    assert "dim 1" in message
    assert "224" in message and "64" in message


def test_wrong_fixed_output_dim(bert_sig):
    message = _refused(bert_sig, {"max_batch_size": 8, "output": [{"name": "pooler_output", "dims": [768]}]})
    assert "'pooler_output'" in message
    assert "768" in message and "64" in message


def test_config_minus_one_takes_onnx_value_and_fixed_config_value_kept_for_symbolic(bert_sig):
    config = {
        "max_batch_size": 8,
        "input": [{"name": "input_ids", "dims": [128]}, {"name": "attention_mask", "dims": [128]}],
        "output": [{"name": "last_hidden_state", "dims": [128, -1]}],
    }
    r = reconcile("bert", config, bert_sig, default_max_batch_size=8)
    # the config's dims win over the file's names: a dim it fixes carries no name
    assert r.inputs[0] == TensorSpec("input_ids", INT64, (128,), (None,), **IDS)
    assert r.outputs == (TensorSpec("last_hidden_state", FP32, (128, 64), (None, None)),)  # listed: served alone


def test_a_config_that_lists_outputs_is_served_those_alone_as_on_the_peer(bert_sig):
    config = {"max_batch_size": 8, "output": [{"name": "pooler_output"}]}
    for fill in (True, False):  # auto-complete adds no other output, and the load serves none
        r = reconcile("bert", config, bert_sig, default_max_batch_size=8, fill=fill)
        assert [t.name for t in r.outputs] == ["pooler_output"]
        assert [t.name for t in r.inputs] == ["input_ids", "attention_mask"]  # inputs are still completed
    r = reconcile("bert", {"max_batch_size": 8}, bert_sig, default_max_batch_size=8)
    assert [t.name for t in r.outputs] == ["last_hidden_state", "pooler_output"]  # none listed: every output


def test_labels_carry_dim_params(bert_sig):
    r = reconcile("bert", {"max_batch_size": 4}, bert_sig, default_max_batch_size=8)
    assert {t.name: t.labels for t in r.inputs} == {"input_ids": ("sequence",), "attention_mask": ("sequence",)}
    assert r.outputs[0].labels == ("sequence", None)


# ---------------------------------------------------------------- build_model_spec


def _bert_config(**extra):
    config = {
        "name": "bert",
        "max_batch_size": 4,
        "input": [
            {"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]},
            {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": ["-1"]},
        ],
        "output": [
            {"name": "last_hidden_state", "data_type": "TYPE_FP32", "dims": ["-1", "64"]},
            {"name": "pooler_output", "data_type": "TYPE_FP32", "dims": ["64"]},
        ],
        "dynamic_batching": {},
    }
    config.update(extra)
    return config


def test_build_model_spec_complete_config(bert_sig):
    options = BackendOptions.make(intra_op_thread_count=2)
    spec = build_model_spec(_bert_config(), bert_sig, Path("/m/1/model.onnx"), options)
    assert isinstance(spec, ModelSpec)
    assert spec.name == "bert"
    assert spec.path == Path("/m/1/model.onnx")
    assert spec.max_batch_size == 4 and spec.batching is True
    assert spec.options is options
    assert spec.input("attention_mask") == TensorSpec("attention_mask", INT64, (-1,), ("sequence",))
    assert spec.input("nope") is None
    assert [t.name for t in spec.outputs] == ["last_hidden_state", "pooler_output"]


def test_build_model_spec_output_subset_kept(bert_sig):
    config = _bert_config(output=[{"name": "pooler_output", "data_type": "TYPE_FP32", "dims": ["64"]}])
    spec = build_model_spec(config, bert_sig, Path("m.onnx"), BackendOptions())
    assert [t.name for t in spec.outputs] == ["pooler_output"]


def test_build_model_spec_refuses_omitted_input(bert_sig):
    config = _bert_config(input=[{"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]}])
    with pytest.raises(ConfigError) as info:
        build_model_spec(config, bert_sig, Path("m.onnx"), BackendOptions())
    message = str(info.value)
    assert "'bert'" in message
    assert "attention_mask" in message
    # reconcile with fill=True (auto-complete) fills the same config instead
    filled = reconcile("bert", config, bert_sig, 8, fill=True)
    assert [t.name for t in filled.inputs] == ["input_ids", "attention_mask"]


def test_build_model_spec_non_batching_fixed_model(fixed_sig):
    config = {
        "name": "ident",
        "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["2", "3"]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["2", "3"]}],
    }
    spec = build_model_spec(config, fixed_sig, Path("m.onnx"), BackendOptions())
    assert spec.batching is False
    assert spec.max_batch_size == 0
    assert spec.inputs == (TensorSpec("x", FP32, (2, 3), (None, None)),)


def test_build_model_spec_refuses_ambiguous_zero_batch(add_mul_sig):
    # Every tensor has a variable dim 0 but the config neither sets max_batch_size nor full-rank dims.
    config = {"name": "am", "max_batch_size": 0, "input": [{"name": "x", "dims": [4]}, {"name": "y", "dims": [4]}]}
    with pytest.raises(ConfigError) as info:
        build_model_spec(config, add_mul_sig, Path("m.onnx"), BackendOptions())
    assert "'am'" in str(info.value)
    assert "max_batch_size" in str(info.value)


def test_build_model_spec_contradiction_names_model(resnet_sig):
    config = {"name": "resnet_ge", "max_batch_size": 8, "input": [{"name": "image", "data_type": "TYPE_FP16", "dims": [3, 64, 64]}]}
    with pytest.raises(ConfigError) as info:
        build_model_spec(config, resnet_sig, Path("m.onnx"), BackendOptions())
    assert "'resnet_ge'" in str(info.value) and "'image'" in str(info.value)


def test_reshape_gives_the_dims_the_model_sees_and_a_batch_only_tensor_is_completed_with_one():
    from gebackend.modelzoo import build_row_scale

    sig = signature_of(build_row_scale())
    declared = {"name": "m", "max_batch_size": 8, "input": [
        {"name": "scale", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}]}
    result = reconcile("m", declared, sig, 8)
    assert {t.name: t.dims for t in result.inputs} == {"scale": (), "x": (4,)}
    # Without a config, as Triton's onnxruntime backend completes it: dims [1], reshaped to [] for the model.
    completed = reconcile("m", {"name": "m", "max_batch_size": 8}, sig, 8)
    entries = {t.name: t.config_entry() for t in completed.inputs}
    assert entries["scale"] == {"name": "scale", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}
    assert entries["x"] == {"name": "x", "data_type": "TYPE_FP32", "dims": [4]}
    assert completed.max_batch_size == 8
    # ... and the completed config is what the instance then loads.
    again = reconcile("m", {"name": "m", "max_batch_size": 8, "input": list(entries.values())}, sig, 8, fill=False)
    assert {t.name: t.dims for t in again.inputs} == {"scale": (), "x": (4,)}
    with pytest.raises(ConfigError, match="rank 1"):  # a reshape that does not match the ONNX file
        reconcile("m", {"name": "m", "max_batch_size": 8, "input": [
            {"name": "scale", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": [1]}}]}, sig, 8)


def _model(inputs, outputs, nodes):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_batch_only_output_is_completed_as_the_onnxruntime_backend_does():
    """An ArgMax class index `idx: int64 [batch]`, the last layer of most classifiers."""
    from onnx import TensorProto, helper

    model = _model([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 10])],
                   [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])],
                   [helper.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0)])
    result = reconcile("cls", {"name": "cls"}, signature_of(model), 8)
    assert result.max_batch_size == 8 and result.enable_dynamic_batching
    assert result.outputs[0].config_entry() == {"name": "idx", "data_type": "TYPE_INT64", "dims": [1],
                                                "reshape": {"shape": []}}


def test_a_scalar_input_without_batching_is_completed_as_the_onnxruntime_backend_does():
    from onnx import TensorProto, helper

    model = _model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                    helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                   [helper.make_node("Mul", ["x", "s"], ["y"])])
    result = reconcile("scaled", {"name": "scaled"}, signature_of(model), 8)
    assert result.max_batch_size == 0 and not result.enable_dynamic_batching
    entries = {t.name: t.config_entry() for t in result.inputs}
    assert entries == {"x": {"name": "x", "data_type": "TYPE_FP32", "dims": [3]},
                       "s": {"name": "s", "data_type": "TYPE_FP32", "dims": [1]}}  # Triton refuses [] reshapes here
    spec_inputs = reconcile("scaled", {"name": "scaled", "input": list(entries.values())}, signature_of(model), 8,
                            fill=False).inputs
    assert {t.name: (t.dims, t.wire_dims) for t in spec_inputs} == {"x": ((3,), None), "s": ((), (1,))}
    with pytest.raises(ConfigError, match=r"input 's' is a scalar in the ONNX file.*dims of 1 only.*\[2\]"):
        reconcile("scaled", {"name": "scaled", "input": [{"name": "s", "data_type": "TYPE_FP32", "dims": [2]}]},
                  signature_of(model), 8)
