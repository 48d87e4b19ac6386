"""ONNX's shape inference and checker on a model without its weights; ONNX Runtime's symbolic shape inference.

Both take a ModelProto by serialising all of it (and shape inference parses its answer back): on ResNet-50 (98 MB of
weights) 0.2-0.5 s a call, paid by every static bucket at load (specialise's inference, the fold pass's check). Their
answers need the weights' types and dims, never their bytes, except for the small integer tensors data
propagation reads as shapes. So they run on a light copy: every initializer of `LIGHT_MIN_BYTES` or more a graph
input of its own type and dims instead (the same to shape inference and to the checker), the rest as they are.

`symbolic_shapes` is ONNX Runtime's symbolic shape inference, which also knows ONNX Runtime's com.microsoft operators
(the fused `SkipLayerNormalization`, `BiasGelu`, `Attention`, ... of its transformer optimizer): `typed_light_copy`,
and so `infer_shapes`, type a graph that has such operators with it, where ONNX's inference would leave their outputs
and everything they feed without dims (a static graph of such a file would keep its shape arithmetic and allocate
its outputs on every run).

Read by the graph passes (compile/) and by the signature of a classifier's ZipMap outputs (config/zipmap.py).
"""

from __future__ import annotations

import logging
import math
from typing import Iterable

import numpy as np
import onnx
from onnx import helper

LIGHT_MIN_BYTES = 4096  # shape values (Reshape's target, Slice's ends, ...) are a few dozen bytes
CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's own operators


def tensor_bytes(init: onnx.TensorProto) -> int:
    """About how many bytes the tensor's values take, from its dims and type alone: a TensorProto's `ByteSize()`
    serialises it (a second for a 784 MB weight), this reads no value (strings counted at 8 bytes each)."""
    try:
        size = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    except (KeyError, TypeError, ValueError):  # an undefined or unknown element type
        size = 8
    return math.prod(init.dims) * size


def light_copy(model: onnx.ModelProto, min_bytes: int = LIGHT_MIN_BYTES) -> onnx.ModelProto:
    """`model` with each initializer of `min_bytes` or more replaced by a graph input of its type and dims."""
    graph = model.graph
    heavy = [init for init in graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL
             or tensor_bytes(init) >= min_bytes]
    if not heavy:
        return model
    names = {init.name for init in heavy}
    light = with_initializers(model, [init for init in graph.initializer if init.name not in names])
    declared = {value.name for value in light.graph.input}
    light.graph.input.extend(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                             for init in heavy if init.name not in declared)
    return light


def with_initializers(model: onnx.ModelProto, initializers: Iterable[onnx.TensorProto]) -> onnx.ModelProto:
    """A new model with `model`'s fields and graph, the graph's initializers replaced by `initializers`: those are
    copied into it (protobuf's extend copies: 0.4 s for 200 MB), none of `model`'s others (a ModelProto's CopyFrom
    copies every byte of them)."""
    out = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        if model.HasField(field):  # proto2: an unset field stays unset
            setattr(out, field, getattr(model, field))
    for field in ("opset_import", "functions", "metadata_props", "training_info", "configuration"):
        getattr(out, field).extend(getattr(model, field))
    graph, source = out.graph, model.graph
    for field in ("name", "doc_string"):
        if source.HasField(field):
            setattr(graph, field, getattr(source, field))
    for field in ("node", "input", "output", "value_info", "sparse_initializer", "quantization_annotation",
                  "metadata_props"):
        getattr(graph, field).extend(getattr(source, field))
    graph.initializer.extend(initializers)
    return out


def has_contrib_ops(model: onnx.ModelProto) -> bool:
    """Whether the graph has ONNX Runtime's com.microsoft operators (ONNX's shape inference does not know them)."""
    return any(node.domain == CONTRIB_DOMAIN for node in model.graph.node)


def typed_light_copy(model: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto:
    """The light copy of `model` with its value_info inferred: by ONNX Runtime's symbolic shape inference where the
    graph has com.microsoft operators and that inference completes, else by
    `onnx.shape_inference.infer_shapes(strict_mode=False, data_prop=...)` (raises what that raises). Never a copy of
    the weights."""
    weightless = light_copy(model)
    if has_contrib_ops(model):
        try:
            typed = symbolic_shapes(weightless)
        except Exception:  # noqa: BLE001 - it stops where it cannot resolve a dim; ONNX's inference then answers
            typed = None
        if typed is not None:
            return typed
    return onnx.shape_inference.infer_shapes(weightless, strict_mode=False, data_prop=data_prop)


def infer_shapes(model: onnx.ModelProto, data_prop: bool, in_place: bool = False) -> onnx.ModelProto:
    """A copy of `model` (`model` itself with `in_place`: a copy of a 2 GB model takes a second) with the value_info
    and output types `typed_light_copy` infers (raises what ONNX's shape inference raises, `model` then unchanged)."""
    inferred = typed_light_copy(model, data_prop)
    result = model
    if not in_place:
        result = onnx.ModelProto()
        result.CopyFrom(model)
    del result.graph.value_info[:]
    result.graph.value_info.extend(inferred.graph.value_info)
    types = {value.name: value.type for value in inferred.graph.output}
    for value in result.graph.output:
        if value.name in types:
            value.type.CopyFrom(types[value.name])
    return result


def check_model(model: onnx.ModelProto) -> None:
    """onnx's checker on the light copy (raises what the checker raises); no 2 GB limit there."""
    onnx.checker.check_model(light_copy(model))


def symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` typed by ONNX Runtime's symbolic shape inference, which knows its com.microsoft operators (ONNX's does
    not); None where it declines the model (opset below 7). Raises what it raises, and `IncompleteShapes` where it
    stops before every tensor has a shape.

    Its own `infer_shapes` does the same steps and, where it stops, first saves the model as
    `sym_shape_infer_temp.onnx` (with its weights, as external data) into the working folder: the server's, or the
    user's of `gebackend analyze`. So they are run here, writing nothing."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset

    opset = get_opset(model)
    if not opset or opset < 7:
        return None
    logger = logging.getLogger(SymbolicShapeInference.__module__)
    level = logger.level
    logger.setLevel(logging.ERROR)  # its warnings are its own guesses ("Cannot determine if ... < 0"), not the user's
    try:
        inference = SymbolicShapeInference(2**31 - 1, auto_merge=True, guess_output_rank=True, verbose=0)
        inference._preprocess(model)
        complete = False
        while inference.run_:
            complete = inference._infer_impl()
        inference._update_output_from_vi()
    finally:
        logger.setLevel(level)
    if not complete:
        raise IncompleteShapes("ONNX Runtime's symbolic shape inference stopped before every tensor had a shape")
    return inference.out_mp_


class IncompleteShapes(RuntimeError):
    """ONNX Runtime's symbolic shape inference stopped before every tensor had a shape."""
