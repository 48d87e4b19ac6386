"""Static shape resolution: ge-backend bucket syntax, the shapes static_model compiles, and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec, reconcile
from gebackend.config.spec import shapes_from_config
from gebackend.config.static_shapes import FreeDims, compiled_shapes, parse_buckets
from gebackend.errors import ConfigError
from gebackend.modelzoo import build_bert, build_identity_fixed, build_resnet


def specs(model, config=None):
    result = reconcile("m", config or {"name": "m"}, signature_of(model), 8)
    return result.max_batch_size, result.inputs


def test_parse_ge_backend_bucket_syntax():
    buckets = parse_buckets("m", "image:-1,3,-1,-1", "1,224,224;8,224,224;1,336,336")
    assert buckets == [{"image": (1, 3, 224, 224)}, {"image": (8, 3, 224, 224)}, {"image": (1, 3, 336, 336)}]
    two = parse_buckets("m", "ids:-1,-1;mask:-1,-1", "1,16,1,16;4,32,4,32")
    assert two == [{"ids": (1, 16), "mask": (1, 16)}, {"ids": (4, 32), "mask": (4, 32)}]


@pytest.mark.parametrize(
    "input_shape,dims,fragment",
    [
        ("image:-1,3,-1,-1", "1,224", "has 2 values but graph.ge.inputShape"),
        ("image:-1,3,-1,-1", "1,a,224", "non-integer"),
        ("image-1,3", "1", "NAME:d0,d1"),
        ("image:-1,3,-1,-1", "", "graph.ge.dynamicDims is missing"),
        ("image:-1,3,-1,-1", "0,224,224", "dim < 1"),
    ],
)
def test_bad_bucket_syntax_is_refused(input_shape, dims, fragment):
    with pytest.raises(ConfigError, match="model 'm'") as info:
        parse_buckets("m", input_shape, dims)
    assert fragment in str(info.value)


def test_buckets_checked_against_the_model():
    mbs, inputs = specs(build_resnet())
    options = BackendOptions.make(input_shape="image:-1,3,-1,-1", dynamic_dims="4,64,64;1,64,64")
    assert compiled_shapes("m", mbs, inputs, options) == [{"image": (1, 3, 64, 64)}, {"image": (4, 3, 64, 64)}]
    with pytest.raises(ConfigError, match="dim 2 is fixed to 64"):
        compiled_shapes("m", mbs, inputs, BackendOptions.make(input_shape="image:-1,3,-1,-1", dynamic_dims="1,32,32"))
    with pytest.raises(ConfigError, match="exceeds max_batch_size 8"):
        compiled_shapes("m", mbs, inputs, BackendOptions.make(input_shape="image:-1,3,64,64", dynamic_dims="16"))
    with pytest.raises(ConfigError, match="names input 'pixels'"):
        compiled_shapes("m", mbs, inputs, BackendOptions.make(input_shape="pixels:-1,3,64,64", dynamic_dims="1"))


def test_a_bucket_giving_one_dim_name_two_sizes_is_compiled_as_written():
    # the file's dim names are hints: the engine decides whether the bucket runs (the loader falls back if not)
    mbs, inputs = specs(build_bert())
    ok = BackendOptions.make(input_shape="input_ids:-1,-1;attention_mask:-1,-1", dynamic_dims="1,16,1,16;4,32,4,32")
    assert compiled_shapes("m", mbs, inputs, ok)[1] == {"input_ids": (4, 32), "attention_mask": (4, 32)}
    apart = BackendOptions.make(input_shape="input_ids:-1,-1;attention_mask:-1,-1", dynamic_dims="1,16,1,8")
    assert compiled_shapes("m", mbs, inputs, apart) == [{"input_ids": (1, 16), "attention_mask": (1, 8)}]


def test_static_model_with_batching_compiles_power_of_two_batches():
    mbs, inputs = specs(build_resnet(), {"name": "m", "max_batch_size": 6})
    shapes = compiled_shapes("m", mbs, inputs, BackendOptions.make(static_model=True))
    assert [s["image"][0] for s in shapes] == [1, 2, 4, 6]
    assert all(s["image"][1:] == (3, 64, 64) for s in shapes)


def test_static_model_fully_static_onnx():
    mbs, inputs = specs(build_identity_fixed())
    assert compiled_shapes("m", mbs, inputs, BackendOptions.make(static_model=True)) == [{"x": (2, 3)}]


def test_static_model_with_a_free_dim_is_served_dynamic_and_says_how_to_fix():
    mbs, inputs = specs(build_bert())
    with pytest.raises(FreeDims) as info:
        compiled_shapes("m", mbs, inputs, BackendOptions.make(static_model=True))
    message = str(info.value)
    assert "input 'input_ids' dim 1 ('sequence') is free and no bucket fixes it" in message
    assert "served on the dynamic graph" in message
    assert "graph.ge.inputShape" in message and "dims" in message
    spec = build_model_spec({"name": "m", "max_batch_size": 4}, signature_of(build_bert()), Path("b.onnx"),
                            BackendOptions.make(static_model=True))
    assert not spec.static and spec.static_note == message


def test_static_model_with_config_dims_is_resolved():
    config = {"name": "m", "max_batch_size": 2, "input": [
        {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [16]},
        {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [16]}]}
    mbs, inputs = specs(build_bert(), config)
    assert compiled_shapes("m", mbs, inputs, BackendOptions.make(static_model=True)) == [
        {"input_ids": (1, 16), "attention_mask": (1, 16)}, {"input_ids": (2, 16), "attention_mask": (2, 16)}]


def test_dynamic_mode_compiles_nothing():
    mbs, inputs = specs(build_resnet())
    assert compiled_shapes("m", mbs, inputs, BackendOptions()) == []


def test_shapes_from_config_reads_ge_parameters():
    config = {"name": "m", "max_batch_size": 8, "parameters": {
        "graph.ge.inputShape": {"string_value": "image:-1,3,64,64"},
        "graph.ge.dynamicDims": {"string_value": "1;8"},
        "graph.ge.dynamicNodeType": {"string_value": "1"},
    }}
    assert [s["image"][0] for s in shapes_from_config(config, signature_of(build_resnet()))[0]] == [1, 8]
