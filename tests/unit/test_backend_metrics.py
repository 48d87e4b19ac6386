"""triton/metrics.BackendMetrics without a server: what it publishes, and that a publisher which fails says so."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from gebackend.triton.metrics import BackendMetrics


class _Metric:
    def __init__(self, labels, fail):
        self.labels, self.value, self.fail = labels, 0.0, fail

    def increment(self, by):
        if self.fail.is_set():
            raise RuntimeError("Failed to increment metric value: tritonserver is gone")
        self.value += by

    def set(self, value):
        self.value = value


class _PbUtils:
    """pb_utils' MetricFamily surface, recording every metric it hands out."""

    def __init__(self):
        self.metrics: dict[tuple[str, tuple], _Metric] = {}
        self.fail = threading.Event()
        pb = self

        class MetricFamily:
            COUNTER, GAUGE = "counter", "gauge"

            def __init__(self, name, description, kind):
                self.name = name

            def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
                metric = _Metric(labels, pb.fail)
                pb.metrics[(self.name, tuple(sorted(labels.items())))] = metric
                return metric

        self.MetricFamily = MetricFamily

    def value(self, name: str) -> float:
        return self.metrics[(name, (("model", "m"),))].value


def _runner():
    return SimpleNamespace(router=None, runs_per_bucket={}, rows=0, padded_rows=0, fallback_runs=0)


def test_update_publishes_what_the_runner_counted_since_the_last_update():
    pb, runner = _PbUtils(), _runner()
    metrics = BackendMetrics(pb, "m", runner, 1.5)
    assert pb.value("gebackend_compile_seconds") == 1.5
    runner.rows, runner.padded_rows = 8, 2
    metrics.update()
    runner.rows, runner.padded_rows = 12, 2
    metrics.update()
    assert (pb.value("gebackend_rows_total"), pb.value("gebackend_padded_rows_total")) == (12, 2)
    assert pb.value("gebackend_padding_waste_ratio") == 2 / 12


def test_a_publisher_that_fails_says_why_in_the_log_and_stops():
    pb, runner = _PbUtils(), _runner()
    said: list[str] = []
    warned = threading.Event()
    metrics = BackendMetrics(pb, "m", runner, 0.0, warn=lambda line: (said.append(line), warned.set()))
    pb.fail.set()
    runner.rows = 4
    metrics.start(interval=0.01)
    assert warned.wait(5), "the failing publisher said nothing"
    metrics._thread.join(5)
    assert not metrics._thread.is_alive()
    assert len(said) == 1
    assert said[0].startswith("m: gebackend's metrics stopped: publishing them failed (RuntimeError: Failed to "
                              "increment metric value: tritonserver is gone)")
    assert "the model keeps serving" in said[0]


def test_a_publisher_failing_while_the_model_unloads_stays_quiet():
    pb, runner = _PbUtils(), _runner()
    said: list[str] = []
    metrics = BackendMetrics(pb, "m", runner, 0.0, warn=said.append)
    metrics._stop.set()  # close() has begun: tritonserver may be gone
    pb.fail.set()
    runner.rows = 4
    metrics._stop.wait = lambda interval: False  # one more round after the stop, as a publish already under way
    thread = threading.Thread(target=metrics._run, args=(0.0,))
    thread.start()
    thread.join(5)
    assert said == []


def test_runs_on_the_dynamic_graph_count_under_bucket_dynamic():
    from gebackend.runtime.buckets import DYNAMIC

    pb = _PbUtils()
    router = SimpleNamespace(describe=lambda: ["x:[1, 4]", "x:[4, 4]"], costs=[0.001, 0.003],
                             dynamic_rows={(("x", (4,)),): (3,)})
    runner = SimpleNamespace(router=router, runs_per_bucket={}, rows=0, padded_rows=0, fallback_runs=0)
    metrics = BackendMetrics(pb, "m", runner, 0.0)
    runner.runs_per_bucket = {0: 2, DYNAMIC: 3}
    runner.rows = 11
    metrics.update()

    def runs(bucket):
        return pb.metrics[("gebackend_bucket_runs_total", (("bucket", bucket), ("model", "m")))].value

    assert (runs("x:[1, 4]"), runs("x:[4, 4]"), runs("dynamic")) == (2, 0, 3)
    assert ("gebackend_bucket_run_seconds", (("bucket", "dynamic"), ("model", "m"))) not in pb.metrics
    assert pb.metrics[("gebackend_bucket_run_seconds", (("bucket", "x:[4, 4]"), ("model", "m")))].value == 0.003
