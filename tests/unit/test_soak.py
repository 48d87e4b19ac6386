"""Unit tests for the soak's pure logic (gebackend.bench.soak): Triton's counters, memory growth, the verdict, output."""

from __future__ import annotations

import math

import pytest

from gebackend.bench import soak, soak_report

METRICS = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="bert_small",version="1"} 3421
nv_inference_request_success{model="resnet_small",version="1"} 1706
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="bert_small",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="bert_small",reason="BACKEND",version="1"} 3
nv_inference_request_failure{model="resnet_small",reason="OTHER",version="1"} 0
nv_inference_count{model="bert_small",version="1"} 9999
"""


def test_request_counts_sum_failures_over_reasons():
    assert soak.request_counts(METRICS) == {
        "bert_small": {"success": 3421.0, "failure": 5.0},
        "resnet_small": {"success": 1706.0, "failure": 0.0},
    }
    assert soak.request_counts("") == {}


def test_memory_growth_is_measured_after_the_warm_up():
    # fills during the warm-up (0-20 s), then flat: no growth
    series = [(0, 100.0), (10, 130.0), (20, 140.0), (30, 140.0), (40, 140.0), (50, 140.0), (60, 140.0)]
    flat = soak.memory_growth(series, warmup_s=20)
    assert flat["start_mib"] == 100.0 and flat["baseline_mib"] == 140.0 and flat["end_mib"] == 140.0
    assert flat["growth"] == 0.0 and flat["slope_mib_per_min"] == 0.0 and flat["peak_mib"] == 140.0
    # a leak of 1 MiB per 10 s after warm-up
    leaking = [(t, 100.0 + t / 10) for t in range(0, 610, 10)]
    grown = soak.memory_growth(leaking, warmup_s=60)
    assert grown["slope_mib_per_min"] == pytest.approx(6.0)
    assert grown["baseline_mib"] == pytest.approx(107.0) and grown["end_mib"] == pytest.approx(159.0)
    assert grown["growth"] == pytest.approx(52 / 107, abs=1e-4)
    assert soak.memory_growth([], 10) == {}
    assert soak.memory_growth([(0, 50.0)], 10)["growth"] == 0.0  # too short: compared with itself


def result(failed=0.0, succeeded=100.0, errors=(), growth=0.01, restarts=0):
    return {"models": {"m": {"failed": failed, "succeeded": succeeded, "errors": list(errors)}},
            "processes": {"stub m_0": {"memory": {"growth": growth}, "restarts": restarts}}}


def test_problems_name_what_missed_the_target():
    assert soak.problems(result(), 0.05) == []
    assert soak.problems(result(failed=3), 0.05) == ["m: 3 failed request(s)"]
    assert soak.problems(result(succeeded=0), 0.05) == ["m: no request succeeded"]
    assert soak.problems(result(errors=["Thread [0] had error: boom"]), 0.05) == ["m: perf_analyzer: Thread [0] had error: boom"]
    assert soak.problems(result(growth=0.07), 0.05) == ["stub m_0: RSS grew 7.0% after warm-up (limit 5%)"]
    assert soak.problems(result(restarts=1), 0.05) == ["stub m_0: its process was replaced 1 time(s)"]


def test_warm_up_is_a_fraction_of_the_soak_capped():
    assert soak.SoakSettings(minutes=1).warmup_s == pytest.approx(12.0)
    assert soak.SoakSettings(minutes=10).warmup_s == 60.0


def test_soak_serves_a_static_and_a_bucketed_model():
    (static_model, static), (bucket_model, buckets) = soak.SOAK_MODELS
    assert static.static and static.buckets == (4,) and static_model != bucket_model
    assert buckets.static and buckets.buckets == (1, 2, 4, 8) and buckets.dynamic_batching


def test_markdown_and_plots(tmp_path):
    full = {
        "meta": {"minutes": 1, "elapsed_s": 61.0, "interrupted": False, "concurrency_per_model": 2, "warmup_s": 12.0,
                 "max_growth": 0.05, "protocol": "grpc"},
        "models": {"m": {"served_as": "static", "succeeded": 1000.0, "failed": 0.0, "throughput_mean": 16.7,
                         "throughput_min": 15.0, "throughput_max": 18.0, "p99_ms_max": 9.5,
                         "runs": [{"started": 1.0, "ended": 31.0, "throughput": 15.0},
                                  {"started": 31.0, "ended": 61.0, "throughput": 18.0}]}},
        "processes": {"tritonserver": {"restarts": 0, "rss": [(0, 40.0), (30, 42.0), (60, 42.0)],
                                       "memory": soak.memory_growth([(0, 40.0), (30, 42.0), (60, 42.0)], 12.0)}},
        "problems": [], "passed": True,
    }
    text = soak_report.markdown(full)
    assert "**PASSED**" in text and "| m | static | 1,000 | 0 | 16.7 (15.0-18.0) | 9.5 ms |" in text
    assert "| tritonserver | 40.0 MiB | 42.0 MiB | 42.0 MiB | 42.0 MiB | +0.00% |" in text
    paths = soak_report.plot(full, tmp_path)
    assert [p.name for p in paths] == ["soak_rss.png", "soak_throughput.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    assert not math.isnan(full["processes"]["tritonserver"]["memory"]["growth"])


def test_counter_increase_survives_a_restart_of_the_counter():
    assert soak.increase([0, 10, 25]) == 25
    assert soak.increase([0, 10, 25, 3, 8]) == 33  # reloaded after 25: counts from 0 again
    assert soak.increase([7]) == 0 and soak.increase([]) == 0
