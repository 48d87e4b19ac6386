"""Optional inputs: the ONNX file's overridable initializers (an initializer also listed as a graph input, IR >= 4),
served as Triton's onnxruntime backend serves them, and the copy of the model the engines load for them.

The onnxruntime backend takes such a tensor as a request input only when config.pbtxt lists it, with `optional: true`,
on a model without batching (`max_batch_size: 0`, since a default has no batch dim); its auto-complete never adds
one; a request that leaves it out runs on the value in the file. `check` holds a config to those rules, naming what is
wrong; `served_model` gives the engines what they run:

- each listed default becomes a plain graph input, and the instance feeds the file's value when a request omits it
  (`Defaults`): every engine and graph mode then takes it alike (OpenVINO reads an overridable initializer as a
  constant and cannot be fed it; the static pipeline would fold it in);
- the defaults no config lists become plain constants, which nothing can feed through Triton anyway, so that ONNX
  Runtime folds and prepacks them: it does neither for an initializer a caller may replace.

A model without defaults is served from its own file, untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from gebackend.config.onnx_signature import Signature
from gebackend.errors import ConfigError, ModelLoadError


def optional_names(entries: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The config.pbtxt inputs marked `optional: true`."""
    return frozenset(str(e.get("name", "")) for e in entries if e.get("optional") in (True, "true"))


def check(model: str, entries: Sequence[Mapping[str, Any]], signature: Signature, batching: bool) -> None:
    """Refuse an `optional: true` input the file has no default for, and optional inputs on a batching model."""
    optional = optional_names(entries)
    if not optional:
        return
    defaults = sorted(t.name for t in signature.defaults)
    for name in sorted(optional):
        if name not in defaults:
            has = f"its defaults are {defaults}" if defaults else "it has none"
            raise ConfigError(
                f"model '{model}': input '{name}' is `optional: true` in config.pbtxt but the ONNX file has no default "
                f"for it (a default is an initializer also listed among the graph inputs; {has}); a request leaving "
                f"it out could not run: remove `optional: true`"
            )
    if batching:
        raise ConfigError(
            f"model '{model}': optional input(s) {sorted(optional)} need a model without batching (max_batch_size: 0),"
            f" as in Triton's onnxruntime backend: a default in the ONNX file has no batch dim to batch requests on"
        )


class Defaults:
    """The file's value of each listed default, fed to a request that leaves it out."""

    def __init__(self, values: Mapping[str, np.ndarray]):
        self.values = dict(values)

    def __bool__(self) -> bool:
        return bool(self.values)

    def fill(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if all(name in feeds for name in self.values):
            return feeds
        return {**self.values, **feeds}  # what a request sends wins


def served_model(config: Mapping[str, Any], path: Path, signature: Signature,
                 log: Callable[[str], None] = lambda m: None, temp_parent: Path | None = None) -> tuple[Path, Defaults]:
    """The file the engines load for `config` (`path` itself when its `signature` has no defaults, without reading it
    again) and the defaults the instance fills in. The copy sits beside the other model copies (config/model_copy.py)."""
    if not signature.defaults:
        return path, Defaults({})
    import onnx

    from gebackend.config.model_copy import served_copy

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    defaults = [v.name for v in graph.input if v.name in initializers]  # as `signature.defaults` names them
    listed = {str(e.get("name", "")) for e in config.get("input") or []} & set(defaults)
    values = {}
    for name in sorted(listed):
        try:
            values[name] = onnx.numpy_helper.to_array(initializers[name], base_dir=str(Path(path).parent))
        except Exception as exc:  # onnx raises OSError, ValueError, ... for a tensor it cannot read
            raise ModelLoadError(f"cannot read the default of input '{name}' in {path}: {exc}") from None
    kept_inputs = [v for v in graph.input if v.name not in initializers or v.name in listed]
    kept_initializers = [init for init in graph.initializer if init.name not in listed]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    constants = len(defaults) - len(listed)
    if listed:
        log(f"optional input(s) {sorted(listed)}: a request that leaves one out runs on the ONNX file's value")
    if constants:
        log(f"{constants} initializer(s) listed as graph inputs but not in config.pbtxt served as constants "
            f"(foldable, prepacked)")
    return served_copy(model, Path(path), temp_parent, "ge-defaults-", "with its defaults resolved"), Defaults(values)
