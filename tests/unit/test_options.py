"""Unit tests for gebackend.config.options: parsing, merging and the sources of backend options."""

from __future__ import annotations

import json

import pytest

from gebackend.config.options import (
    ENV_VAR,
    KNOWN_KEYS,
    BackendOptions,
    global_options_from_env,
    graph_level_from_config,
    model_parameters,
    parse_backend_config_args,
    parse_options,
)
from gebackend.errors import ConfigError


def test_defaults_when_nothing_is_set():
    parsed = parse_options("m", {}, {})
    assert parsed.options == BackendOptions()
    assert parsed.options.graph_optimization_level == "all"
    assert parsed.options.default_max_batch_size == 8
    assert parsed.options.execution_mode == "sequential"
    assert parsed.unknown == ()
    assert dict(parsed.sources) == {}


def test_model_parameters_override_global():
    parsed = parse_options(
        "m",
        {"intra_op_thread_count": "2", "inter_op_thread_count": "3"},
        {"intra_op_thread_count": "5"},
    )
    assert parsed.options.intra_op_thread_count == 5
    assert parsed.options.inter_op_thread_count == 3
    assert parsed.sources["intra_op_thread_count"] == "model"
    assert parsed.sources["inter_op_thread_count"] == "global"


def test_global_only_and_model_only_both_apply():
    parsed = parse_options("m", {"enable_mem_arena": "off"}, {"static_model": "yes"})
    assert parsed.options.enable_mem_arena is False
    assert parsed.options.static_model is True
    assert parsed.options.enable_mem_pattern is True  # untouched default


@pytest.mark.parametrize(
    "text,expected",
    [("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True), (" On ", True),
     ("0", False), ("false", False), ("False", False), ("no", False), ("off", False)],
)
def test_bool_values(text, expected):
    parsed = parse_options("m", {}, {"enable_mem_pattern": text, "static_model": text})
    assert parsed.options.enable_mem_pattern is expected
    assert parsed.options.static_model is expected


@pytest.mark.parametrize("text,expected", [("0", 0), ("4", 4), (" 16 ", 16)])
def test_int_values(text, expected):
    parsed = parse_options("m", {"intra_op_thread_count": text}, {"inter_op_thread_count": text})
    assert parsed.options.intra_op_thread_count == expected
    assert parsed.options.inter_op_thread_count == expected


def test_default_max_batch_size_parsed():
    assert parse_options("m", {}, {"default_max_batch_size": "32"}).options.default_max_batch_size == 32


@pytest.mark.parametrize(
    "text,expected",
    [("0", "sequential"), ("sequential", "sequential"), ("SEQUENTIAL", "sequential"),
     ("1", "parallel"), ("parallel", "parallel"), ("Parallel", "parallel")],
)
def test_execution_mode(text, expected):
    assert parse_options("m", {}, {"execution_mode": text}).options.execution_mode == expected


@pytest.mark.parametrize(
    "text,expected",
    [("disable", "disable"), ("disabled", "disable"), ("none", "disable"), ("basic", "basic"),
     ("Extended", "extended"), ("all", "all"), ("ALL", "all")],
)
def test_graph_optimization_level_names(text, expected):
    parsed = parse_options("m", {"graph_optimization_level": text}, {})
    assert parsed.options.graph_optimization_level == expected


@pytest.mark.parametrize(
    "key,value",
    [
        ("enable_mem_arena", "maybe"),
        ("static_model", ""),
        ("intra_op_thread_count", "-1"),
        ("inter_op_thread_count", "two"),
        ("intra_op_thread_count", "1.5"),
        ("default_max_batch_size", "0"),
        ("default_max_batch_size", "-3"),
        ("execution_mode", "2"),
        ("execution_mode", "concurrent"),
        ("graph_optimization_level", "max"),
        ("graph_optimization_level", "99"),
        ("hang_timeout_s", "-1"),
        ("hang_timeout_s", "nan"),
        ("hang_timeout_s", "soon"),
    ],
)
@pytest.mark.parametrize("source", ["global", "model"])
def test_invalid_value_names_model_key_value_source(key, value, source):
    options = {key: value}
    with pytest.raises(ConfigError) as info:
        if source == "global":
            parse_options("my_model", options, {})
        else:
            parse_options("my_model", {}, options)
    message = str(info.value)
    assert "my_model" in message
    assert key in message
    assert repr(value) in message
    if source == "global":
        assert "--backend-config" in message
        assert "config.pbtxt" not in message
    else:
        assert "config.pbtxt parameters" in message
        assert "--backend-config" not in message


def test_hang_timeout_is_seconds_with_zero_meaning_never():
    assert parse_options("m", {}, {}).options.hang_timeout_s == 120.0
    assert parse_options("m", {"hang_timeout_s": "0"}, {}).options.hang_timeout_s == 0.0
    assert parse_options("m", {"hang_timeout_s": "30"}, {"hang_timeout_s": "2.5"}).options.hang_timeout_s == 2.5


def test_invalid_global_value_raises_even_if_model_overrides():
    with pytest.raises(ConfigError, match="intra_op_thread_count"):
        parse_options("m", {"intra_op_thread_count": "x"}, {"intra_op_thread_count": "2"})


def test_unknown_keys_returned_once_not_raised():
    parsed = parse_options(
        "m",
        {"ge.exec.deviceId": "0", "intra_op_thread_count": "2", "foo": "1"},
        {"foo": "2", "ge.exec.deviceId": "1", "bar": "x"},
    )
    assert parsed.unknown == ("ge.exec.deviceId", "foo", "bar")
    assert parsed.options.intra_op_thread_count == 2
    assert not set(parsed.unknown) & KNOWN_KEYS
    assert "foo" not in parsed.sources


@pytest.mark.parametrize(
    "level,expected",
    [(-1, "basic"), ("-1", "basic"), (1, "extended"), ("1", "extended"), (2, "all"), (0, "all"), ("0", "all")],
)
def test_optimization_graph_level(level, expected):
    config = {"name": "m", "optimization": {"graph": {"level": level}}}
    parsed = parse_options("m", {}, {}, config)
    assert parsed.options.graph_optimization_level == expected
    if level in (0, "0"):
        assert "graph_optimization_level" not in parsed.sources
    else:
        assert parsed.sources["graph_optimization_level"] == "optimization.graph.level"


@pytest.mark.parametrize(
    "config",
    [{}, {"name": "m"}, {"optimization": {}}, {"optimization": None}, {"optimization": {"graph": {}}},
     {"optimization": {"graph": None}}],
)
def test_graph_level_unset_is_default_all(config):
    assert graph_level_from_config("m", config) is None
    assert parse_options("m", {}, {}, config).options.graph_optimization_level == "all"


def test_optimization_graph_level_beats_global_option():
    config = {"optimization": {"graph": {"level": -1}}}
    parsed = parse_options("m", {"graph_optimization_level": "disable"}, {}, config)
    assert parsed.options.graph_optimization_level == "basic"
    assert parsed.sources["graph_optimization_level"] == "optimization.graph.level"


def test_non_integer_graph_level_is_a_config_error():
    with pytest.raises(ConfigError, match="model 'm'.*optimization.graph.level 'abc'"):
        parse_options("m", {}, {}, {"optimization": {"graph": {"level": "abc"}}})


def test_model_parameter_beats_optimization_graph_level():
    config = {"optimization": {"graph": {"level": -1}}}
    parsed = parse_options("m", {}, {"graph_optimization_level": "disable"}, config)
    assert parsed.options.graph_optimization_level == "disable"
    assert parsed.sources["graph_optimization_level"] == "model"


def test_model_parameters_from_triton_json():
    config = {
        "name": "m",
        "parameters": {"intra_op_thread_count": {"string_value": "3"}, "empty": {}, "plain": 7},
    }
    assert model_parameters(config) == {"intra_op_thread_count": "3", "empty": "", "plain": "7"}
    assert model_parameters({"name": "m"}) == {}
    assert model_parameters({"parameters": None}) == {}
    parsed = parse_options("m", {}, model_parameters(config))
    assert parsed.options.intra_op_thread_count == 3
    assert parsed.unknown == ("empty", "plain")


def test_global_options_from_env_missing_or_empty():
    assert global_options_from_env({}) == {}
    assert global_options_from_env({ENV_VAR: ""}) == {}
    assert global_options_from_env({"OTHER": '{"a": "b"}'}) == {}


def test_global_options_from_env_valid_json():
    env = {ENV_VAR: json.dumps({"intra_op_thread_count": "4", "static_model": True, "default_max_batch_size": 16})}
    got = global_options_from_env(env)
    assert got == {"intra_op_thread_count": "4", "static_model": "True", "default_max_batch_size": "16"}
    parsed = parse_options("m", got, {})
    assert parsed.options.intra_op_thread_count == 4
    assert parsed.options.static_model is True
    assert parsed.options.default_max_batch_size == 16
    assert all(parsed.sources[k] == "global" for k in got)


@pytest.mark.parametrize("raw", ["{not json", "intra_op_thread_count=4", "[1, 2]", '"text"', "3"])
def test_global_options_from_env_invalid(raw):
    with pytest.raises(ConfigError) as info:
        global_options_from_env({ENV_VAR: raw})
    assert ENV_VAR in str(info.value)


def test_parse_backend_config_args_splits_ours_from_others():
    ours, others = parse_backend_config_args(
        [
            "ge,intra_op_thread_count=4",
            "python,shm-default-byte-size=1048576",
            "npu_ge,static_model=1",
            "onnxruntime,enable-global-threadpool=1",
            "ge,graph_optimization_level = basic ",
            "ge,url=a=b",
            "default-max-batch-size=4",
        ]
    )
    assert ours == {
        "intra_op_thread_count": "4",
        "static_model": "1",
        "graph_optimization_level": "basic",
        "url": "a=b",
    }
    assert others == [
        "python,shm-default-byte-size=1048576",
        "onnxruntime,enable-global-threadpool=1",
        "default-max-batch-size=4",
    ]


def test_parse_backend_config_args_later_wins_and_empty_value_allowed():
    ours, others = parse_backend_config_args(["ge,k=1", "npu_ge,k=2", "ge,empty="])
    assert ours == {"k": "2", "empty": ""}
    assert others == []


def test_parse_backend_config_args_custom_names():
    ours, others = parse_backend_config_args(["mine,a=1", "ge,b=2"], backend_names=("mine",))
    assert ours == {"a": "1"}
    assert others == ["ge,b=2"]


@pytest.mark.parametrize("arg", ["ge,novalue", "npu_ge,", "ge,=value", "ge, =value"])
def test_parse_backend_config_args_malformed(arg):
    with pytest.raises(ConfigError) as info:
        parse_backend_config_args(["python,x=y", arg])
    assert repr(arg) in str(info.value)
    assert "KEY=VALUE" in str(info.value)
