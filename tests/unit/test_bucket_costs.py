"""Bucket run costs measured at load (runtime/bucket_costs.py): when they are measured, what they measure, and the
load line; and that a static model served with them answers as the dynamic graph does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from gebackend.config.onnx_signature import read_signature
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec
from gebackend.modelzoo import build_resnet
from gebackend.runtime import bucket_costs
from gebackend.runtime.loader import load_executor


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("resnet") / "model.onnx"
    onnx.save(build_resnet(), str(path))
    return path


def _spec(path, max_batch_size=8, **options):
    config = {"name": "m", "max_batch_size": max_batch_size}
    return build_model_spec(config, read_signature(path), path, BackendOptions.make(static_model=True, **options))


def test_only_a_choice_between_batch_sizes_is_measured(resnet):
    assert bucket_costs.worth_measuring(_spec(resnet))  # buckets 1/2/4/8 by default
    assert not bucket_costs.worth_measuring(_spec(resnet, bucket_plan="smallest"))
    assert not bucket_costs.worth_measuring(_spec(resnet, max_batch_size=1))  # one bucket: nothing to choose


class Timed:
    """A static engine whose bucket i takes `times[i]` on a fake clock, except where a round adds a spike."""

    def __init__(self, times, spikes=()):
        self.times, self.spikes, self.now, self.ran = list(times), set(spikes), 0.0, []

    def clock(self):
        return self.now

    def run_bucket(self, index, feeds, output_names):
        self.ran.append((index, {n: a.shape for n, a in feeds.items()}, {str(a.dtype) for a in feeds.values()}))
        self.now += self.times[index] + (5.0 if len(self.ran) in self.spikes else 0.0)
        return [np.zeros(1)]


def test_each_bucket_runs_on_zeros_round_robin_and_keeps_its_least_time(resnet):
    spec = _spec(resnet)
    engine = Timed([1.0, 2.0, 4.0, 8.0], spikes={1, 6})  # round 1 bucket 0 and round 2 bucket 1 are disturbed
    costs, _ = bucket_costs.measure(engine, spec, ["logits"], rounds=3, clock=engine.clock)
    assert costs == [1.0, 2.0, 4.0, 8.0]
    assert [i for i, _, _ in engine.ran] == [0, 1, 2, 3] * 3
    assert [shapes["image"] for _, shapes, _ in engine.ran[:4]] == [(b, 3, 64, 64) for b in (1, 2, 4, 8)]
    assert all(dtypes == {"float32"} for _, _, dtypes in engine.ran)


def test_a_quick_model_is_timed_over_more_rounds_within_the_budget(resnet):
    """Models load side by side: a small model's few milliseconds of rounds are taken again, up to a second."""
    assert bucket_costs.BUDGET_SECONDS == 1.0
    engine = Timed([0.03125] * 4)  # a round takes 1/8 s: 8 rounds fill the budget
    bucket_costs.measure(engine, _spec(resnet), ["logits"], clock=engine.clock)
    assert len(engine.ran) == 4 * 8
    tiny = Timed([1e-6] * 4)
    bucket_costs.measure(tiny, _spec(resnet), ["logits"], clock=tiny.clock)
    assert len(tiny.ran) == 4 * bucket_costs.MAX_ROUNDS
    slow = Timed([1.0] * 4)
    bucket_costs.measure(slow, _spec(resnet), ["logits"], clock=slow.clock)
    assert len(slow.ran) == 4 * bucket_costs.ROUNDS  # never fewer


def test_a_smaller_bucket_never_costs_more_than_a_larger_one(resnet):
    """Bucket 1 timed in a load spike on every round (CI: a 1-row request was then padded to bucket 4): its cost is
    capped by bucket 2's, so a 1-row batch still runs on bucket 1."""
    from gebackend.runtime.buckets import batch_plan

    spec = _spec(resnet)
    engine = Timed([1.0, 2.0, 4.0, 8.0], spikes={1, 5, 9})  # bucket 0's run in each of the 3 rounds
    costs, _ = bucket_costs.measure(engine, spec, ["logits"], rounds=3, clock=engine.clock)
    assert costs == [2.0, 2.0, 4.0, 8.0]
    assert batch_plan(1, [1, 2, 4, 8], costs) == [0]
    assert bucket_costs.monotone(spec, [1.0, 3.0, 2.5, 8.0]) == [1.0, 2.5, 2.5, 8.0]


def test_a_bucket_that_fails_on_zeros_means_no_costs(resnet):
    class Failing(Timed):
        def run_bucket(self, index, feeds, output_names):
            if index == 2:
                raise RuntimeError("zeros are no valid input here")
            return super().run_bucket(index, feeds, output_names)

    assert bucket_costs.measure(Failing([1, 2, 4, 8]), _spec(resnet), ["logits"]) is None


def test_the_load_line_names_each_cost_and_each_split(resnet):
    spec = _spec(resnet)
    line = bucket_costs.describe(spec, [0.0011, 0.0021, 0.0041, 0.0081])
    assert line.startswith("bucket run costs measured at load: [image:1,3,64,64] 1.10 ms, [image:2,3,64,64] 2.10 ms")
    assert line.endswith("; batches split instead of padded: 3 as 2+1, 5 as 4+1, 6 as 4+2")  # 7: gain under 10 %
    flat = bucket_costs.describe(spec, [0.001, 0.00105, 0.0011, 0.0013])
    assert flat.endswith("; every batch pads up to the smallest bucket that holds it")


def test_a_static_model_loads_with_its_costs_and_answers_as_the_dynamic_graph(resnet):
    log: list[str] = []
    executor, _ = load_executor(_spec(resnet), log=log.append)
    dynamic, _ = load_executor(build_model_spec({"name": "m", "max_batch_size": 8}, read_signature(resnet), resnet,
                                                BackendOptions()))
    try:
        (line,) = [m for m in log if m.startswith("bucket run costs measured at load: ")]
        costs = executor.runner.router.costs
        assert costs is not None and len(costs) == 4 and all(c > 0 for c in costs)
        rng = np.random.default_rng(0)
        for rows in (1, 3, 5, 7, 8):
            requests = [{"image": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)} for _ in range(rows)]
            got, want = executor.execute(requests), dynamic.execute(requests)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g["logits"], w["logits"], rtol=1e-4, atol=1e-5)
        smallest, _ = load_executor(_spec(resnet, bucket_plan="smallest"), log=log.append)
        assert smallest.runner.router.costs is None
        smallest.close()
    finally:
        executor.close()
        dynamic.close()


class TimedDynamic:
    """A dynamic engine on the static one's fake clock: a run of n rows takes `per_row * n + fixed`."""

    def __init__(self, timed, per_row=1.0, fixed=0.0, fail=False):
        self.timed, self.per_row, self.fixed, self.fail, self.ran = timed, per_row, fixed, fail, []

    def run(self, feeds, output_names):
        if self.fail:
            raise RuntimeError("zeros are no valid input here")
        rows = feeds["image"].shape[0]
        self.ran.append(rows)
        self.timed.ran.append(("dynamic", rows))
        self.timed.now += self.per_row * rows + self.fixed
        return [np.zeros(rows)]


def test_the_dynamic_graph_is_timed_at_every_batch_size_in_the_same_rounds(resnet):
    spec = _spec(resnet)
    engine = Timed([1.5, 2.5, 4.5, 8.5])
    dynamic = TimedDynamic(engine, per_row=1.0, fixed=0.25)
    costs, dynamic_costs = bucket_costs.measure(engine, spec, ["logits"], dynamic, rounds=2, clock=engine.clock)
    assert costs == [1.5, 2.5, 4.5, 8.5]
    key = (("image", (3, 64, 64)),)
    assert dynamic_costs == {key: {n: n + 0.25 for n in range(1, 9)}}
    # buckets and dynamic sizes alternate by round, each engine's first run after an untimed one of its own
    one_round = [0, 0, 1, 2, 3] + [("dynamic", 1)] + [("dynamic", n) for n in range(1, 9)]
    assert [r if r[0] == "dynamic" else r[0] for r in engine.ran] == one_round * 2
    assert bucket_costs.measure(engine, spec, ["logits"], None, clock=engine.clock)[1] == {}


def test_the_switch_from_one_engine_to_the_other_is_not_timed(resnet):
    """A run right after the other engine's (its thread pool still spinning, its memory in the caches) is slower;
    that is the switch's cost, not the batch size's, and it must not decide where a batch size runs."""

    class Switching(Timed):
        def run_bucket(self, index, feeds, output_names):
            if self.ran and self.ran[-1][0] == "dynamic":
                self.now += 5.0
            return super().run_bucket(index, feeds, output_names)

    class SwitchingDynamic(TimedDynamic):
        def run(self, feeds, output_names):
            if self.timed.ran and self.timed.ran[-1][0] != "dynamic":
                self.timed.now += 5.0
            return super().run(feeds, output_names)

    engine = Switching([1.0, 2.0, 4.0, 8.0])
    costs, dynamic_costs = bucket_costs.measure(engine, _spec(resnet), ["logits"], SwitchingDynamic(engine),
                                                rounds=3, clock=engine.clock)
    assert costs == [1.0, 2.0, 4.0, 8.0]
    assert dynamic_costs == {(("image", (3, 64, 64)),): {n: float(n) for n in range(1, 9)}}


def test_a_dynamic_graph_that_fails_on_zeros_leaves_the_bucket_costs(resnet):
    engine = Timed([1.0, 2.0, 4.0, 8.0])
    costs, dynamic_costs = bucket_costs.measure(engine, _spec(resnet), ["logits"], TimedDynamic(engine, fail=True),
                                                clock=engine.clock)
    assert costs == [1.0, 2.0, 4.0, 8.0] and dynamic_costs == {}


def test_a_dynamic_graph_whose_outputs_the_data_sizes_is_no_candidate(resnet):
    """NonZero's count is no batch: the dynamic runner could not cut such an output back per request."""
    engine = Timed([1.0, 2.0, 4.0, 8.0])
    dynamic = TimedDynamic(engine)
    dynamic_run = dynamic.run
    dynamic.run = lambda feeds, names: [np.zeros((0, 2))] if feeds["image"].shape[0] == 5 else dynamic_run(feeds, names)
    costs, dynamic_costs = bucket_costs.measure(engine, _spec(resnet), ["logits"], dynamic, clock=engine.clock)
    assert costs == [1.0, 2.0, 4.0, 8.0] and dynamic_costs == {}


def test_the_load_line_names_the_batch_sizes_run_on_the_dynamic_graph(resnet):
    spec = _spec(resnet)
    key = (("image", (3, 64, 64)),)
    costs, dynamic = [0.0011, 0.0021, 0.0041, 0.0081], {key: {3: 0.0029, 7: 0.0070}}
    line = bucket_costs.describe(spec, costs, dynamic, {key: (3, 7)})
    assert line.endswith("; batches split instead of padded: 5 as 4+1, 6 as 4+2; run whole on the dynamic graph, "
                         "measured faster: 3 (2.90 ms against 3.20), 7 (7.00 ms against 8.10)")
    assert bucket_costs.describe(spec, costs, dynamic, {}).endswith("; the dynamic graph was faster at no batch size")


def _measured_as(monkeypatch, dynamic_wins_at):
    """Loads time the dynamic graph as 1 ms a row and the buckets as 1.5 ms a row, except where it should lose."""
    calls = []

    def fake(engine, spec, output_names, dynamic=None, rounds=3, clock=None):
        calls.append(dynamic)
        key = bucket_costs.batch_and_inner(spec.static_shapes[0])[1]
        costs = [0.0015 * b for b in (1, 2, 4, 8)]
        by_rows = {n: (0.001 if n in dynamic_wins_at else 0.1) * n for n in range(1, 9)}
        return costs, ({key: by_rows} if dynamic is not None else {})

    monkeypatch.setattr(bucket_costs, "measure", fake)
    return calls


def test_a_static_model_runs_the_batch_sizes_measured_faster_on_a_dynamic_session(resnet, monkeypatch):
    from gebackend.runtime.buckets import DYNAMIC

    calls = _measured_as(monkeypatch, dynamic_wins_at={3, 5})
    log: list[str] = []
    executor, how = load_executor(_spec(resnet), log=log.append)
    dynamic, _ = load_executor(build_model_spec({"name": "m", "max_batch_size": 8}, read_signature(resnet), resnet,
                                                BackendOptions()))
    try:
        runner = executor.runner
        assert calls[0] is not None and runner.dynamic is calls[0] and runner.fallback is None
        assert "batch sizes 3,5 on the dynamic graph" in how
        assert any("run whole on the dynamic graph, measured faster: 3 (3.00 ms against 4.50), 5 (5.00 ms" in m
                   for m in log)
        rng = np.random.default_rng(1)
        for rows in (3, 4, 5):
            requests = [{"image": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)} for _ in range(rows)]
            for g, w in zip(executor.execute(requests), dynamic.execute(requests)):
                np.testing.assert_allclose(g["logits"], w["logits"], rtol=1e-4, atol=1e-5)
        assert runner.runs_per_bucket[DYNAMIC] == 2 and runner.runs_per_bucket[2] == 1  # 3 and 5; 4 on bucket 4
    finally:
        executor.close()
        dynamic.close()


def test_a_dynamic_session_that_wins_nothing_is_closed_and_buckets_only_makes_none(resnet, monkeypatch):
    from gebackend.runtime import loader

    calls = _measured_as(monkeypatch, dynamic_wins_at=set())
    closed, made = [], []

    def create_engine(spec, providers):
        engine = real(spec, providers)
        made.append(engine)
        engine.close = lambda: closed.append(engine)  # (an ONNX Runtime session holds nothing else to free)
        return engine

    real = loader.create_engine
    monkeypatch.setattr(loader, "create_engine", create_engine)
    executor, how = load_executor(_spec(resnet))
    try:
        assert calls == made and executor.runner.dynamic is None and "on the dynamic graph" not in how
        assert closed == made  # closed at load: it won no batch size
        assert executor.runner.engines() == [executor.runner.engine]
    finally:
        executor.close()
    assert closed == made  # and not again
    buckets_only, _ = load_executor(_spec(resnet, bucket_plan="buckets"))
    try:
        assert calls[1] is None and len(made) == 1 and buckets_only.runner.router.costs is not None
    finally:
        buckets_only.close()


def test_with_the_dynamic_fallback_the_same_session_is_timed_and_kept(resnet, monkeypatch):
    calls = _measured_as(monkeypatch, dynamic_wins_at=set())
    executor, _ = load_executor(_spec(resnet, bucket_fallback="dynamic"))
    try:
        assert calls[0] is executor.runner.fallback and executor.runner.dynamic is None
    finally:
        executor.close()
