"""Keys and values for the kept queries only: an attention left with a few query rows reads its layer's input through
the key and value weights instead of projecting every token.

After the rows pass (compile/unused_rows.py) a classifier's last layer runs its attention for the kept row `q` only,
`softmax(q Kᵀ) V`, but its keys and values `K = X Wk + bk`, `V = X Wv + bv` are still projected for every token of
`X` (2·S·H² multiply-adds: 61 M of a 4-layer CN_CLIP text encoder's 1.2 G a request at 52 tokens). Per head `j`
the same sums in another order need none of them:

    q_j K_jᵀ = (q_j Wk_jᵀ) Xᵀ + q_j bk_j          p_j V_j = (p_j X) Wv_j + (Σ p_j) bv_j

2·(H² + heads·S·H) multiply-adds (2.1 M there), though each product reads its H² float weights for a single row:
memory-bound, 0.6 ms of the 17 ms an int8 request took at 1 thread (ONNX Runtime's profile); the request as a whole
ran 2-3.5 % faster, fp32 too.

The pattern: a `MatMul(q, K')` whose first operand has few rows (`r·(d + S) < S·d`) and whose second is `X Wk (+ bk)`
split into heads by a `Reshape` of its last axis `[B, S, H] -> [B, S, heads, d]`, laid out by `Transpose`s as
`[B, heads, d, S]` (keys) or `[B, heads, S, d]` (values), maybe times a constant scalar; every tensor on that chain
read by the next step only, the weights stored in the graph. In a static graph, other layouts are traced element by
element (compile/traced_projection.py): a projection of queries, keys and values in one weight, sequence first, as
torch's `nn.MultiheadAttention` (CLIP's image encoder) writes it, and ONNX Runtime's dynamic int8 of such a projection
(its weight read back as float). The rows pass then moves the queries' kept rows up through that projection too.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from gebackend.compile.node_writer import NodeWriter
from gebackend.compile.row_rules import GraphView
from gebackend.compile.runtime_shapes import DEFAULT_DOMAINS
from gebackend.compile.traced_projection import trace
from gebackend.compile.upgrade import default_opset

MIN_OPSET = 13  # Unsqueeze's and ReduceSum's axes as inputs

_KEYS, _VALUES = (0, 2, 3, 1), (0, 2, 1, 3)  # [B, S, heads, d] -> [B, heads, d, S] / [B, heads, S, d]


class _Projection:
    """`X W (+ b)` times `scale`, split into `heads` of `d` and laid out by `perm`; `chain`: the nodes that make it."""

    def __init__(self, x: str, weight: np.ndarray, bias: np.ndarray | None, scale: float, perm: tuple[int, ...],
                 heads: int, d: int, chain: list[onnx.NodeProto], sequence_first: bool = False) -> None:
        self.x, self.weight, self.bias, self.scale, self.perm = x, weight, bias, scale, perm
        self.heads, self.d, self.chain, self.sequence_first = heads, d, chain, sequence_first
        self.token_axis = 0 if sequence_first else 1  # of X: [B, S, H], or [S, B, H] sequence first

    def per_head(self, order: tuple[int, int, int]) -> np.ndarray:
        """The weight as [H_in, heads, d] transposed by `order`, times the scale, in its own dtype."""
        split = self.weight.reshape(self.weight.shape[0], self.heads, self.d).astype(np.float64) * self.scale
        return split.transpose(order).astype(self.weight.dtype)

    def bias_per_head(self, shape: tuple[int, int, int]) -> np.ndarray | None:
        if self.bias is None:
            return None
        return (self.bias.astype(np.float64) * self.scale).reshape(shape).astype(self.weight.dtype)


def _only_reader(view: GraphView, name: str) -> bool:
    """Whether `name` feeds one node, leaving aside the `Shape`s a file with symbolic dims reads its Reshape targets
    through (they die with the chain; where one feeds something else, the projection stays, the answer the same)."""
    readers = [node for node in view.readers.get(name, ()) if node.op_type != "Shape"]
    return len(readers) == 1 and name not in view.outputs and name not in view.body_reads


def _scalar(view: GraphView, name: str) -> float | None:
    value = view.stored(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 and value.dtype.kind == "f" else None


def _projection(view: GraphView, name: str) -> _Projection | None:
    """What `name` is, where it is a per-head projection of a stored weight (see the module docstring); else None."""
    perm, scale, chain = (0, 1, 2, 3), 1.0, []
    while True:
        node = view.maker.get(name)
        if node is None or node.domain not in DEFAULT_DOMAINS or not _only_reader(view, name):
            return None
        chain.append(node)
        if node.op_type == "Transpose":
            dims = view.dims.get(node.input[0])
            if dims is None or len(dims) != 4:
                return None
            step = [int(a) for a in next((helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"),
                                         (3, 2, 1, 0))]
            perm, name = tuple(step[axis] for axis in perm), node.input[0]
        elif node.op_type in ("Mul", "Div") and len(node.input) == 2:
            factor = _scalar(view, node.input[1])
            if factor is not None:
                scale, name = (scale * factor if node.op_type == "Mul" else scale / factor), node.input[0]
            elif node.op_type == "Mul" and (factor := _scalar(view, node.input[0])) is not None:
                scale, name = scale * factor, node.input[1]
            else:
                return None
        elif node.op_type == "Reshape":
            break
        else:
            return None
    split, joined = view.dims.get(node.output[0]), view.dims.get(node.input[0])
    if split is None or joined is None or len(split) != 4 or len(joined) != 3 or None in split[:2] \
            or tuple(split[:2]) != tuple(joined[:2]) or not all(isinstance(d, int) for d in (*split[2:], joined[2])) \
            or split[2] * split[3] != joined[2]:
        return None
    name, bias = node.input[0], None
    maker = view.maker.get(name)
    if maker is not None and maker.op_type == "Add" and maker.domain in DEFAULT_DOMAINS and _only_reader(view, name):
        for position in (0, 1):
            stored = view.stored(maker.input[position])
            if stored is not None and stored.shape == (joined[2],):
                bias, name = stored, maker.input[1 - position]
                chain.append(maker)
                break
        else:
            return None
    matmul = view.maker.get(name)
    if matmul is None or matmul.op_type != "MatMul" or matmul.domain not in DEFAULT_DOMAINS \
            or not _only_reader(view, name):
        return None
    weight, x_dims = view.stored(matmul.input[1]), view.dims.get(matmul.input[0])
    if weight is None or weight.ndim != 2 or weight.dtype.kind != "f" or x_dims is None or len(x_dims) != 3 \
            or tuple(x_dims[:2]) != tuple(split[:2]) or weight.shape[1] != joined[2]:
        return None
    chain.append(matmul)
    return _Projection(matmul.input[0], weight, bias, scale, perm, split[2], split[3], chain)


def _traced(view: GraphView, node: onnx.NodeProto) -> _Projection | None:
    """The projection compile/traced_projection.py finds behind `node`'s second operand, as `_projection` answers."""
    found = trace(view, node)
    if found is None:
        return None
    traced, scale = found
    return _Projection(traced.x, traced.weight, traced.bias, scale, _KEYS if traced.kind == "keys" else _VALUES,
                       traced.heads, traced.d, traced.chain, traced.sequence_first)


def _pays(view: GraphView, rows_operand: str, projection: _Projection) -> bool:
    """Whether the rewrite multiplies less: `r` kept rows against the projection of `S` tokens."""
    dims, tokens = view.dims.get(rows_operand), view.dims[projection.x][projection.token_axis]
    if dims is None or len(dims) != 4 or not isinstance(dims[2], int) or dims[1] != projection.heads:
        return False
    if not isinstance(tokens, int):  # a sequence of any length: one row pays from two tokens on
        return dims[2] == 1
    return dims[2] * (projection.d + tokens) < tokens * projection.d


def _few_rows(view: GraphView, node: onnx.NodeProto) -> bool:
    """Whether the rows `r` of an attention MatMul are fewer than both its first operand's last dim and its output's
    (`d` and the tokens `S`, in either order): what `_pays` needs of any projection, checked before tracing one
    (compile/traced_projection.py copies an index of every element of it: an attention of every layer but the last
    is not traced)."""
    rows, out = view.dims.get(node.input[0]), view.dims.get(node.output[0])
    if rows is None or out is None or len(rows) != 4 or len(out) != 4:
        return False
    return all(isinstance(d, int) for d in (rows[2], rows[3], out[3])) and rows[2] < rows[3] and rows[2] < out[3]


class _Writer(NodeWriter):
    """The new nodes (names `<base>__kq<n>`) and weights, named after the node they replace."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model, "__kq")
        self.layouts: dict[tuple[str, bool], str] = {}

    def axes_op(self, op_type: str, source: str, axes: list[int], base: str, **attributes) -> str:
        """Unsqueeze / ReduceSum over `axes` (an input from opset 13)."""
        return self.node(op_type, [source, self.weight(np.array(axes, np.int64), base + "_axes")], base, **attributes)

    def x_as(self, projection: _Projection) -> str:
        """The projection's `X` [B, S, H] (or [S, B, H]) as [B, 1, S, H], written once per tensor."""
        x = projection.x
        if (x, projection.sequence_first) not in self.layouts:
            source = self.node("Transpose", [x], x + "_batch_first", perm=[1, 0, 2]) if projection.sequence_first else x
            self.layouts[x, projection.sequence_first] = self.axes_op("Unsqueeze", source, [1], x + "_heads")
        return self.layouts[x, projection.sequence_first]


def _keys(writer: _Writer, node: onnx.NodeProto, projection: _Projection) -> None:
    """scoresᵀ = X (W3 qᵀ) (+ b3 qᵀ), transposed: W3 [heads, H_in, d], b3 [heads, 1, d]. The weights are the first
    operand: ONNX Runtime's dynamic quantizer leaves a MatMul whose second is computed in float (its int8 of a 3-D
    weight per channel fails to run), and these are small."""
    base = node.name or node.output[0]
    query = writer.node("Transpose", [node.input[0]], base + "_qt", perm=[0, 1, 3, 2])  # [B, heads, d, r]
    through = writer.node("MatMul", [writer.weight(projection.per_head((1, 0, 2)), base + "_wk"), query], base + "_wq")
    scores = writer.node("MatMul", [writer.x_as(projection), through], base + "_xwq")  # [B, heads, S, r]
    bias = projection.bias_per_head((projection.heads, 1, projection.d))
    if bias is not None:
        offset = writer.node("MatMul", [writer.weight(bias, base + "_bk"), query], base + "_bq")  # [B, heads, 1, r]
        scores = writer.node("Add", [scores, offset], base + "_plus_bias")
    writer.node("Transpose", [scores], base, outputs=[node.output[0]], perm=[0, 1, 3, 2])


def _values(writer: _Writer, node: onnx.NodeProto, projection: _Projection) -> None:
    """context = (W3 (p X)ᵀ)ᵀ (+ Σp b3): W3 [heads, d, H_in], b3 [heads, 1, d]; the weights first, as for the keys."""
    weights, base = node.input[0], node.name or node.output[0]
    mixed = writer.node("MatMul", [weights, writer.x_as(projection)], base + "_px")  # [B, heads, r, H_in]
    mixed = writer.node("Transpose", [mixed], base + "_pxt", perm=[0, 1, 3, 2])
    context = writer.node("MatMul", [writer.weight(projection.per_head((1, 2, 0)), base + "_wv"), mixed], base + "_wpx")
    bias = projection.bias_per_head((projection.heads, 1, projection.d))
    if bias is None:
        writer.node("Transpose", [context], base, outputs=[node.output[0]], perm=[0, 1, 3, 2])
        return
    context = writer.node("Transpose", [context], base + "_ctx", perm=[0, 1, 3, 2])  # [B, heads, r, d]
    total = writer.axes_op("ReduceSum", weights, [-1], base + "_sum", keepdims=1)
    offset = writer.node("Mul", [total, writer.weight(bias, base + "_bv")], base + "_pb")
    writer.node("Add", [context, offset], base, outputs=[node.output[0]])


def _made_by_layout(model: onnx.ModelProto) -> set[str]:
    return {node.output[0] for node in model.graph.node if node.op_type in ("Transpose", "Mul", "Div") and node.output}


def kept_query_attention(model: onnx.ModelProto, view: GraphView | None = None) -> tuple[onnx.ModelProto, int]:
    """`model` with every attention MatMul of few query rows reading its keys or values through the weights (a new
    model), and how many nodes no longer run for every token; `model` itself and 0 where none matches."""
    laid_out = _made_by_layout(model)
    if (default_opset(model) or 0) < MIN_OPSET or not any(
            node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in laid_out for node in model.graph.node):
        return model, 0  # no attention's MatMul: no shape inference spent
    view = view or GraphView(model)
    found = []
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain not in DEFAULT_DOMAINS or len(node.input) != 2:
            continue
        projection = _projection(view, node.input[1]) or (_traced(view, node) if _few_rows(view, node) else None)
        if projection is not None and projection.perm in (_KEYS, _VALUES) and _pays(view, node.input[0], projection):
            found.append((node, projection))
    if not found:
        return model, 0
    writer = _Writer(model)
    replaced = set()
    for node, projection in found:
        (_keys if projection.perm == _KEYS else _values)(writer, node, projection)
        replaced.add(id(node))
    return writer.rewritten(model, replaced), sum(len(projection.chain) for _, projection in found)
