"""Unit tests for gebackend.config.pbtxt: config.pbtxt -> Triton's JSON-shaped dict."""

from __future__ import annotations

import pytest

from gebackend.config.pbtxt import config_parse_error, load_model_config
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


def test_parse_error_names_the_file_line_and_column(tmp_path):
    path = _write(tmp_path, 'backend: "ge"\nmax_batch_size: "eight"\n')
    with pytest.raises(ConfigError) as info:
        load_model_config(path)
    assert str(info.value) == f"cannot parse {path}:2:17: 'max_batch_size: \"eight\"': Couldn't parse integer: \"eight\""


def test_unknown_field_is_a_parse_error(tmp_path):
    with pytest.raises(ConfigError, match="no_such_field"):
        load_model_config(_write(tmp_path, "no_such_field: 1\n"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_model_config(tmp_path / "absent" / "config.pbtxt")


@pytest.mark.parametrize("text,where,complaint", [
    ('backend: "ge"\nmax_batch_size: 4\ninput [ { name: "x" dims: [ 4 ] }\n', "4:1", 'Expected'),  # unclosed list
    ('backend: "ge"\n  dynamic_batching { max_queue_delay: 5 }\n', "2:22", 'has no field named "max_queue_delay"'),
    ('backend: "ge"\ninstance_group [ { kind: KIND_TPU } ]\n', "2:26", 'KIND_TPU'),
    ('backend: "ge"\nbackend: "ge"\n', "2:10", 'should not have multiple "backend" fields'),
])
def test_config_parse_error_says_where_and_why(tmp_path, text, where, complaint):
    path = _write(tmp_path, text)
    reason = config_parse_error(path.parent)
    assert reason.startswith(f"cannot parse {path}:{where}: "), reason
    assert complaint in reason


def test_config_parse_error_is_none_when_it_parses_or_is_absent(tmp_path):
    assert config_parse_error(_write(tmp_path, 'backend: "ge"\nmax_batch_size: 4\n').parent) is None
    assert config_parse_error(tmp_path / "no_such_model") is None


def test_config_parse_error_for_an_unreadable_file(tmp_path):
    path = _write(tmp_path, "")
    path.write_bytes(b"\xff\xfe backend")
    assert config_parse_error(path.parent).startswith(f"cannot read {path}: ")
