"""What one run of each static bucket costs on this machine, measured at load, for the router's choice between
padding a batch up to a bucket and splitting it into smaller runs (runtime/buckets.py: `cheapest_cover`).

Measured, not assumed: whether a batch of 3 is cheaper padded to bucket 4 or run as 2 + 1 depends on how a run's
fixed cost compares with a row's compute, which differs by model, engine, threads and CPU. Each bucket runs on
zeros (the warm-up's input) in round-robin rounds over the buckets, so that a load spike on a shared machine hits
all of them alike, and a bucket's cost is its least time: the run least disturbed by others. At least `ROUNDS`
rounds, and more while they fit in `BUDGET_SECONDS` (up to `MAX_ROUNDS`): Triton loads a repository's models side
by side, so a model is timed while others compile on the same cores (seen in CI: resnet_small's bucket 4 timed 4.4x
its bucket 2 in 3 rounds), and a small model's least time over a dozen rounds is the one that says what it costs. Not measured,
so the router pads as it always did: models without batching, a single batch size per inner shape (there is
nothing to choose), graphs whose input values decide a shape (zeros are no valid input there), and any bucket
that fails to run on zeros. `bucket_plan=smallest` switches the measurement off.

With `bucket_plan=measured` on the CPU the unspecialised (dynamic) graph is timed too, in the same rounds, at every
batch size from 1 to the largest bucket of each inner shape: a batch size it runs faster than its bucket plan goes
to it (runtime/buckets.py: `dynamic_wins`). Each engine's first run of a round follows an untimed run of its own,
so that neither pays for the switch from the other (on ResNet-50, a 2-core AMD EPYC, bucket 1 right after the
dynamic graph's 8-row run timed at 89.5 ms in one of five timings, 49–60 ms otherwise). Specialising does not win everywhere: a batch
no bucket fits pays for padding or for a second run, and on some CPUs a transformation of the static pipeline loses
outright; what ran faster here is what serves. `bucket_plan=buckets` keeps to the buckets (no dynamic session).
"""

from __future__ import annotations

import time
from typing import Callable, Collection, Mapping, Sequence

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.engines.base import Engine, StaticEngine
from gebackend.runtime import batching
from gebackend.runtime.buckets import batch_plan, inner_key

ROUNDS = 3  # at least
MAX_ROUNDS = 25
BUDGET_SECONDS = 1.0  # more rounds while the rounds so far took less than this


def batch_and_inner(shapes: Mapping[str, Sequence[int]]) -> tuple[int, tuple] | None:
    """A bucket's batch size and its shapes without the batch axis; None for rank-0 inputs (no batch axis)."""
    first = next(iter(shapes.values()), ())
    if not first:
        return None
    return int(first[0]), inner_key(shapes)


def batches_by_inner(spec: ModelSpec) -> dict[tuple, set[int]] | None:
    """The batch sizes compiled for each inner shape (`batch_and_inner`); None for rank-0 inputs (no batch axis)."""
    inner: dict[tuple, set[int]] = {}
    for shapes in spec.static_shapes:
        split = batch_and_inner(shapes)
        if split is None:
            return None
        inner.setdefault(split[1], set()).add(split[0])
    return inner


def worth_measuring(spec: ModelSpec) -> bool:
    """Only a batching model with two batch sizes compiled for one inner shape has a choice to make."""
    if not spec.batching or spec.options.static.bucket_plan not in ("measured", "buckets"):
        return False
    inner = batches_by_inner(spec)  # None: rank-0 inputs, no batch axis to split along
    return inner is not None and any(len(batches) > 1 for batches in inner.values())


def zeros(spec: ModelSpec, shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """The warm-up's input for one bucket: zeros of each input's type (empty strings for BYTES)."""
    out = {}
    for tensor in spec.inputs:
        shape = tuple(shapes[tensor.name])
        dtype = tensor.dtype.numpy
        out[tensor.name] = np.full(shape, "", dtype=object) if dtype == np.object_ else np.zeros(shape, dtype=dtype)
    return out


def measure(engine: StaticEngine, spec: ModelSpec, output_names: Sequence[str], dynamic: Engine | None = None,
            rounds: int = ROUNDS, clock: Callable[[], float] = time.perf_counter
            ) -> tuple[list[float], dict[tuple, dict[int, float]]] | None:
    """Seconds of one run of each bucket (engine bucket i = spec.static_shapes[i]) and, with a dynamic engine, of one
    run of it per inner shape and batch size up to the largest bucket of that shape, timed in the same rounds; None
    if a bucket failed. A dynamic run that fails, or whose outputs are not batch-sized, leaves that engine out ({}),
    not the buckets' costs."""
    jobs: list[Callable[[], object]] = []
    for index, shapes in enumerate(spec.static_shapes):
        jobs.append(_runner(engine.run_bucket, index, zeros(spec, shapes), output_names))
    sizes = dynamic_sizes(spec) if dynamic is not None else []
    for (key, rows) in sizes:
        feed = zeros(spec, {name: (rows, *inner) for name, inner in key})
        jobs.append(_dynamic_runner(dynamic, rows, feed, output_names))
    # each engine's first timed run follows an untimed run of its own (the same job), not the other engine's last
    primed = {0, len(spec.static_shapes)} if sizes else set()
    best = _least_times(jobs, rounds, clock, primed)
    buckets = best[:len(spec.static_shapes)]
    if any(cost is None for cost in buckets):
        return None
    dynamic_costs: dict[tuple, dict[int, float]] = {}
    if all(cost is not None for cost in best[len(buckets):]):
        for (key, rows), cost in zip(sizes, best[len(buckets):]):
            dynamic_costs.setdefault(key, {})[rows] = cost
    return monotone(spec, buckets), dynamic_costs


def to_payload(spec: ModelSpec, measured: tuple[list[float], dict[tuple, dict[int, float]]] | None) -> dict:
    """`measure`'s answer as JSON (shared with the model's other instances: control/shared_costs.py); the dynamic
    graph's costs in `dynamic_sizes` order, None where it was not timed or failed."""
    if measured is None:
        return {"buckets": None, "dynamic": None}
    costs, dynamic_costs = measured
    dynamic = [dynamic_costs[key][rows] for key, rows in dynamic_sizes(spec)] if dynamic_costs else None
    return {"buckets": [float(cost) for cost in costs], "dynamic": dynamic}


def from_payload(spec: ModelSpec, payload: Mapping) -> tuple[list[float], dict[tuple, dict[int, float]]] | None:
    """`to_payload`'s JSON back as `measure` answers; raises ValueError where it does not fit `spec`."""
    buckets = payload.get("buckets")
    if buckets is None:
        return None
    if len(buckets) != len(spec.static_shapes):
        raise ValueError(f"{len(buckets)} bucket costs for {len(spec.static_shapes)} buckets")
    dynamic: dict[tuple, dict[int, float]] = {}
    values = payload.get("dynamic")
    if values:
        sizes = dynamic_sizes(spec)
        if len(values) != len(sizes):
            raise ValueError(f"{len(values)} dynamic-graph costs for {len(sizes)} batch sizes")
        for (key, rows), cost in zip(sizes, values):
            dynamic.setdefault(key, {})[rows] = float(cost)
    return [float(cost) for cost in buckets], dynamic


def dynamic_sizes(spec: ModelSpec) -> list[tuple[tuple, int]]:
    """(inner shape, batch size) for every batch size from 1 to the largest bucket of each inner shape that has more
    than one bucket (a lone batch size has nothing in between to win)."""
    inner = batches_by_inner(spec) or {}
    return [(key, rows) for key, batches in inner.items() if len(batches) > 1
            for rows in range(1, max(batches) + 1)]


def _runner(run, index, feeds, output_names) -> Callable[[], object]:
    return lambda: run(index, feeds, output_names)


def _dynamic_runner(dynamic: Engine, rows: int, feeds, output_names) -> Callable[[], object]:
    """A dynamic run of `rows` rows that fails as the executor's split would (`batching.split`) unless every output's
    dim 0 is those rows: an output the data sizes (NonZero's count) cannot be cut back per request, so the dynamic
    graph is no candidate for such a model."""
    return lambda: batching.split(dict(zip(output_names, dynamic.run(feeds, output_names))), [rows])


def _least_times(jobs: Sequence[Callable[[], object]], rounds: int, clock: Callable[[], float],
                 primed: Collection[int] = ()) -> list[float | None]:
    """Each job's least time over round-robin rounds: `rounds` of them, and more up to MAX_ROUNDS while all so far
    took less than BUDGET_SECONDS; None for a job that raised (not run again). A job in `primed` runs once untimed
    just before its timed run (so that it does not pay for the switch from another engine's job; an untimed run
    that raises is left to the timed one to report)."""
    best: list[float | None] = [float("inf")] * len(jobs)
    began, done = clock(), 0
    while done < rounds or (done < MAX_ROUNDS and clock() - began < BUDGET_SECONDS):
        done += 1
        for index, job in enumerate(jobs):
            if best[index] is None:
                continue
            if index in primed:
                try:
                    job()
                except Exception:  # noqa: BLE001 - the timed run says whether this job runs
                    pass
            start = clock()
            try:
                job()
            except Exception:  # noqa: BLE001 - zeros are no valid input for some models: then the router pads
                best[index] = None
                continue
            best[index] = min(best[index], clock() - start)
    return best


def monotone(spec: ModelSpec, costs: Sequence[float]) -> list[float]:
    """Each bucket's cost capped by that of every larger bucket of the same inner shape: a run of more rows does not
    cost less, so a timing that says so is noise (seen in CI: a 1-row request padded to bucket 4 because bucket 1 was
    timed during a load spike), and padding up to a bigger bucket is never chosen for it."""
    split = [batch_and_inner(shapes) for shapes in spec.static_shapes]
    capped = []
    for mine, cost in zip(split, costs):
        larger = [other for theirs, other in zip(split, costs)
                  if mine and theirs and theirs[1] == mine[1] and theirs[0] >= mine[0]]
        capped.append(min([cost, *larger]))
    return capped


def describe(spec: ModelSpec, costs: Sequence[float], dynamic_costs: Mapping[tuple, Mapping[int, float]] | None = None,
             dynamic_rows: Mapping[tuple, Sequence[int]] | None = None) -> str:
    """The load line: each bucket's measured cost and, per batch size up to the largest bucket, how it runs
    (`dynamic_rows`: the batch sizes the router runs on the dynamic graph, `BucketRouter.dynamic_rows`)."""
    parts = []
    for shapes, cost in zip(spec.static_shapes, costs):
        label = ";".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())
        parts.append(f"[{label}] {cost * 1000:.2f} ms")
    text = "bucket run costs measured at load: " + ", ".join(parts)
    # How batches run on the first inner shape (the common one-shape case; others follow the same rule).
    split = [batch_and_inner(shapes) for shapes in spec.static_shapes]  # never None: worth_measuring said so
    key = split[0][1]
    same = sorted((batch, cost) for (batch, inner), cost in zip(split, costs) if inner == key)
    batches, bucket_costs = [b for b, _ in same], [c for _, c in same]
    on_dynamic = set((dynamic_rows or {}).get(key, ()))
    splits, dynamic = [], []
    for rows in range(1, batches[-1] + 1):
        plan = batch_plan(rows, batches, bucket_costs)
        if rows in on_dynamic:
            dynamic.append(f"{rows} ({dynamic_costs[key][rows] * 1000:.2f} ms against "
                           f"{sum(bucket_costs[i] for i in plan) * 1000:.2f})")
        elif plan != batch_plan(rows, batches, None):
            splits.append(f"{rows} as {'+'.join(str(batches[i]) for i in plan)}")
    text += ("; batches split instead of padded: " + ", ".join(splits) if splits else
             "; no batch is split" if dynamic else "; every batch pads up to the smallest bucket that holds it")
    if dynamic_costs:
        text += ("; run whole on the dynamic graph, measured faster: " + ", ".join(dynamic) if dynamic else
                 "; the dynamic graph was faster at no batch size")
    return text
