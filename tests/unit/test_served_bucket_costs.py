"""Bucket costs kept true while serving (runtime/bucket_costs.py `ServedCosts`, the router's `observe` and its
exploration): a cost timed in a load spike is corrected by the runs served, and a split that is really cheaper
stays. A fake engine and a fake clock that advances by each bucket's true cost: no timing of this machine."""

from __future__ import annotations

import numpy as np
import pytest

from gebackend.runtime import bucket_costs
from gebackend.runtime.bucket_costs import SERVED_MIN_RUNS, SERVED_WINDOW, ServedCosts
from gebackend.runtime.buckets import EXPLORE_EVERY
from gebackend.runtime.runners import BucketRunner
from test_buckets import IMAGE_BUCKETS, LINEAR_COSTS, RowSum, costed_router

SPLIT = [(b, (("image", (3, 8, 8)),)) for b in (1, 2, 4, 8)] + [(2, (("image", (3, 16, 16)),))]


class TrueCosts:
    """A clock that a RowSum engine advances by the true cost of each bucket it runs."""

    def __init__(self, costs):
        self.costs, self.now = list(costs), 0.0

    def __call__(self) -> float:
        return self.now


class TimedRowSum(RowSum):
    def __init__(self, buckets, clock: TrueCosts):
        super().__init__(buckets)
        self.clock = clock

    def run_bucket(self, bucket, feeds, output_names):
        self.clock.now += self.clock.costs[bucket]
        return super().run_bucket(bucket, feeds, output_names)


def _serve(load_costs, true_costs, rows, batches):
    clock = TrueCosts(true_costs)
    engine = TimedRowSum(IMAGE_BUCKETS, clock)
    heard = []
    runner = BucketRunner("m", costed_router(load_costs), engine, ["logits"], on_replan=heard.append, clock=clock)
    image = np.random.default_rng(0).random((rows, 3, 8, 8), dtype=np.float32)
    for _ in range(batches):
        out = runner.run({"image": image})["logits"]
        np.testing.assert_allclose(out[:, 0], image.reshape(rows, -1).sum(axis=1), rtol=1e-5)
    return runner, engine, heard


def test_a_bucket_timed_in_a_load_spike_is_corrected_by_the_runs_served():
    # At load bucket 4 was timed at 10 (a spike; capped to bucket 8's 8.1), so a batch of 4 runs as 2 + 2.
    spiked = [1.1, 2.1, 10.0, 8.1, 4.0]
    runner, engine, heard = _serve(spiked, LINEAR_COSTS, rows=4, batches=EXPLORE_EVERY * (SERVED_MIN_RUNS + 2))
    first = engine.calls[:2]
    assert first == [2, 2]
    # Exploration ran the padded plan (one run of bucket 4) once in EXPLORE_EVERY; after SERVED_MIN_RUNS of them
    # the cost is bucket 4's true 4.1 and every batch of 4 runs as one run of 4.
    assert router_plan(runner, 4) == [(2, 4)]
    assert runner.router.costs[2] == pytest.approx(4.1) and runner.router.replans >= 1
    assert heard and heard[-1][2] == pytest.approx(4.1)
    assert engine.calls[-5:] == [4] * 5


def test_a_split_that_is_really_cheaper_stays_and_explores_rarely():
    batches = EXPLORE_EVERY * 4
    runner, engine, heard = _serve(LINEAR_COSTS, LINEAR_COSTS, rows=3, batches=batches)
    assert router_plan(runner, 3) == [(1, 2), (0, 1)]  # 2 + 1 (3.2) beats padding to 4 (4.1)
    assert runner.runs_per_bucket[2] == batches // EXPLORE_EVERY  # the padded plan, once in EXPLORE_EVERY
    assert runner.runs_per_bucket[1] == runner.runs_per_bucket[0] == batches - batches // EXPLORE_EVERY
    assert heard == [] and runner.router.replans == 0  # served timings equal the load's: nothing to replan


def test_without_measured_costs_nothing_is_timed_or_explored():
    clock = TrueCosts(LINEAR_COSTS)
    engine = TimedRowSum(IMAGE_BUCKETS, clock)
    runner = BucketRunner("m", costed_router(None), engine, ["logits"], clock=lambda: pytest.fail("timed"))
    for _ in range(EXPLORE_EVERY * 2):
        runner.run({"image": np.zeros((3, 3, 8, 8), np.float32)})
    assert set(engine.calls) == {4}


def router_plan(runner, rows):
    # The plan cached for this shape (not a call of plan(), which would count towards exploration)
    key = (("image", (rows, 3, 8, 8)),)
    return [(c.bucket, c.rows) for c in runner.router._plans[key][0]]


def test_served_costs_move_by_the_least_of_the_recent_runs_beyond_a_margin():
    served = ServedCosts(SPLIT, [1.0, 2.0, 4.0, 8.0, 4.0])
    for _ in range(SERVED_MIN_RUNS - 1):
        assert not served.observe(0, 3.0)  # too few runs yet
    assert served.observe(0, 3.0) and served.costs[0] == 2.0  # 3.0, capped by bucket 2's 2.0
    assert served.estimates[0] == 3.0
    assert not served.observe(1, 2.05) and not served.observe(1, 2.0) and not served.observe(1, 2.08)  # within 5 %
    assert served.costs[1] == 2.0
    for _ in range(SERVED_WINDOW):
        served.observe(2, 9.0)  # slower for a whole window: a real change (another tenant), not a spike
    assert served.costs[2] == 8.0  # 9.0 capped by bucket 8
    served.observe(2, 3.9)  # one quiet run: the least of the window
    assert served.costs[2] == 3.9 and served.costs[0] == 2.0


def test_the_replan_line_names_the_new_costs_and_splits():
    class Spec:  # describe() reads only the spec's static shapes
        static_shapes = IMAGE_BUCKETS[:4]

    line = bucket_costs.describe(Spec, [1.1, 2.1, 4.1, 8.1], "while serving")
    assert line.startswith("bucket run costs measured while serving: [image:1,3,8,8] 1100.00 ms")
    assert "3 as 2+1" in line
