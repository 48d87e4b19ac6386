"""Bucket costs timed by one instance and used by the others of its model (control/shared_costs.py): the record,
its key and age, the costs' JSON form (runtime/bucket_costs.py), and two loads in one control folder timing once."""

from __future__ import annotations

import json
import re

import onnx
import pytest

from gebackend.config.onnx_signature import read_signature
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec
from gebackend.control.shared_costs import MAX_AGE_SECONDS, CostRecord, key
from gebackend.modelzoo import build_resnet
from gebackend.runtime import bucket_costs
from gebackend.runtime.loader import load_executor

PARTS = {"file": "abc", "shapes": [{"x": [1, 3]}, {"x": [2, 3]}], "options": "BackendOptions(...)", "cores": 1}


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("resnet") / "model.onnx"
    onnx.save(build_resnet(), str(path))
    return path


def _spec(path, **options):
    return build_model_spec({"name": "m", "max_batch_size": 8}, read_signature(path), path,
                            BackendOptions.make(static_model=True, **options))


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_the_key_names_the_question_and_nothing_else():
    assert key(PARTS) == key(dict(reversed(list(PARTS.items()))))  # order of the parts does not matter
    for changed in ({"cores": 2}, {"file": "abd"}, {"shapes": [{"x": [1, 3]}]}, {"options": "other"}):
        assert key({**PARTS, **changed}) != key(PARTS), changed


def test_a_record_written_is_read_back_by_the_same_question_only(tmp_path):
    clock = Clock()
    writer = CostRecord(tmp_path, "resnet", PARTS, clock)
    assert writer.read() is None  # nothing timed yet
    assert writer.write({"buckets": [0.001, 0.002], "dynamic": None})
    clock.now += 12.0
    shared = CostRecord(tmp_path, "resnet", PARTS, clock).read()
    assert shared.payload == {"buckets": [0.001, 0.002], "dynamic": None} and shared.age_seconds == 12.0
    assert shared.describe().startswith("timed 12s ago by another instance of this model (on cores ")
    assert CostRecord(tmp_path, "resnet", {**PARTS, "cores": 2}, clock).read() is None
    assert CostRecord(tmp_path, "other", PARTS, clock).read() is None
    assert [p.name for p in (tmp_path / "bucket_costs").iterdir()] == [writer.path.name]  # no partial file left


def test_an_old_or_broken_record_is_not_used(tmp_path):
    clock = Clock()
    record = CostRecord(tmp_path, "m", PARTS, clock)
    record.write({"buckets": [1.0]})
    clock.now += MAX_AGE_SECONDS + 1  # a reload much later times afresh
    assert record.read() is None
    record.path.write_text("{not json")
    assert record.read() is None
    record.path.write_text(json.dumps({"payload": {}}))  # no time written
    assert record.read() is None


def test_without_a_control_folder_nothing_is_shared(tmp_path, monkeypatch):
    monkeypatch.delenv("GE_CONTROL_DIR", raising=False)
    record = CostRecord.here("m", PARTS)
    assert record.path is None and record.read() is None and not record.write({"buckets": [1.0]})
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    assert not CostRecord(unwritable, "m", PARTS).write({"buckets": [1.0]})  # never a load failure


def test_costs_round_trip_through_json_in_dynamic_sizes_order(resnet):
    spec = _spec(resnet)
    inner = bucket_costs.batch_and_inner(spec.static_shapes[0])[1]
    measured = ([0.001, 0.002, 0.004, 0.008], {inner: {rows: rows * 0.0011 for rows in range(1, 9)}})
    payload = json.loads(json.dumps(bucket_costs.to_payload(spec, measured)))
    assert payload["dynamic"] == [rows * 0.0011 for rows in range(1, 9)]
    assert bucket_costs.from_payload(spec, payload) == measured
    buckets_only = ([0.001, 0.002, 0.004, 0.008], {})
    assert bucket_costs.from_payload(spec, bucket_costs.to_payload(spec, buckets_only)) == buckets_only
    assert bucket_costs.from_payload(spec, bucket_costs.to_payload(spec, None)) is None  # a bucket failed: padding
    with pytest.raises(ValueError, match="3 bucket costs for 4 buckets"):
        bucket_costs.from_payload(spec, {"buckets": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match="2 dynamic-graph costs for 8 batch sizes"):
        bucket_costs.from_payload(spec, {"buckets": [0.1] * 4, "dynamic": [0.1, 0.2]})


def test_the_second_load_of_the_same_model_uses_the_first_ones_timing(resnet, tmp_path, monkeypatch):
    monkeypatch.setenv("GE_CONTROL_DIR", str(tmp_path / "control"))
    timed = []

    def measure(engine, spec, output_names, dynamic=None, rounds=3, clock=None):
        timed.append(dynamic is not None)
        inner = bucket_costs.batch_and_inner(spec.static_shapes[0])[1]
        # the dynamic graph faster at 3 rows only: both loads must run batches of 3 there
        return [0.0015 * b for b in (1, 2, 4, 8)], {inner: {n: (0.001 if n == 3 else 0.1) * n for n in range(1, 9)}}

    monkeypatch.setattr(bucket_costs, "measure", measure)
    logs: list[list[str]] = [[], [], []]
    first, how_first = load_executor(_spec(resnet), log=logs[0].append)
    second, how_second = load_executor(_spec(resnet), log=logs[1].append)
    other, _ = load_executor(_spec(resnet, bucket_plan="buckets"), log=logs[2].append)  # another question
    try:
        assert timed == [True, False]  # the second load did not time; the buckets-only one did, without a dynamic graph
        assert "batch sizes 3 on the dynamic graph" in how_first and "batch sizes 3 on the dynamic graph" in how_second
        assert second.runner.router.costs == first.runner.router.costs
        assert any(re.match(r"bucket costs: timed \d+s ago by another instance of this model \(on cores [\d,]+\), "
                            r"used as they are", m) for m in logs[1]), logs[1]
        assert not any("another instance" in m for m in logs[0] + logs[2])
        costs_line = [m for m in logs[0] if m.startswith("bucket run costs measured at load")]
        assert costs_line and costs_line == [m for m in logs[1] if m.startswith("bucket run costs measured at load")]
    finally:
        for executor in (first, second, other):
            executor.close()
