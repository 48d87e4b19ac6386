"""tune/numerics_order.py and the search with it: the rungs screened fastest first by the accuracy guard's in-process
time of one request, those under half the fastest's speed pruned before any server starts."""

from __future__ import annotations

from dataclasses import replace

from gebackend.tune import space
from gebackend.tune.numerics_order import Check, order
from gebackend.tune.search import Budget, Search, SearchSettings

from test_tune_search import Clock, FakeMeasurer

TIMES = {("onnxruntime", "origin"): 100.0, ("openvino", "origin"): 75.0, ("openvino", "bf16"): 40.0,
         ("onnxruntime", "int8"): 60.0, ("openvino", "int8-static"): 10.0, ("onnxruntime", "int8-static"): 250.0}


def full_space():
    return space.space(2, ("onnxruntime", "openvino"), ("BF16", "FP32"), 8, 2)


def checks(rejected=(("openvino", "int8-static"),)):
    return {key: Check(0.9 if key in rejected else 0.9999, ms) for key, ms in TIMES.items()}


def test_the_fastest_accepted_rung_is_screened_first_and_a_rejected_faster_one_is_not_the_reference():
    found = order(full_space(), checks(), min_cosine=0.999, prune_below=0.5)
    firsts = []
    for cand in found.candidates:
        if cand.numerics not in firsts:
            firsts.append(cand.numerics)
    assert firsts[:4] == [("openvino", "bf16"), ("onnxruntime", "int8"), ("openvino", "origin"),
                          ("onnxruntime", "origin")]
    assert found.candidates[0].numerics == ("openvino", "bf16")
    assert found.candidates[0].ranks[0] == 0
    assert "openvino bf16 40.0 ms = 2.50x onnxruntime origin" in found.line
    assert "onnxruntime origin 100.0 ms (not served" in found.line


def test_a_rung_under_half_the_fastests_speed_is_dead_before_it_is_served():
    found = order(full_space(), checks(), min_cosine=0.999, prune_below=0.5)
    assert set(found.dead) == {("numerics", ("onnxruntime", "origin")), ("numerics", ("onnxruntime", "int8-static"))}
    why = found.dead[("numerics", ("onnxruntime", "int8-static"))]
    assert "250.0 ms" in why and "openvino bf16 (40.0 ms)" in why and "not served" in why
    assert ("numerics", ("openvino", "origin")) not in found.dead  # 75 ms: 0.53x the speed of 40 ms, kept


def test_engines_faster_than_what_serving_adds_to_a_request_are_ordered_but_not_pruned():
    tiny = {key: Check(0.9999, ms / 1000) for key, ms in TIMES.items()}  # 0.01 to 0.25 ms a request
    found = order(full_space(), tiny, min_cosine=0.999, prune_below=0.5)
    assert found.dead == {} and found.candidates[0].numerics == ("openvino", "int8-static")


def test_nothing_changes_unless_every_accepted_rung_was_timed():
    partial = {**checks(), ("onnxruntime", "int8"): Check(0.9999)}
    cands = full_space()
    found = order(cands, partial, min_cosine=0.999, prune_below=0.5)
    assert found.candidates == cands and found.dead == {} and found.line == ""


class TimedMeasurer(FakeMeasurer):
    def accuracy(self, engine, rung):
        return replace(super().accuracy(engine, rung), run_ms=TIMES[(engine, rung.name)])


def test_the_search_serves_the_fastest_rung_first_and_never_starts_the_dead_ones():
    clock = Clock()
    m = TimedMeasurer(clock, cosine={("openvino", "int8-static"): 0.9})
    s = SearchSettings(concurrency=2, rounds=1, finalists=2, time_budget_s=100_000)
    done = Search(full_space(), m, s, budget=Budget(s.time_budget_s, clock)).run()
    started = m.started()
    assert started[0].startswith("ov-") and "-bf16-" in started[0]
    slow = [o for o in done.outcomes if o.candidate.numerics == ("onnxruntime", "int8-static")]
    assert slow and all(o.status.startswith("pruned: onnxruntime int8-static took 250.0 ms") for o in slow)
    assert not any("-int8-static-" in key and key.startswith("ort-") for key in started)
    assert any(note.startswith("screening order by the time of one request in process") for note in done.notes)


def test_a_quick_tune_times_every_precision_and_screens_around_the_fastest():
    clock = Clock()
    m = TimedMeasurer(clock)
    pool = full_space()
    assert space.quick_set(pool)[0].numerics == ("onnxruntime", "origin")  # the rules' guess, before any timing
    s = SearchSettings(concurrency=2, rounds=1, finalists=2, time_budget_s=100_000, quick=True)
    done = Search(pool, m, s, budget=Budget(s.time_budget_s, clock)).run()
    assert {(e[1], e[2]) for e in m.events if e[0] == "accuracy"} == set(TIMES)  # every precision checked and timed
    started = m.started()
    assert started[0] == "ov-static-int8-static-1x2-d0"  # timed fastest: 10 ms, the next 40
    assert {"ov-dynamic-int8-static-1x2-d0", "ov-static-int8-static-2x1-d0", "ov-static-int8-static-1x2-d100"} <= set(started)
    assert all("-int8-static-" in key and key.startswith("ov-") for key in started)
    out = {o.candidate.key: o for o in done.outcomes}
    # the other precisions once each, at the guess's other values, all under half its speed: reported, never served
    others = [o for o in out.values() if o.candidate.numerics != ("openvino", "int8-static")]
    assert sorted(o.candidate.numerics for o in others) == sorted(set(TIMES) - {("openvino", "int8-static")})
    assert all(o.status.startswith("pruned: ") and "not served" in o.status for o in others)
    assert all(o.candidate.choices()["instances"] == (1, 2) for o in others)
    assert any(note.startswith("quick: 4 candidates, around openvino static int8-static 1x2 cores delay 0us and one change "
                                   "of each dimension (5 more of the other precisions reported, not served)") for note in done.notes)


def test_a_quick_tune_steps_to_the_best_screened_when_it_is_not_the_guess():
    """Timed in process, ONNX Runtime's int8 is the guess; served, OpenVINO's int8 (one of the other precisions the
    quick set serves at the guess's values) is faster: one change of each dimension from it is screened too, and its
    2 instances x 1 core wins (before: never screened, the winner stayed at 1 x 2)."""
    times = {("onnxruntime", "origin"): 50.0, ("openvino", "origin"): 45.0, ("openvino", "bf16"): 40.0,
             ("onnxruntime", "int8"): 30.0, ("openvino", "int8-static"): 35.0, ("onnxruntime", "int8-static"): 45.0}

    class Measurer(FakeMeasurer):
        def accuracy(self, engine, rung):
            return replace(super().accuracy(engine, rung), run_ms=times[(engine, rung.name)])

    clock = Clock()
    m = Measurer(clock, throughput={"ov-static-int8-static-1x2-d0": 300.0, "ov-static-int8-static-2x1-d0": 400.0})
    s = SearchSettings(concurrency=2, rounds=1, finalists=2, time_budget_s=100_000, quick=True)
    done = Search(full_space(), m, s, budget=Budget(s.time_budget_s, clock)).run()
    started = m.started()
    assert started[0] == "ort-static-int8-1x2-d0"
    stepped = {"ov-static-int8-static-2x1-d0", "ov-static-int8-static-1x2-d100", "ov-dynamic-int8-static-1x2-d0"}
    assert stepped <= set(started)
    assert started.index("ov-static-int8-static-1x2-d0") < min(started.index(key) for key in stepped)
    assert done.winner.candidate.key == "ov-static-int8-static-2x1-d0"
    assert any(note.startswith("quick: the best screened, openvino static int8-static 1x2 cores delay 0us, is not the "
                               "guess: 3 more") for note in done.notes)


def test_a_quick_tune_whose_guess_screens_best_screens_nothing_more():
    clock = Clock()
    m = TimedMeasurer(clock, throughput={"ov-static-int8-static-1x2-d0": 300.0})
    s = SearchSettings(concurrency=2, rounds=1, finalists=2, time_budget_s=100_000, quick=True)
    done = Search(full_space(), m, s, budget=Budget(s.time_budget_s, clock)).run()
    assert len(set(m.started())) == 4 and not any("is not the guess" in note for note in done.notes)


TIED = {("onnxruntime", "origin"): 50.0, ("openvino", "origin"): 45.0, ("openvino", "bf16"): 40.0,
        ("onnxruntime", "int8"): 30.0, ("openvino", "int8-static"): 35.0, ("onnxruntime", "int8-static"): 29.0}


def tied_search(int8_at_guess: float):
    """ONNX Runtime's static and dynamic int8 tie in process (29 and 30 ms); the static one is the guess. Served at
    1 instance x 2 cores they screen 188 and `int8_at_guess`; the best is the guess at 2 x 1 core (230), where the
    dynamic int8 serves 270."""
    class Measurer(FakeMeasurer):
        def accuracy(self, engine, rung):
            return replace(super().accuracy(engine, rung), run_ms=TIED[(engine, rung.name)])

    clock = Clock()
    m = Measurer(clock, throughput={"ort-static-int8-static-1x2-d0": 188.0, "ort-static-int8-1x2-d0": int8_at_guess,
                                    "ort-static-int8-static-2x1-d0": 230.0, "ort-static-int8-2x1-d0": 270.0})
    s = SearchSettings(concurrency=2, rounds=1, finalists=2, time_budget_s=100_000, quick=True)
    return m, Search(full_space(), m, s, budget=Budget(s.time_budget_s, clock)).run()


def test_a_quick_tune_steps_with_the_precisions_level_with_the_best_at_the_guess():
    """A text-encoder tune: the dynamic int8, level with the static one where the guess put both, must also be
    screened at the layout where the static one won, and then wins."""
    m, done = tied_search(int8_at_guess=187.0)
    started = m.started()
    assert started[0] == "ort-static-int8-static-1x2-d0" and "ort-static-int8-1x2-d0" in started
    assert started.index("ort-static-int8-static-2x1-d0") < started.index("ort-static-int8-2x1-d0")
    assert done.winner.candidate.key == "ort-static-int8-2x1-d0"
    assert any(note.startswith("quick: the best screened, onnxruntime static int8-static 2x1 core delay 0us, is not the "
                               "guess: 3 more, one change of each dimension from it, and its place with onnxruntime "
                               "int8, which screened level with its precision") for note in done.notes), done.notes


def test_a_precision_well_below_the_best_at_the_guess_is_not_stepped_with_it():
    m, done = tied_search(int8_at_guess=150.0)  # under 0.9 x 188
    assert "ort-static-int8-2x1-d0" not in m.started()
    assert done.winner.candidate.key == "ort-static-int8-static-2x1-d0"
    assert any(note.endswith("is not the guess: 2 more, one change of each dimension from it") for note in done.notes)
