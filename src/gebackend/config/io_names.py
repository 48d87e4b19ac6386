"""Tensor names for `backend: "npu_ge"` configs: Ascend ge-backend pairs config.pbtxt's inputs and outputs with the
ONNX file's by position, not by name; this reproduces that, so its configs load unchanged.

ge-backend (hicann/triton-inference-server-ge-backend) reads the ONNX signature into a list (ModelState::ParseOnnxInfo)
and compares it with config.pbtxt's entries index by index (CompareOnnxAndTxt, CheckConfigIO, both
src/model_state.cpp); requests are read and answered under config.pbtxt's names (src/inference.cpp). Its own
example, example/resnet/config.pbtxt, names the output `resnetv24_dense0_fwd` while the resnet18-v1-7.onnx its README
downloads calls it `resnetv15_dense0_fwd`, and serves it as `resnetv24_dense0_fwd`.

Here, for an `npu_ge` config whose declared input (or output) names are not all in the ONNX file while the counts
match, entry i takes the ONNX file's tensor i: the signature is read under config.pbtxt's names and the engines get
a copy of the model whose boundary is renamed (an Identity node per renamed tensor). `backend: "ge"` keeps Triton's
onnxruntime backend's rule: names must match, and a wrong one fails the load naming both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gebackend.config.model_copy import write_model_copy
from gebackend.config.onnx_signature import OnnxTensor, Signature
from gebackend.errors import ModelLoadError


@dataclasses.dataclass(frozen=True)
class Renames:
    """ONNX name -> config.pbtxt name, per kind, with the position of each."""

    inputs: tuple[tuple[int, str, str], ...] = ()
    outputs: tuple[tuple[int, str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)

    def describe(self) -> list[str]:
        return [f"config.pbtxt {kind} '{new}' is not in the ONNX file: served as its {kind} #{i} '{old}' "
                f"(ge-backend pairs them by position)"
                for kind, pairs in (("input", self.inputs), ("output", self.outputs)) for i, old, new in pairs]


def _by_position(entries: Sequence[Mapping[str, Any]], tensors: Sequence[OnnxTensor]) -> tuple[tuple[int, str, str], ...]:
    declared = [str(e.get("name", "")) for e in entries]
    onnx_names = [t.name for t in tensors]
    if not declared or set(declared) <= set(onnx_names) or len(declared) != len(onnx_names):
        return ()  # nothing to pair, or names decide (a wrong count stays an error, as in ge-backend's checks)
    if len(set(declared)) != len(declared):
        return ()
    for position, name in enumerate(declared):
        if name in onnx_names and onnx_names.index(name) != position:
            return ()  # a declared name sits elsewhere in the file: ambiguous, let the name check report it
    return tuple((i, old, new) for i, (old, new) in enumerate(zip(onnx_names, declared)) if old != new)


def positional_renames(model_config: Mapping[str, Any], signature: Signature) -> Renames:
    """What an `npu_ge` config renames (nothing for `ge`, or when every declared name is in the file)."""
    if model_config.get("backend") != "npu_ge":
        return Renames()
    return Renames(_by_position(model_config.get("input") or [], signature.inputs),
                   _by_position(model_config.get("output") or [], signature.outputs))


def aliased_signature(model_config: Mapping[str, Any], signature: Signature) -> Signature:
    """The signature under config.pbtxt's names (unchanged unless `positional_renames` finds some)."""
    renames = positional_renames(model_config, signature)
    if not renames:
        return signature
    inputs, outputs = list(signature.inputs), list(signature.outputs)
    for i, _, new in renames.inputs:
        inputs[i] = dataclasses.replace(inputs[i], name=new)
    for i, _, new in renames.outputs:
        outputs[i] = dataclasses.replace(outputs[i], name=new)
    return dataclasses.replace(signature, inputs=tuple(inputs), outputs=tuple(outputs))


def _names_in_use(graph) -> set[str]:
    names = {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names |= {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
    return names


def rename_boundary(model, renames: Renames) -> bool:
    """Rename the graph's inputs and outputs in place through Identity nodes; False when a new name is taken."""
    import onnx

    graph = model.graph
    taken = _names_in_use(graph)
    if any(new in taken for _, _, new in renames.inputs + renames.outputs):
        return False
    by_name = {v.name: v for v in graph.input}
    for _, old, new in renames.inputs:
        by_name[old].name = new
        graph.node.insert(0, onnx.helper.make_node("Identity", [new], [old], name=f"ge_input_{new}"))
    outputs = {v.name: v for v in graph.output}
    for _, old, new in renames.outputs:
        outputs[old].name = new
        graph.node.append(onnx.helper.make_node("Identity", [old], [new], name=f"ge_output_{new}"))
    return True


def aliased_model(model_config: Mapping[str, Any], path: Path, log: Callable[[str], None] = lambda m: None,
                  temp_parent: Path | None = None) -> Path:
    """`path`, or a copy of it with config.pbtxt's names at its boundary when an `npu_ge` config pairs by position.

    The copy is config/model_copy.py's (under `temp_parent`, the server's temp folder, when given).
    """
    if model_config.get("backend") != "npu_ge" or not (model_config.get("input") or model_config.get("output")):
        return path
    import onnx

    from gebackend.config.onnx_signature import read_signature

    renames = positional_renames(model_config, read_signature(path))  # ConfigError for a file it cannot read
    if not renames:
        return path
    model = onnx.load(str(path), load_external_data=False)
    if not rename_boundary(model, renames):
        log("config.pbtxt's tensor names are used inside the ONNX file; not pairing them by position")
        return path
    for line in renames.describe():
        log(line)
    try:
        return write_model_copy(model, Path(path), temp_parent, prefix="npu-ge-names-")
    except OSError as exc:
        raise ModelLoadError(f"cannot write the renamed copy of {path}: {exc}") from None
