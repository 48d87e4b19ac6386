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
    costs = bucket_costs.measure(engine, spec, ["logits"], rounds=3, clock=engine.clock)
    assert costs == [1.0, 2.0, 4.0, 8.0]
    assert [i for i, _, _ in engine.ran] == [0, 1, 2, 3] * 3
    assert [shapes["image"] for _, shapes, _ in engine.ran[:4]] == [(b, 3, 64, 64) for b in (1, 2, 4, 8)]
    assert all(dtypes == {"float32"} for _, _, dtypes in engine.ran)


def test_a_smaller_bucket_never_costs_more_than_a_larger_one(resnet):
    """Bucket 1 timed in a load spike on every round (CI: a 1-row request was then padded to bucket 4): its cost is
    capped by bucket 2's, so a 1-row batch still runs on bucket 1."""
    from gebackend.runtime.buckets import batch_plan

    spec = _spec(resnet)
    engine = Timed([1.0, 2.0, 4.0, 8.0], spikes={1, 5, 9})  # bucket 0's run in each of the 3 rounds
    costs = bucket_costs.measure(engine, spec, ["logits"], rounds=3, clock=engine.clock)
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
