"""The search: what is measured, in which order, what is dropped, and when to stop.

1. The baseline (the original config) and, where asked, the peer (Triton's onnxruntime backend) are measured
   first: they are the references of the report's ratio columns.
2. The accuracy guard: once per (engine, precision rung), in process; a rung below `min_cosine` drops all its
   candidates ("rejected: cosine X < Y"). Where the measurer also timed a request there, the rungs are screened
   fastest first and those under half the fastest's speed are pruned unserved (numerics_order.py). A quick tune
   then keeps the best guess by that order and one change of each dimension from it (space.quick_set); where
   another of those screens best, one change of each dimension from that one too, and that one's place with the
   precisions that screened level with its own (space.step_from).
3. Screening: one short perf_analyzer window per candidate, nearest the best so far first: the fewest rank steps
   from it over the dimensions, prior order (space.py) among equals, so a rung that wins (int8 where the prior put
   the exact one first) has its instance layouts and delays measured next, before the other rungs' variations. One
   that beats the best so far by more than 1.5x is measured twice and the lower counts (it becomes the reference).
   A candidate below half the best so far is "pruned"; when it differs from the best in one dimension only, that
   dimension's value is dead and the later candidates having it are pruned unmeasured (so that window is measured
   again first and the higher counts). p99 above the latency
   budget: "over budget" (kept in the report, cannot win).
4. Refining: the best `finalists` (3) and the references are served together and measured with longer windows in
   interleaved rounds (candidate A, B, C, baseline, A, B, ...); medians and the spread are reported, the best
   median within the latency budget wins.

Nothing is started that the remaining time cannot fit: every start is checked against an estimate made from
what was measured so far (server start-up per engine and graph mode, perf_analyzer wall time per window), and
screening stops early enough to leave the refining its time (fewer rounds when short; the clock and the estimates
are budget.py's). Ctrl-C or the budget ends it cleanly with the best so far. Measurement is a `Measurer` (measure.py,
or a fake in tests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

from gebackend.tune import numerics_order, space
from gebackend.tune.budget import Budget
from gebackend.tune.numerics_order import Check
from gebackend.tune.outcome import Measurement, MeasureFailed, Outcome
from gebackend.tune.space import DIMENSIONS, Candidate, PrecisionRung, quick_set

MIN_START_S = 10.0  # the shortest start-up a server is given
ROUND_MARGIN = 1.1  # another refining round starts when the time left is this many times the last round's


class Measurer(Protocol):
    def accuracy(self, engine: str, rung: PrecisionRung) -> Check: ...  # cosine to fp32, and the in-process time
    def start(self, cand: Candidate, timeout_s: float): ...  # a handle; raises MeasureFailed
    def measure(self, handle, phase: str) -> Measurement: ...  # phase: "screen" or "refine"; raises MeasureFailed
    def stop(self, handle) -> None: ...
    def in_process_times(self) -> dict: ...  # after the guard: (engine, rung name) -> ms, the close ones side by side


@dataclass
class SearchSettings:
    concurrency: int = 4
    min_cosine: float = 0.999
    latency_budget_ms: float | None = None
    time_budget_s: float = 600.0
    finalists: int = 3
    rounds: int = 3
    prune_below: float = 0.5  # of the best so far
    confirm_above: float = 1.5  # a screening this many times the best so far is measured twice, the lower kept
    refine_share: float = 0.35  # of the time budget kept for refining, at most
    quick: bool = False  # screen only space.quick_set, chosen once the accuracy guard has timed the precisions


def differs_in(a: Candidate, b: Candidate) -> list[str]:
    ca, cb = a.choices(), b.choices()
    return [d for d in DIMENSIONS if ca[d] != cb[d]]


class Search:
    def __init__(self, candidates: Sequence[Candidate], measurer: Measurer, settings: SearchSettings,
                 references: Sequence[Candidate] = (), progress: Callable[[str], None] = lambda line: None,
                 budget: Budget | None = None):
        self.settings = settings
        self.measurer = measurer
        self.progress = progress
        self.budget = budget or Budget(settings.time_budget_s)
        self.references = [Outcome(c) for c in references]
        self.outcomes = [Outcome(c) for c in candidates]
        self.dead: dict[tuple[str, object], str] = {}  # (dimension, value) -> why its candidates are pruned
        self.winner: Outcome | None = None
        self.interrupted = False
        self.out_of_time = False  # a candidate was skipped for time: the later ones are too, said once
        self.notes: list[str] = []
        self.checks: dict[tuple, Check] = {}  # (engine, rung name) -> what the accuracy guard found (cosine, in-process time)
        self._guess: Candidate | None = None  # a quick tune's best guess, and the candidates its quick set left out
        self._held: list[Candidate] = []
        self.steps = len(self.references) + len(self.outcomes)
        self.step = 0

    # -------------------------------------------------------------------------------------- the phases
    def run(self) -> "Search":
        try:
            for ref in self.references:
                self._screen(ref)
            self._accuracy_guard()
            if self.settings.quick:
                self._keep_quick_set()
            self.steps = len(self.references) + sum(o.status == "not run" for o in self.outcomes)
            while (outcome := self._next_to_screen()) is not None:
                self._screen(outcome)
            if self.settings.quick and self._step_to_best():
                while (outcome := self._next_to_screen()) is not None:
                    self._screen(outcome)
            self._refine()
        except KeyboardInterrupt:
            self.interrupted = True
            self.notes.append("interrupted: the best so far is reported")
        for outcome in self.outcomes:
            if outcome.status == "not run":
                outcome.status = "skipped: interrupted" if self.interrupted else "skipped: time budget"
        self._choose()
        return self

    def _accuracy_guard(self) -> None:
        checked: dict[tuple, Check | MeasureFailed | None] = {}
        for outcome in self.outcomes:
            key = outcome.candidate.numerics
            if key not in checked and not self.budget.fits(0):
                checked[key] = None  # no time left: its candidates are skipped unchecked
            if key not in checked:
                engine, rung = outcome.candidate.scenario.engine, outcome.candidate.rung
                try:
                    checked[key] = self.measurer.accuracy(engine, rung)
                except MeasureFailed as exc:
                    checked[key] = exc
                value = checked[key]
                text = f"{value.said}: {value}" if isinstance(value, MeasureFailed) else f"cosine {value.cosine:.6f}" + (
                    f", {value.run_ms:.1f} ms a request in process" if value.run_ms is not None else "")
                self.progress(f"[accuracy] {engine} {rung.name} ... {text}")
            value = checked[key]
            if value is None:
                outcome.status = "skipped: time budget"
                continue
            if isinstance(value, MeasureFailed):
                outcome.status = f"{value.status}: {value}"
                continue
            outcome.cosine = value.cosine
            if value.cosine < self.settings.min_cosine:
                outcome.status = f"rejected: cosine {value.cosine:.6f} < {self.settings.min_cosine}"
        self.checks = {k: v for k, v in checked.items() if isinstance(v, Check)}
        times = self.measurer.in_process_times()  # the close ones timed side by side (paired_timing.py)
        self.checks = {k: replace(v, run_ms=times.get(k, v.run_ms)) for k, v in self.checks.items()}
        self._order_by_speed(self.checks)

    def _order_by_speed(self, checks: dict) -> None:
        """Screen the fastest numerics first and never serve those under half its speed (numerics_order.py)."""
        found = numerics_order.order([o.candidate for o in self.outcomes], checks, self.settings.min_cosine,
                                     self.settings.prune_below)
        if not found.line:
            return
        by_key = {o.candidate.key: o for o in self.outcomes}
        for cand in found.candidates:
            by_key[cand.key].candidate = cand
        self.outcomes = [by_key[c.key] for c in found.candidates]
        self.dead.update(found.dead)
        self.notes.append(found.line)
        self.progress(f"[order] {found.line}")

    def _keep_quick_set(self) -> None:
        """A quick tune screens the best guess and one change of each dimension from it, the guess chosen now, after
        the accuracy guard's order, so that it has the fastest accepted precision and not only the rules' guess."""
        def usable(cand: Candidate) -> bool:
            return by_key[cand.key].status == "not run" and ("numerics", cand.numerics) not in self.dead

        by_key = {o.candidate.key: o for o in self.outcomes}
        kept = {cand.key for cand in quick_set([o.candidate for o in self.outcomes], usable)}
        self._held = [o.candidate for o in self.outcomes if o.candidate.key not in kept and usable(o.candidate)]
        self.outcomes = [o for o in self.outcomes if o.candidate.key in kept]
        served = [o.candidate for o in self.outcomes if usable(o.candidate)]
        self._guess = served[0] if served else None
        if served:
            left = len(self.outcomes) - len(served)
            line = (f"quick: {len(served)} candidates, around {served[0].label} and one change of each dimension"
                    + (f" ({left} more of the other precisions reported, not served)" if left else ""))
            self.notes.append(line)
            self.progress(f"[quick] {line}")

    def _step_to_best(self) -> bool:
        """A quick tune whose best screened candidate is not its guess screens around that best too (space.step_from:
        where the guess's own changes were all that was screened, the best's layout was never tried with the best's
        precision, nor with those level with it). Whether more was added."""
        best = self.best()
        if best is None or self._guess is None or best.candidate.key == self._guess.key:
            return False
        screened = [(o.candidate, o.screen.throughput) for o in self.outcomes if o.eligible and o.screen]
        more = space.step_from(self._held, best.candidate, screened)
        if not more:
            return False
        self._held = [cand for cand in self._held if cand not in more]
        self.outcomes.extend(Outcome(cand) for cand in more)
        self.steps += len(more)
        level = sorted({c.describe("numerics") for c in more if c.numerics != best.candidate.numerics})
        line = (f"quick: the best screened, {best.candidate.label}, is not the guess: {len(more)} more, one change of "
                "each dimension from it" + (f", and its place with {', '.join(level)}, which screened level with its "
                                           "precision" if level else ""))
        self.notes.append(line)
        self.progress(f"[quick] {line}")
        return True

    def _next_to_screen(self) -> Outcome | None:
        """The unmeasured candidate nearest the best so far: the fewest rank steps from it over the dimensions (prior
        order among equals). Until a candidate beats the first, that is the prior order itself."""
        waiting = [(i, o) for i, o in enumerate(self.outcomes) if o.status == "not run"]
        if not waiting:
            return None
        best = self.best()
        anchor = best.candidate.ranks if best is not None else ()

        def steps(outcome: Outcome) -> int:
            ranks = outcome.candidate.ranks
            return sum(abs(a - b) for a, b in zip(ranks, anchor)) if len(ranks) == len(anchor) else 0

        return min(waiting, key=lambda pair: (steps(pair[1]), pair[0]))[1]

    def best(self) -> Outcome | None:
        ok = [o for o in self.outcomes if o.eligible and o.throughput]
        return max(ok, key=lambda o: o.throughput) if ok else None

    def _screen(self, outcome: Outcome) -> None:
        cand = outcome.candidate
        self.step += 1
        tag = f"[{self.step}/{self.steps}] {cand.label}"
        choices = cand.choices()
        dead = next((why for dim in DIMENSIONS if (why := self.dead.get((dim, choices[dim])))), None)
        if dead and cand.kind == "candidate":
            outcome.status = f"pruned: {dead}"
            self.progress(f"{tag} ... {outcome.status}")
            return
        needed = self.budget.candidate_estimate(cand)
        if cand.kind == "candidate":
            needed += self.refine_reserve(cand)
        if not self.budget.fits(needed):
            outcome.status = "skipped: time budget"
            if not self.out_of_time:
                self.progress(f"{tag} ... {outcome.status} (needs ~{needed:.0f} s with the refining, "
                              f"{max(0, self.budget.remaining()):.0f} s left); later ones that do not fit are skipped silently")
            self.out_of_time = True
            return
        handle = self._start(outcome)
        if handle is None:
            self.progress(f"{tag} ... {outcome.status}")
            return
        again = ""
        try:
            outcome.screen = self._measure(handle, "screen")
            best = self.best()
            if (cand.kind == "candidate" and best is not None
                    and outcome.screen.throughput > self.settings.confirm_above * best.throughput):
                # A new best by far becomes the reference that prunes others (and kills dimension values): one
                # window is not enough for that on a shared machine, so it is measured again and the lower counts.
                second = self._measure(handle, "screen")
                again = f" (a new best by over {self.settings.confirm_above:g}x: measured again, {second.throughput:.0f})"
                outcome.screen = min(outcome.screen, second, key=lambda m: m.throughput)
            elif cand.kind == "candidate" and best is not None and self._kills_a_value(cand, outcome.screen, best):
                # The other way round: one slow window would prune every later candidate with this value unmeasured
                # (a whole instance layout, say), so it is measured again and the higher counts.
                second = self._measure(handle, "screen")
                again = (f" (under {self.settings.prune_below:g}x the best and one change from it: measured again, "
                         f"{second.throughput:.0f})")
                outcome.screen = max(outcome.screen, second, key=lambda m: m.throughput)
        except MeasureFailed as exc:
            outcome.status = f"failed: {exc}"
            self.progress(f"{tag} ... {outcome.status}")
            return
        finally:
            self.measurer.stop(handle)
        self.progress(f"{tag} ... {outcome.screen.throughput:.0f} infer/s p99 {outcome.screen.p99_ms:.1f} ms{again}")
        self._judge(outcome)

    def _kills_a_value(self, cand: Candidate, screen: Measurement, best: Outcome) -> bool:
        """Whether this window, judged, would prune `cand` and with it its one value that differs from the best's."""
        return (screen.throughput < self.settings.prune_below * best.throughput
                and len(differs_in(cand, best.candidate)) == 1)

    def _judge(self, outcome: Outcome) -> None:
        """ok, over budget, or pruned (and which dimension value dies with it)."""
        m, s = outcome.screen, self.settings
        if s.latency_budget_ms is not None and m.p99_ms > s.latency_budget_ms:
            outcome.status = f"over budget: p99 {m.p99_ms:.1f} ms > {s.latency_budget_ms:g} ms"
            return
        if outcome.candidate.kind != "candidate":
            outcome.status = "ok"
            return
        best = self.best()
        if best is not None and m.throughput < s.prune_below * best.throughput:
            outcome.status = (f"pruned: {m.throughput:.0f} infer/s < {s.prune_below:g} x the best so far "
                              f"({best.throughput:.0f}, {best.candidate.key})")
            if self._kills_a_value(outcome.candidate, m, best):
                (dim,) = differs_in(outcome.candidate, best.candidate)
                value = outcome.candidate.choices()[dim]
                self.dead[(dim, value)] = (f"{outcome.candidate.describe(dim)} measured {m.throughput:.0f} infer/s < {s.prune_below:g} x "
                                           f"{best.throughput:.0f} ({outcome.candidate.key} vs {best.candidate.key})")
            return
        outcome.status = "ok"

    def _start(self, outcome: Outcome):
        started = self.budget.clock()
        try:  # a start that hangs may not outlast the budget
            handle = self.measurer.start(outcome.candidate, max(MIN_START_S, self.budget.remaining() - 30))
        except MeasureFailed as exc:
            outcome.status = f"failed: {exc}"
            return None
        outcome.startup_s = self.budget.clock() - started
        self.budget.record_start(outcome.candidate, outcome.startup_s)
        return handle

    def _measure(self, handle, phase: str) -> Measurement:
        started = self.budget.clock()
        try:
            return self.measurer.measure(handle, phase)
        finally:
            self.budget.record_window(phase, self.budget.clock() - started)

    # -------------------------------------------------------------------------------------- refining
    def _finalists(self) -> list[Outcome]:
        ok = sorted((o for o in self.outcomes if o.status == "ok" and o.screen), key=lambda o: -o.screen.throughput)
        return ok[:self.settings.finalists]

    def _finalist_candidates(self, extra: Candidate | None = None) -> list[Candidate]:
        """What refining would serve if it started now (with `extra` among the finalists)."""
        chosen = [o.candidate for o in self._finalists()]
        if extra is not None and len(chosen) < self.settings.finalists:
            chosen.append(extra)
        return chosen + [r.candidate for r in self.references if r.status == "ok"]

    def refine_reserve(self, extra: Candidate | None = None) -> float:
        """The time screening leaves for refining: all its rounds, but at most `refine_share` of the whole budget
        (fewer rounds then), and never less than one round."""
        group = self._finalist_candidates(extra=extra)
        full = self.budget.refine_estimate(group, self.settings.rounds)
        one = self.budget.refine_estimate(group, 1)
        return max(one, min(full, self.settings.refine_share * self.settings.time_budget_s))

    def _refine(self) -> None:
        finalists = self._finalists()
        if not finalists or self.settings.rounds < 1:
            return
        refs = [r for r in self.references if r.status == "ok"]
        group = finalists + refs
        rounds = self.settings.rounds
        if not self.budget.fits(self.budget.refine_estimate([o.candidate for o in group], 1)):
            self.notes.append("no time left to re-measure the best: the winner is the best short window")
            return
        for o in finalists:
            o.status = "finalist"
        handles: list[tuple[Outcome, object]] = []
        done = 0
        try:
            for o in group:
                handle = self._start(o)
                if handle is None:
                    self.progress(f"[refine] {o.candidate.label} ... {o.status}")
                    continue
                handles.append((o, handle))
                o.rounds = []
            last = 0.0
            for r in range(1, rounds + 1):
                if r > 1 and not self.budget.fits(ROUND_MARGIN * last):  # another round as long as the last
                    break
                began = self.budget.clock()
                for o, handle in handles:
                    try:
                        m = self._measure(handle, "refine")
                    except MeasureFailed as exc:
                        self.progress(f"[round {r}/{rounds}] {o.candidate.label} ... failed: {exc}")
                        continue
                    o.rounds.append(m)
                    self.progress(f"[round {r}/{rounds}] {o.candidate.label} ... {m.throughput:.0f} infer/s "
                                  f"p99 {m.p99_ms:.1f} ms")
                last = self.budget.clock() - began
                done = r
        finally:
            for _, handle in handles:
                self.measurer.stop(handle)
        if done < rounds:
            self.notes.append(f"refining: {done} of {rounds} rounds fitted the time budget")
        s = self.settings
        for o in group:
            if s.latency_budget_ms is not None and o.p99_ms is not None and o.p99_ms > s.latency_budget_ms:
                o.status = f"over budget: median p99 {o.p99_ms:.1f} ms > {s.latency_budget_ms:g} ms"

    def _choose(self) -> None:
        """The best median of the refined finalists (rounds measured side by side, in the same minutes); the best
        screening window only when nothing was refined (a screening window from minutes earlier, on a machine
        whose load moves, does not compete with a round)."""
        refined = [o for o in self.outcomes if o.eligible and o.rounds]
        best = max(refined, key=lambda o: o.throughput) if refined else self.best()
        if best is not None:
            best.status = "winner"
            self.winner = best
        for o in self.outcomes:
            if o.status == "finalist":
                o.status = "ok"

    # -------------------------------------------------------------------------------------- results
    def reference(self, kind: str) -> Outcome | None:
        return next((r for r in self.references if r.candidate.kind == kind and r.throughput), None)
