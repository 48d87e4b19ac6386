"""Ragged batching: inputs with `allow_ragged_batch: true` and the `batch_input` tensors that describe a batch of them.

Triton's onnxruntime backend serves such configs as they are, and so does `ge`: requests whose ragged inputs differ
in length are batched together, the model gets each ragged input flattened into one 1-D tensor of every request's
elements, and each `batch_input` is a tensor of the ONNX file that the backend computes from the batch (its
`target_name`: element counts, their running sums, item shapes). Clients never send a batch input, so auto-complete
must not add one to `input`.

`ragged_spec` reads the config; `check_against` refuses what contradicts the ONNX file, naming the model, the tensor
and both values. Building a batch is `runtime/ragged.py`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gebackend.config import dtypes
from gebackend.errors import ConfigError

# model_config.proto's BatchInput.Kind values, each with the rank of the tensor it makes.
KINDS = {
    "BATCH_ELEMENT_COUNT": 1,  # [requests]: each request's element count of the source input
    "BATCH_ACCUMULATED_ELEMENT_COUNT": 1,  # [requests]: their running sum (each request's end offset)
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": 1,  # [requests + 1]: 0, then the running sum
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE": 1,  # [largest element count]: only its shape says something
    "BATCH_ITEM_SHAPE": 2,  # [rows, rank - 1]: each row's shape without the batch dim
    "BATCH_ITEM_SHAPE_FLATTEN": 1,  # the same, flattened
}
_DEFAULT_KIND = "BATCH_ELEMENT_COUNT"  # the enum's first value: a proto3 JSON leaves it out
_TYPES = ("TYPE_FP32", "TYPE_INT32")  # what the onnxruntime backend writes batch inputs as


@dataclass(frozen=True)
class BatchInput:
    kind: str
    target: str  # the ONNX input it feeds
    dtype: dtypes.DType
    source: str  # the (ragged) input it describes


@dataclass(frozen=True)
class RaggedSpec:
    ragged_inputs: frozenset[str]  # inputs with allow_ragged_batch: flattened across the batch
    batch_inputs: tuple[BatchInput, ...]

    @property
    def provided_inputs(self) -> frozenset[str]:
        """The ONNX inputs the backend computes for each batch: the batch inputs' targets."""
        return frozenset(b.target for b in self.batch_inputs)


def ragged_spec(model: str, config: Mapping[str, Any]) -> RaggedSpec | None:
    """The config's ragged inputs and batch inputs, or None when it has neither."""
    ragged = frozenset(e.get("name", "") for e in config.get("input") or [] if e.get("allow_ragged_batch"))
    batch_inputs = []
    for entry in config.get("batch_input") or []:
        kind = str(entry.get("kind") or _DEFAULT_KIND)
        targets, sources = list(entry.get("target_name") or []), list(entry.get("source_input") or [])
        where = f"batch_input {targets[0] if targets else '(no target_name)'!r} ({kind})"
        if kind not in KINDS:
            raise ConfigError(f"model '{model}': {where}: unknown kind; the kinds are {sorted(KINDS)}")
        if len(targets) != 1 or len(sources) != 1:
            raise ConfigError(f"model '{model}': {where} needs one target_name and one source_input, "
                              f"got {targets} and {sources}")
        dtype = str(entry.get("data_type") or "TYPE_INVALID")
        if dtype not in _TYPES:
            raise ConfigError(f"model '{model}': {where} has data_type {dtype}; a batch input is one of {list(_TYPES)}")
        batch_inputs.append(BatchInput(kind, targets[0], dtypes.from_triton(dtype), sources[0]))
    if not ragged and not batch_inputs:
        return None
    return RaggedSpec(ragged, tuple(batch_inputs))


def check_against(model: str, spec: RaggedSpec, config: Mapping[str, Any], inputs: Sequence[Any], batching: bool) -> None:
    """Refuse ragged or batch inputs the model cannot take (`inputs`: the ONNX file's, each with `name`, `dtype`
    and `shape`; `batching`: max_batch_size > 0)."""
    by_name = {t.name: t for t in inputs}
    declared = {e.get("name") for e in config.get("input") or []}
    if not batching:
        raise ConfigError(f"model '{model}': ragged batching (allow_ragged_batch, batch_input) needs batching; "
                          f"set max_batch_size > 0")
    for name in sorted(spec.ragged_inputs):
        tensor = by_name.get(name)
        if tensor is not None and tensor.rank != 1:
            raise ConfigError(f"model '{model}': ragged input '{name}' has rank {tensor.rank} in the ONNX file; the "
                              f"model gets a ragged input as one flat tensor of every request's elements (rank 1)")
    for b in spec.batch_inputs:
        tensor = by_name.get(b.target)
        if tensor is None:
            raise ConfigError(f"model '{model}': batch_input '{b.target}' is not an input of the ONNX file, whose "
                              f"inputs are {sorted(by_name)}")
        if b.target in declared:
            raise ConfigError(f"model '{model}': '{b.target}' is both a batch_input target and an input in "
                              f"config.pbtxt; clients do not send batch inputs, so leave it out of `input`")
        if tensor.dtype != b.dtype:
            raise ConfigError(f"model '{model}': batch_input '{b.target}' is {b.dtype.triton} in config.pbtxt but "
                              f"{tensor.dtype.triton} in the ONNX file")
        if tensor.rank != KINDS[b.kind]:
            raise ConfigError(f"model '{model}': batch_input '{b.target}' ({b.kind}) makes a tensor of rank "
                              f"{KINDS[b.kind]} but the ONNX file's has rank {tensor.rank}")
        if b.source not in declared:
            raise ConfigError(f"model '{model}': batch_input '{b.target}' describes input '{b.source}', which "
                              f"config.pbtxt does not declare")
