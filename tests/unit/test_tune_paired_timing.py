"""tune/paired_timing.py and the search with it: two close rungs are timed again side by side (interleaved rounds)
and ranked by those rounds, at most two rungs held at once; a far one keeps its one window."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gebackend.tune.paired_timing import FastestHeld, Timed, paired_ms
from gebackend.tune.search import Budget, Search, SearchSettings

from test_tune_numerics_order import full_space
from test_tune_search import Clock, FakeMeasurer


class Rungs:
    """Fake loaded rungs: each round of one returns the next of its scripted seconds; every event recorded."""

    def __init__(self, rounds: dict[str, list[float]]):
        self.rounds = {key: list(values) for key, values in rounds.items()}
        self.events: list[tuple[str, str]] = []

    def timed(self, key: str, window_ms: float) -> Timed:
        return Timed(key, lambda: key, lambda: self.events.append(("release", key)), window_ms)

    def time_round(self, run, seconds):
        key = run()
        self.events.append(("round", key))
        self.most_loaded = max(getattr(self, "most_loaded", 0), len(self.loaded()))
        return self.rounds[key].pop(0)

    def loaded(self) -> set[str]:
        offered = {key for kind, key in self.events if kind == "offer"}
        return offered - {key for kind, key in self.events if kind == "release"}

    def offer(self, held: FastestHeld, key: str, window_ms: float) -> float:
        self.events.append(("offer", key))
        return held.offer(self.timed(key, window_ms))


def test_rounds_alternate_their_order_and_each_side_gets_its_median():
    rungs = Rungs({"a": [0.010, 0.012, 0.030, 0.011], "b": [0.009, 0.020, 0.008, 0.010]})
    a_ms, b_ms = paired_ms(rungs.timed("a", 1.0), rungs.timed("b", 1.0), rungs.time_round, rounds=4, round_s=0.1)
    assert [key for _, key in rungs.events] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert round(a_ms, 6) == 11.5 and round(b_ms, 6) == 9.5  # medians of the rounds, in milliseconds


def test_a_close_rung_that_won_its_window_by_noise_loses_beside_the_fastest():
    """The window said b (9 ms) beats a (10 ms); beside each other a runs 8 ms, b 9: a stays held, b is released,
    and both times are the rounds'."""
    rungs = Rungs({"a": [0.008] * 4, "b": [0.009] * 4})
    lines: list[str] = []
    held = FastestHeld(rungs.time_round, rounds=4, log=lines.append)
    assert rungs.offer(held, "a", 10.0) == 10.0
    assert rungs.offer(held, "b", 9.0) == 9.0  # its own time: the rounds' (9 ms here)
    assert held.times == {"a": 8.0, "b": 9.0} and held.paired == {"a", "b"}
    assert held.held.key == "a" and rungs.loaded() == {"a"}
    assert lines and "a 10.0 -> 8.0 ms" in lines[0] and "b 9.0 -> 9.0 ms" in lines[0]


def test_a_far_rung_keeps_its_window_and_is_released_or_held_without_rounds():
    rungs = Rungs({})
    held = FastestHeld(rungs.time_round)
    rungs.offer(held, "exact", 100.0)
    rungs.offer(held, "slow", 300.0)  # 3x: released at once
    assert rungs.loaded() == {"exact"}
    rungs.offer(held, "int8", 40.0)  # 2.5x faster: held, the exact one released
    assert rungs.loaded() == {"int8"} and held.held.key == "int8"
    assert not any(kind == "round" for kind, _ in rungs.events)
    assert held.times == {"exact": 100.0, "slow": 300.0, "int8": 40.0} and held.paired == set()
    held.close()
    assert rungs.loaded() == set() and held.held is None


def test_at_most_two_rungs_are_loaded_at_once():
    rungs = Rungs({key: [0.010 + 0.001 * i] * 4 for i, key in enumerate("abcde")})
    held = FastestHeld(rungs.time_round, rounds=4)
    most = 0
    for key in "edcba":
        rungs.offer(held, key, 10.0)
        most = max(most, len(rungs.loaded()))
    assert rungs.most_loaded == 2  # the held one and the one timed beside it
    assert most == 1 and held.held.key == "a"  # each pairing ends with one released
    assert held.times == pytest.approx({"a": 10.0, "b": 11.0, "c": 12.0, "d": 13.0, "e": 14.0})


def test_a_pairing_that_fails_leaves_both_their_windows():
    rungs = Rungs({"a": [0.008] * 4})  # b has no rounds: its run raises
    lines: list[str] = []
    held = FastestHeld(rungs.time_round, rounds=4, log=lines.append)
    rungs.offer(held, "a", 10.0)
    assert rungs.offer(held, "b", 9.0) == 9.0
    assert held.times == {"a": 10.0, "b": 9.0} and held.paired == set()
    assert held.held.key == "b" and rungs.loaded() == {"b"}
    assert "failed" in lines[0] and "each keeps its own window" in lines[0]


def test_the_search_ranks_by_the_paired_times_the_measurer_reports():
    """The windows rank ONNX Runtime's int8 first (30 against 32 ms); beside each other OpenVINO's static int8 is
    faster: the quick tune is built around it."""
    windows = {("onnxruntime", "origin"): 50.0, ("openvino", "origin"): 60.0, ("openvino", "bf16"): 90.0,
               ("onnxruntime", "int8"): 30.0, ("openvino", "int8-static"): 32.0, ("onnxruntime", "int8-static"): 45.0}
    paired = {**windows, ("onnxruntime", "int8"): 33.0, ("openvino", "int8-static"): 29.0}

    class Measurer(FakeMeasurer):
        def accuracy(self, engine, rung):
            return replace(super().accuracy(engine, rung), run_ms=windows[(engine, rung.name)])

        def in_process_times(self):
            self.events.append(("times",))
            return paired

    clock = Clock()
    m = Measurer(clock)
    s = SearchSettings(concurrency=2, rounds=1, finalists=2, time_budget_s=100_000, quick=True)
    done = Search(full_space(), m, s, budget=Budget(s.time_budget_s, clock)).run()
    assert m.started()[0] == "ov-static-int8-static-1x2-d0"
    assert done.checks[("openvino", "int8-static")].run_ms == 29.0
    assert done.checks[("onnxruntime", "int8")].run_ms == 33.0
    kinds = [e[0] for e in m.events]
    assert kinds.index("times") > max(i for i, kind in enumerate(kinds) if kind == "accuracy")
