"""Adds an L2-normalised copy of an encoder's output to its ONNX file, so an ensemble needs no normalisation step.

CN_CLIP's exports (cn_clip's `deploy/pytorch_to_onnx.py`, `gebackend.modelzoo.bench_models`, the stand-ins) output the
unnormalised features; `CLIP.forward` then divides them by their L2 norm over the last axis (`x / x.norm(dim=-1,
keepdim=True)`, no epsilon). `add_normalized_output` appends that division to the graph as a second output
(ReduceL2 + Div, the same two ops a separate model would run), so the encoder gives both and the ensemble saves a
whole Python-backend hop per request.

The file is rewritten without loading its external data (the tensors' references are kept, so the data files
must sit beside it, as they do in a version folder), and it is replaced rather than written through, so a
hard link to a cache or to the user's own export is never changed.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import helper

_NORM_NODE = "gebackend_l2_norm"


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def with_normalized_output(model: onnx.ModelProto, source: str, name: str) -> onnx.ModelProto:
    """A copy of `model` with output `name` = `source` / ||`source`||_2 over the last axis, after its outputs.

    ValueError when `source` is not an output of the graph, or `name` is already a tensor of it."""
    outputs = {o.name: o for o in model.graph.output}
    if source not in outputs:
        raise ValueError(f"the graph has no output '{source}' to normalise (its outputs: {sorted(outputs)})")
    taken = {t for node in model.graph.node for t in node.output} | {i.name for i in model.graph.input}
    if name in taken or name in outputs:
        raise ValueError(f"the graph already has a tensor named '{name}'")
    result = onnx.ModelProto()
    result.CopyFrom(model)
    norm = f"{_NORM_NODE}_{name}"
    if _opset(model) >= 18:  # ReduceL2 takes its axes as an input from opset 18 on
        axes = f"{norm}_axes"
        result.graph.initializer.append(helper.make_tensor(axes, onnx.TensorProto.INT64, [1], [-1]))
        reduce = helper.make_node("ReduceL2", [source, axes], [norm], name=norm, keepdims=1)
    else:
        reduce = helper.make_node("ReduceL2", [source], [norm], name=norm, axes=[-1], keepdims=1)
    result.graph.node.extend([reduce, helper.make_node("Div", [source, norm], [name], name=name)])
    normalized = result.graph.output.add()
    normalized.CopyFrom(outputs[source])
    normalized.name = name
    normalized.doc_string = f"{source} / ||{source}||_2 over the last axis (added by gebackend)"
    return result


def ensure_normalized_output(path: Path, source: str, name: str) -> bool:
    """Give the ONNX file at `path` the output `name` (see `with_normalized_output`) unless it has it already.

    Returns whether the file was rewritten; ValueError (naming the file) when it cannot be. The file is replaced (a temporary file beside it, then a rename), so
    the file it may have been a hard link to is left as it was."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    if any(o.name == name for o in model.graph.output):
        return False
    try:
        changed = with_normalized_output(model, source, name)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    temporary = path.with_name(f".{path.name}.normalized.tmp")
    try:
        onnx.save(changed, str(temporary))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return True
