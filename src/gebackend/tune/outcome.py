"""What the tune knows of one candidate: its measurements (one screening window, the refining rounds), their medians
and spread, and its status in the search ("ok", "pruned", "rejected: ...", "finalist", "winner", ...)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from gebackend.tune.space import Candidate


class MeasureFailed(RuntimeError):
    """A candidate that could not be served or measured (the message is the reason)."""

    said = "failed"  # the accuracy guard's progress line: "failed: <reason>"
    status = "failed: accuracy check"  # its candidates' status: "failed: accuracy check: <reason>"


class Pruned(MeasureFailed):
    """An (engine, precision rung) whose candidates are left out unmeasured: the engine cannot read the model, or the
    rung serves the exact model (its lowering does not lower it): "pruned: <reason>"."""

    said = status = "pruned"


@dataclass
class Measurement:
    throughput: float
    p50_ms: float
    p99_ms: float
    notes: str = ""


@dataclass
class Outcome:
    candidate: Candidate
    status: str = "not run"
    cosine: float | None = None
    screen: Measurement | None = None
    rounds: list[Measurement] = field(default_factory=list)
    startup_s: float | None = None

    @property
    def measured(self) -> list[Measurement]:
        return self.rounds or ([self.screen] if self.screen else [])

    def _median(self, attr: str) -> float | None:
        values = [getattr(m, attr) for m in self.measured]
        return statistics.median(values) if values else None

    @property
    def throughput(self) -> float | None:
        return self._median("throughput")

    @property
    def p50_ms(self) -> float | None:
        return self._median("p50_ms")

    @property
    def p99_ms(self) -> float | None:
        return self._median("p99_ms")

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the rounds' throughputs (None with fewer than 2 rounds)."""
        values = [m.throughput for m in self.rounds]
        if len(values) < 2 or not statistics.median(values):
            return None
        return (max(values) - min(values)) / statistics.median(values)

    @property
    def eligible(self) -> bool:
        return self.status in ("ok", "finalist", "winner")
