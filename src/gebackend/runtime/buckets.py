"""Shape-bucket routing: which compiled shape a batch runs on, how it is padded up, and how outputs are cut back.

Pure logic on shapes and numpy arrays. A batch goes to the smallest bucket that holds it: the batch
axis is zero-padded up to the bucket's batch; other axes must match exactly unless they carry a
named dim declared paddable (e.g. `sequence`), which is zero-padded too, unless the request's is empty (a
length of 0 fits only a bucket of 0 there: padded, the run would hold no data of the request). A batch larger than
the largest bucket is split into several runs.

Where each bucket's cost of one run was measured at load (`costs`, runtime/bucket_costs.py), a batch is
covered by the cheapest sequence of runs instead (`cheapest_cover`), when that is cheaper than padding by
more than `SPLIT_MARGIN` (`batch_plan`): on 2 cores a batch of 3 padded to bucket 4 costs a whole fourth
row of compute, while runs of 2 and 1 may cost less; a batch of 5 on buckets 1/2/4/8 may run as 4 + 1
rather than padded to 8. Padding still wins where a run's fixed cost is large next to a row's (small
models, many threads), and the measured costs say which. The margin keeps costs timed on a busy machine
(models loading side by side) from splitting a batch for a gain that is only noise.

Where the unspecialised (dynamic) graph was timed too, at each batch size up to the largest bucket (`dynamic_costs`),
a batch it runs faster than its bucket plan by more than `DYNAMIC_MARGIN` runs on it whole, unpadded
(`Chunk.bucket == DYNAMIC`): measured on a 2-core AVX2 EPYC, a batch of 3 on a small CNN ran 2665 us as static 2 + 1
against 2310-2370 us on the dynamic graph, while the exact buckets ran level with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

Shapes = Mapping[str, tuple[int, ...]]


DYNAMIC = -1  # Chunk.bucket of a batch run whole on the unspecialised (dynamic) graph


def inner_key(shapes: Shapes) -> tuple:
    """A bucket's shapes without the batch axis: what groups buckets that differ only in batch size."""
    return tuple((name, tuple(shape[1:])) for name, shape in shapes.items())


@dataclass(frozen=True)
class Chunk:
    """One engine run: rows [start, stop) of the batch, padded up to `bucket`."""

    bucket: int  # index into the router's buckets
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def cheapest_cover(rows: int, batches: Sequence[int], costs: Sequence[float]) -> list[int]:
    """Positions into `batches` whose runs cover `rows` rows at the least total cost (the last run of a bucket
    may be padded), largest runs first; ties go to fewer runs. `costs[i]` is the cost of one run of `batches[i]`."""
    if rows <= 0:
        return []
    best: list[tuple[float, int, int]] = [(0.0, 0, -1)] * (rows + 1)  # (cost, runs, choice) to cover n rows
    for n in range(1, rows + 1):
        best[n] = min((best[max(0, n - b)][0] + c, best[max(0, n - b)][1] + 1, i)
                      for i, (b, c) in enumerate(zip(batches, costs)))
    chosen, n = [], rows
    while n > 0:
        i = best[n][2]
        chosen.append(i)
        n = max(0, n - batches[i])
    return sorted(chosen, key=lambda i: -batches[i])


SPLIT_MARGIN = 0.10  # a split must beat padding by this fraction of padding's cost


def padded_cover(rows: int, batches: Sequence[int]) -> list[int]:
    """Positions into `batches` (ascending) that the plain rule runs: the smallest bucket that holds what is left,
    else the largest, until every row is covered."""
    chosen, left = [], rows
    while left > 0:
        position = next((i for i, b in enumerate(batches) if b >= left), len(batches) - 1)
        chosen.append(position)
        left -= batches[position]
    return chosen


def batch_plan(rows: int, batches: Sequence[int], costs: Sequence[float] | None) -> list[int]:
    """The runs a batch of `rows` takes (positions into the ascending `batches`): the cheapest cover where costs
    were measured and it beats padding by more than SPLIT_MARGIN, else the plain rule."""
    padded = padded_cover(rows, batches)
    if costs is None:
        return padded
    cover = cheapest_cover(rows, batches, costs)
    if sum(costs[i] for i in cover) < (1 - SPLIT_MARGIN) * sum(costs[i] for i in padded):
        return cover
    return padded


DYNAMIC_MARGIN = 0.05  # the dynamic graph must beat the bucket plan by this fraction of the plan's cost


def dynamic_wins(rows: int, batches: Sequence[int], costs: Sequence[float], dynamic_cost: float) -> bool:
    """Whether one unpadded run of `rows` on the dynamic graph beats the bucket plan `batch_plan` makes by more
    than DYNAMIC_MARGIN (a timing at load within noise of the plan keeps the plan)."""
    plan = batch_plan(rows, batches, costs)
    return dynamic_cost < (1 - DYNAMIC_MARGIN) * sum(costs[i] for i in plan)


class BucketRouter:
    def __init__(
        self,
        buckets: Sequence[Shapes],
        batching: bool,
        input_labels: Mapping[str, Sequence[str | None]],
        output_labels: Mapping[str, Sequence[str | None]],
        paddable: Sequence[str] = (),
        costs: Sequence[float] | None = None,
        dynamic_costs: Mapping[tuple, Mapping[int, float]] | None = None,
    ):
        """`*_labels`: the ONNX dim name of every axis *after* the batch axis (None when unnamed); `costs`: the
        measured cost of one run of each bucket (None: the smallest bucket that holds a batch, always);
        `dynamic_costs`: per inner shape (`inner_key`), the measured cost of one run of the dynamic graph per batch
        size (only with `costs`)."""
        self.buckets = [dict(b) for b in buckets]
        self.costs = None if costs is None else [float(c) for c in costs]
        self.batching = batching
        self.paddable = set(paddable)
        offset = 1 if batching else 0
        self._pad_axes = {
            name: {axis + offset for axis, label in enumerate(labels) if label in self.paddable}
            for name, labels in input_labels.items()
        }
        self._input_labels = {name: [None] * offset + list(labels) for name, labels in input_labels.items()}
        self._output_labels = {name: [None] * offset + list(labels) for name, labels in output_labels.items()}
        # Per bucket, computed once: routing runs on every request (numpy here cost ~100 us a request).
        self._inner = [sum(math.prod(shape[offset:]) for shape in b.values()) for b in self.buckets]
        self._batch = [next(iter(b.values()))[0] if batching and b else 1 for b in self.buckets]  # rank-0 inputs: no batch
        self._plans: dict[tuple, list[Chunk] | None] = {}  # request shapes -> plan (shapes repeat)
        self._inner_keys = [inner_key(b) for b in self.buckets]
        #: per inner shape, the batch sizes that run whole on the dynamic graph (measured faster than their plan)
        self.dynamic_rows: dict[tuple, tuple[int, ...]] = self._dynamic_rows(dynamic_costs or {})

    def _dynamic_rows(self, dynamic_costs: Mapping[tuple, Mapping[int, float]]) -> dict[tuple, tuple[int, ...]]:
        if self.costs is None or not self.batching:
            return {}
        chosen = {}
        for key, by_rows in dynamic_costs.items():
            group = sorted((i for i, k in enumerate(self._inner_keys) if k == key), key=self.batch_of)
            batches, costs = [self.batch_of(i) for i in group], [self.costs[i] for i in group]
            rows = tuple(sorted(n for n, cost in by_rows.items() if group and n <= batches[-1]
                                and dynamic_wins(n, batches, costs, cost)))
            if rows:
                chosen[key] = rows
        return chosen

    # -- routing -------------------------------------------------------------------------------
    def _fits(self, bucket: Shapes, shapes: Shapes, pad: bool = True) -> bool:
        start = 1 if self.batching else 0
        for name, shape in shapes.items():
            target = bucket.get(name)
            if target is None or len(target) != len(shape):
                return False
            for axis in range(start, len(shape)):
                # an empty axis is not padded: the bucket's run would be all padding, nothing of the request's
                paddable = pad and axis in self._pad_axes.get(name, ()) and target[axis] > shape[axis] > 0
                if target[axis] != shape[axis] and not paddable:
                    return False
        return True

    def plan(self, shapes: Shapes) -> list[Chunk] | None:
        """The runs that cover a batch of these input shapes, or None if no bucket can hold it."""
        key = tuple((name, tuple(shape)) for name, shape in shapes.items())
        try:
            return self._plans[key]
        except KeyError:
            pass
        chunks = self._plan(shapes)
        if len(self._plans) >= 4096:
            self._plans.clear()
        self._plans[key] = chunks
        return chunks

    def _plan(self, shapes: Shapes) -> list[Chunk] | None:
        pad = self._paddable_dims_agree(shapes)
        candidates = [i for i, b in enumerate(self.buckets) if self._fits(b, shapes, pad)]
        if not candidates:
            return None
        if not self.batching:
            best = min(candidates, key=lambda i: self._inner[i])
            return [Chunk(best, 0, 1)]
        # The tightest non-batch shape first, then batch sizes within it.
        tightest = min(self._inner[i] for i in candidates)
        same_inner = [i for i in candidates if self._inner[i] == tightest]
        by_batch = sorted(same_inner, key=lambda i: self.batch_of(i))
        rows = next(iter(shapes.values()))[0]
        if rows in self.dynamic_rows.get(self._inner_keys[by_batch[0]], ()):
            return [Chunk(DYNAMIC, 0, rows)]
        batches = [self.batch_of(i) for i in by_batch]
        costs = None if self.costs is None else [self.costs[i] for i in by_batch]
        chunks, start = [], 0
        for position in batch_plan(rows, batches, costs):
            take = min(rows - start, batches[position])
            if take > 0:  # (positive costs never choose a run with nothing left to take)
                chunks.append(Chunk(by_batch[position], start, start + take))
                start += take
        return chunks

    def _paddable_dims_agree(self, shapes: Shapes) -> bool:
        """Whether every paddable dim name has one size across the request's axes that carry it: the outputs are cut
        back by that size, so a request giving it two sizes is padded nowhere (it runs on an exact bucket or the
        fallback)."""
        sizes: dict[str, int] = {}
        for name, shape in shapes.items():
            for axis, label in enumerate(self._input_labels.get(name, ())):
                if label in self.paddable and axis < len(shape) and sizes.setdefault(label, shape[axis]) != shape[axis]:
                    return False
        return True

    def batch_of(self, index: int) -> int:
        return self._batch[index]

    # -- padding -------------------------------------------------------------------------------
    def pad(self, feeds: Mapping[str, np.ndarray], chunk: Chunk) -> dict[str, np.ndarray]:
        """Rows [start, stop) of every input, zero-padded up to the chunk's bucket."""
        bucket = self.buckets[chunk.bucket]
        out = {}
        for name, array in feeds.items():
            whole = not self.batching or (chunk.start == 0 and chunk.stop == array.shape[0])
            part = array if whole else array[chunk.start:chunk.stop]
            target = bucket[name]
            if part.shape == target:
                out[name] = part
            else:
                padded = np.zeros(target, dtype=part.dtype)
                padded[tuple(slice(0, n) for n in part.shape)] = part
                out[name] = padded
        return out

    def sizes_by_label(self, shapes: Shapes) -> dict[str, int]:
        """The request's size of each paddable named dim, to cut outputs back to."""
        sizes = {}
        for name, shape in shapes.items():
            for axis, label in enumerate(self._input_labels.get(name, ())):
                if label in self.paddable:
                    sizes[label] = shape[axis]
        return sizes

    def unpad(self, outputs: Mapping[str, np.ndarray], rows: int, label_sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Cut padded rows and padded named dims off every output."""
        out = {}
        for name, array in outputs.items():
            index = [slice(None)] * array.ndim
            if self.batching and array.ndim:
                index[0] = slice(0, rows)
            for axis, label in enumerate(self._output_labels.get(name, ())):
                if label in label_sizes and axis < array.ndim:
                    index[axis] = slice(0, label_sizes[label])
            out[name] = array[tuple(index)]
        return out

    def describe(self) -> list[str]:
        return ["; ".join(f"{n}:{list(s)}" for n, s in b.items()) for b in self.buckets]

    def describe_dynamic(self) -> str:
        """The batch sizes run on the dynamic graph, e.g. "3,5" (with their inner shape where there are several)."""
        if len(self.dynamic_rows) <= 1:
            return ",".join(str(rows) for sizes in self.dynamic_rows.values() for rows in sizes)
        return ", ".join(",".join(map(str, sizes)) + " at " + ";".join(f"{n}:{list(s)}" for n, s in key)
                         for key, sizes in self.dynamic_rows.items())
