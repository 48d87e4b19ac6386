"""Which integer inputs of an ONNX file index a table stored in it, and the values they may take.

A text model's `input_ids` go straight to a `Gather` of its embedding table: a token id outside the table's rows is
no valid request (a client tokenizing with another vocabulary, an off-by-one in a pad id). Engines disagree on it:
ONNX Runtime fails the run with its own message ("indices element out of data bounds"), OpenVINO answers with the
row left empty, silently wrong. Knowing each such input's range, the request check (runtime/validation.py) refuses
those values on every engine alike, with a message naming the model, the input and the range.

An input is bounded when its values reach, unchanged, the indices of a `Gather` (axis `a`) whose data is stored in
the file (an initializer, a `Constant`, or a stored table through `DequantizeLinear`): through `Identity`, shape ops
that keep every value (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`, `Transpose`) and `Cast`s to a type that holds
every value of the one before (a narrowing cast wraps, so its values are no longer the request's). The range is
ONNX's for `Gather`: `[-n, n-1]` for `n` rows along `a` (negative ids count from the end). Tables a request may
replace (initializers also listed as graph inputs, config/optional_inputs.py) bound nothing; only the main graph is
read, not subgraphs.

A length is bounded the same way: a text model numbers its positions with `Range(0, n)`, `n` the length of an
input (`Gather(Shape(input_ids), 1)`), and gathers those numbers from its position table, so an input longer than
that table has rows fails inside the engine ("indices element out of data bounds"), after the request was taken as
valid. `length_limits` finds that pattern (the `Range` from 0 in steps of 1, or a stored buffer cut to the
length with `Slice` as Hugging Face's BERT exports it, through the ops above and `Expand`) and says, per input,
which axis may be at most how long; the request check refuses longer ones (400), and a shape bucket longer than the
table is a config error at load. A cut buffer's own values are what the `Gather` reads: its `position_ids` number
0..N-1, but RoBERTa's `token_type_ids` buffer is all zeros, which any length up to the buffer's reads from a table of
2 rows; so the limit is the longest cut whose values all lie in the table's rows (a buffer whose values cannot be
read limits nothing).

`out_of_bounds` finds the first value outside a bound with `first_outside`, which the OpenVINO engine's check of
64-bit inputs it computes in 32 bits (engines/openvino.py) uses too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

# Ops whose output holds exactly the values of their first input (in another shape).
_SAME_VALUES = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})
# ... or some of them repeated: a numbering broadcast to the batch
_SAME_OR_REPEATED = _SAME_VALUES | {"Expand", "Cast"}


@dataclass(frozen=True)
class IndexBound:
    """The values an integer input may take: those of `low`..`high`, the rows of `table` that `node` gathers."""

    low: int
    high: int
    table: str
    node: str

    def describe(self) -> str:
        return f"[{self.low}, {self.high}] (the {self.high + 1} rows of '{self.table}' that Gather '{self.node}' reads)"

    def tighter(self, other: "IndexBound | None") -> "IndexBound":
        """The bound a value meets when it meets both: the one with fewer rows."""
        return self if other is None or self.high <= other.high else other


@dataclass(frozen=True)
class LengthLimit:
    """Axis `axis` (counted with the batch axis) of an input may be at most `most` long: it numbers the rows of
    `table` that Gather `node` reads, directly or through the stored buffer `cut` sliced to that length, where the
    buffer's length or values are what limit it."""

    axis: int
    most: int
    table: str
    node: str
    cut: str = ""

    def describe(self) -> str:
        if self.cut:
            return (f"{self.most} (the length of the stored '{self.cut}' cut to it, whose values Gather "
                    f"'{self.node}' reads from '{self.table}')")
        return f"{self.most} (the rows of position table '{self.table}' that Gather '{self.node}' reads)"


def index_bounds(model: onnx.ModelProto) -> dict[str, IndexBound]:
    """The bound of each integer graph input whose values index a stored table (see the module docstring)."""
    graph = model.graph
    stored, consumers = _stored_tables(model), _consumers(graph)
    initializers = {init.name for init in graph.initializer}
    bounds: dict[str, IndexBound] = {}
    for value in graph.input:
        if value.name in initializers:  # a default a request may replace, not a request's own input
            continue
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem not in _INTEGER_BITS:
            continue
        bound = _follow(value.name, elem, consumers, stored)
        if bound is not None:
            bounds[value.name] = bound
    return bounds


# element type -> (signed, bits)
_INTEGER_BITS = {
    onnx.TensorProto.INT8: (True, 8), onnx.TensorProto.INT16: (True, 16), onnx.TensorProto.INT32: (True, 32),
    onnx.TensorProto.INT64: (True, 64), onnx.TensorProto.UINT8: (False, 8), onnx.TensorProto.UINT16: (False, 16),
    onnx.TensorProto.UINT32: (False, 32), onnx.TensorProto.UINT64: (False, 64),
}


def length_limits(model: onnx.ModelProto) -> dict[str, tuple[LengthLimit, ...]]:
    """Per graph input, the axes a position numbering of it bounds (see the module docstring), tightest per axis."""
    graph = model.graph
    stored, producers = _stored_tables(model), {out: node for node in graph.node for out in node.output}
    constants = _scalar_constants(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in graph.input
             if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    tensors = {init.name: init for init in graph.initializer if init.name in stored}
    tensors.update(constant_node_tensors(graph))
    found: dict[tuple[str, int], LengthLimit] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in stored:
            continue
        dims = stored[node.input[0]]
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
        if not dims or not -len(dims) <= axis < len(dims) or dims[axis] <= 0:
            continue
        numbering = _back_through(node.input[1], producers, _SAME_OR_REPEATED)
        found_here = _numbered_length(numbering, producers, constants, ranks, tensors, int(dims[axis])) \
            if numbering else None
        if found_here is None:
            continue
        name, input_axis, most, cut = found_here
        limit_here = LengthLimit(input_axis, most, node.input[0], node.name or node.output[0], cut)
        known = found.get((name, input_axis))
        if known is None or limit_here.most < known.most:
            found[(name, input_axis)] = limit_here
    limits: dict[str, tuple[LengthLimit, ...]] = {}
    for (name, _), limit in sorted(found.items()):
        limits[name] = limits.get(name, ()) + (limit,)
    return limits


def _numbered_length(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], constants: dict[str, int],
                     ranks: dict[str, int], tensors: dict[str, onnx.TensorProto],
                     rows: int) -> tuple[str, int, int, str] | None:
    """(input, axis, at most, the buffer cut) when `node` gives, for n the length of an input's axis, the n numbers
    a Gather reads from a table of `rows` rows: `Range(0, n, 1)` (torch's `arange`: at most `rows`, no buffer), or
    `Slice(buffer, 0, n)` along one axis in steps of 1 (a stored buffer cut to the length, as Hugging Face's
    exports do: at most the longest cut whose values all lie in the table's rows, and never longer than the buffer,
    since a longer cut stops at its end)."""
    if node.op_type == "Range" and len(node.input) == 3:
        start, limit, delta = node.input
        if constants.get(start) != 0 or constants.get(delta) != 1:
            return None
        length = _length_of(limit, producers, constants, ranks)
        return None if length is None else (*length, rows, "")
    if node.op_type == "Slice" and 3 <= len(node.input) <= 5 and node.input[0] in tensors:
        data, start, end = node.input[:3]
        axes = node.input[3] if len(node.input) > 3 and node.input[3] else None
        steps = node.input[4] if len(node.input) > 4 and node.input[4] else None
        if constants.get(start) != 0 or (steps is not None and constants.get(steps) != 1):
            return None
        buffer = _integer_values(tensors[data])
        axis = 0 if axes is None else constants.get(axes)
        length = _length_of(end, producers, constants, ranks)
        if buffer is None or axis is None or not -buffer.ndim <= axis < buffer.ndim or length is None:
            return None
        return (*length, _longest_cut_inside(buffer, axis, rows), data)
    return None


def _integer_values(tensor: onnx.TensorProto) -> np.ndarray | None:
    """A stored tensor's values when it holds integers stored in the file itself, else None."""
    return stored_array(tensor) if tensor.data_type in _INTEGER_BITS else None


def stored_array(tensor: onnx.TensorProto) -> np.ndarray | None:
    """The values of a tensor stored in the file itself (not in external data), or None when they cannot be read."""
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - a tensor we cannot read is no value we know
        return None


def _longest_cut_inside(buffer: np.ndarray, axis: int, rows: int) -> int:
    """The largest n for which `buffer` cut to its first n entries along `axis` holds only valid row numbers of a
    table of `rows` rows (ONNX's `Gather`: -rows..rows-1)."""
    if buffer.size == 0:
        return int(buffer.shape[axis])
    outside = np.moveaxis((buffer < -rows) | (buffer >= rows), axis, 0).reshape(buffer.shape[axis], -1).any(axis=1)
    return int(np.argmax(outside)) if outside.any() else int(buffer.shape[axis])


def _stored_tables(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """The dims of every tensor stored in the file that no request may replace: initializers, `Constant`s, and the
    dequantization of either (a QDQ model's int8 table)."""
    graph = model.graph
    replaceable = {v.name for v in graph.input} if model.ir_version >= 4 else set()  # IR < 4: no replacing
    stored = {init.name: tuple(init.dims) for init in graph.initializer if init.name not in replaceable}
    stored.update((name, tuple(tensor.dims)) for name, tensor in constant_node_tensors(graph).items())
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input and node.input[0] in stored and node.output:
            stored[node.output[0]] = stored[node.input[0]]
    return stored


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            consumers.setdefault(name, []).append(node)
    return consumers


def _scalar_constants(model: onnx.ModelProto) -> dict[str, int]:
    """The whole-number values of the one-element tensors stored in the file (`Range`'s start and step, the axis a
    `Gather` picks from a shape)."""
    from onnx import numpy_helper

    named = [(t.name, t) for t in model.graph.initializer] + list(constant_node_tensors(model.graph).items())
    values = {}
    for name, tensor in named:
        if math.prod(tensor.dims) != 1 or tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        try:
            value = numpy_helper.to_array(tensor).reshape(-1)[0]
        except Exception:  # noqa: BLE001 - a tensor we cannot read is no constant we know
            continue
        if isinstance(value, (np.integer, np.floating)) and float(value).is_integer():
            values[name] = int(value)
    return values


def _back_through(name: str, producers: dict[str, onnx.NodeProto], passing: frozenset) -> onnx.NodeProto | None:
    """The first node producing `name`'s values that is not one of `passing` (followed through their first input)."""
    for _ in range(16):
        node = producers.get(name)
        if node is None or node.op_type not in passing:
            return node
        name = node.input[0]
    return None


def _length_of(name: str, producers: dict[str, onnx.NodeProto], constants: dict[str, int],
               ranks: dict[str, int]) -> tuple[str, int] | None:
    """(input, axis) when `name` is the length of one axis of a graph input: `Gather(Shape(input), k)` or
    `Shape(input, start=k, end=k+1)`, through casts and reshapes."""
    node = _back_through(name, producers, frozenset({"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape"}))
    if node is not None and node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in constants:
        shape, axis = producers.get(node.input[0]), constants[node.input[1]]
        if shape is None or shape.op_type != "Shape" or _shape_span(shape) != (0, None):
            return None
    elif node is not None and node.op_type == "Shape":
        shape, (axis, end) = node, _shape_span(node)
        if end is None or end != axis + 1 or end == 0:  # one axis only (Shape's end is exclusive; -1 + 1 is no end)
            return None
    else:
        return None
    rank = ranks.get(shape.input[0])
    if rank is None or not -rank <= axis < rank:
        return None
    return shape.input[0], axis % rank


def _shape_span(node: onnx.NodeProto) -> tuple[int, int | None]:
    start = next((int(a.i) for a in node.attribute if a.name == "start"), 0)
    end = next((int(a.i) for a in node.attribute if a.name == "end"), None)
    return start, end


def _holds(to: int, source: int) -> bool:
    """Whether every value of integer type `source` is a value of type `to`."""
    if to not in _INTEGER_BITS or source not in _INTEGER_BITS:
        return False
    (to_signed, to_bits), (src_signed, src_bits) = _INTEGER_BITS[to], _INTEGER_BITS[source]
    if to_signed == src_signed:
        return to_bits >= src_bits
    return to_signed and to_bits > src_bits  # unsigned into a wider signed type


def constant_node_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The tensor each `Constant` node holds as its `value`, by the node's output."""
    return {node.output[0]: attribute.t for node in graph.node if node.op_type == "Constant" and node.output
            for attribute in node.attribute if attribute.name == "value" and attribute.HasField("t")}


def _follow(start: str, elem: int, consumers: dict[str, list[onnx.NodeProto]],
            stored: dict[str, tuple[int, ...]]) -> IndexBound | None:
    """The tightest Gather bound among the nodes `start`'s values reach unchanged (a walk, each tensor once)."""
    bound: IndexBound | None = None
    todo, seen = [(start, elem)], {start}
    while todo:
        name, current = todo.pop()
        for node in consumers.get(name, ()):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
                dims = stored.get(node.input[0])
                axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
                if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
                    rows = int(dims[axis])
                    bound = IndexBound(-rows, rows - 1, node.input[0], node.name or node.output[0]).tighter(bound)
                continue
            if not node.input or node.input[0] != name or not node.output:
                continue
            following = current
            if node.op_type == "Cast":
                following = next((int(a.i) for a in node.attribute if a.name == "to"), 0)
                if not _holds(following, current):
                    continue
            elif node.op_type not in _SAME_VALUES:
                continue
            if node.output[0] not in seen:
                seen.add(node.output[0])
                todo.append((node.output[0], following))
    return bound


def out_of_bounds(array: np.ndarray, bound: IndexBound) -> tuple[int, tuple[int, ...]] | None:
    """The first value of `array` outside `bound` and where it is, or None when all are inside."""
    found = first_outside(array, bound.low, bound.high)
    return None if found is None else (int(found[0]), found[1])


def first_outside(array: np.ndarray, low, high, finite_only: bool = False) -> tuple[np.generic, tuple[int, ...]] | None:
    """The first value of `array` outside [`low`, `high`] and where it is, or None when all are inside; with
    `finite_only`, infinities and NaN count as inside. A min and a max when everything is inside (the common case)."""
    if array.size == 0:
        return None
    if finite_only:
        outside = np.isfinite(array) & ((array < low) | (array > high))
        if not outside.any():
            return None
    else:
        if array.min() >= low and array.max() <= high:
            return None
        outside = (array < low) | (array > high)
    flat = int(np.flatnonzero(outside)[0])
    return array.flat[flat], tuple(int(i) for i in np.unravel_index(flat, array.shape))
