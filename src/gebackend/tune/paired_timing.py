"""The in-process times the tune ranks its engines and precisions by, with the close ones timed side by side.

The accuracy guard loads each (engine, precision rung) once and times a request in it, one window of about a second
each, one rung after the other. On a shared machine two windows a minute apart differ by 10-20 %, as much as two
int8 rungs differ from each other: two tunes of the CN_CLIP text encoder an hour apart timed its dynamic int8 at 11.2
and 8.8 ms, and the QDQ int8 at 10.0 and 11.3, so the two swapped places and the quick tune built its candidates
around the other one.

`FastestHeld` keeps the fastest rung timed so far loaded. A rung whose own window is within `CLOSE` of it is timed
again beside it, in `ROUNDS` rounds of `ROUND_S` seconds each in the order A B B A ..., and both get the median of
their rounds: what decides between two close rungs is then measured in the same seconds. The faster of the two stays
held (the other is released at once), so at most two rungs are loaded at a time; a rung far from the fastest keeps
its one window, where noise cannot change which is faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

CLOSE = 1.25  # a rung whose window is within this factor of the fastest's (either way) is timed beside it
ROUNDS = 4
ROUND_S = 0.5

TimeRound = Callable[[Callable[[], object], float], float]  # (run one request, seconds) -> its median seconds


@dataclass
class Timed:
    key: Hashable
    run: Callable[[], object]  # one request in the loaded rung
    release: Callable[[], None]  # unload it
    ms: float  # its time: the first window's, then the paired rounds' median


def _name(key: Hashable) -> str:
    return " ".join(map(str, key)) if isinstance(key, tuple) else str(key)


def paired_ms(first: Timed, second: Timed, time_round: TimeRound, rounds: int = ROUNDS,
              round_s: float = ROUND_S) -> tuple[float, float]:
    """The medians over `rounds` interleaved rounds (A B, B A, ...) of the milliseconds of one request in each."""
    times: dict[int, list[float]] = {0: [], 1: []}
    pair = (first, second)
    for number in range(rounds):
        for side in ((0, 1) if number % 2 == 0 else (1, 0)):
            times[side].append(1000 * time_round(pair[side].run, round_s))
    return float(np.median(times[0])), float(np.median(times[1]))


class FastestHeld:
    """The in-process times of the rungs offered, the close ones re-timed beside the fastest (module doc)."""

    def __init__(self, time_round: TimeRound, close: float = CLOSE, rounds: int = ROUNDS, round_s: float = ROUND_S,
                 log: Callable[[str], None] = lambda line: None):
        self.time_round, self.close_factor, self.rounds, self.round_s, self.log = time_round, close, rounds, round_s, log
        self.held: Timed | None = None
        self.times: dict[Hashable, float] = {}
        self.paired: set[Hashable] = set()  # keys whose time came from paired rounds

    def offer(self, timed: Timed) -> float:
        """Take a rung just timed (its one window in `timed.ms`): its time, paired with the fastest's if close.
        Keeps the faster of the two loaded and releases the other."""
        held = self.held
        if held is not None and max(timed.ms, held.ms) <= self.close_factor * min(timed.ms, held.ms):
            before = (held.ms, timed.ms)
            try:
                held.ms, timed.ms = paired_ms(held, timed, self.time_round, self.rounds, self.round_s)
            except Exception as exc:  # noqa: BLE001 - both keep their own windows, as without pairing
                held.ms, timed.ms = before
                self.log(f"timing {_name(timed.key)} beside {_name(held.key)} failed ({type(exc).__name__}: {exc}): "
                         "each keeps its own window")
            else:
                self.times[held.key] = held.ms
                self.paired.update((held.key, timed.key))
                self.log(f"timed beside each other ({self.rounds} rounds): {_name(held.key)} {before[0]:.1f} -> "
                         f"{held.ms:.1f} ms, {_name(timed.key)} {before[1]:.1f} -> {timed.ms:.1f} ms")
        self.times[timed.key] = timed.ms
        if held is None or timed.ms < held.ms:
            self.held = timed
            if held is not None:
                self._release(held)
        else:
            self._release(timed)
        return timed.ms

    def close(self) -> None:
        """Release the rung still held."""
        if self.held is not None:
            held, self.held = self.held, None
            self._release(held)

    @staticmethod
    def _release(timed: Timed) -> None:
        try:
            timed.release()
        except Exception:  # noqa: BLE001 - unloading a timed rung must not end the tune
            pass
