"""The file a model is served from: its ONNX file as the engines must see it, read once.

One load step, in order: config.pbtxt's names at the file's boundary (an `npu_ge` config pairing by position), the
file's signature, optional inputs made plain ones, StringNormalizers given a locale this machine has, a classifier's
ZipMap outputs made tensors, and a sequence's unused rows left uncomputed. Each rewrite leaves the file alone where
it does not apply, and says what it did where it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from gebackend.compile.unused_rows import served_kept_rows
from gebackend.config.io_names import aliased_model
from gebackend.config.normalizer_locale import served_locale
from gebackend.config.onnx_signature import Signature, read_signature
from gebackend.config.optional_inputs import Defaults, served_model
from gebackend.config.training_mode import describe as describe_training
from gebackend.config.zipmap import served_unzipped


@dataclass(frozen=True)
class ServedFile:
    path: Path  # the file the engines load
    signature: Signature  # its inputs and outputs, as read before the rewrites that keep them
    defaults: Defaults  # the values of optional inputs, for requests that leave them out


def served_file(config: Mapping[str, Any], path: Path, say: Callable[[str], None], warn: Callable[[str], None],
                temp_parent: Path | None) -> ServedFile:
    """The file the engines load for `config` from the repository's `path`; `say` logs each rewrite, `warn` a file
    exported in training mode."""
    path = aliased_model(config, path, say, temp_parent)  # npu_ge: names paired by position
    signature = read_signature(path)
    if signature.training:
        warn(describe_training(signature.training))
    path, defaults = served_model(config, path, signature, say, temp_parent)  # optional inputs: plain ones
    path = served_locale(path, signature, say, temp_parent)  # StringNormalizer: a locale this machine has
    path = served_unzipped(path, signature, say, temp_parent)  # a classifier's ZipMap: its tensor
    path = served_kept_rows(path, signature, say, temp_parent)  # the first token: its rows only
    return ServedFile(path, signature, defaults)
