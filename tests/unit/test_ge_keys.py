"""Unit tests for gebackend.config.ge_keys and config.option_report: ge-backend's keys and what the load log says."""

from __future__ import annotations

import pytest

from gebackend.config.ge_keys import describe_no_effect, device_notes, exec_blocks, hint, instance_count, is_ge_family
from gebackend.config.option_report import load_report
from gebackend.config.options import parse_options


@pytest.mark.parametrize("key,family", [("ge.aicoreNum", True), ("session.ge.exec.x", True), ("graph.ge.inputShape", True),
                                        ("session.use_device_allocator_for_initializers", False), ("gex", False),
                                        ("device_ids", False), ("global.ge.x", False)])
def test_family(key, family):
    assert is_ge_family(key) is family


@pytest.mark.parametrize("instances,devices,per_instance,per_device,expected", [
    (1, 1, 1, -1, 1), (64, 1, 1, -1, 64), (64, 1, 1, 8, 8), (3, 2, 1, -1, 2), (4, 2, 2, -1, 4), (1, 2, 1, -1, 1)])
def test_exec_blocks_as_ge_backend_computes_them(instances, devices, per_instance, per_device, expected):
    assert exec_blocks(instances, devices, per_instance, per_device) == expected


@pytest.mark.parametrize("config,expected", [({}, 1), ({"instance_group": []}, 1), ({"instance_group": [{"count": 3}]}, 3),
                                             ({"instance_group": [{"count": 2}, {"count": 5}, {}]}, 8)])
def test_instance_count(config, expected):
    assert instance_count(config) == expected


def test_hints_by_ge_option_name_at_every_level():
    assert hint("ge.exec.deviceId") == hint("session.ge.exec.deviceId") == hint("graph.ge.exec.deviceId") != ""
    assert hint("ge.somethingElse") == ""
    assert describe_no_effect(("ge.graphRunMode", "ge.x")) == (
        "ge-backend option(s) accepted, no effect on this engine: ge.graphRunMode (these engines always run inference), ge.x")


def test_device_notes():
    options = parse_options("m", {}, {"device_ids": "4,5"}).options
    assert device_notes(options, {}) == [
        "device_ids 4,5 (ge-backend: the NPUs the model spreads over): this instance runs on the CPU, so they select nothing "
        "(execution_provider=cann runs on them)"]
    assert "Triton places GPU instances" in device_notes(options, {}, "KIND_GPU")[0]
    cann = parse_options("m", {}, {"device_ids": "4,5", "execution_provider": "cann"}).options
    assert device_notes(cann, {}) == ["device_ids 4,5 (ge-backend: the NPUs the model spreads over): "
                                      "execution_provider=cann: instance i runs on NPU device_ids[i % count]"]
    assert device_notes(parse_options("m", {}, {}).options, {}) == []
    options = parse_options("m", {}, {"device_ids": "0,1", "instance_exec_blocks": "2"}).options
    notes = device_notes(options, {"instance_group": [{"count": 3}]})
    assert notes[1] == ("instance_exec_blocks=2: ge-backend would run 3 execution block(s) on each of 2 device(s); here "
                        "each Triton instance runs one engine, so instance_group count (3) sets how many run at once")


def test_load_report_lines_and_levels():
    config = {"instance_group": [{"count": 1}], "optimization": {"execution_accelerators": {
        "cpu_execution_accelerator": [{"name": "openvino"}],
        "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}]}}}
    parsed = parse_options("m", {"nope": "1"}, {"ge.graphRunMode": "0", "device_exec_blocks": "4"}, config)
    assert load_report(parsed, config) == [
        (True, "unknown option(s) ignored: nope"),
        (True, "ge-backend option(s) accepted, no effect on this engine: ge.graphRunMode (these engines always run inference)"),
        (False, "device_exec_blocks=4: ge-backend would run 4 execution block(s) on each of 1 device(s); here each Triton "
                "instance runs one engine, so instance_group count (1) sets how many run at once"),
        (False, "cpu_execution_accelerator openvino: selects engine=openvino"),
        (False, "gpu_execution_accelerator tensorrt(precision_mode=FP16): for KIND_GPU instances; this CPU instance "
                "runs without it"),
    ]
    assert (False, "gpu_execution_accelerator tensorrt(precision_mode=FP16): selects the tensorrt execution provider "
                   "(engines/providers/)") in load_report(parsed, config, "KIND_GPU")
    overridden = parse_options("m", {}, {"engine": "ort"}, config)
    assert (False, "cpu_execution_accelerator openvino: the config.pbtxt parameter engine=onnxruntime wins") in load_report(
        overridden, config, "KIND_GPU")


def test_load_report_is_empty_for_plain_options():
    assert load_report(parse_options("m", {"intra_op_thread_count": "2"}, {}), {}) == []
