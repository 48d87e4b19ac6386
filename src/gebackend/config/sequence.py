"""A stateful model's `sequence_batching` section: the inputs Triton fills and the state carried between requests.

Triton's onnxruntime backend serves such configs as they are, and so does `ge`: each `control_input` (START, END,
READY, CORRID) is an input of the ONNX file that Triton's sequence batcher fills in every request, and each
`state` (implicit state) is an input/output pair of the file whose output, after a request, is the input of the
next request of the same sequence. Clients send neither, so auto-complete must not add them to `input` (Triton
would then demand them), nor add an output state to `output` (listed there, a client may request it).

`sequence_spec` reads the section; `check_against` refuses what contradicts the ONNX file, naming the model, the
tensor and both values. Carrying the state is `runtime/sequence_state.py`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gebackend.config import dtypes
from gebackend.errors import ConfigError

# Triton's default `max_sequence_idle_microseconds` (model_config.proto): a sequence idle this long is released.
DEFAULT_IDLE_US = 1_000_000

# The first value of model_config.proto's control Kind enum: a proto3 JSON leaves it out when it is the kind.
_DEFAULT_KIND = "CONTROL_SEQUENCE_START"

# Which *_false_true list of a boolean control gives its data type.
_FALSE_TRUE = (("int32_false_true", "TYPE_INT32"), ("fp32_false_true", "TYPE_FP32"), ("bool_false_true", "TYPE_BOOL"))


@dataclass(frozen=True)
class Control:
    """One control input: the ONNX input Triton fills with a sequence's START/END/READY flag or its CORRID."""

    name: str
    kind: str  # CONTROL_SEQUENCE_START / _END / _READY / _CORRID
    dtype: dtypes.DType


@dataclass(frozen=True)
class State:
    """One implicit state: `output_name` after a request is `input_name` of the sequence's next request."""

    input_name: str
    output_name: str
    dtype: dtypes.DType
    dims: tuple[int, ...]  # without the batch dim; -1: any size
    returned: bool  # the output state is also listed in config.pbtxt `output`, so a client may request it


@dataclass(frozen=True)
class SequenceSpec:
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    idle_seconds: float  # max_sequence_idle_microseconds: Triton releases a sequence idle longer than this

    @property
    def provided_inputs(self) -> frozenset[str]:
        """The ONNX inputs Triton fills in every request: controls and input states."""
        return frozenset([c.name for c in self.controls] + [s.input_name for s in self.states])

    @property
    def hidden_outputs(self) -> frozenset[str]:
        """Output states not listed in config.pbtxt `output`: computed and kept, never sent to a client."""
        return frozenset(s.output_name for s in self.states if not s.returned)


def sequence_spec(model: str, config: Mapping[str, Any]) -> SequenceSpec | None:
    """The `sequence_batching` section of a config (as Triton hands it over), or None when the model has none."""
    section = config.get("sequence_batching")
    if not isinstance(section, Mapping):
        return None
    controls = []
    for entry in section.get("control_input") or []:
        for control in entry.get("control") or []:
            kind = str(control.get("kind") or _DEFAULT_KIND)
            controls.append(Control(entry.get("name", ""), kind, _control_dtype(model, entry, kind, control)))
    declared_outputs = {e.get("name") for e in config.get("output") or []}
    states = []
    for entry in section.get("state") or []:
        dtype = _dtype(model, f"state '{entry.get('input_name', '')}'", entry.get("data_type") or "TYPE_INVALID")
        output = entry.get("output_name", "")
        dims = tuple(int(d) for d in entry.get("dims") or [])
        states.append(State(entry.get("input_name", ""), output, dtype, dims, output in declared_outputs))
    idle_us = int(section.get("max_sequence_idle_microseconds") or 0) or DEFAULT_IDLE_US
    return SequenceSpec(tuple(controls), tuple(states), idle_us / 1e6)


def _control_dtype(model: str, entry: Mapping[str, Any], kind: str, control: Mapping[str, Any]) -> dtypes.DType:
    where = f"sequence control '{entry.get('name', '')}' ({kind})"
    if kind == "CONTROL_SEQUENCE_CORRID":
        return _dtype(model, where, control.get("data_type") or "TYPE_INVALID")
    for key, triton in _FALSE_TRUE:
        if control.get(key):
            return dtypes.from_triton(triton)
    raise ConfigError(f"model '{model}': {where} gives none of {[k for k, _ in _FALSE_TRUE]}, so its data type is unknown")


def _dtype(model: str, where: str, name: str) -> dtypes.DType:
    try:
        return dtypes.from_triton(name)
    except ConfigError as exc:
        raise ConfigError(f"model '{model}': {where}: {exc}") from None


def check_against(model: str, spec: SequenceSpec, inputs: Sequence[Any], outputs: Sequence[Any], batching: bool) -> None:
    """Refuse a control or state that the ONNX file lacks, types differently, or (a state) shapes differently
    (`inputs`/`outputs`: its tensors, each with `name`, `dtype` and `shape`; `batching`: dim 0 is the batch)."""
    by_input = {t.name: t for t in inputs}
    by_output = {t.name: t for t in outputs}
    wanted = [("sequence control", c.name, c.dtype, None, by_input, "input") for c in spec.controls]
    for state in spec.states:
        wanted.append(("input state", state.input_name, state.dtype, state.dims, by_input, "input"))
        wanted.append(("output state", state.output_name, state.dtype, state.dims, by_output, "output"))
    for what, name, dtype, dims, tensors, kind in wanted:
        tensor = tensors.get(name)
        if tensor is None:
            raise ConfigError(
                f"model '{model}': sequence_batching names {what} '{name}' but the ONNX file's {kind}s are {sorted(tensors)}"
            )
        if tensor.dtype != dtype:
            raise ConfigError(
                f"model '{model}': {what} '{name}' is {dtype.triton} in sequence_batching but {tensor.dtype.triton} "
                f"in the ONNX file"
            )
        onnx_dims = tuple(tensor.shape[1:] if batching else tensor.shape)
        if dims is not None and (len(dims) != len(onnx_dims) or any(
                isinstance(o, int) and d != -1 and d != o for d, o in zip(dims, onnx_dims))):
            shown = "[" + ", ".join(str(o) if isinstance(o, int) else "?" for o in onnx_dims) + "]"
            batch = " (after the batch dim)" if batching else ""
            raise ConfigError(
                f"model '{model}': {what} '{name}' has dims {list(dims)} in sequence_batching but {shown}{batch} "
                f"in the ONNX file"
            )
