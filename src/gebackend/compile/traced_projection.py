"""Where an attention's keys or values come from, traced element by element: for compile/kept_query_attention.py,
the layouts its pattern does not name.

torch's `nn.MultiheadAttention` (CLIP's, CN_CLIP's image encoder) projects queries, keys and values with one weight
`[H, 3H]`, sequence first, then unflattens, transposes, squeezes and `Gather`s each third, and reshapes it into heads
over three more steps. Rather than naming that chain op by op, this module runs the chain's data movement (Reshape,
Transpose, Squeeze, Unsqueeze, Identity, Gather and Slice of constant indices) on the index of every element of the
projection `P = X W (+ b)`, and reads the result: each element of the keys `[B, heads, d, S]` (or values
`[B, heads, S, d]`) comes from one column of `W` that depends on its head and place in the head only, and from the
row of `X` of its batch and token, batch first or sequence first. Then the keys are `X W[:, cols] (+ b[cols])`,
which kept_query_attention rewrites as it does the named layout. Needs the fixed dims of a static graph.

`P`'s weight is a stored float `W`, or the int8 weight of ONNX Runtime's dynamic quantization (`DynamicQuantizeLinear`
of `X`, `MatMulInteger`, `Cast`, times the product of the two scales), read back as `(W_q - zero) * scale`: the
rewritten products run in float on those values.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from gebackend.compile.row_rules import GraphView, attribute
from gebackend.compile.runtime_shapes import DEFAULT_DOMAINS

_RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten"})  # the same elements, in order
_MOVES = _RESHAPES | {"Transpose", "Gather", "Slice"}
_MAX_TRACED = 1 << 24  # elements of a projection traced (128 MiB of indices); larger ones are left as they are


class Traced:
    """`X W (+ b)` read as keys or values: `weight` [H_in, heads·d] and `bias` with their columns in head order,
    `kind` "keys" or "values", `sequence_first` for X as [S, B, H]; `chain`: the nodes from the projection's
    input to the attention (the weight's own nodes included)."""

    def __init__(self, x: str, weight: np.ndarray, bias: np.ndarray | None, heads: int, d: int, kind: str,
                 sequence_first: bool, chain: list[onnx.NodeProto]) -> None:
        self.x, self.weight, self.bias, self.heads, self.d = x, weight, bias, heads, d
        self.kind, self.sequence_first, self.chain = kind, sequence_first, chain


def _fixed(view: GraphView, name: str) -> tuple[int, ...] | None:
    dims = view.dims.get(name)
    return tuple(dims) if dims is not None and all(isinstance(d, int) and d > 0 for d in dims) else None


def _moved(view: GraphView, node: onnx.NodeProto, index: np.ndarray) -> np.ndarray | None:
    """`index` through one data-movement node, checked against the node's inferred output dims; None if it cannot."""
    out = _fixed(view, node.output[0])
    if out is None:
        return None
    if node.op_type in _RESHAPES:
        moved = index.reshape(out) if math.prod(out) == index.size else None
    elif node.op_type == "Transpose":
        moved = index.transpose(attribute(node, "perm", list(range(index.ndim))[::-1]))
    elif node.op_type == "Gather":
        indices = view.stored(node.input[1])
        moved = None if indices is None else np.take(index, indices.astype(np.int64), axis=attribute(node, "axis", 0))
    else:  # Slice
        starts, ends = view.ints(node, "starts", 1), view.ints(node, "ends", 2)
        axes = view.ints(node, "axes", 3) or list(range(len(starts or ())))
        steps = view.ints(node, "steps", 4) or [1] * len(axes)
        if starts is None or ends is None:
            return None
        cut = [slice(None)] * index.ndim
        for axis, start, end, step in zip(axes, starts, ends, steps):
            cut[axis % index.ndim] = slice(start, max(end, -2 ** 62) if step < 0 else end, step)
        moved = index[tuple(cut)]
    return moved if moved is not None and moved.shape == out else None


def _linear(view: GraphView, name: str) -> tuple[str, np.ndarray, np.ndarray | None, list] | None:
    """(X, W as float [H_in, C], b or None, the nodes) where `name` is `X W (+ b)` of a stored weight; else None."""
    nodes, bias = [], None
    maker = view.maker.get(name)
    if maker is not None and maker.op_type == "Add" and maker.domain in DEFAULT_DOMAINS:
        for position in (0, 1):
            stored = view.stored(maker.input[position])
            if stored is not None and stored.ndim == 1:
                bias, name = stored, maker.input[1 - position]
                nodes.append(maker)
                maker = view.maker.get(name)
                break
    if maker is None or maker.domain not in DEFAULT_DOMAINS:
        return None
    if maker.op_type == "MatMul":
        weight = view.stored(maker.input[1])
        found = (maker.input[0], weight) if weight is not None and weight.ndim == 2 and weight.dtype.kind == "f" else None
    elif maker.op_type == "Mul":
        found = _dequantized(view, maker)
    else:
        found = None
    if found is None or (bias is not None and bias.shape != (found[1].shape[1],)):
        return None
    return found[0], found[1], bias, [*nodes, maker]


def _dequantized(view: GraphView, scaled: onnx.NodeProto) -> tuple[str, np.ndarray] | None:
    """ONNX Runtime's dynamic quantization of `X W`: Cast(MatMulInteger(DynamicQuantizeLinear(X), W_q)) times
    Mul(X's scale, W's scale): (X, W read back as float)."""
    for position in (0, 1):
        cast, scales = view.maker.get(scaled.input[position]), view.maker.get(scaled.input[1 - position])
        if cast is None or cast.op_type != "Cast" or scales is None or scales.op_type != "Mul":
            continue
        product = view.maker.get(cast.input[0])
        if product is None or product.op_type != "MatMulInteger" or len(product.input) < 3:
            continue
        quantize = view.maker.get(product.input[0])
        if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or product.input[2] != quantize.output[2]:
            continue
        if quantize.output[1] not in scales.input:
            continue
        weight = view.stored(product.input[1])
        weight_scale = view.stored(scales.input[1 - list(scales.input).index(quantize.output[1])])
        zero = view.stored(product.input[3]) if len(product.input) > 3 and product.input[3] else np.zeros(1)
        if weight is None or weight.ndim != 2 or weight_scale is None or zero is None \
                or weight_scale.size not in (1, weight.shape[1]) or zero.size not in (1, weight.shape[1]):
            continue
        values = (weight.astype(np.float64) - zero.reshape(1, -1)) * weight_scale.reshape(1, -1)
        return quantize.input[0], values.astype(np.float32)
    return None


def _shared_only_by_selections(view: GraphView, name: str, next_node: onnx.NodeProto) -> bool:
    """Whether the readers of `name` beside the chain's next node are Gathers or Slices (another head's third, the
    queries' kept rows): the chain then costs nothing once its own reader is rewritten."""
    if name in view.outputs or name in view.body_reads:
        return False
    return all(reader is next_node or reader.op_type in ("Gather", "Slice") for reader in view.readers.get(name, ()))


def trace(view: GraphView, attention: onnx.NodeProto) -> tuple[Traced, float] | None:
    """What the second operand of `attention` (a MatMul) is, where a projection's data movement makes it: the
    projection read as keys or values, and the constant scalar the chain multiplies by; else None."""
    moves, chain, scale, node, name = [], [], 1.0, attention, attention.input[1]
    if [reader for reader in view.readers.get(name, ()) if reader is not attention]:
        return None
    while True:
        maker = view.maker.get(name)
        if maker is None or maker.domain not in DEFAULT_DOMAINS or not _shared_only_by_selections(view, name, node):
            return None
        if maker.op_type in _MOVES:
            moves.append(maker)
        elif maker.op_type in ("Mul", "Div") and len(maker.input) == 2 and maker.input[1] and \
                (factor := view.stored(maker.input[1])) is not None and factor.size == 1:
            scale = scale * float(factor.reshape(-1)[0]) if maker.op_type == "Mul" else scale / float(factor.reshape(-1)[0])
        else:
            break
        chain.append(maker)
        node, name = maker, maker.input[0]
    found, dims = _linear(view, name), _fixed(view, name)
    if found is None or dims is None or len(dims) != 3 or not moves or math.prod(dims) > _MAX_TRACED:
        return None
    x, weight, bias, nodes = found
    columns = weight.shape[1]
    index = np.arange(math.prod(dims), dtype=np.int64).reshape(dims)
    for move in reversed(moves):
        index = _moved(view, move, index)
        if index is None:
            return None
    read = _read(index, dims, columns)
    if read is None:
        return None
    kind, cols, sequence_first = read
    heads, d = cols.shape
    picked = cols.reshape(-1)
    return Traced(x, weight[:, picked], None if bias is None else bias[picked], heads, d, kind, sequence_first,
                  chain + nodes), scale


def _read(index: np.ndarray, dims: tuple[int, ...], columns: int):
    """(kind, the column of W per head and place [heads, d], whether X is sequence first) where every element of
    `index` ([B, heads, d, S] keys or [B, heads, S, d] values) takes its column from its head and place and its row
    from its batch and token; else None."""
    if index.ndim != 4:
        return None
    column, row = index % columns, index // columns
    first, second = row // dims[1], row % dims[1]
    for kind, place, token in (("keys", 2, 3), ("values", 3, 2)):
        per_head = np.moveaxis(column, (1, place), (0, 1))  # [heads, d, B, S]
        cols = per_head[..., 0, 0]
        if not (per_head == cols[..., None, None]).all():
            continue
        batch = np.arange(index.shape[0]).reshape(-1, 1, 1, 1)
        tokens = np.moveaxis(np.arange(index.shape[token]).reshape(1, 1, 1, -1), 3, token)
        if (first == batch).all() and (second == tokens).all():
            return kind, cols, False
        if (first == tokens).all() and (second == batch).all():
            return kind, cols, True
    return None
