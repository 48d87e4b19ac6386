"""`bucket_paddable_dims` checked at load: a request shorter than its bucket along a paddable dim is zero-padded up to
it (runtime/buckets.py), which is right only for a model that ignores its padding (a BERT whose attention mask is
padded with 0 too). Before the instance serves, a seeded request of three quarters of a bucket's length runs padded
through that bucket and unpadded on the dynamic graph; where an output moves (runtime/same_answer.py), the instance
serves without padding, a request then matching a bucket exactly or taking `bucket_fallback`, and the load says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.errors import GeBackendError
from gebackend.runtime.buckets import BucketRouter, Chunk
from gebackend.runtime.same_answer import exact_disagreement, fp32_disagreement

Tensors = Mapping[str, np.ndarray]
Shapes = dict[str, tuple[int, ...]]


def padded_request(spec: ModelSpec, router: BucketRouter) -> tuple[int, Shapes] | None:
    """(a bucket, a one-row request of three quarters of its size along every paddable dim): the longest bucket of the
    fewest rows whose paddable dims are at least 2; None when no bucket has one (nothing would ever be padded)."""
    offset = 1 if spec.batching else 0
    labels = {t.name: t.labels for t in spec.inputs}
    paddable = set(spec.options.static.bucket_paddable_dims)
    best = None
    for index, shapes in enumerate(router.buckets):
        sizes = {label: shape[axis + offset] for name, shape in shapes.items()
                 for axis, label in enumerate(labels.get(name, ())) if label in paddable}
        if not sizes or min(sizes.values()) < 2:
            continue
        rank = (router.batch_of(index), -int(np.prod(list(sizes.values()))))
        if best is None or rank < best[0]:
            best = (rank, index, sizes)
    if best is None:
        return None
    _, index, sizes = best
    shorter = {label: max(1, size * 3 // 4) for label, size in sizes.items()}
    request = {}
    for name, shape in router.buckets[index].items():
        dims = [shorter.get(label, size) for label, size in zip(labels.get(name, ()), shape[offset:])]
        request[name] = ((1,) if spec.batching else ()) + tuple(dims)
    return index, request


def check(spec: ModelSpec, router: BucketRouter, run_bucket: Callable[[int, Tensors], Tensors],
          run_unpadded: Callable[[Tensors], Tensors], original: Path | None = None) -> str | None:
    """None when a request padded up to its bucket answers as the dynamic graph does unpadded, else why not (one
    line). `original`: the fp32 file a lowered model came from (its answers are compared through fp32)."""
    from gebackend.compile.accuracy import random_feeds

    found = padded_request(spec, router)
    if found is None:
        return None
    bucket, shapes = found
    feeds = random_feeds(spec.path, shapes, seed=3)
    rows = next(iter(shapes.values()))[0] if spec.batching else 1
    try:
        outputs = run_bucket(bucket, router.pad(feeds, Chunk(bucket, 0, rows)))
        padded = router.unpad(outputs, rows, router.sizes_by_label(shapes))
        unpadded = run_unpadded(feeds)
    except GeBackendError as exc:
        return f"the model did not run the check's request ({_describe(shapes)}): {exc}"
    for name, expected in unpadded.items():
        if padded[name].shape != expected.shape:
            return (f"output '{name}' has shape {list(padded[name].shape)} padded and {list(expected.shape)} unpadded "
                    f"(an axis of it grows with the padding but is not named as the padded dim)")
    change = f"{_describe(shapes)} padded up to its bucket"
    if original is not None:
        return fp32_disagreement(original, feeds, unpadded, padded, change)
    return exact_disagreement(unpadded, padded, f"when {change}")


def checked_router(spec: ModelSpec, router: BucketRouter, run_bucket: Callable[[int, Tensors], Tensors],
                   run_unpadded: Callable[[Tensors], Tensors], rebuild: Callable[[Sequence[str]], BucketRouter],
                   log: Callable[[str], None], original: Path | None = None) -> BucketRouter:
    """`router`, whose buckets pad `spec`'s paddable dims, once `check` passed; else `rebuild(())`, a router that pads
    no dim but the batch, the load saying why (a check that cannot run counts as failed: padding is the risk)."""
    names = ", ".join(spec.options.static.bucket_paddable_dims)
    try:
        reason = check(spec, router, run_bucket, run_unpadded, original)
    except Exception as exc:  # noqa: BLE001 - a reason not to pad, never a load failure
        reason = f"the check could not run: {type(exc).__name__}: {exc}"
    if reason is None:
        log(f"bucket_paddable_dims={names}: checked at load: a request padded up to its bucket answers as unpadded")
        return router
    log(f"bucket_paddable_dims={names}: not used, a request must match a bucket's {names} exactly (else "
        f"bucket_fallback={spec.options.static.bucket_fallback}): {reason}")
    return rebuild(())


def _describe(shapes: Shapes) -> str:
    return "; ".join(f"{name}:{list(shape)}" for name, shape in shapes.items())
