"""How one already-batched feed dict is run: straight on a dynamic engine, or through shape buckets on a static one
(with, beside it, a dynamic engine for what fits no bucket and for the batch sizes measured faster on it)."""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from gebackend.engines.base import Engine, EngineInputError, EngineRunError, StaticEngine
from gebackend.errors import GeBackendError, InvalidRequest
from gebackend.runtime.buckets import DYNAMIC, BucketRouter

Tensors = Mapping[str, np.ndarray]


class InternalError(GeBackendError):
    """The server's fault, not the request's (HTTP 500)."""


def run_engine(model: str, engine: Engine, feeds: Tensors, output_names: Sequence[str],
               bucket: int | None = None) -> dict[str, np.ndarray]:
    """Run an engine (a static one on `bucket`, when given), turning its errors into the request's fault (400) or
    ours (500)."""
    try:
        arrays = engine.run(feeds, output_names) if bucket is None else engine.run_bucket(bucket, feeds, output_names)
    except EngineInputError as exc:
        raise InvalidRequest(f"{_whose(model, _empty_input(feeds))} cannot run this request: {exc}") from None
    except EngineRunError as exc:
        empty = _empty_input(feeds)
        if empty is not None:  # the model does not compute on an empty tensor: the request's to change
            raise InvalidRequest(f"{_whose(model, empty)} cannot run this request: {exc}") from None
        raise InternalError(f"model '{model}' failed while running: {exc}") from None
    return dict(zip(output_names, arrays))


def _empty_input(feeds: Tensors) -> tuple[str, tuple[int, ...]] | None:
    """The first input with no elements (a dim of 0), and its shape."""
    return next(((name, a.shape) for name, a in feeds.items() if getattr(a, "size", 1) == 0), None)


def _whose(model: str, empty: tuple[str, tuple[int, ...]] | None) -> str:
    """Who could not run: the model, and the empty input when there is one (the likely cause)."""
    if empty is None:
        return f"model '{model}'"
    return f"model '{model}' (input '{empty[0]}' is an empty tensor, shape {list(empty[1])})"


class DynamicRunner:
    """Dynamic graph mode: shapes are resolved by the engine on every run."""

    def __init__(self, model: str, engine: Engine, output_names: Sequence[str]):
        self.model, self.engine, self.output_names = model, engine, list(output_names)

    def run(self, feeds: Tensors) -> dict[str, np.ndarray]:
        return run_engine(self.model, self.engine, feeds, self.output_names)

    def engines(self) -> list[Engine]:
        return [self.engine]

    def close(self) -> None:
        self.engine.close()


class BucketRunner:
    """Static graph mode: pad each batch to a compiled shape, run, slice back; split what is too big."""

    def __init__(
        self,
        model: str,
        router: BucketRouter,
        engine: StaticEngine,
        output_names: Sequence[str],
        fallback: Engine | None = None,
        dynamic: Engine | None = None,
    ):
        """`engine`'s bucket i is the router's bucket i (both list the spec's static shapes in order); `fallback`
        runs what fits no bucket, `dynamic` the batch sizes the router sends whole to the dynamic graph (may be the
        same engine)."""
        self.model, self.router, self.engine, self.fallback, self.dynamic = model, router, engine, fallback, dynamic
        self.output_names = list(output_names)
        self.runs_per_bucket: Counter[int] = Counter()
        self.fallback_runs = 0
        self.rows = 0
        self.padded_rows = 0

    def run(self, feeds: Tensors) -> dict[str, np.ndarray]:
        shapes = {name: tuple(a.shape) for name, a in feeds.items()}
        plan = self.router.plan(shapes)
        if plan is None:
            if self.fallback is not None:
                self.fallback_runs += 1
                return run_engine(self.model, self.fallback, feeds, self.output_names)
            sent = "; ".join(f"{n}:{list(s)}" for n, s in shapes.items())
            raise InvalidRequest(
                f"model '{self.model}': input shapes {sent} match no compiled shape; compiled shapes: "
                f"{' | '.join(self.router.describe())}"
            )
        if plan[0].bucket == DYNAMIC:  # measured at load: this batch size runs faster unspecialised
            self.runs_per_bucket[DYNAMIC] += 1
            self.rows += plan[0].rows
            return run_engine(self.model, self.dynamic, feeds, self.output_names)
        if len(plan) == 1 and self.router.buckets[plan[0].bucket] == shapes:
            return self._run_exact(feeds, plan[0].bucket)  # the request is a bucket: nothing to pad or cut
        label_sizes = self.router.sizes_by_label(shapes)
        pieces = []
        for chunk in plan:
            padded = self.router.pad(feeds, chunk)
            outputs = run_engine(self.model, self.engine, padded, self.output_names, chunk.bucket)
            bucket_rows = self.router.batch_of(chunk.bucket) if self.router.batching else 1
            if self.router.batching:
                self._check_batch_axis(outputs, bucket_rows)
            pieces.append(self.router.unpad(outputs, chunk.rows, label_sizes))
            self.runs_per_bucket[chunk.bucket] += 1
            self.rows += bucket_rows
            self.padded_rows += bucket_rows - chunk.rows
        if len(pieces) == 1:
            return pieces[0]
        return {name: np.concatenate([p[name] for p in pieces], axis=0) for name in self.output_names}

    def _run_exact(self, feeds: Tensors, bucket: int) -> dict[str, np.ndarray]:
        outputs = run_engine(self.model, self.engine, feeds, self.output_names, bucket)
        rows = self.router.batch_of(bucket) if self.router.batching else 1
        if self.router.batching:
            self._check_batch_axis(outputs, rows)
        self.runs_per_bucket[bucket] += 1
        self.rows += rows
        return outputs

    def _check_batch_axis(self, outputs: Tensors, rows: int) -> None:
        """Cutting padded rows off is right only for outputs whose dim 0 is the batch: one whose size the data decides
        (NonZero's count) is refused, as the dynamic runner's split refuses it, rather than cut into a wrong answer."""
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != rows:
                raise InternalError(
                    f"model '{self.model}': output '{name}' has shape {list(array.shape)}, whose dim 0 is not the batch "
                    f"of {rows} rows, so it cannot be cut back per request; serve it with max_batch_size: 0"
                )

    def engines(self) -> list[Engine]:
        extra = [e for e in (self.fallback, self.dynamic) if e is not None]
        return [self.engine] + list({id(e): e for e in extra}.values())

    def close(self) -> None:
        for engine in self.engines():
            engine.close()
