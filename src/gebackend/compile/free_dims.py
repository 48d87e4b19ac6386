"""Sizes for the free dims of an ONNX file's inputs, for the seeded data a load runs through it without a request.

The accuracy check of a lowered model, the calibration samples of static int8, the padding checks and `gebackend
analyze` run the model on seeded inputs, whose shapes must be ones the model takes. A free dim (no value in the
file) gets, in this order:

1. the size the user gave (`hints`: config.pbtxt's dims, -1 where free);
2. the size the graph needs there: an input read by a `Conv` (or `ConvTranspose`) whose weight is stored in the file
   has as many channels on axis 1 as the weight takes (Hugging Face exports name that dim `num_channels`, free);
3. one size per dim name, shared by every input naming it (`batch_size` on two inputs is one size);
4. for a dim named by an expression of other names, its value: optimum writes an attention mask after a KV cache as
   `past_sequence_length + sequence_length`, which is not a third free size (taken as one, GPT-2's mask is shorter
   than its cache and the model fails: "indices element out of data bounds");
5. else `batch` on axis 0 and `default` on the others.

compile/seed_shapes.py is where the loads and the tune ask: it gives the hints and defaults of each source in turn
(model_warmup, calibration data, the file's metadata, probed sizes) and keeps the first that runs.
"""

from __future__ import annotations

import ast
import operator
from typing import Mapping, Sequence

import onnx

from gebackend.config.index_bounds import constant_node_tensors

# ops whose output holds the same tensor as their first input, shape and all
_SAME_SHAPE = frozenset({"Identity", "Cast"})
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod}


def graph_inputs(model: onnx.ModelProto) -> list:
    """The graph's tensor inputs that are no initializer: what a request (or an invented input) feeds."""
    initializers = {init.name for init in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers and v.type.HasField("tensor_type")]


def concrete_shapes(model: onnx.ModelProto, hints: Mapping[str, Sequence[int]] | None = None, batch: int = 1,
                    default: int = 16) -> dict[str, tuple[int, ...]]:
    """A concrete shape for every graph input that is no initializer (see the module docstring)."""
    inputs = graph_inputs(model)
    needed = {**conv_channels(model), **_hinted(inputs, hints or {})}  # the user's sizes win
    named: dict[str, int] = {}
    for value in inputs:  # the names a size is known for: given, or needed by the graph
        for axis, d in enumerate(value.type.tensor_type.shape.dim):
            if d.dim_param and (value.name, axis) in needed and _is_name(d.dim_param):
                named.setdefault(d.dim_param, needed[(value.name, axis)])
    for value in inputs:  # plain names not seen yet: the defaults
        for axis, d in enumerate(value.type.tensor_type.shape.dim):
            if d.dim_param and _is_name(d.dim_param) and not (d.HasField("dim_value") and d.dim_value > 0):
                named.setdefault(d.dim_param, batch if axis == 0 else default)
    shapes = {}
    for value in inputs:
        shape = []
        for axis, d in enumerate(value.type.tensor_type.shape.dim):
            fallback = batch if axis == 0 else default
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
            elif (value.name, axis) in needed:
                shape.append(needed[(value.name, axis)])
            elif d.dim_param and _is_name(d.dim_param):
                shape.append(named[d.dim_param])
            elif d.dim_param:
                size = _evaluate(d.dim_param, named, default)
                shape.append(size if size is not None and size > 0 else fallback)
            else:
                shape.append(fallback)
        shapes[value.name] = tuple(shape)
    return shapes


def config_shapes(path, inputs, batching: bool, default: int = 16) -> dict[str, tuple[int, ...]]:
    """`concrete_shapes` of the ONNX file at `path` (read without its weights) with the dims config.pbtxt gives:
    `inputs` are its tensors (name and dims without the batch dim, -1 where free), `batching` whether dim 0 of each is
    the batch. The shapes are whole, the batch dim 1 where it batches."""
    lead = (-1,) if batching else ()
    model = onnx.load(str(path), load_external_data=False)
    return concrete_shapes(model, {t.name: (*lead, *t.dims) for t in inputs}, default=default)


def conv_channels(model: onnx.ModelProto) -> dict[tuple[str, int], int]:
    """(input, axis 1) -> the channels a Conv/ConvTranspose with a weight stored in the file reads there, for each
    graph input reaching its data input unchanged (through Identity or Cast)."""
    graph = model.graph
    weights = {init.name: tuple(init.dims) for init in graph.initializer}
    weights.update((name, tuple(tensor.dims)) for name, tensor in constant_node_tensors(graph).items())
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            consumers.setdefault(name, []).append(node)
    found: dict[tuple[str, int], int] = {}
    for value in graph.input:
        if value.name in weights:
            continue
        todo, seen = [value.name], {value.name}
        while todo:
            for node in consumers.get(todo.pop(), ()):
                if node.op_type in _SAME_SHAPE and node.output and node.output[0] not in seen:
                    seen.add(node.output[0])
                    todo.append(node.output[0])
                elif node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 and node.input[0] in seen:
                    channels = _channels(node, weights.get(node.input[1]))
                    if channels:
                        found.setdefault((value.name, 1), channels)
    return found


def _channels(node: onnx.NodeProto, weight: tuple[int, ...] | None) -> int | None:
    if not weight or len(weight) < 3:
        return None
    group = next((int(a.i) for a in node.attribute if a.name == "group"), 1)
    # Conv: W is [M, C/group, k...]; ConvTranspose: W is [C, M/group, k...]
    return weight[1] * group if node.op_type == "Conv" else weight[0]


def _hinted(inputs, hints: Mapping[str, Sequence[int]]) -> dict[tuple[str, int], int]:
    found = {}
    for value in inputs:
        hint = hints.get(value.name)
        if hint is None or len(hint) != len(value.type.tensor_type.shape.dim):
            continue
        found.update(((value.name, axis), int(size)) for axis, size in enumerate(hint) if size > 0)
    return found


def _is_name(text: str) -> bool:
    return text.isidentifier()


def _evaluate(expression: str, named: dict[str, int], default: int) -> int | None:
    """The value of a dim written as arithmetic over dim names and whole numbers (`past_sequence_length +
    sequence_length`, `2*s0`); a name not seen on any input takes `default`; None when it is no such expression."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None

    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return named.setdefault(node.id, default)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(expression)

    try:
        return int(value(tree))
    except (ValueError, ZeroDivisionError):
        return None
