"""`gebackend tune`'s search decisions on fake measurements and a fake clock: the accuracy guard, pruning below half
the best, dead dimension values, the latency budget, the time budget, and the interleaved refining rounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gebackend.tune import space
from gebackend.tune.numerics_order import Check
from gebackend.tune.outcome import Measurement, MeasureFailed
from gebackend.tune.search import Budget, Search, SearchSettings


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeMeasurer:
    """Throughput per candidate key (default 100), p99 per key (default 1 ms); start-up and windows advance the clock."""

    def __init__(self, clock: Clock, throughput=None, p99=None, cosine=None, start_s=5.0, window_s=3.0,
                 fail_start=()):
        self.clock, self.throughput, self.p99 = clock, throughput or {}, p99 or {}
        self.cosine = cosine or {}
        self.start_s, self.window_s, self.fail_start = start_s, window_s, set(fail_start)
        self.events: list[tuple] = []

    def accuracy(self, engine, rung):
        self.events.append(("accuracy", engine, rung.name))
        return Check(self.cosine.get((engine, rung.name), 1.0))  # not timed: the prior order stays

    def start(self, cand, timeout_s):
        self.events.append(("start", cand.key))
        self.clock.now += self.start_s
        if cand.key in self.fail_start:
            raise MeasureFailed("model failed to load: boom")
        return cand

    def measure(self, cand, phase):
        self.events.append(("measure", cand.key, phase))
        self.clock.now += self.window_s
        value = self.throughput.get((cand.key, phase), self.throughput.get(cand.key, 100.0))
        if isinstance(value, list):  # one value per window, in order; the last one repeats
            value = value.pop(0) if len(value) > 1 else value[0]
        return Measurement(value, 0.5, self.p99.get(cand.key, 1.0))

    def stop(self, cand):
        self.events.append(("stop", cand.key))

    def in_process_times(self):
        return {}  # nothing timed again: every rung keeps what accuracy() said

    def started(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "start"]


def cands(quick=True, **kw):
    found = space.space(2, ("onnxruntime", "openvino"), ("BF16", "FP32"), 8, 2, **kw)
    return space.quick_set(found) if quick else found


def run(candidates, measurer, clock, references=(), **settings):
    s = SearchSettings(**{"concurrency": 2, "rounds": 2, "finalists": 2, "time_budget_s": 10_000, **settings})
    return Search(candidates, measurer, s, references, budget=Budget(s.time_budget_s, clock)).run()


def by_key(search):
    return {o.candidate.key: o for o in search.outcomes}


def test_accuracy_guard_rejects_a_rung_once_and_never_serves_it():
    clock = Clock()
    m = FakeMeasurer(clock, cosine={("onnxruntime", "int8"): 0.9}, throughput={"ort-static-int8-1x2-d0": 1e6})
    done = run(cands(), m, clock)
    out = by_key(done)
    assert out["ort-static-int8-1x2-d0"].status == "rejected: cosine 0.900000 < 0.999"
    assert "ort-static-int8-1x2-d0" not in m.started()
    assert [e for e in m.events if e[0] == "accuracy"] == [
        ("accuracy", "onnxruntime", "origin"), ("accuracy", "openvino", "bf16"), ("accuracy", "onnxruntime", "int8")]
    assert done.winner.candidate.key != "ort-static-int8-1x2-d0"


def test_below_half_the_best_is_pruned_and_its_dimension_value_dies():
    clock = Clock()
    full = cands(quick=False)
    # the dynamic graph at 40 vs the static graph's 100: every later dynamic candidate is pruned unmeasured
    throughput = {c.key: 40.0 for c in full if not c.scenario.static}
    m = FakeMeasurer(clock, throughput=throughput)
    out = by_key(run(full, m, clock))
    first_dynamic = next(c.key for c in full if not c.scenario.static)
    assert out[first_dynamic].status.startswith("pruned: 40 infer/s < 0.5 x the best so far (100")
    dynamic = [c.key for c in full if not c.scenario.static]
    assert [k for k in dynamic if k in m.started()] == [first_dynamic]
    for key in dynamic[1:]:
        assert out[key].status.startswith("pruned: the dynamic graph measured 40 infer/s < 0.5 x 100"), key
    assert all(o.status != "not run" for o in out.values())


def test_a_new_best_by_far_is_measured_twice_and_the_lower_counts():
    clock = Clock()
    full = cands(quick=False)
    spike, later = full[1].key, full[2].key
    # a window of 250 on a shared machine, then 110: with 250 as the reference, 60 would be pruned (< 125)
    m = FakeMeasurer(clock, throughput={(spike, "screen"): [250.0, 110.0], (later, "screen"): 60.0})
    out = by_key(run(full[:3], m, clock))
    screens = [e for e in m.events if e[0] == "measure" and e[2] == "screen"]
    assert [e[1] for e in screens] == [full[0].key, spike, spike, later]  # only the spike is measured again
    assert out[spike].screen.throughput == 110.0
    assert out[later].status == "ok"  # 60 > 0.5 x 110


def test_one_slow_window_that_would_kill_a_value_is_measured_again_and_the_higher_counts():
    clock = Clock()
    full = cands(quick=False)
    slow_dynamic = next(c.key for c in full if not c.scenario.static)
    # 40 once (a neighbour's build on a shared machine), then 95: the dynamic graph lives on
    m = FakeMeasurer(clock, throughput={(slow_dynamic, "screen"): [40.0, 95.0]})
    done = run(full, m, clock)
    screens = [e[1] for e in m.events if e[0] == "measure" and e[2] == "screen"]
    assert screens.count(slow_dynamic) == 2 and by_key(done)[slow_dynamic].screen.throughput == 95.0
    assert by_key(done)[slow_dynamic].status == "ok" and done.dead == {}
    assert sum(not c.scenario.static and c.key in m.started() for c in full) > 1  # later dynamic ones measured


def test_a_slow_candidate_differing_in_two_dimensions_kills_no_value():
    clock = Clock()
    cs = cands()
    two_away = space.make_candidate("onnxruntime", space.PRECISIONS[0], False, (2, 1), 0, 8, 2, (0, 1, 1, 0))
    m = FakeMeasurer(clock, throughput={two_away.key: 10.0})
    done = run([cs[0], two_away, cs[1]], m, clock)
    assert by_key(done)[two_away.key].status.startswith("pruned: 10 infer/s")
    assert done.dead == {}
    assert cs[1].key in m.started()


def test_over_the_latency_budget_is_reported_and_cannot_win():
    clock = Clock()
    cs = cands()
    fastest = cs[1].key
    m = FakeMeasurer(clock, throughput={fastest: 500.0}, p99={fastest: 9.0})
    done = run(cs, m, clock, latency_budget_ms=5)
    assert by_key(done)[fastest].status == "over budget: p99 9.0 ms > 5 ms"
    assert done.winner.candidate.key != fastest
    assert ("measure", fastest, "refine") not in m.events


def test_refining_interleaves_the_finalists_and_the_baseline_and_takes_medians():
    clock = Clock()
    cs = cands()
    base = replace(cs[0], key="baseline", kind="baseline")
    m = FakeMeasurer(clock, throughput={cs[0].key: 300.0, cs[2].key: 200.0, "baseline": 100.0})
    done = run(cs, m, clock, references=[base])
    refine = [e[1] for e in m.events if e[0] == "measure" and e[2] == "refine"]
    assert refine == [cs[0].key, cs[2].key, "baseline"] * 2
    assert done.winner.candidate.key == cs[0].key and done.winner.status == "winner"
    assert len(done.winner.rounds) == 2 and done.winner.throughput == 300.0 and done.winner.spread == 0.0
    assert done.reference("baseline").throughput == 100.0
    # every server started for refining is stopped
    starts, stops = m.started(), [e[1] for e in m.events if e[0] == "stop"]
    assert sorted(starts) == sorted(stops)


def test_nothing_starts_that_the_time_budget_cannot_fit():
    clock = Clock()
    cs = cands()
    m = FakeMeasurer(clock, start_s=20.0, window_s=10.0)
    done = run(cs, m, clock, time_budget_s=100, rounds=1, finalists=1)
    statuses = [o.status for o in done.outcomes]
    assert "skipped: time budget" in statuses
    skipped = [o.candidate.key for o in done.outcomes if o.status == "skipped: time budget"]
    assert not set(skipped) & set(m.started())
    assert done.winner is not None  # the best so far
    assert clock.now <= 100 + 1e-9


def test_budget_estimates_from_what_was_measured():
    clock = Clock()
    budget = Budget(60, clock)
    cand = cands()[0]
    assert budget.start_estimate(cand) == 30.0  # nothing measured yet: the first guess
    budget.record_start(cand, 12.0)
    budget.record_window("screen", 4.0)
    assert budget.candidate_estimate(cand) == 12.0 + 1.25 * 4.0  # windows: the median measured, with a margin
    assert budget.window_estimate("refine") == 1.25 * 8.0  # twice the screening window until a refine one is measured
    assert budget.refine_estimate([cand, cand], 3) == 12.0 * 2 + 3 * 2 * 10.0
    for seconds in (4.0, 40.0):  # one window retried for instability does not make every later one look that long
        budget.record_window("screen", seconds)
    assert budget.window_estimate("screen") == 1.25 * 4.0
    budget.record_start(cand, 15.0)
    assert budget.start_estimate(cand) == 15.0  # start-ups: the longest seen in the group
    clock.now = 50
    assert budget.fits(10) and not budget.fits(10.5)


def test_a_candidate_that_fails_to_start_is_reported_failed():
    clock = Clock()
    cs = cands()
    m = FakeMeasurer(clock, fail_start={cs[1].key})
    out = by_key(run(cs, m, clock))
    assert out[cs[1].key].status == "failed: model failed to load: boom"


def test_interrupt_keeps_the_best_so_far():
    clock = Clock()
    cs = cands()

    class Interrupting(FakeMeasurer):
        def start(self, cand, timeout_s):
            if cand.key == cs[2].key:
                raise KeyboardInterrupt
            return super().start(cand, timeout_s)

    m = Interrupting(clock, throughput={cs[1].key: 150.0})
    done = run(cs, m, clock)
    assert done.interrupted and done.winner.candidate.key == cs[1].key
    assert {o.status for o in done.outcomes[2:]} == {"skipped: interrupted"}


@pytest.mark.parametrize("values,expected", [([100.0, 120.0, 90.0], 0.3), ([50.0], None)])
def test_spread_is_max_minus_min_over_the_median(values, expected):
    from gebackend.tune.outcome import Outcome

    o = Outcome(cands()[0], rounds=[Measurement(v, 1, 2) for v in values])
    assert (o.spread if expected is None else round(o.spread, 6)) == expected


def test_no_accuracy_check_starts_after_the_budget():
    clock = Clock()
    cs = cands()

    class Slow(FakeMeasurer):
        def accuracy(self, engine, rung):
            self.clock.now += 60  # each check takes a minute
            return super().accuracy(engine, rung)

    m = Slow(clock)
    done = run(cs, m, clock, time_budget_s=90)
    checked = [e[1:] for e in m.events if e[0] == "accuracy"]
    assert checked == [("onnxruntime", "origin"), ("openvino", "bf16")]  # the third would start past the budget
    assert {o.status for o in done.outcomes if o.candidate.rung.name == "int8"} == {"skipped: time budget"}
    assert m.started() == []  # and no candidate fits what is left


def test_refining_keeps_at_most_its_share_of_the_budget_but_one_round():
    clock = Clock()
    cs = cands()
    s = SearchSettings(concurrency=2, rounds=3, finalists=2, time_budget_s=100, refine_share=0.35)
    search = Search(cs, FakeMeasurer(clock), s, budget=Budget(100, clock))
    search.budget.record_start(cs[0], 5.0)
    search.budget.record_window("screen", 1.6)  # refine windows estimated at 1.25 * 3.2 = 4 s
    # one finalist (the candidate asked about): full = 5 + 3 * 4 = 17 s, under 35 s
    assert search.refine_reserve(cs[0]) == 17.0
    search.budget.record_window("refine", 16.0)  # 20 s: full 5 + 3 * 20 = 65 s > 35 s; one round: 25 s
    assert search.refine_reserve(cs[0]) == 35.0
    search.budget.windows["refine"] = [32.0]  # 40 s: one round is 45 s > 35 s, and one round is always kept
    assert search.refine_reserve(cs[0]) == 45.0


def test_refining_stops_when_another_round_does_not_fit():
    clock = Clock()
    cs = cands()
    m = FakeMeasurer(clock, start_s=1.0, window_s=10.0)
    done = run(cs, m, clock, time_budget_s=120, rounds=5, finalists=2)
    refined = [e[1] for e in m.events if e[0] == "measure" and e[2] == "refine"]
    rounds = len(refined) // 2
    assert 1 <= rounds < 5 and len(refined) == 2 * rounds  # whole rounds only
    assert f"refining: {rounds} of 5 rounds fitted the time budget" in done.notes
    assert clock.now <= 120


def test_the_winner_is_a_refined_finalist_not_an_older_screening_window():
    clock = Clock()
    cs = cands()
    m = FakeMeasurer(clock, throughput={cs[0].key: 180.0, cs[1].key: 170.0, (cs[0].key, "refine"): 50.0,
                                        (cs[1].key, "refine"): 60.0})  # the others screen at 100
    done = run(cs, m, clock, finalists=2)
    assert done.winner.candidate.key == cs[1].key and done.winner.throughput == 60.0
    assert {o.status for o in done.outcomes if o.candidate.key not in (cs[0].key, cs[1].key)} == {"ok"}


def test_after_a_new_best_its_neighbours_are_screened_before_the_other_rungs_variations():
    clock = Clock()
    full = cands(quick=False)
    # a lowered rung the prior put third wins by 3x: its layouts and delays come next, not the exact rung's
    winner = next(c for c in full if c.ranks == (2, 0, 0, 0))
    m = FakeMeasurer(clock, throughput={winner.key: 300.0})
    run(full, m, clock, finalists=1, rounds=1)
    screened = [e[1] for e in m.events if e[0] == "measure" and e[2] == "screen"]
    # (the winner measured twice: a new best by far; a neighbour under half of it too, the same key twice in a row)
    after = list(dict.fromkeys(screened[screened.index(winner.key) + 2:]))
    ranks = {c.key: c.ranks for c in full}
    steps = [sum(abs(a - b) for a, b in zip(ranks[key], winner.ranks)) for key in after]
    assert steps == sorted(steps), steps  # nearest the winner first
    neighbours = [c.key for c in full if sum(abs(a - b) for a, b in zip(c.ranks, winner.ranks)) == 1
                  and c.key not in screened[:screened.index(winner.key)]]
    assert neighbours and after[:len(neighbours)] == neighbours
    # before it won, the prior order: the candidates ahead of it in that order, then it
    before = screened[:screened.index(winner.key)]
    assert before == [c.key for c in full[:len(before)]]


def test_until_something_beats_the_first_the_prior_order_is_kept():
    clock = Clock()
    full = cands(quick=False)
    m = FakeMeasurer(clock)
    run(full, m, clock, finalists=1, rounds=1)
    screened = [e[1] for e in m.events if e[0] == "measure" and e[2] == "screen"]
    assert screened == [c.key for c in full]
