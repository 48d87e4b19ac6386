"""The search's clock: the time left of `gebackend tune`'s budget, and estimates of what the next server start and
measurement window cost, from what the earlier ones took (search.py checks every start against them)."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from gebackend.tune.space import Candidate

FIRST_START_S = 30.0  # the start-up guess before any server was started
WINDOW_MARGIN = 1.25  # a window is estimated at this many times the median of those measured


class Budget:
    """The time left, and estimates of what the next step costs from what earlier steps took."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.deadline = clock() + seconds
        self.startups: dict[tuple, list[float]] = {}
        self.windows: dict[str, list[float]] = {}

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def record_start(self, cand: Candidate, seconds: float) -> None:
        self.startups.setdefault(_start_group(cand), []).append(seconds)

    def record_window(self, phase: str, seconds: float) -> None:
        self.windows.setdefault(phase, []).append(seconds)

    def start_estimate(self, cand: Candidate) -> float:
        same = self.startups.get(_start_group(cand))
        if same:
            return max(same)
        every = [s for group in self.startups.values() for s in group]
        return max(every) if every else FIRST_START_S

    def window_estimate(self, phase: str) -> float:
        """The median of the windows measured in `phase` (refine: twice the screening's until one is), with a
        margin: a median, because one window retried for instability should not stop the search."""
        seen = self.windows.get(phase) or (
            [2 * s for s in self.windows.get("screen", [])] if phase == "refine" else [])
        return WINDOW_MARGIN * statistics.median(seen) if seen else 20.0

    def candidate_estimate(self, cand: Candidate, phase: str = "screen") -> float:
        return self.start_estimate(cand) + self.window_estimate(phase)

    def refine_estimate(self, cands: Sequence[Candidate], rounds: int) -> float:
        return sum(self.start_estimate(c) for c in cands) + rounds * len(cands) * self.window_estimate("refine")

    def fits(self, seconds: float) -> bool:
        return self.remaining() >= seconds


def _start_group(cand: Candidate) -> tuple:
    return (cand.kind, cand.scenario.engine, cand.scenario.static, cand.rung.name)
