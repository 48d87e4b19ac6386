"""What one run of each static bucket costs on this machine, measured at load, for the router's choice between
padding a batch up to a bucket and splitting it into smaller runs (runtime/buckets.py: `cheapest_cover`).

Measured, not assumed: whether a batch of 3 is cheaper padded to bucket 4 or run as 2 + 1 depends on how a run's
fixed cost compares with a row's compute, which differs by model, engine, threads and CPU. Each bucket runs on
zeros (the warm-up's input) `rounds` times, round-robin over the buckets so that a load spike on a shared machine
hits all of them alike, and a bucket's cost is its least time: the run least disturbed by others. Not measured,
so the router pads as it always did: models without batching, a single batch size per inner shape (there is
nothing to choose), graphs whose input values decide a shape (zeros are no valid input there), and any bucket
that fails to run on zeros. `bucket_plan=smallest` switches the measurement off.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.engines.base import StaticEngine

ROUNDS = 3


def batch_and_inner(shapes: Mapping[str, Sequence[int]]) -> tuple[int, tuple] | None:
    """A bucket's batch size and its shapes without the batch axis; None for rank-0 inputs (no batch axis)."""
    first = next(iter(shapes.values()), ())
    if not first:
        return None
    return int(first[0]), tuple((name, tuple(shape[1:])) for name, shape in shapes.items())


def worth_measuring(spec: ModelSpec) -> bool:
    """Only a batching model with two batch sizes compiled for one inner shape has a choice to make."""
    if not spec.batching or spec.options.static.bucket_plan != "measured":
        return False
    inner: dict[tuple, set[int]] = {}
    for shapes in spec.static_shapes:
        split = batch_and_inner(shapes)
        if split is None:
            return False  # rank-0 inputs: no batch axis to split along
        inner.setdefault(split[1], set()).add(split[0])
    return any(len(batches) > 1 for batches in inner.values())


def zeros(spec: ModelSpec, shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """The warm-up's input for one bucket: zeros of each input's type (empty strings for BYTES)."""
    out = {}
    for tensor in spec.inputs:
        shape = tuple(shapes[tensor.name])
        dtype = tensor.dtype.numpy
        out[tensor.name] = np.full(shape, "", dtype=object) if dtype == np.object_ else np.zeros(shape, dtype=dtype)
    return out


def measure(engine: StaticEngine, spec: ModelSpec, output_names: Sequence[str], rounds: int = ROUNDS,
            clock: Callable[[], float] = time.perf_counter) -> list[float] | None:
    """Seconds of one run of each bucket (engine bucket i = spec.static_shapes[i]), or None if any failed."""
    feeds = [zeros(spec, shapes) for shapes in spec.static_shapes]
    best = [float("inf")] * len(feeds)
    try:
        for _ in range(rounds):
            for index, feed in enumerate(feeds):
                start = clock()
                engine.run_bucket(index, feed, output_names)
                best[index] = min(best[index], clock() - start)
    except Exception:  # noqa: BLE001 - zeros are no valid input for some models: then the router pads, as before
        return None
    return monotone(spec, best)


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


def describe(spec: ModelSpec, costs: Sequence[float]) -> str:
    """The load line: each bucket's measured cost and, per batch size up to the largest bucket, how it runs."""
    from gebackend.runtime.buckets import batch_plan

    parts = []
    for shapes, cost in zip(spec.static_shapes, costs):
        label = ";".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())
        parts.append(f"[{label}] {cost * 1000:.2f} ms")
    text = "bucket run costs measured at load: " + ", ".join(parts)
    # How batches run on the first inner shape (the common one-shape case; others follow the same rule).
    split = [batch_and_inner(shapes) for shapes in spec.static_shapes]  # never None: worth_measuring said so
    same = sorted((batch, cost) for (batch, inner), cost in zip(split, costs) if inner == split[0][1])
    batches, bucket_costs = [b for b, _ in same], [c for _, c in same]
    splits = []
    for rows in range(1, batches[-1] + 1):
        plan = batch_plan(rows, batches, bucket_costs)
        if plan != batch_plan(rows, batches, None):
            splits.append(f"{rows} as {'+'.join(str(batches[i]) for i in plan)}")
    return text + ("; batches split instead of padded: " + ", ".join(splits) if splits else
                   "; every batch pads up to the smallest bucket that holds it")
