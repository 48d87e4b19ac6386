"""compile/kept_query_attention.py: an attention left with a few query rows reads its keys and values through their
weights, never projecting every token, and answers the same.

Hugging Face classifiers nobody here wrote (BERT exported both ways its attention exports, ViT, CLIP's vision tower)
as static graphs and as files; small graphs for the layouts it takes (a scale on the keys, no bias, a batch of any
size) and the ones it must leave (keys read elsewhere too, as many query rows as tokens, one weight for queries,
keys and values).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import passes, unused_rows
from gebackend.compile.kept_query_attention import kept_query_attention
from tests.unit.test_unused_rows import _feeds, _run, _same_answers, exports  # noqa: F401 - the fixture

H, HEADS, D, S = 8, 2, 4, 6


def _projection_nodes(name: str, weight: str, bias: str | None, perm: list[int], scale: float | None) -> list:
    """X [B, S, H] @ weight (+ bias), split into heads, (times scale), laid out by perm: the tensor `name`."""
    nodes = [helper.make_node("MatMul", ["x", weight], [name + "_mm"])]
    joined = name + "_mm"
    if bias is not None:
        nodes.append(helper.make_node("Add", [bias, joined], [name + "_b"]))  # the bias first, as torch exports it
        joined = name + "_b"
    nodes.append(helper.make_node("Reshape", [joined, "heads_shape"], [name + "_split"]))
    laid = name + "_split"
    if scale is not None:
        nodes.append(helper.make_node("Mul", [laid, name + "_scale"], [name + "_scaled"]))
        laid = name + "_scaled"
    nodes.append(helper.make_node("Transpose", [laid], [name], perm=perm))
    return nodes


def _attention(rows: int = 1, key_scale: float | None = 0.5, bias: bool = True, key_read_too: bool = False,
               batch="batch") -> onnx.ModelProto:
    """scores = q @ K (K [B, heads, d, S]), context = p @ V (V [B, heads, S, d]), q and p given as inputs."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), name) for name in ("wk", "wv")]
    weights += [numpy_helper.from_array(np.array([0, 0, HEADS, D], np.int64), "heads_shape")]
    if bias:
        weights += [numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), name) for name in ("bk", "bv")]
    if key_scale is not None:
        weights.append(numpy_helper.from_array(np.array(key_scale, np.float32), "k_scale"))
    nodes = (_projection_nodes("k", "wk", "bk" if bias else None, [0, 2, 3, 1], key_scale)
             + _projection_nodes("v", "wv", "bv" if bias else None, [0, 2, 1, 3], None)
             + [helper.make_node("MatMul", ["q", "k"], ["scores"]), helper.make_node("MatMul", ["p", "v"], ["context"])])
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f, [batch, S, H]),
              helper.make_tensor_value_info("q", f, [batch, HEADS, rows, D]),
              helper.make_tensor_value_info("p", f, [batch, HEADS, rows, S])]
    outputs = [helper.make_tensor_value_info(name, f, None) for name in ("scores", "context")]
    if key_read_too:
        outputs.append(helper.make_tensor_value_info("k", f, None))
    return helper.make_model(helper.make_graph(nodes, "attention", inputs, outputs, weights),
                             opset_imports=[helper.make_opsetid("", 17)])


def _inputs(batch: int, rows: int = 1) -> dict:
    rng = np.random.default_rng(batch)
    return {"x": rng.standard_normal((batch, S, H)).astype(np.float32),
            "q": rng.standard_normal((batch, HEADS, rows, D)).astype(np.float32),
            "p": rng.random((batch, HEADS, rows, S)).astype(np.float32)}


@pytest.mark.parametrize("key_scale, bias", [(0.5, True), (None, True), (None, False)])
def test_keys_and_values_of_one_query_are_read_through_their_weights(key_scale, bias):
    model = _attention(key_scale=key_scale, bias=bias)
    rewritten, replaced = kept_query_attention(model)
    assert replaced == len(model.graph.node) - 2  # every projection node, the two attention MatMuls kept as outputs
    kept = {init.name for init in rewritten.graph.initializer}
    assert not {"wk", "wv"} & kept  # no [H, H] projection is left: nothing runs per token
    for batch in (1, 3):  # the batch dim is symbolic: any batch
        feeds = _inputs(batch)
        for got, want in zip(_run(rewritten, feeds), _run(model, feeds)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_keys_another_node_reads_stay_and_the_values_still_move():
    model = _attention(key_read_too=True)
    rewritten, replaced = kept_query_attention(model)
    assert replaced == 4  # the values' MatMul, Add, Reshape, Transpose
    assert "wk" in {init.name for init in rewritten.graph.initializer}
    feeds = _inputs(2)
    for got, want in zip(_run(rewritten, feeds), _run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_as_many_query_rows_as_tokens_gain_nothing_and_are_left():
    model = _attention(rows=S, batch=2)
    assert kept_query_attention(model) == (model, 0)


def test_one_weight_for_queries_keys_and_values_is_left():
    """CLIP's image encoder (nn.MultiheadAttention) projects all three with one [H, 3H] weight, then splits it."""
    model = _attention()
    graph = model.graph
    wide = numpy_helper.from_array(np.random.default_rng(1).standard_normal((H, 3 * H)).astype(np.float32), "w_in")
    split = [helper.make_node("MatMul", ["x", "w_in"], ["qkv"]),
             helper.make_node("Split", ["qkv", "thirds"], ["q_all", "k_all", "v_all"], axis=2)]
    graph.initializer.extend([wide, numpy_helper.from_array(np.array([H, H, H], np.int64), "thirds")])
    for node in graph.node:
        if node.output[0] == "k_mm":
            node.op_type = "Identity"
            del node.input[:]
            node.input.append("k_all")
    nodes = split + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    assert kept_query_attention(model)[1] == 4  # the values only: the keys come out of the shared projection


@pytest.mark.parametrize("name", ["bert", "vit", "clip_vision"])
def test_a_classifiers_static_graph_projects_no_key_or_value_per_token_in_its_last_layer(exports, name):
    original = onnx.load(str(exports[name]))
    feeds = _feeds(name, 2)
    shapes = {key: value.shape for key, value in feeds.items()}
    compiled = passes.compile_graph(original, shapes, 1 << 20, lambda *said: pytest.fail(f"pass skipped: {said}"))
    _same_answers(original, compiled, feeds)
    tokens = next(iter(shapes.values()))[1] if name == "bert" else 17
    dims = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in compiled.graph.value_info}
    full = [node for node in compiled.graph.node
            if node.op_type == "MatMul" and dims.get(node.output[0]) == (2, tokens, 32)]
    # the first layer's queries, keys, values, attention output and second feed-forward for every token; the last's none
    assert len(full) == 5, [node.name for node in full]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unused_rows, "kept_query_attention", lambda model, view=None: (model, 0))
        without = passes.compile_graph(original, shapes, 1 << 20, lambda *said: None)
    assert unused_rows.pass_record(compiled)[0] >= unused_rows.pass_record(without)[0] + 8


def test_reshape_targets_read_through_shape_die_with_the_projections():
    """A file with symbolic dims computes its Reshape targets from `Shape`s of the projections (torch's export):
    those are no reader that keeps a projection."""
    model = _attention()
    graph = model.graph
    graph.initializer.extend([numpy_helper.from_array(np.array([HEADS, D], np.int64), "per_head"),
                              numpy_helper.from_array(np.array([0], np.int64), "zero"),
                              numpy_helper.from_array(np.array([2], np.int64), "two")])
    nodes = []
    for node in graph.node:
        if node.op_type == "Reshape":
            joined = node.input[0]
            nodes += [helper.make_node("Shape", [joined], [joined + "_shape"]),
                      helper.make_node("Slice", [joined + "_shape", "zero", "two"], [joined + "_lead"]),
                      helper.make_node("Concat", [joined + "_lead", "per_head"], [joined + "_target"], axis=0)]
            node.input[1] = joined + "_target"
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    rewritten, replaced = kept_query_attention(model)
    assert replaced == 9
    assert not [node for node in rewritten.graph.node if node.op_type == "Shape"]  # dead with the projections
    feeds = _inputs(3)
    for got, want in zip(_run(rewritten, feeds), _run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_bias_read_through_an_identity_is_still_the_stored_one():
    """torch's exporter reads a weight two modules share through an `Identity` (CN_CLIP's text encoder's biases)."""
    model = _attention()
    graph = model.graph
    for node in graph.node:
        if node.op_type == "Add":
            node.input[0] = node.input[0] + "_shared"
    graph.node.extend(helper.make_node("Identity", [name], [name + "_shared"]) for name in ("bk", "bv"))
    ordered = sorted(graph.node, key=lambda node: node.op_type != "Identity")
    del graph.node[:]
    graph.node.extend(ordered)
    rewritten, replaced = kept_query_attention(model)
    assert replaced == 9
    feeds = _inputs(2)
    for got, want in zip(_run(rewritten, feeds), _run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
