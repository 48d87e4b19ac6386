"""The typed model spec every later layer works from, and how config.pbtxt and the ONNX file are reconciled.

`reconcile` is the single place where config.pbtxt meets the ONNX signature: it fills what the
config omits (auto-complete) and refuses what contradicts the file, naming the model, the tensor
and both values. `build_model_spec` turns a complete config into a `ModelSpec`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gebackend.config import dtypes
from gebackend.config.dim_names import meaningful
from gebackend.config.index_bounds import IndexBound, LengthLimit
from gebackend.config.onnx_signature import Dim, OnnxTensor, Signature
from gebackend.config.options import BackendOptions, model_parameters, parse_options
from gebackend.config import optional_inputs
from gebackend.config import ragged as ragged_config
from gebackend.config import sequence as sequence_config
from gebackend.config.ragged import RaggedSpec
from gebackend.config.sequence import SequenceSpec
from gebackend.config.static_shapes import FreeDims, Shapes, check_paddable, compiled_shapes
from gebackend.errors import ConfigError

_SCHEDULERS = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as a request sees it: the batch dim, if any, is not part of `dims`."""

    name: str
    dtype: dtypes.DType
    dims: tuple[int, ...]  # -1: any size
    # the ONNX dim_param of each free dim where it names one (config/dim_names.py): a hint for bucket planning and
    # padding, never a reason to refuse a request; None where config.pbtxt fixes the dim or the name is a placeholder
    labels: tuple[str | None, ...]
    # A rank-0 tensor of a model without batching: the dims clients send and get ([1]; Triton has no scalars and
    # refuses an empty reshape there); the adapter turns it into the scalar the model sees and back. None otherwise.
    wire_dims: tuple[int, ...] | None = None
    optional: bool = False  # a default in the ONNX file a request may leave out (config/optional_inputs.py)
    bound: IndexBound | None = None  # the values an integer input may take, where it indexes a stored table
    limits: tuple[LengthLimit, ...] = ()  # the longest each axis may be, where its length numbers a stored table

    def config_entry(self) -> dict[str, Any]:
        """The config.pbtxt entry auto-complete writes, as Triton's onnxruntime backend completes it: Triton needs at
        least one dim per tensor, so a tensor with only the batch dim is `dims: [1]` reshaped to `[]` (clients send
        `[batch, 1]`, the model gets `[batch]`), and a scalar of a model without batching is `dims: [1]`."""
        if self.wire_dims is not None:
            return {"name": self.name, "data_type": self.dtype.triton, "dims": list(self.wire_dims)}
        if not self.dims:
            return {"name": self.name, "data_type": self.dtype.triton, "dims": [1], "reshape": {"shape": []}}
        return {"name": self.name, "data_type": self.dtype.triton, "dims": list(self.dims)}


@dataclass(frozen=True)
class Reconciled:
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    enable_dynamic_batching: bool
    sequence: SequenceSpec | None = None  # sequence_batching: inputs Triton fills, states carried between requests
    ragged: RaggedSpec | None = None  # ragged inputs and the batch inputs computed for them (config/ragged.py)

    def completes(self, kind: str, name: str) -> bool:
        """Whether auto-complete writes this tensor into config.pbtxt: not the inputs Triton fills for a sequence
        model (controls, input states) nor its output states unless listed (clients neither send nor get them)."""
        if self.sequence is None:
            return True
        return name not in (self.sequence.provided_inputs if kind == "input" else self.sequence.hidden_outputs)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    options: BackendOptions
    static_shapes: tuple[dict[str, tuple[int, ...]], ...] = ()  # compiled shapes; empty in dynamic graph mode
    sequence: SequenceSpec | None = None  # a stateful model's sequence_batching (config/sequence.py)
    # ragged inputs (flattened across a batch) and batch inputs (computed per batch, not in `inputs`)
    ragged: RaggedSpec | None = None
    # the file in the model repository when `path` is a copy or a lowering of it: what is kept or looked up beside
    # the model (the precision cache, a relative calibration_data) goes by this file (`home`)
    source: Path | None = None
    # why static graph mode, asked for, does not apply (a free input dim no bucket fixes): the model is served on the
    # dynamic graph and the load line says so; "" otherwise
    static_note: str = ""

    @property
    def home(self) -> Path:
        """The model's file in its repository (see `source`)."""
        return self.source or self.path

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @property
    def static(self) -> bool:
        return bool(self.static_shapes)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)


def _config_dims(entry: Mapping[str, Any]) -> list[int] | None:
    """The dims the model sees: `reshape.shape` when the entry has one (Triton reshapes between what clients
    send, `dims`, and what the backend gets), else `dims`; None when not given."""
    reshape = entry.get("reshape")
    if isinstance(reshape, Mapping):
        return [int(d) for d in reshape.get("shape") or []]
    dims = entry.get("dims")
    if dims is None or len(dims) == 0:
        return None
    return [int(d) for d in dims]


def _batch_capable(tensor: OnnxTensor) -> bool:
    return tensor.rank >= 1 and not isinstance(tensor.shape[0], int)


def _decide_batching(
    model: str, config: Mapping[str, Any], tensors: Sequence[tuple[Mapping[str, Any] | None, OnnxTensor]]
) -> bool:
    max_batch_size = int(config.get("max_batch_size") or 0)
    if max_batch_size > 0:
        for _, tensor in tensors:
            if not _batch_capable(tensor):
                dim0 = tensor.shape[0] if tensor.rank else "none (a scalar)"
                raise ConfigError(
                    f"model '{model}': max_batch_size is {max_batch_size} but tensor '{tensor.name}' has "
                    f"dim 0 = {dim0} in the ONNX file, not a variable batch dim; set max_batch_size: 0 "
                    f"or export the model with a dynamic batch axis"
                )
        return True
    if not all(_batch_capable(t) for _, t in tensors):
        return False
    # dim 0 is symbolic everywhere: batch, unless the config spelled dims out at full rank.
    for entry, tensor in tensors:
        dims = _config_dims(entry) if entry else None
        if dims is not None and len(dims) == tensor.rank:
            return False
    return True


def _merge_tensor(model: str, kind: str, entry: Mapping[str, Any] | None, tensor: OnnxTensor, batching: bool,
                  ragged: frozenset[str] = frozenset()) -> TensorSpec:
    onnx_dims: tuple[Dim, ...] = tensor.shape[1:] if batching else tensor.shape
    if entry is not None:
        declared = entry.get("data_type")
        if declared and declared != "TYPE_INVALID" and declared != tensor.dtype.triton:
            raise ConfigError(
                f"model '{model}': {kind} '{tensor.name}' has data_type {declared} in config.pbtxt "
                f"but {tensor.dtype.triton} in the ONNX file"
            )
    config_dims = _config_dims(entry) if entry else None
    if tensor.name in ragged and config_dims is not None:  # what a request sends; the model gets it flattened
        return TensorSpec(tensor.name, tensor.dtype, tuple(config_dims), (None,) * len(config_dims),
                          bound=tensor.bound)
    if not batching and not onnx_dims:  # a scalar: [1] on the wire, as the onnxruntime backend serves it
        if config_dims is not None and any(d != 1 for d in config_dims):
            raise ConfigError(
                f"model '{model}': {kind} '{tensor.name}' is a scalar in the ONNX file; a model without batching "
                f"declares it with dims of 1 only (dims: [ 1 ]), not {config_dims}"
            )
        return TensorSpec(tensor.name, tensor.dtype, (), (), tuple(config_dims) if config_dims else (1,),
                          bound=tensor.bound)
    if config_dims is None:  # a tensor with only the batch dim is completed with a reshape (see config_entry)
        dims = tuple(d if isinstance(d, int) else -1 for d in onnx_dims)
    else:
        if len(config_dims) != len(onnx_dims):
            batch_note = " (not counting the batch dim, since max_batch_size > 0)" if batching else ""
            raise ConfigError(
                f"model '{model}': {kind} '{tensor.name}' has dims {config_dims} (rank {len(config_dims)}) "
                f"in config.pbtxt but the ONNX file's shape {_show(onnx_dims)} has rank {len(onnx_dims)}{batch_note}"
            )
        merged = []
        for axis, (c, o) in enumerate(zip(config_dims, onnx_dims)):
            if isinstance(o, int) and c != -1 and c != o:
                raise ConfigError(
                    f"model '{model}': {kind} '{tensor.name}' dim {axis} is {c} in config.pbtxt "
                    f"but {o} in the ONNX file (shape {_show(onnx_dims)})"
                )
            merged.append(o if isinstance(o, int) else c)
        dims = tuple(merged)
    labels = tuple(meaningful(o) if isinstance(o, str) and d == -1 else None for o, d in zip(onnx_dims, dims))
    return TensorSpec(tensor.name, tensor.dtype, dims, labels, bound=tensor.bound, limits=tensor.limits)


def _show(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _pair(
    model: str, kind: str, entries: Sequence[Mapping[str, Any]], onnx_tensors: Sequence[OnnxTensor], fill: bool,
    implied: frozenset[str] = frozenset(),
) -> list[tuple[Mapping[str, Any] | None, OnnxTensor]]:
    """Each config entry with its ONNX tensor, then the tensors the config omits: all of them with `fill` or when it
    lists none, else only the `implied` ones (a sequence model's controls and states, which config.pbtxt never lists).
    Outputs are filled only where the config lists none, as Triton's onnxruntime backend completes them: a config
    that lists some outputs is served those alone (a client asking another is refused by Triton)."""
    if kind == "output" and entries:
        fill = False
    by_name = {t.name: t for t in onnx_tensors}
    pairs = []
    for entry in entries:
        name = entry.get("name", "")
        if name not in by_name:
            raise ConfigError(
                f"model '{model}': config.pbtxt declares {kind} '{name}' but the ONNX file's {kind}s are "
                f"{sorted(by_name)}"
            )
        pairs.append((entry, by_name[name]))
    declared = {entry.get("name") for entry in entries}
    missing = [t for t in onnx_tensors if t.name not in declared]
    if not fill and entries:
        pairs.extend((None, t) for t in missing if t.name in implied)
        missing = [t for t in missing if t.name not in implied]
    if kind == "input" and missing and entries and not fill:
        raise ConfigError(
            f"model '{model}': config.pbtxt omits input(s) {[t.name for t in missing]} that the ONNX file requires"
        )
    if fill or not entries:
        pairs.extend((None, t) for t in missing)
    return pairs


def reconcile(
    model: str, config: Mapping[str, Any], signature: Signature, default_max_batch_size: int, fill: bool = True
) -> Reconciled:
    """Check config.pbtxt against the ONNX signature; return the complete I/O and batching settings.

    With `fill`, tensors the config omits are taken from the ONNX file (auto-complete); without it
    (after Triton has completed the config) an omitted required input is an error.
    """
    sequence = sequence_config.sequence_spec(model, config)
    ragged = ragged_config.ragged_spec(model, config)
    computed = ragged.provided_inputs if ragged else frozenset()  # batch inputs: made per batch, never sent
    entries = config.get("input") or []
    listed = {e.get("name") for e in entries}  # defaults in the file are inputs only where config.pbtxt lists them
    onnx_inputs = [t for t in signature.inputs if t.name not in computed] + [
        t for t in signature.defaults if t.name in listed]
    inputs = _pair(model, "input", entries, onnx_inputs, fill,
                   sequence.provided_inputs if sequence else frozenset())
    outputs = _pair(model, "output", config.get("output") or [], signature.outputs, fill,
                    sequence.hidden_outputs if sequence else frozenset())
    optional = optional_inputs.optional_names(entries)
    batching = _decide_batching(model, config, [p for p in inputs if p[1].name not in optional] + outputs)
    optional_inputs.check(model, entries, signature, batching)
    if sequence is not None:
        sequence_config.check_against(model, sequence, signature.inputs, signature.outputs, batching)
    if ragged is not None:
        ragged_config.check_against(model, ragged, config, signature.inputs, batching)
    max_batch_size = int(config.get("max_batch_size") or 0)
    if batching and max_batch_size == 0:
        max_batch_size = default_max_batch_size
    enable_dynamic = batching and not any(k in config for k in _SCHEDULERS)
    return Reconciled(
        max_batch_size=max_batch_size,
        inputs=tuple(dataclasses.replace(spec, optional=True) if spec.name in optional else spec for spec in (
            _merge_tensor(model, "input", e, t, batching, ragged.ragged_inputs if ragged else frozenset())
            for e, t in inputs)),
        outputs=tuple(_merge_tensor(model, "output", e, t, batching) for e, t in outputs),
        enable_dynamic_batching=enable_dynamic,
        sequence=sequence,
        ragged=ragged,
    )


def build_model_spec(
    config: Mapping[str, Any], signature: Signature, path: Path, options: BackendOptions, source: Path | None = None
) -> ModelSpec:
    """The spec of a model whose config Triton has already completed (`source`: see `ModelSpec.source`)."""
    name = config.get("name", "")
    result = reconcile(name, config, signature, options.default_max_batch_size, fill=False)
    if result.max_batch_size != int(config.get("max_batch_size") or 0):
        raise ConfigError(
            f"model '{name}': the ONNX file has a variable batch dim on every tensor but config.pbtxt sets "
            f"max_batch_size: 0 without spelling out full-rank dims; set max_batch_size or the dims"
        )
    static = options.static
    if result.ragged is not None and (static.static_model or static.input_shape or static.dynamic_dims):
        raise ConfigError(f"model '{name}': ragged batching (allow_ragged_batch, batch_input) runs on the dynamic "
                          f"graph only; remove static_model / the shape buckets")
    try:
        shapes, note = compiled_shapes(name, result.max_batch_size, result.inputs, options), ""
    except FreeDims as exc:
        shapes, note = [], str(exc)
    check_paddable(name, result.inputs, options)
    return ModelSpec(name, path, result.max_batch_size, result.inputs, result.outputs, options, tuple(shapes),
                     result.sequence, result.ragged, None if source == path else source, note)


def shapes_from_config(config: Mapping, signature: Signature) -> tuple[list[Shapes], str]:
    """The compiled shapes of a config.pbtxt (as a dict) for an ONNX signature, for `gebackend analyze`, and why
    static graph mode does not apply where it was asked for and nothing can be compiled ("" otherwise)."""
    name = config.get("name", "model")
    options = parse_options(name, {}, model_parameters(config), config).options
    result = reconcile(name, config, signature, options.default_max_batch_size)
    try:
        return compiled_shapes(name, result.max_batch_size, result.inputs, options), ""
    except FreeDims as exc:
        return [], str(exc)
