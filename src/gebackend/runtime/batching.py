"""Dynamic batching on the backend side: group compatible requests, concatenate along dim 0, split back."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from gebackend.errors import GeBackendError

Tensors = Mapping[str, np.ndarray]


class BatchSplitError(GeBackendError):
    """An output lost the batch axis, so it cannot be split back per request."""


def _key(inputs: Tensors, ragged: frozenset[str]) -> tuple:
    return tuple((name, inputs[name].dtype.str, None if name in ragged else inputs[name].shape[1:]) for name in sorted(inputs))


def group_compatible(requests: Sequence[Tensors], ragged: frozenset[str] = frozenset()) -> list[list[int]]:
    """Indices of requests that can share one run: same inputs, dtypes and non-batch dims (any for the `ragged`
    inputs, which are flattened into one: runtime/ragged.py), in arrival order."""
    groups: dict[tuple, list[int]] = {}
    for index, inputs in enumerate(requests):
        groups.setdefault(_key(inputs, ragged), []).append(index)
    return list(groups.values())


def concat(requests: Sequence[Tensors]) -> tuple[dict[str, np.ndarray], list[int]]:
    """One feed dict with every request's rows stacked along dim 0, and each request's row count."""
    sizes = [int(next(iter(r.values())).shape[0]) for r in requests]
    if len(requests) == 1:
        return dict(requests[0]), sizes
    names = list(requests[0])
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in names}, sizes


def split(outputs: Mapping[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut each output back into per-request pieces along dim 0."""
    total = sum(sizes)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise BatchSplitError(
                f"output '{name}' has shape {list(array.shape)}, whose dim 0 is not the batch of {total} rows"
            )
    if len(sizes) == 1:
        return [dict(outputs)]
    bounds = np.cumsum([0, *sizes])
    return [{name: array[bounds[i]:bounds[i + 1]] for name, array in outputs.items()} for i in range(len(sizes))]
