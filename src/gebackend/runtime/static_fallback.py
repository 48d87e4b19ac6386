"""Which buckets of a static graph serve when some cannot be built: each is built alone, and those that build serve
together while the requests the others would hold run on the dynamic graph beside them (bucket_fallback=dynamic).
runtime/loader.py asks this only after the buckets failed to build together; a model none of whose buckets builds, or
all of whose do (the failure was elsewhere), is served on the dynamic graph."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from gebackend.config.spec import ModelSpec
from gebackend.errors import GeBackendError

Failed = Sequence[tuple[Mapping[str, tuple[int, ...]], Exception]]


def without_failing_buckets(spec: ModelSpec, build_alone: Callable[[ModelSpec], object]):
    """(the spec keeping the buckets that build alone, with bucket_fallback=dynamic, [(each failing bucket's shapes,
    its error)]) where some build and some do not; None otherwise. `build_alone` builds the engine of a spec of one
    bucket (closed here at once)."""
    if len(spec.static_shapes) < 2:
        return None
    kept, failed = [], []
    for shapes in spec.static_shapes:
        try:
            engine = build_alone(dataclasses.replace(spec, static_shapes=(shapes,)))
        except Exception as exc:  # noqa: BLE001 - said once, by the caller
            failed.append((shapes, exc))
        else:
            engine.close()
            kept.append(shapes)
    if not kept or not failed:
        return None
    options = spec.options.replace(bucket_fallback="dynamic")
    return dataclasses.replace(spec, static_shapes=tuple(kept), options=options), failed


def describe(failed: Failed) -> str:
    """"bucket [x:[1, 3, 48, 192]]", "buckets [x:[1, 3, 48, 192] | x:[4, 3, 48, 192]]"."""
    shown = " | ".join("; ".join(f"{name}:{list(shape)}" for name, shape in shapes.items()) for shapes, _ in failed)
    return f"bucket{'s' if len(failed) > 1 else ''} [{shown}]"


def why(failure: Exception) -> str:
    """A build's failure in words: our own error's message, a dependency's error without its traceback."""
    from gebackend.compile.specialize import describe_error

    return str(failure) if isinstance(failure, GeBackendError) else describe_error(failure)
