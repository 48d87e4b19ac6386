"""The engines and precisions (a candidate's "numerics") screened in the order their measured speed says, and those
too slow to be worth serving left out, before any server starts.

The accuracy guard loads every (engine, precision rung) once in process, as the backend loads it, to compare its
answers with fp32; measure.py then also times a request there (`Check.run_ms`: the median over about a second,
one instance with every core). That costs seconds, while serving one candidate costs a screening window, a
minute on a 10-request-a-second model. So where every accepted rung was timed:

- the numerics rank of every candidate becomes its rung's place by that time (fastest first), the other dimensions
  keeping their prior ranks, and the candidates are put back in space.py's order (fewest rank steps first): the
  rung that runs fastest here is served first, whatever the rules of space.py and tuner.py expected of this CPU;
- a rung slower than `prune_below` (0.5) times the fastest accepted one is dead before it is served, its
  candidates "pruned" with the two times as the reason, as screening prunes a served one. The times are compared
  with `TOLL_MS` added to each, what serving adds to every request whatever the engine: on a small model, whose
  engines differ by less than that, a 2x engine does not serve 2x, and nothing is pruned in process.

Rungs the guard rejected (cosine) or could not check keep their place: they are never served anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from gebackend.tune.space import DIMENSIONS, Candidate

NUMERICS = DIMENSIONS.index("numerics")
# What a served request costs beyond its engine run: the Python backend's stub round trip (0.14-0.21 ms), ge's
# layers and gRPC; a client's p50 on a model of no work was 0.56-0.70 ms (docs/tuning.md, the toll tables).
TOLL_MS = 0.5
EXACT = ("onnxruntime", "origin")  # what the order line compares each time with: the peer's engine and precision


@dataclass(frozen=True)
class Check:
    """What the accuracy guard found for one (engine, precision rung)."""

    cosine: float
    run_ms: float | None = None  # one request in process, the median (None: not timed)


@dataclass
class Order:
    candidates: list[Candidate]  # re-ranked, in screening order (the input as it was when nothing was timed)
    dead: dict[tuple[str, object], str]  # ("numerics", (engine, rung)) -> why its candidates are pruned unserved
    line: str  # what the order is and why, for the progress and the report ("" when unchanged)


def _name(numerics: tuple[str, str]) -> str:
    return f"{numerics[0]} {numerics[1]}"


def order(candidates: Sequence[Candidate], checks: Mapping[tuple[str, str], Check], min_cosine: float,
          prune_below: float, toll_ms: float = TOLL_MS) -> Order:
    """`candidates` re-ranked by the in-process times of `checks` (keyed by `Candidate.numerics`)."""
    accepted = {key: check for key, check in checks.items() if check.cosine >= min_cosine}
    if not accepted or any(check.run_ms is None for check in accepted.values()):
        return Order(list(candidates), {}, "")
    by_speed = sorted(accepted, key=lambda key: accepted[key].run_ms)
    fastest_key = by_speed[0]
    fastest = accepted[fastest_key].run_ms
    place = {key: rank for rank, key in enumerate(by_speed)}
    later = len(place)  # rejected or unchecked rungs after the others, in their prior order
    prior = sorted({c.numerics: c.ranks[NUMERICS] for c in candidates if c.ranks}.items(), key=lambda item: item[1])
    for key, _ in prior:
        if key not in place:
            place[key] = later
            later += 1
    dead = {}
    for key in by_speed:
        ms = accepted[key].run_ms
        if (ms + toll_ms) * prune_below > fastest + toll_ms:
            dead[("numerics", key)] = (f"{_name(key)} took {ms:.1f} ms a request in process, under {prune_below:g} x "
                                       f"the speed of {_name(fastest_key)} ({fastest:.1f} ms): not served")

    def reranked(cand: Candidate) -> Candidate:
        if not cand.ranks or cand.numerics not in place:
            return cand
        ranks = list(cand.ranks)
        ranks[NUMERICS] = place[cand.numerics]
        return replace(cand, ranks=tuple(ranks))

    out = [reranked(c) for c in candidates]
    if all(c.ranks for c in out):
        out.sort(key=lambda c: (sum(c.ranks), c.ranks))
    exact = accepted.get(EXACT)

    def said(key: tuple[str, str]) -> str:
        ms = accepted[key].run_ms
        ratio = f" = {exact.run_ms / ms:.2f}x {_name(EXACT)}" if exact and key != EXACT and ms else ""
        slow = f" (not served: under {prune_below:g} x the fastest's speed)" if ("numerics", key) in dead else ""
        return f"{_name(key)} {ms:.1f} ms{ratio}{slow}"

    line = "screening order by the time of one request in process: " + ", ".join(said(key) for key in by_speed)
    return Order(out, dead, line)
