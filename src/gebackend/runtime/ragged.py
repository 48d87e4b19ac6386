"""One batch of requests with ragged inputs, as Triton's onnxruntime backend builds it (config/ragged.py says which).

Each ragged input is flattened and the requests' elements laid end to end (one 1-D tensor); every other input is
stacked along dim 0 as usual; each batch input is computed from its source input's shape in each request. A
request's batch size (for splitting the outputs back) is dim 0 of its first input, as that backend takes it.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from gebackend.config.ragged import BatchInput, RaggedSpec

Tensors = Mapping[str, np.ndarray]


class RaggedBatch:
    def __init__(self, spec: RaggedSpec, first_input: str):
        self.spec = spec
        self.first_input = first_input

    def concat(self, requests: Sequence[Tensors]) -> tuple[dict[str, np.ndarray], list[int]]:
        """One feed dict for the batch, and each request's row count."""
        sizes = [int(r[self.first_input].shape[0]) for r in requests]
        feeds = {}
        for name in requests[0]:
            if name in self.spec.ragged_inputs:
                feeds[name] = np.concatenate([r[name].reshape(-1) for r in requests])
            else:
                feeds[name] = requests[0][name] if len(requests) == 1 else np.concatenate([r[name] for r in requests])
        for batch_input in self.spec.batch_inputs:
            feeds[batch_input.target] = batch_input_value(batch_input, [r[batch_input.source].shape for r in requests])
        return feeds, sizes


def batch_input_value(batch_input: BatchInput, shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    """The tensor `batch_input` makes for requests whose source input has `shapes` (each with its batch dim)."""
    dtype = batch_input.dtype.numpy
    counts = np.array([math.prod(shape) for shape in shapes], dtype=np.int64)
    kind = batch_input.kind
    if kind == "BATCH_ELEMENT_COUNT":
        return counts.astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(int(counts.max()), dtype)
    items = np.array([shape[1:] for shape in shapes for _ in range(shape[0])], dtype=dtype)  # one per row
    items = items.reshape(sum(shape[0] for shape in shapes), len(shapes[0]) - 1)
    return items if kind == "BATCH_ITEM_SHAPE" else items.reshape(-1)  # BATCH_ITEM_SHAPE_FLATTEN
