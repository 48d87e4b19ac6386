"""Classifiers exported from scikit-learn (skl2onnx, onnxmltools) end in a `ZipMap` (ai.onnx.ml): their probability
output is a sequence of maps, class label -> probability, one map per row. Triton carries tensors only, so Triton's
onnxruntime backend refuses such a model (`Unsupported ONNX Type 'ONNX_TYPE_SEQUENCE' for I/O 'probabilities'`) and its
users re-export with `zipmap=False`. Here the output is served as the tensor the ZipMap maps: the same name, FP32
[rows, classes], its columns in the order of the ZipMap's class labels (which the load log lists; a config.pbtxt
`label_filename` for that output gives Triton's classification extension the names).

`unzipped(model)` is that graph (the ZipMap removed, the tensor it read renamed to its output); the signature
(config/onnx_signature.py) reads it, so auto-complete and config checks see the tensor, and `served_unzipped` writes it
as the model copy the engines load (config/model_copy.py). A ZipMap whose output is not a graph output, or is read by
another node, is left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import onnx

if TYPE_CHECKING:
    from gebackend.config.onnx_signature import Signature

_ML_DOMAIN = "ai.onnx.ml"


def _zipmaps(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ZipMap nodes whose (sequence) output is a graph output that no other node reads, of a tensor a node makes
    that is no graph output itself (it takes the ZipMap's output name)."""
    graph = model.graph
    outputs = {v.name for v in graph.output if v.type.WhichOneof("value") == "sequence_type"}
    read = {name for node in graph.node for name in node.input}
    made = {name for node in graph.node for name in node.output} - {v.name for v in graph.output}
    return [node for node in graph.node
            if node.op_type == "ZipMap" and node.domain == _ML_DOMAIN and node.output[0] in outputs
            and node.output[0] not in read and node.input[0] in made]


def class_labels(node: onnx.NodeProto) -> list:
    for attribute in node.attribute:
        if attribute.name == "classlabels_int64s":
            return list(attribute.ints)
        if attribute.name == "classlabels_strings":
            return [s.decode() for s in attribute.strings]
    return []


def unzipped(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` whose ZipMap outputs are the tensors they map, or None when it has none."""
    zipmaps = _zipmaps(model)
    if not zipmaps:
        return None
    from gebackend.config.light import infer_shapes

    try:
        shapes = {v.name: v.type for v in infer_shapes(model, data_prop=False).graph.value_info}
    except Exception:  # noqa: BLE001 - no inferred dims: [rows, classes] from the labels alone
        shapes = {}
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    renames = {node.input[0]: node.output[0] for node in zipmaps}
    dropped = {node.output[0] for node in zipmaps}
    kept = [node for node in graph.node if not (node.op_type == "ZipMap" and node.output and node.output[0] in dropped)]
    for node in kept:
        node.output[:] = [renames.get(name, name) for name in node.output]
        node.input[:] = [renames.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    for value in graph.output:
        if value.name not in dropped:
            continue
        tensor = next(node.input[0] for node in zipmaps if node.output[0] == value.name)
        labels = len(class_labels(next(node for node in zipmaps if node.output[0] == value.name)))
        inferred = shapes.get(tensor)
        value.type.Clear()
        if inferred is not None and inferred.WhichOneof("value") == "tensor_type":
            value.type.CopyFrom(inferred)
        else:
            value.type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [None, labels or None]))
    infos = [value for value in graph.value_info if value.name not in renames]  # now graph outputs
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return result


def served_unzipped(path: Path, signature: Signature, log: Callable[[str], None] = lambda m: None,
                    temp_parent: Path | None = None) -> Path:
    """The file the engines load: `path` itself (its `signature` names no ZipMap output: the file is not read again),
    or the copy whose ZipMap outputs are tensors (said in the log)."""
    if not signature.unzipped:
        return path
    model = onnx.load(str(path), load_external_data=False)
    zipmaps = _zipmaps(model)
    if not zipmaps:
        return path
    served = unzipped(model)
    for node in zipmaps:
        log(f"output '{node.output[0]}' is a ZipMap (a sequence of maps, which Triton cannot carry): served as the "
            f"tensor it maps, FP32 [rows, classes], columns in the order of the class labels {class_labels(node)}")
    from gebackend.config.model_copy import served_copy

    return served_copy(served, Path(path), temp_parent, "ge-unzipped-", "with its ZipMap outputs as tensors")
