"""triton/metrics.BackendMetrics without a server: what it publishes, that a publisher which fails says so, and that
closing it lets go of every pb_utils object (ServedModel's close too), unless its thread would not stop, and that of
the processes sharing a model's series only the last deletes them."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from types import SimpleNamespace

import pytest

from gebackend.triton import metrics as metrics_module
from gebackend.triton.bridge import ServedModel
from gebackend.triton.metrics import BackendMetrics, SeriesOwners


class _Metric:
    def __init__(self, labels, fail, hold=None, entered=None):
        self.labels, self.value, self.fail, self.hold, self.entered = labels, 0.0, fail, hold, entered

    def increment(self, by):
        if self.hold is not None:
            self.entered.set()
            self.hold.wait(10)  # a round trip to tritonserver that does not come back
        if self.fail.is_set():
            raise RuntimeError("Failed to increment metric value: tritonserver is gone")
        self.value += by

    def set(self, value):
        self.value = value


class _PbUtils:
    """pb_utils' MetricFamily surface, recording every metric it hands out. As in the stub, a family holds the metrics
    it made; `alive` names the families and metrics not yet destroyed."""

    def __init__(self, hold: threading.Event | None = None):
        self.metrics: dict[tuple[str, tuple], _Metric] = {}
        self.fail = threading.Event()
        self.entered = threading.Event()  # a publish is inside a held call
        self._alive: list[tuple[str, weakref.ref]] = []
        pb = self

        class MetricFamily:
            COUNTER, GAUGE = "counter", "gauge"

            def __init__(self, name, description, kind):
                self.name = name
                self.made: list[_Metric] = []
                pb._alive.append((name, weakref.ref(self)))

            def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
                metric = _Metric(labels, pb.fail, hold, pb.entered)
                self.made.append(metric)
                pb.metrics[(self.name, tuple(sorted(labels.items())))] = metric
                pb._alive.append((f"{self.name}{labels}", weakref.ref(metric)))
                return metric

        self.MetricFamily = MetricFamily

    def value(self, name: str) -> float:
        return self.metrics[(name, (("model", "m"),))].value

    def alive(self) -> list[str]:
        self.metrics.clear()  # the record of values is the test's, not a reference the model holds
        return [name for name, ref in self._alive if ref() is not None]


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


def _bucketed_runner():
    router = SimpleNamespace(describe=lambda: ["x:[1, 4]", "x:[4, 4]"], costs=[0.001, 0.003], dynamic_rows={})
    return SimpleNamespace(router=router, runs_per_bucket={}, rows=0, padded_rows=0, fallback_runs=0)


def test_close_joins_the_publisher_then_lets_go_of_every_metric_and_family():
    """As the stub needs: nothing of pb_utils outlives finalize() (tritonserver 2.51's stub crashes destroying a
    family after it tore itself down). No garbage collection: dropping the references must be enough."""
    pb, runner = _PbUtils(), _bucketed_runner()
    trimmer = SimpleNamespace(positions=0, trimmed=0)
    metrics = BackendMetrics(pb, "m", runner, 1.0, trimmer).start(interval=0.01)
    runner.rows, trimmer.positions = 4, 8
    assert len(pb.alive()) == 9 + 11  # 9 families; runs and run seconds of 2 buckets, 5 of the model, 2 of the trim
    gc.disable()
    try:
        assert metrics.close() is True
        assert pb.alive() == []
    finally:
        gc.enable()


def test_close_with_a_stuck_publisher_says_so_and_tears_nothing_down():
    hold = threading.Event()
    pb, runner, said = _PbUtils(hold), _runner(), []
    metrics = BackendMetrics(pb, "m", runner, 0.0, warn=said.append).start(interval=0.01)
    runner.rows = 4  # the next publish blocks in its increment
    try:
        assert pb.entered.wait(5)
        assert metrics.close(timeout=0.3) is False
        assert said == ["m: gebackend's metrics publisher did not stop within 0.3s; its metrics are left registered "
                        "(their series may stay on /metrics, and the backend process may not exit cleanly)"]
        assert len(pb.alive()) == 7 + 5  # not a family nor a metric was let go under the running thread
    finally:
        hold.set()
    assert metrics.close() is True and pb.alive() == []


class _Instance:
    def __init__(self):
        self.spec = SimpleNamespace(name="m", inputs=[], outputs=[])
        self.closed = False

    def close(self):
        self.closed = True


def test_a_served_model_closed_holds_nothing_of_pb_utils():
    pb, logged = _PbUtils(), []
    logger = SimpleNamespace(log_info=logged.append, log_warn=logged.append)
    from gebackend.triton.bridge import _TritonLog

    log = _TritonLog(logger)
    served = ServedModel(_Instance(), pb, BackendMetrics(pb, "m", _runner(), 0.0, warn=log.warn).start(0.01), log)
    assert served.close() is True
    assert served.instance.closed and served.metrics is None and served.pb is None
    assert log.info is not logger.log_info and log.warn is not logger.log_warn  # a late line goes to stderr
    assert pb.alive() == []


def test_a_served_model_whose_publisher_is_stuck_keeps_what_it_uses():
    hold = threading.Event()
    pb, runner = _PbUtils(hold), _runner()
    metrics = BackendMetrics(pb, "m", runner, 0.0).start(interval=0.01)
    served = ServedModel(_Instance(), pb, metrics)
    runner.rows = 4
    try:
        assert pb.entered.wait(5)
        metrics.close = lambda: BackendMetrics.close(metrics, timeout=0.2)
        assert served.close() is False
        assert served.instance.closed and served.metrics is metrics and served.pb is pb
    finally:
        hold.set()


def test_only_the_last_live_publisher_of_a_model_deletes_its_series(tmp_path, monkeypatch):
    """The instances of a model, and the old and new versions of a reloaded one, share their series inside
    tritonserver: the first to delete them would delete them for all. So the ones leaving before the last hand their
    families over (kept alive, never destroyed) and the last one deletes; a publisher that died is not counted."""
    alive = {1, 2}
    monkeypatch.setattr(metrics_module, "is_running", lambda pid, started: pid in alive)
    pb = _PbUtils()
    first = BackendMetrics(pb, "m", _runner(), 0.0, owners=SeriesOwners(tmp_path, "m", me="1-100"))
    last = BackendMetrics(pb, "m", _runner(), 0.0, owners=SeriesOwners(tmp_path, "m", me="2-200"))
    owners = tmp_path / "metrics" / "m"
    (owners / "3-300").touch()  # one that died without leaving
    handed, deleted = [weakref.ref(f) for f in first._families], [weakref.ref(f) for f in last._families]
    try:
        assert first.close() is True
        assert all(ref() is not None for ref in handed), "the other publisher still uses these series"
        assert last.close() is True
        assert all(ref() is None for ref in deleted), "the last one deletes them"
        assert sorted(p.name for p in owners.iterdir()) == []  # the dead one's entry swept with it
    finally:
        for ref in handed:  # give back the references handed over: this process lives on
            if ref() is not None:
                ctypes.pythonapi.Py_DecRef(ctypes.py_object(ref()))


def test_without_the_server_s_control_folder_each_instance_deletes_its_own(monkeypatch, tmp_path):
    monkeypatch.delenv("GE_CONTROL_DIR", raising=False)
    assert SeriesOwners.of("m") is None
    monkeypatch.setenv("GE_CONTROL_DIR", str(tmp_path))
    assert SeriesOwners.of("m").folder == tmp_path / "metrics" / "m"


def test_with_the_control_folder_gone_an_instance_deletes_its_own_and_never_makes_the_folder_again(tmp_path):
    gone = tmp_path / "control"
    owners = SeriesOwners(gone, "m", me="1-100")
    owners.join()
    with owners.leaving() as last:
        assert last is True
    assert not gone.exists()


def test_the_phases_of_execute_are_published_in_seconds():
    from gebackend.runtime.phase_clock import PhaseClock

    pb, clock = _PbUtils(), PhaseClock()
    metrics = BackendMetrics(pb, "m", _runner(), 0.0, clock=clock)
    clock.engine(3_000_000)
    clock.execution(read_ns=1_000_000, call_ns=5_000_000, engine_ns=3_000_000, respond_ns=500_000)
    metrics.update()
    clock.engine(1_000_000)
    clock.execution(read_ns=0, call_ns=1_500_000, engine_ns=1_000_000, respond_ns=0)
    metrics.update()

    def phase(name):
        return pb.metrics[("gebackend_execute_seconds_total", (("model", "m"), ("phase", name)))].value

    assert [phase(p) for p in ("read", "prepare", "engine", "respond")] == pytest.approx([0.001, 0.0025, 0.004, 0.0005])
    assert pb.value("gebackend_executions_total") == 2
    assert metrics.close() is True and pb.alive() == []
