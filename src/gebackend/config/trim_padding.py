"""Which inputs `trim_padding=INPUT[=PAD]` cuts, and what it refuses: the one rule config/static_shapes.py (compiled
lengths may be shorter than the config's for those inputs) and runtime/padding_trim.py (the cut itself) follow.

INPUT is cut along its last axis, and so is every input whose last dim is the same dim (the same size and the same
ONNX dim name, or both fixed): an attention mask, token type ids. INPUT must hold integer ids (the pad id marks the
padding) and have a sequence axis besides the batch; an input carrying that dim on another axis too (a [seq, seq]
mask) cannot be cut, and is refused rather than cut wrongly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from gebackend.errors import ConfigError

if TYPE_CHECKING:  # spec.py builds on static_shapes, which uses this module: no import back at run time
    from gebackend.config.spec import TensorSpec


def trimmed_inputs(model: str, option: tuple[str, int], inputs: Sequence[TensorSpec], batching: bool) -> tuple[str, ...]:
    """The inputs `trim_padding=option` cuts, INPUT first; `ConfigError` naming what does not fit."""
    key = option[0]
    tensor = next((t for t in inputs if t.name == key), None)
    if tensor is None:
        raise ConfigError(f"model '{model}': trim_padding names input '{key}', but the model's inputs are "
                          f"{[t.name for t in inputs]}")
    if tensor.dtype.numpy.kind not in "iu":
        raise ConfigError(f"model '{model}': trim_padding input '{key}' is {tensor.dtype.triton}; it must hold integer "
                          f"token ids whose pad id marks the padding")
    if len(tensor.dims) + (1 if batching else 0) < 2:
        raise ConfigError(f"model '{model}': trim_padding input '{key}' has dims {list(tensor.dims)}; it needs a "
                          f"sequence axis besides the batch ([batch, sequence])")
    seq = (tensor.dims[-1], tensor.labels[-1])
    cut = [key] + [t.name for t in inputs if t.name != key and t.dims and (t.dims[-1], t.labels[-1]) == seq]
    for t in inputs:
        if t.name in cut and seq[1] is not None and seq[1] in t.labels[:-1]:
            raise ConfigError(f"model '{model}': trim_padding: input '{t.name}' has the sequence dim '{seq[1]}' on "
                              f"another axis too (dims {list(t.dims)}); only the last axis can be cut")
    return tuple(cut)
