"""What `gebackend tune` searches: the candidates for the model under tune (tuned_model.py) on this machine.

A candidate is the bench's `Scenario` (gebackend.bench.scenarios) plus the precision rung it runs: engine x
precision x graph mode x instances and cores x batching. The precision rungs are a data table, `PRECISIONS`:
each names the `precision_mode` it sets, the engines that run it (preferred first), the OpenVINO capability it
needs (OPTIMIZATION_CAPABILITIES, e.g. BF16: asked of the CPU plugin, never assumed), the bench feature it needs
(`scenarios.feature_missing`), and any further backend parameters; a new rung (e.g. static int8 with
`quantization=static`) is one more line there.

The order is by prior: a candidate's score is the sum, over its dimensions, of the rank of its value in that
dimension's preference order (static before dynamic, one instance with all cores before pinned ones, no queue
delay before 100 us before 500 us, the default engine's exact precision first), so candidates one change away
from the usual best guess are measured first, and those several changes away last (or never, at the budget).
A precision on an engine that measured slower than its f32 on this kind of CPU (`slow`, from
engines/auto_choice.py: NNCF's int8 of a MatMul model without VNNI) comes after every other one; those this CPU runs
natively (`favoured`: int8 with VNNI, bf16 where OpenVINO reports BF16), which won by 2-4x where measured, come before
the exact one, in the order `favoured` gives, so the usual best guess there is the lowered rung.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

from gebackend.bench.scenarios import BUCKETS, PEER_BACKEND, Scenario

if TYPE_CHECKING:
    from gebackend.tune.tuned_model import TunedModel

DELAYS_US = (0, 100, 500)  # max_queue_delay_microseconds rungs
DIMENSIONS = ("numerics", "graph", "instances", "delay")  # what a candidate chooses (numerics: engine + precision)
STATIC_UNCUT_RANK = 1000  # with trim_padding: static candidates after every dynamic one (their buckets cannot cut)


@dataclass(frozen=True)
class PrecisionRung:
    name: str  # as reports say it, unique: "origin", "bf16", "int8", ...
    precision_mode: str  # the backend option it sets
    engines: tuple[str, ...]  # the engines that run it, the preferred one first
    capability: str = ""  # the OpenVINO CPU capability it needs on the openvino engine ("" = none)
    feature: str = ""  # the bench feature it needs (gebackend.bench.scenarios.feature_missing), "" = none
    parameters: tuple[tuple[str, str], ...] = ()  # further backend parameters it sets
    prior: int = 0  # lower: measured earlier
    what: str = ""  # one line for the winner's config comment

    @property
    def calibrated(self) -> bool:
        """Static int8: quantized from calibration samples (`calibration_data`, else seeded ones)."""
        return dict(self.parameters).get("quantization") == "static"


PRECISIONS: tuple[PrecisionRung, ...] = (
    PrecisionRung("origin", "origin", ("onnxruntime", "openvino"), prior=0, what="the model's own precision (exact)"),
    PrecisionRung("bf16", "bf16", ("openvino",), capability="BF16", prior=1, what="OpenVINO compiles in bfloat16"),
    PrecisionRung("int8", "int8", ("onnxruntime",), feature="int8", parameters=(("quantization", "dynamic"),), prior=2,
                  what="ONNX Runtime dynamic quantization of MatMul/Gemm weights to int8"),
    PrecisionRung("int8-static", "int8", ("openvino", "onnxruntime"), feature="int8",
                  parameters=(("quantization", "static"),), prior=2,
                  what="static int8 calibrated on seeded samples (NNCF's QDQ on OpenVINO, quantize_static on ONNX Runtime)"),
    PrecisionRung("fp16", "fp16", ("openvino",), capability="FP16", prior=3, what="OpenVINO compiles in float16"),
)


@dataclass(frozen=True)
class Candidate:
    key: str  # stable and unique: the repository folder name and report id
    scenario: Scenario
    rung: PrecisionRung
    cores: int  # the cores the candidate uses in all
    kind: str = "candidate"  # "candidate", "baseline" (the original config) or "peer" (Triton's onnxruntime backend)
    ranks: tuple[int, ...] = ()  # per DIMENSIONS: the prior rank of its value
    config_text: str = ""  # baseline: the original config as it is

    @property
    def numerics(self) -> tuple[str, str]:
        return (self.scenario.engine, self.rung.name)

    def choices(self) -> dict[str, object]:
        s = self.scenario
        return {"numerics": self.numerics, "graph": "static" if s.static else "dynamic",
                "instances": (s.instances, s.cores_per_instance or self.cores),
                "delay": s.max_queue_delay_us if s.dynamic_batching else None}

    def describe(self, dimension: str) -> str:
        """This candidate's value of one dimension, in words ("openvino bf16", "the dynamic graph", ...)."""
        value = self.choices()[dimension]
        if dimension == "numerics":
            return f"{value[0]} {value[1]}"
        if dimension == "graph":
            return f"the {value} graph"
        if dimension == "instances":
            n, per = value
            return f"{n} instance{'s' if n > 1 else ''} x {per} core{'s' if per > 1 else ''}"
        return "no dynamic batching" if value is None else f"a {value} us queue delay"

    @property
    def label(self) -> str:
        if self.kind == "baseline":
            return "baseline: your config"
        if self.kind == "peer":
            return "Triton's onnxruntime backend (your config's IO, defaults)"
        s = self.scenario
        per = s.cores_per_instance or self.cores
        delay = f"delay {s.max_queue_delay_us}us" if s.dynamic_batching else "no batching"
        return (f"{s.engine} {'static' if s.static else 'dynamic'} {self.rung.name} {s.instances}x{per} "
                f"core{'s' if per > 1 else ''} {delay}")


def buckets_for(max_batch_size: int) -> tuple[int, ...]:
    """Batch buckets 1/2/4/8 capped by max_batch_size (which is a bucket itself when below 8)."""
    if max_batch_size <= 0:
        return ()
    out = [b for b in BUCKETS if b <= max_batch_size]
    if max_batch_size < BUCKETS[-1] and max_batch_size not in out:
        out.append(max_batch_size)
    return tuple(out)


def instance_layouts(cores: int, concurrency: int) -> list[tuple[int, int]]:
    """(instances, cores each): 1 x all cores first, then N pinned instances x cores/N for each N > 1 dividing the
    core count, largest N first, N at most the concurrency (more instances than requests in flight stay idle)."""
    layouts = [(1, cores)]
    layouts += [(n, cores // n) for n in range(cores, 1, -1) if cores % n == 0 and n <= max(1, concurrency)]
    return layouts


def queue_delays(max_batch_size: int, concurrency: int) -> list[int | None]:
    """The max_queue_delay_microseconds rungs: none without batching (None: no dynamic_batching), and only 0 at
    concurrency 1, where no second request can join the one in flight and a delay only holds it back."""
    if max_batch_size <= 0:
        return [None]
    return [0] if concurrency <= 1 else list(DELAYS_US)


Slow = Callable[[str, PrecisionRung], str]  # (engine, rung) -> why it is expected to lose here ("" = not)
# (engine, rung) -> (its place among the favoured, why this CPU is expected to run it fastest), or None: not favoured
Favoured = Callable[[str, PrecisionRung], "tuple[int, str] | None"]


def numerics(engines: Sequence[str], capabilities: Sequence[str],
             available: Callable[[str], bool] = lambda feature: True,
             table: Sequence[PrecisionRung] = PRECISIONS,
             slow: Slow = lambda engine, rung: "",
             favoured: Favoured = lambda engine, rung: None) -> list[tuple[str, PrecisionRung]]:
    """(engine, rung) pairs runnable here, in prior order: the pairs `favoured` places (in its order), then each
    rung's preferred engine by the rung's prior, then the rungs on their other engines, then the pairs `slow` gives a
    reason for (measured last, not left out)."""
    pairs = []
    for rung in table:
        if rung.feature and not available(rung.feature):
            continue
        for position, engine in enumerate(rung.engines):
            if engine not in engines:
                continue
            if engine == "openvino" and rung.capability and rung.capability not in capabilities:
                continue
            late = slow(engine, rung)
            place = None if late else favoured(engine, rung)
            if place is not None:
                key = (-1, place[0], 0)
            else:
                key = (0, rung.prior + (2 * len(table) if late else 0 if position == 0 else len(table)),
                       list(engines).index(engine))
            pairs.append((key, engine, rung))
    return [(engine, rung) for _, engine, rung in sorted(pairs, key=lambda p: p[0])]


def _key(engine: str, static: bool, rung: PrecisionRung, instances: int, per: int, delay: int | None) -> str:
    short = {"onnxruntime": "ort", "openvino": "ov"}.get(engine, engine)
    return f"{short}-{'static' if static else 'dynamic'}-{rung.name}-{instances}x{per}-" + ("nobatch" if delay is None else f"d{delay}")


def make_candidate(engine: str, rung: PrecisionRung, static: bool, layout: tuple[int, int], delay: int | None,
                   max_batch_size: int, cores: int, ranks: tuple[int, ...] = (), trim: bool = False) -> Candidate:
    instances, per = layout
    buckets = buckets_for(max_batch_size) if static else ()
    preferred = tuple(b for b in (buckets or buckets_for(max_batch_size)) if b > 1)
    pinned = instances > 1
    scenario = Scenario(
        name=_key(engine, static, rung, instances, per, delay), title="", static=static, buckets=buckets,
        dynamic_batching=delay is not None, preferred_batch_sizes=preferred if delay is not None else (),
        max_queue_delay_us=delay or 0, instances=instances, cores_per_instance=per if pinned else 0,
        intra_op_threads=per if pinned else 0, engine=engine, precision=rung.precision_mode,
        requires=("pinning",) if pinned else (), trim_padding=trim)
    candidate = Candidate(scenario.name, scenario, rung, cores, ranks=ranks)
    return replace(candidate, scenario=replace(scenario, title=candidate.label))


def space(cores: int, engines: Sequence[str], capabilities: Sequence[str], max_batch_size: int, concurrency: int,
          static_ok: bool = True, available: Callable[[str], bool] = lambda feature: True,
          table: Sequence[PrecisionRung] = PRECISIONS, slow: Slow = lambda engine, rung: "",
          trim: bool = False, favoured: Favoured = lambda engine, rung: None) -> list[Candidate]:
    """Every candidate for this machine and model, in prior order (see the module docstring; a quick tune screens
    only their `quick_set`). `trim`: every candidate cuts its batches' padding (trim_padding), and the static graph,
    whose batch buckets keep the full length and so cannot cut, comes after every dynamic candidate (kept, measured
    last)."""
    pairs = numerics(engines, capabilities, available, table, slow, favoured)
    graphs = ([False, True] if trim else [True, False]) if static_ok else [False]
    uncut = STATIC_UNCUT_RANK if trim else 0  # the static graph's rank offset when the others cut their padding
    layouts = instance_layouts(cores, concurrency)
    delays = queue_delays(max_batch_size, concurrency)
    out = []
    for a, (engine, rung) in enumerate(pairs):
        for b, static in enumerate(graphs):
            for c, layout in enumerate(layouts):
                for d, delay in enumerate(delays):
                    ranks = (a, b + (uncut if static else 0), c, d)
                    out.append(make_candidate(engine, rung, static, layout, delay, max_batch_size, cores, ranks, trim))
    return sorted(out, key=lambda cand: (sum(cand.ranks), cand.ranks))


QUICK_SERVED = 6  # a quick tune serves at most this many candidates


def quick_set(candidates: Sequence[Candidate], usable: Callable[[Candidate], bool] = lambda cand: True
              ) -> list[Candidate]:
    """What a quick tune screens: the usable candidate of the fewest rank steps (the best guess; once the accuracy
    guard has timed the precisions, one with the fastest), the next value of each other dimension from it, then the
    other engines and precisions at its other values, fastest (or likeliest) first, `QUICK_SERVED` usable ones in
    all, the last of them the exact precision's where the guess is lowered and no faster exact one came first; the
    unusable ones (rejected, pruned) once each too, which are never served but reported so. Candidates
    without ranks (references) are not chosen."""
    ranked = [cand for cand in candidates if cand.ranks]
    pool = [cand for cand in ranked if usable(cand)] or ranked
    if not pool:
        return []
    anchor = min(pool, key=lambda cand: (sum(cand.ranks), cand.ranks))
    out = [anchor, *neighbours(pool, anchor)]
    served = len(out)
    others = sorted((c for c in ranked if c.numerics != anchor.numerics and _one_change(c, anchor, "numerics")),
                    key=lambda c: c.ranks)
    exact_wanted = not _exact(anchor) and any(_exact(c) and usable(c) for c in others)
    for cand in others:
        if not usable(cand):
            out.append(cand)
        elif served < QUICK_SERVED - (exact_wanted and not _exact(cand)):
            out.append(cand)
            served += 1
            exact_wanted = exact_wanted and not _exact(cand)
    return out


def _one_change(cand: Candidate, at: Candidate, dimension: str) -> bool:
    """Whether `cand` has `at`'s value in every dimension but `dimension`."""
    where = at.choices()
    return all(value == where[d] for d, value in cand.choices().items() if d != dimension)


def neighbours(pool: Sequence[Candidate], at: Candidate) -> list[Candidate]:
    """From `pool`, the next value (by rank) of each dimension but the numerics from `at`, the others as `at` has them."""
    out = []
    for index, dimension in enumerate(DIMENSIONS):
        if dimension == "numerics":
            continue
        later = [cand for cand in pool if _one_change(cand, at, dimension) and cand.ranks[index] > at.ranks[index]]
        if later:
            out.append(min(later, key=lambda cand: cand.ranks[index]))
    return out


LEVEL = 0.9  # a precision that screened within this share of another's infer/s, at one place, is level with it


def step_from(held: Sequence[Candidate], best: Candidate, screened: Sequence[tuple[Candidate, float]]
              ) -> list[Candidate]:
    """What a quick tune screens next, from `held` (what its quick set left out), when its best screened candidate is
    not its guess: one change of each dimension but the numerics from the best (`neighbours`; ResNet-50 on an AVX2
    EPYC: OpenVINO's int8 beat ONNX Runtime's guessed one at 1 instance x 2 cores, and 2 x 1 core, where it wins,
    had been screened with the guess only), then the best's place with each other precision that screened level with
    the best's own (at least `LEVEL` of its infer/s, both at one place; `screened`: (candidate, infer/s) of those
    measured). Two precisions that tie where the guess put them may part where the best is: ONNX Runtime's dynamic
    and static int8 of the 4-layer CN_CLIP text encoder with padded captions on an AVX2 EPYC, 187 and 188 infer/s at
    1 instance x 2 cores; the static one, stepped to 2 x 1 core, served 229, and the dynamic one, never screened
    there, 269 in another tune."""
    more = neighbours(held, best)
    level = {other.numerics for cand, rate in screened if cand.numerics == best.numerics
             for other, theirs in screened
             if other.numerics != best.numerics and _one_change(other, cand, "numerics") and theirs >= LEVEL * rate}
    return more + [cand for cand in held
                   if cand.numerics in level and _one_change(cand, best, "numerics") and cand not in more]


def _exact(cand: Candidate) -> bool:
    """Runs the model in its own precision: the rung a lowered guess is weighed against (it keeps a quick tune's last
    served place, so the report always says what the exact graph serves beside the lowered winner)."""
    return cand.rung.name == PRECISIONS[0].name


def accuracy_groups(candidates: Sequence[Candidate]) -> list[tuple[str, PrecisionRung]]:
    """The (engine, precision rung) pairs the candidates use, each once, in their order."""
    seen, out = set(), []
    for cand in candidates:
        if cand.kind == "candidate" and cand.numerics not in seen:
            seen.add(cand.numerics)
            out.append((cand.scenario.engine, cand.rung))
    return out


def baseline(model: TunedModel, cores: int) -> Candidate:
    """The original config, measured as it is (the reference of the report's "x your config" column)."""
    scenario = Scenario("baseline", "baseline: your config", dynamic_batching="dynamic_batching" in model.config)
    return Candidate("baseline", scenario, PRECISIONS[0], cores, kind="baseline", config_text=model.config_text)


def peer(model: TunedModel, cores: int) -> Candidate:
    """The model on Triton's onnxruntime backend, configured as the original config (no dynamic batching unless it
    has it), the backend's own defaults otherwise."""
    batching = "dynamic_batching" in model.config
    scenario = Scenario("peer", "Triton's onnxruntime backend", backend=PEER_BACKEND, dynamic_batching=batching,
                        requires=("peer",))
    return Candidate("peer", scenario, PRECISIONS[0], cores, kind="peer")


__all__ = ["DIMENSIONS", "PRECISIONS", "Candidate", "Favoured", "PrecisionRung", "accuracy_groups",
           "baseline", "buckets_for", "instance_layouts", "make_candidate", "neighbours", "numerics", "peer", "quick_set",
           "space", "step_from"]
