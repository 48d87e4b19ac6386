"""Unit tests for gebackend.config.pbtxt: config.pbtxt -> Triton's JSON-shaped dict."""

from __future__ import annotations

import pytest

from gebackend.config.pbtxt import load_model_config
from gebackend.errors import ConfigError


def _write(tmp_path, text, folder="my_model"):
    path = tmp_path / folder / "config.pbtxt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_full_config_has_int_dims_and_keeps_parameters(tmp_path):
    path = _write(tmp_path, """
name: "explicit"
backend: "ge"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3, 224 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 preferred_batch_size: [ 2, 4 ] }
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters { key: "static_model" value: { string_value: "1" } }
""")
    config = load_model_config(path)
    assert config == {
        "name": "explicit",
        "backend": "ge",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 3, 224]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [10]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 500, "preferred_batch_size": [2, 4]},
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
        "parameters": {"static_model": {"string_value": "1"}},
    }


def test_name_defaults_to_the_folder_and_max_batch_size_to_0(tmp_path):
    config = load_model_config(_write(tmp_path, 'backend: "ge"\n', folder="bert_ge"))
    assert config == {"name": "bert_ge", "backend": "ge", "max_batch_size": 0}


def test_parse_error_names_the_file(tmp_path):
    path = _write(tmp_path, 'backend: "ge"\nmax_batch_size: "eight"\n')
    with pytest.raises(ConfigError, match=r"cannot parse .*my_model/config\.pbtxt: 2:"):
        load_model_config(path)


def test_unknown_field_is_a_parse_error(tmp_path):
    with pytest.raises(ConfigError, match="no_such_field"):
        load_model_config(_write(tmp_path, "no_such_field: 1\n"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_model_config(tmp_path / "absent" / "config.pbtxt")
