"""bfloat16 graph inputs and outputs around the static int8 quantizers (compile/quantize_static.py).

Both quantizers calibrate by running the model in ONNX Runtime's Python API (NNCF's ONNX backend does too), which
takes and gives numpy arrays only, and numpy has no bfloat16: a model with a TYPE_BF16 input or output failed
there with ONNX Runtime's own "Numpy_type 256 can't be converted to MLDataType". So the quantizer gets a copy whose
bfloat16 edges are float32 (a Cast to bfloat16 after each such input, a Cast to float32 after each such output,
under new names), the calibration samples converted to match (exactly: every bfloat16 is a float32), and the
quantized file gets its bfloat16 edges back under their own names. Neither quantizer quantizes a Cast, so the
edges come back as they were.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

SUFFIX = "__gebackend_fp32"  # the float32 edge's name: the bfloat16 tensor's name + this
_NODE = "gebackend_bf16_edge_"  # the Cast nodes' names: this + the tensor's name


@dataclass(frozen=True)
class Edges:
    """The names of a graph's bfloat16 inputs and outputs."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)

    def float_samples(self, samples: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The calibration samples as the float32 copy takes them."""
        return [{(f"{k}{SUFFIX}" if k in self.inputs else k): (np.asarray(v, np.float32) if k in self.inputs else v)
                 for k, v in sample.items()} for sample in samples]


def _bf16(value: onnx.ValueInfoProto) -> bool:
    return value.type.HasField("tensor_type") and value.type.tensor_type.elem_type == TensorProto.BFLOAT16


def find(model: onnx.ModelProto) -> Edges:
    """The graph's bfloat16 inputs and outputs (none: the quantizers take the model as it is)."""
    return Edges(tuple(v.name for v in model.graph.input if _bf16(v)),
                 tuple(v.name for v in model.graph.output if _bf16(v)))


def to_float(model: onnx.ModelProto, edges: Edges) -> None:
    """In place: each bfloat16 input `x` becomes float32 `x` + SUFFIX cast to `x`; each bfloat16 output `y` is cast
    to float32 `y` + SUFFIX, which the graph outputs instead."""
    graph = model.graph
    for value in graph.input:
        if value.name in edges.inputs:
            name = value.name
            value.name, value.type.tensor_type.elem_type = f"{name}{SUFFIX}", TensorProto.FLOAT
            graph.node.insert(0, helper.make_node("Cast", [value.name], [name], name=f"{_NODE}{name}",
                                                  to=TensorProto.BFLOAT16))
    for value in graph.output:
        if value.name in edges.outputs:
            name = value.name
            value.name, value.type.tensor_type.elem_type = f"{name}{SUFFIX}", TensorProto.FLOAT
            graph.node.append(helper.make_node("Cast", [name], [value.name], name=f"{_NODE}{name}",
                                               to=TensorProto.FLOAT))


def restore(model: onnx.ModelProto, edges: Edges) -> None:
    """In place: undo `to_float` on the quantized model (its Cast nodes removed, the edges bfloat16 again)."""
    graph = model.graph
    ours = {f"{_NODE}{name}" for name in edges.inputs + edges.outputs}
    kept = [node for node in graph.node if node.name not in ours]
    del graph.node[:]
    graph.node.extend(kept)
    for value in list(graph.input) + list(graph.output):
        if value.name.endswith(SUFFIX) and value.name[:-len(SUFFIX)] in edges.inputs + edges.outputs:
            value.name, value.type.tensor_type.elem_type = value.name[:-len(SUFFIX)], TensorProto.BFLOAT16
    boundary = set(edges.inputs + edges.outputs)
    info = [v for v in graph.value_info if v.name not in boundary and not v.name.endswith(SUFFIX)]
    del graph.value_info[:]
    graph.value_info.extend(info)


@contextlib.contextmanager
def float_copy(model: onnx.ModelProto, path: Path, edges: Edges, scratch: Path) -> Iterator[Path]:
    """The model at `path` (`model`: loaded from it without its external data, given float32 edges in place) saved
    in a private folder under `scratch` (its folder copied along when the model keeps external data, which the copy
    names relative to itself)."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bf16-edges.", dir=scratch) as folder:
        external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
        copy = Path(folder) / "model" / path.name
        if external:
            shutil.copytree(path.parent, copy.parent)
        else:
            copy.parent.mkdir()
        to_float(model, edges)
        onnx.save(model, str(copy))
        yield copy


def restore_file(path: Path, edges: Edges) -> None:
    """`restore` on the quantized file at `path`, its external data (if any) left where it is."""
    model = onnx.load(str(path), load_external_data=False)
    restore(model, edges)
    onnx.save(model, str(path))
