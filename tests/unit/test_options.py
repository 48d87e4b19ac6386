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
    assert parsed.options.session.graph_optimization_level == "all"
    assert parsed.options.default_max_batch_size == 8
    assert parsed.options.session.execution_mode == "sequential"
    assert parsed.unknown == ()
    assert dict(parsed.sources) == {}


def test_model_parameters_override_global():
    parsed = parse_options(
        "m",
        {"intra_op_thread_count": "2", "inter_op_thread_count": "3"},
        {"intra_op_thread_count": "5"},
    )
    assert parsed.options.session.intra_op_thread_count == 5
    assert parsed.options.session.inter_op_thread_count == 3
    assert parsed.sources["intra_op_thread_count"] == "model"
    assert parsed.sources["inter_op_thread_count"] == "global"


def test_global_only_and_model_only_both_apply():
    parsed = parse_options("m", {"enable_mem_arena": "off"}, {"static_model": "yes"})
    assert parsed.options.session.enable_mem_arena is False
    assert parsed.options.static.static_model is True
    assert parsed.options.session.enable_mem_pattern is True  # untouched default


@pytest.mark.parametrize(
    "text,expected",
    [("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True), (" On ", True),
     ("0", False), ("false", False), ("False", False), ("no", False), ("off", False)],
)
def test_bool_values(text, expected):
    parsed = parse_options("m", {}, {"enable_mem_pattern": text, "static_model": text})
    assert parsed.options.session.enable_mem_pattern is expected
    assert parsed.options.static.static_model is expected


@pytest.mark.parametrize("text,expected", [("0", 0), ("4", 4), (" 16 ", 16)])
def test_int_values(text, expected):
    parsed = parse_options("m", {"intra_op_thread_count": text}, {"inter_op_thread_count": text})
    assert parsed.options.session.intra_op_thread_count == expected
    assert parsed.options.session.inter_op_thread_count == expected


def test_default_max_batch_size_parsed():
    assert parse_options("m", {}, {"default_max_batch_size": "32"}).options.default_max_batch_size == 32


@pytest.mark.parametrize(
    "text,expected",
    [("0", "sequential"), ("sequential", "sequential"), ("SEQUENTIAL", "sequential"),
     ("1", "parallel"), ("parallel", "parallel"), ("Parallel", "parallel")],
)
def test_execution_mode(text, expected):
    assert parse_options("m", {}, {"execution_mode": text}).options.session.execution_mode == expected


@pytest.mark.parametrize(
    "text,expected",
    [("disable", "disable"), ("disabled", "disable"), ("none", "disable"), ("basic", "basic"),
     ("Extended", "extended"), ("all", "all"), ("ALL", "all")],
)
def test_graph_optimization_level_names(text, expected):
    parsed = parse_options("m", {"graph_optimization_level": text}, {})
    assert parsed.options.session.graph_optimization_level == expected


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
    assert parse_options("m", {}, {}).options.instances.hang_timeout_s == 120.0
    assert parse_options("m", {"hang_timeout_s": "0"}, {}).options.instances.hang_timeout_s == 0.0
    assert parse_options("m", {"hang_timeout_s": "30"}, {"hang_timeout_s": "2.5"}).options.instances.hang_timeout_s == 2.5


def test_invalid_global_value_raises_even_if_model_overrides():
    with pytest.raises(ConfigError, match="intra_op_thread_count"):
        parse_options("m", {"intra_op_thread_count": "x"}, {"intra_op_thread_count": "2"})


def test_unknown_keys_returned_once_not_raised():
    parsed = parse_options(
        "m",
        {"ge.exec.deviceId": "0", "intra_op_thread_count": "2", "foo": "1"},
        {"foo": "2", "ge.exec.deviceId": "1", "bar": "x"},
    )
    assert parsed.unknown == ("foo", "bar")
    assert parsed.no_effect == ("ge.exec.deviceId",)  # a ge-backend key: accepted, reported apart
    assert parsed.options.session.intra_op_thread_count == 2
    assert not set(parsed.unknown) & KNOWN_KEYS
    assert "foo" not in parsed.sources


@pytest.mark.parametrize(
    "level,expected",
    # As Triton's onnxruntime backend maps them (src/onnxruntime.cc): -1 basic, 1 extended, 2 disable all, else all.
    [(-1, "basic"), ("-1", "basic"), (1, "extended"), ("1", "extended"), (2, "disable"), ("2", "disable"),
     (0, "all"), ("0", "all"), (3, "all"), (-2, "all"), (99, "all")],
)
def test_optimization_graph_level(level, expected):
    config = {"name": "m", "optimization": {"graph": {"level": level}}}
    parsed = parse_options("m", {}, {}, config)
    assert parsed.options.session.graph_optimization_level == expected
    if level in (0, "0"):  # 0 is also what an unset level reads as: the default, a global option may change it
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
    assert parse_options("m", {}, {}, config).options.session.graph_optimization_level == "all"


def test_optimization_graph_level_beats_global_option():
    config = {"optimization": {"graph": {"level": -1}}}
    parsed = parse_options("m", {"graph_optimization_level": "disable"}, {}, config)
    assert parsed.options.session.graph_optimization_level == "basic"
    assert parsed.sources["graph_optimization_level"] == "optimization.graph.level"


def test_non_integer_graph_level_is_a_config_error():
    with pytest.raises(ConfigError, match="model 'm'.*optimization.graph.level 'abc'"):
        parse_options("m", {}, {}, {"optimization": {"graph": {"level": "abc"}}})


def test_model_parameter_beats_optimization_graph_level():
    config = {"optimization": {"graph": {"level": -1}}}
    parsed = parse_options("m", {}, {"graph_optimization_level": "disable"}, config)
    assert parsed.options.session.graph_optimization_level == "disable"
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
    assert parsed.options.session.intra_op_thread_count == 3
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
    assert parsed.options.session.intra_op_thread_count == 4
    assert parsed.options.static.static_model is True
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
        "default_max_batch_size": "4",  # Triton's global key: every backend's default, so ours too
    }
    assert others == [
        "python,shm-default-byte-size=1048576",
        "onnxruntime,enable-global-threadpool=1",
        "default-max-batch-size=4",  # and still tritonserver's
    ]


@pytest.mark.parametrize("order", [1, -1])
def test_our_own_default_max_batch_size_wins_over_tritons_global_one(order):
    args = ["default-max-batch-size=4", "ge,default_max_batch_size=16"][::order]
    assert parse_backend_config_args(args)[0] == {"default_max_batch_size": "16"}


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


def test_graph_level_0_leaves_a_global_option_alone_and_2_beats_it():
    assert parse_options("m", {"graph_optimization_level": "basic"}, {},
                         {"optimization": {"graph": {"level": 0}}}).options.session.graph_optimization_level == "basic"
    assert parse_options("m", {"graph_optimization_level": "basic"}, {},
                         {"optimization": {"graph": {"level": 2}}}).options.session.graph_optimization_level == "disable"


OPENVINO = {"optimization": {"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino", "parameters": {}}]}}}


def test_cpu_openvino_accelerator_selects_the_openvino_engine():
    parsed = parse_options("m", {}, {}, OPENVINO)
    assert parsed.options.engines.engine == "openvino"
    assert parsed.options.engines.accelerators.cpu == ("openvino",)
    assert parsed.sources["engine"] == "optimization.execution_accelerators"


def test_openvino_accelerator_beats_global_engine_and_a_model_parameter_beats_it():
    assert parse_options("m", {"engine": "onnxruntime"}, {}, OPENVINO).options.engines.engine == "openvino"
    parsed = parse_options("m", {}, {"engine": "onnxruntime"}, OPENVINO)
    assert parsed.options.engines.engine == "onnxruntime"
    assert parsed.sources["engine"] == "model"
    assert parsed.options.engines.accelerators.cpu == ("openvino",)  # still parsed and reported


def test_gpu_accelerators_are_parsed_into_options():
    config = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "INT8", "trt_engine_cache_enable": "1"}},
        {"name": "cuda", "parameters": {"cudnn_conv_use_max_workspace": "1"}}]}}}
    options = parse_options("m", {}, {}, config).options
    assert options.engines.engine == "onnxruntime"
    assert options.engines.accelerators.tensorrt.precision_mode == "INT8"
    assert options.engines.accelerators.tensorrt.trt_engine_cache_enable is True
    assert options.engines.accelerators.cuda.options == (("cudnn_conv_use_max_workspace", "1"),)


def test_unknown_accelerator_fails_naming_it():
    config = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "rocm"}]}}}
    with pytest.raises(ConfigError, match="model 'm': unknown Execution Accelerator 'rocm' is requested"):
        parse_options("m", {}, {}, config)


@pytest.mark.parametrize("text,expected", [("4,5", (4, 5)), ("2", (2,)), (" 0 , 3 ,", (0, 3)), ("", ())])
def test_device_ids(text, expected):
    parsed = parse_options("m", {}, {"device_ids": text})
    assert parsed.options.instances.device_ids == expected
    assert parsed.unknown == () and parsed.no_effect == ()


@pytest.mark.parametrize("key,value", [("device_ids", "a,b"), ("device_ids", "-1"), ("device_exec_blocks", "0"),
                                       ("device_exec_blocks", "-2"), ("instance_exec_blocks", "0"), ("dump_data", "maybe")])
def test_invalid_ge_backend_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"model 'm': option {key}={value!r}"):
        parse_options("m", {}, {key: value})


def test_exec_blocks_and_dump_data():
    assert parse_options("m", {}, {}).options.instances.device_exec_blocks == -1
    options = parse_options("m", {"device_exec_blocks": "8"}, {"instance_exec_blocks": "2", "dump_data": "1"}).options
    assert (options.instances.device_exec_blocks, options.instances.instance_exec_blocks,
            options.diagnostics.dump_data) == (8, 2, True)
    assert parse_options("m", {}, {"device_exec_blocks": "-1"}).options.instances.device_exec_blocks == -1


@pytest.mark.parametrize("prefix", ["", "session.", "graph."])
def test_ge_family_keys_with_an_equivalent_are_mapped_at_every_level(prefix):
    parsed = parse_options("m", {}, {f"{prefix}ge.aicoreNum": "12|10", f"{prefix}ge.exec.enableDump": "1"})
    assert parsed.options.instances.cores_per_instance == 12
    assert parsed.options.diagnostics.dump_data is True
    assert parse_options("m", {}, {f"{prefix}ge.exec.precision_mode_v2": "fp16"}).options.engines.precision_mode == "fp16"
    assert parse_options("m", {}, {f"{prefix}ge.exec.precision_mode": "allow_mix_precision_bf16"}
                         ).options.engines.precision_mode == "bf16"
    assert parse_options("m", {}, {f"{prefix}ge.exec.precision_mode": "force_fp32"}).options.engines.precision_mode == "origin"
    assert parsed.unknown == () and parsed.no_effect == ()


def test_precision_mode_v1_refuses_v2_values():
    with pytest.raises(ConfigError, match="ge.exec.precision_mode='mixed_float16'"):
        parse_options("m", {}, {"ge.exec.precision_mode": "mixed_float16"})


def test_ge_family_keys_without_an_equivalent_are_no_effect_once_in_order():
    parsed = parse_options("m", {"ge.graphRunMode": "0", "graph.ge.inputFormat": "NCHW"},
                           {"session.ge.exec.atomicCleanPolicy": "1", "ge.graphRunMode": "1", "gex.thing": "1"})
    assert parsed.no_effect == ("ge.graphRunMode", "graph.ge.inputFormat", "session.ge.exec.atomicCleanPolicy")
    assert parsed.unknown == ("gex.thing",)
    # ONNX Runtime's session.* config keys are not ge-backend's: one no option reads stays unknown here (the peer's
    # session.use_device_allocator_for_initializers is an option: tests/unit/test_device_allocator_key.py).
    assert parse_options("m", {}, {"session.disable_cpu_ep_fallback": "1"}).unknown == (
        "session.disable_cpu_ep_fallback",)
