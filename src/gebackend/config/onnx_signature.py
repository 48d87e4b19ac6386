"""Reads what an ONNX file promises at its boundary: input and output names, element types and shapes.

Also refuses an ONNX file whose external data (weights kept beside it, `external_data` location)
points outside its model's folder, before any engine follows that path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

import onnx

from gebackend.config import dtypes
from gebackend.config.index_bounds import IndexBound, LengthLimit, index_bounds, length_limits
from gebackend.config.row_selections import selections
from gebackend.config.training_mode import training_nodes
from gebackend.errors import ConfigError

# A dim is an int (fixed), a str (a named symbolic dim such as "batch") or None (unknown).
Dim = Union[int, str, None]


@dataclass(frozen=True)
class OnnxTensor:
    name: str
    dtype: dtypes.DType
    shape: tuple[Dim, ...]
    bound: IndexBound | None = None  # an input's values index a table stored in the file (config/index_bounds.py)
    limits: tuple[LengthLimit, ...] = ()  # axes whose length numbers the rows of such a table (the same module)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[OnnxTensor, ...]
    outputs: tuple[OnnxTensor, ...]
    # initializers also listed as graph inputs (IR >= 4): defaults a caller may replace, served only when config.pbtxt
    # lists them (config/optional_inputs.py)
    defaults: tuple[OnnxTensor, ...] = ()
    # outputs the file makes with a ZipMap (a sequence of maps), served as the tensors they map (config/zipmap.py)
    unzipped: tuple[str, ...] = ()
    # nodes the file runs in training mode (a module exported without model.eval(): config/training_mode.py)
    training: tuple[str, ...] = ()
    # outputs of nodes that may keep some rows of a computed tensor (an encoder's first token): the file is served
    # computing those rows only where it can (compile/unused_rows.py)
    selections: tuple[str, ...] = ()

    def input(self, name: str) -> OnnxTensor | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> OnnxTensor | None:
        return next((t for t in self.outputs if t.name == name), None)


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value") and d.dim_value > 0:
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def _tensor(value: onnx.ValueInfoProto, where: str, bound: IndexBound | None = None,
            limits: tuple[LengthLimit, ...] = ()) -> OnnxTensor:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ConfigError(f"{where} '{value.name}' is a {kind}, only tensors can be served")
    tensor_type = value.type.tensor_type
    try:
        dtype = dtypes.from_onnx(tensor_type.elem_type)
    except ConfigError as exc:
        raise ConfigError(f"{where} '{value.name}': {exc}") from None
    shape = tuple(_dim(d) for d in tensor_type.shape.dim) if tensor_type.HasField("shape") else ()
    return OnnxTensor(value.name, dtype, shape, bound, limits)


def signature_of(model: onnx.ModelProto) -> Signature:
    from gebackend.config.zipmap import unzipped

    served = unzipped(model)  # a classifier's ZipMap outputs: the tensors they map
    zipped = {v.name for v in model.graph.output if v.type.WhichOneof("value") != "tensor_type"}
    if served is not None:
        model = served
    initializers = {init.name for init in model.graph.initializer}
    bounds, limits = index_bounds(model), length_limits(model)
    inputs = tuple(_tensor(v, "input", bounds.get(v.name), limits.get(v.name, ()))
                   for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_tensor(v, "output") for v in model.graph.output)
    # IR < 4 listed every initializer as an input, and nothing may replace those (as ONNX Runtime reads them)
    defaults = () if model.ir_version < 4 else tuple(
        _tensor(v, "input") for v in model.graph.input if v.name in initializers)
    unzipped_names = tuple(v.name for v in model.graph.output if v.name in zipped) if served is not None else ()
    return Signature(inputs, outputs, defaults, unzipped_names, training_nodes(model), selections(model))


def read_signature(path: str | Path) -> Signature:
    """The signature of the ONNX file at `path`, without loading external weight files.

    Raises `ConfigError` if an external data location leaves the model's folder (see `check_external_data`).
    """
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise ConfigError(f"cannot read ONNX file {path}: {type(exc).__name__}: {exc}") from None
    check_external_data(model, path)
    return signature_of(model)


def model_folder_of(path: str | Path) -> Path:
    """The folder an ONNX file's external data must stay in: its model's folder in a Triton repository
    (`<model>/<version>/model.onnx`), else the folder of the file itself."""
    parent = Path(os.path.abspath(path)).parent
    return parent.parent if parent.name.isdigit() else parent


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield attribute.sparse_tensor.values
                yield attribute.sparse_tensor.indices
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in the model: initializers, constants in nodes, subgraphs and functions."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def check_external_data(model: onnx.ModelProto, path: str | Path, root: str | Path | None = None) -> None:
    """Refuse external data whose location is absolute or leads out of `root` (default: `model_folder_of(path)`).

    Locations are relative to the ONNX file's folder, as onnx and onnxruntime read them. The location text is
    checked (`..`, absolute paths, drive or NUL tricks); a symlink inside the model folder is the repository
    owner's choice and is followed, as Triton follows symlinks in a repository.
    """
    base = Path(os.path.abspath(path)).parent
    root = Path(os.path.abspath(root)) if root is not None else model_folder_of(path)
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _check_location(tensor, path, base, root)


def _check_location(tensor: onnx.TensorProto, path: str | Path, base: Path, root: Path) -> None:
    location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
    target = os.path.normpath(os.path.join(base, location))
    inside = (
        location
        and "\0" not in location
        and not os.path.isabs(location)
        and os.path.commonpath([target, str(root)]) == str(root)
    )
    if not inside:
        raise ConfigError(
            f"ONNX file {path}: tensor '{tensor.name}' keeps its data at external_data location '{location}', "
            f"which is outside the model folder {root}; refusing to read it (external data must be a relative "
            f"path inside the model's folder)"
        )
