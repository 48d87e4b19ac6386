"""compile/unused_rows.py on files ONNX Runtime's transformer optimizer wrote (`optimum-cli export onnx --optimize`):
their com.microsoft ops (SkipLayerNormalization, BiasGelu, the fused Attention) carry the selection as the ops they
fuse do, their dims from ONNX Runtime's symbolic shape inference; and nodes whose other outputs are read too (a
pre-norm layer's SkipLayerNormalization answers the residual sum beside the norm) move with all of them.

Hugging Face classifiers (random weights): BERT exported by torch both ways its attention exports (SDPA: norms and
GELU fused; eager: Attention and the embedding's norm fused too) and a pre-norm ViT, then optimized by
`onnxruntime.transformers.optimizer.optimize_model`; nothing here writes the fused graph by hand.
"""

from __future__ import annotations

import collections
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import passes
from gebackend.compile.unused_rows import prune_unused_rows

LENGTH = 9


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    folder = tmp_path_factory.mktemp("fused")

    class Logits(torch.nn.Module):
        """The classifier's logits, its inputs given by position in the order of `inputs`."""

        def __init__(self, model, inputs):
            super().__init__()
            self.model, self.inputs = model, inputs

        def forward(self, *args):
            return self.model(**dict(zip(self.inputs, args)))["logits"]

    def exported(name, model, args, axes, model_type) -> Path:
        inputs = list(axes)
        plain, optimized = folder / f"{name}.onnx", folder / f"{name}_optimized.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Logits(model, inputs), args, str(plain), input_names=inputs, output_names=["logits"],
                              dynamic_axes={**axes, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
            optimize_model(str(plain), model_type=model_type, num_heads=4, hidden_size=32,
                           opt_level=1).save_model_to_file(str(optimized))
        return optimized

    layers = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    text = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    files = {}
    for attention in ("sdpa", "eager"):
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=1000, max_position_embeddings=128, num_labels=32, attn_implementation=attention, **layers))
        files[attention] = exported(attention, model.eval(), (torch.randint(0, 1000, (2, 7)),
                                    torch.ones(2, 7, dtype=torch.int64)), text, "bert")
    torch.manual_seed(0)
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(image_size=32, patch_size=8, num_labels=10,
                                                                        **layers))
    files["vit"] = exported("vit", vit.eval(), (torch.randn(2, 3, 32, 32),), {"pixel_values": {0: "batch"}}, "vit")
    return files


def _feeds(batch: int, name: str = "bert") -> dict:
    rng = np.random.default_rng(batch)
    if name == "vit":
        return {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
    mask = np.ones((batch, LENGTH), np.int64)
    mask[1:, LENGTH - 3:] = 0  # a padded second text
    return {"input_ids": rng.integers(0, 1000, (batch, LENGTH)), "attention_mask": mask}


def _answers(model: onnx.ModelProto, feeds: dict, also: str | None = None) -> list[np.ndarray]:
    """The model's outputs, and the inner tensor `also` after them."""
    if also is not None:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        copy.graph.output.append(helper.make_tensor_value_info(also, TensorProto.FLOAT, None))
        model = copy
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _last(model: onnx.ModelProto, op_type: str) -> str:
    """The output of the graph's last node of `op_type` (the last layer's)."""
    return [node for node in model.graph.node if node.op_type == op_type][-1].output[0]


def _fused_ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph.node if node.domain == "com.microsoft")


@pytest.mark.parametrize("attention, fused_ops, least", [
    ("sdpa", {"SkipLayerNormalization", "BiasGelu"}, 15),
    ("eager", {"SkipLayerNormalization", "BiasGelu", "Attention", "EmbedLayerNormalization"}, 6),
])
def test_an_optimized_file_computes_its_last_feed_forward_for_the_first_token_only(fused, attention, fused_ops, least):
    original = onnx.load(str(fused[attention]))
    assert set(_fused_ops(original)) == fused_ops  # the optimizer fused what this test is about
    pruned, moved = prune_unused_rows(original)
    assert moved >= least  # eager: both norms, the feed-forward and the attention's output projection, not Attention
    gelu = _last(pruned, "BiasGelu")
    for batch in (1, 3):
        want, inner_before = _answers(original, _feeds(batch), _last(original, "BiasGelu"))
        got, inner = _answers(pruned, _feeds(batch), gelu)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert inner_before.shape == (batch, LENGTH, 64)
        assert inner.shape == (batch, 1, 64)  # the last layer's GELU ran on the [CLS] token alone
        np.testing.assert_allclose(inner[:, 0], inner_before[:, 0], rtol=1e-5, atol=1e-5)
    assert _fused_ops(pruned) == _fused_ops(original)  # moved, not unfused


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_an_optimized_file_as_a_static_graph_answers_the_same(fused, attention):
    original = onnx.load(str(fused[attention]))
    feeds = _feeds(2)
    shapes = {key: value.shape for key, value in feeds.items()}
    compiled = passes.compile_graph(original, shapes, 1 << 20, lambda *said: pytest.fail(f"pass skipped: {said}"))
    got, inner = _answers(compiled, feeds, _last(compiled, "BiasGelu"))
    np.testing.assert_allclose(got, _answers(original, feeds)[0], rtol=1e-5, atol=1e-5)
    assert inner.shape == (2, 1, 64)


def test_a_failing_symbolic_shape_inference_leaves_the_fused_ops_where_they_are(fused, monkeypatch):
    from gebackend.config import light

    def fails(model):
        raise AssertionError("symbolic shape inference gave up")

    monkeypatch.setattr(light, "symbolic_shapes", fails)
    original = onnx.load(str(fused["sdpa"]))
    pruned, moved = prune_unused_rows(original)  # ONNX's inference: no dims past the fused ops, nothing moves there
    assert moved == 0
    np.testing.assert_allclose(_answers(pruned, _feeds(3))[0], _answers(original, _feeds(3))[0], rtol=1e-6)


def test_a_pre_norm_layer_moves_its_norm_with_the_residual_sum_it_also_answers(fused):
    original = onnx.load(str(fused["vit"]))
    readers = {name for node in original.graph.node for name in node.input}
    sums = [node for node in original.graph.node
            if node.op_type == "SkipLayerNormalization" and len(node.output) > 3 and node.output[3] in readers]
    assert sums  # the optimizer's norm answering the residual too, which this test is about
    pruned, moved = prune_unused_rows(original)
    assert moved >= 15  # before: 4 (the final norm and the head), the norm with a read sum stopped the selection
    for batch in (1, 3):
        want, inner_before = _answers(original, _feeds(batch, "vit"), _last(original, "BiasGelu"))
        got, inner = _answers(pruned, _feeds(batch, "vit"), _last(pruned, "BiasGelu"))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert inner_before.shape == (batch, 17, 64) and inner.shape == (batch, 1, 64)


def _norm_model(mean_is_an_output: bool) -> onnx.ModelProto:
    """x [2, 5, 4] @ w -> h; LayerNormalization(h) -> y and its mean; out = (y + mean)[:, 3]."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(dims).astype(np.float32), name)
               for name, dims in (("w", [4, 4]), ("scale", [4]), ("bias", [4]))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "scale", "bias"], ["y", "mean"], axis=-1),
             helper.make_node("Add", ["y", "mean"], ["z"]),
             helper.make_node("Gather", ["z", "i"], ["out"], axis=1)]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    if mean_is_an_output:
        outputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 4])], outputs,
                              [*weights, numpy_helper.from_array(np.array(3, np.int64), "i")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mean_is_an_output, moves", [(False, 3), (True, 1)])
def test_a_norm_whose_mean_is_read_moves_only_where_every_output_wants_the_same_rows(mean_is_an_output, moves):
    model = _norm_model(mean_is_an_output)
    pruned, moved = prune_unused_rows(model)
    assert moved == moves  # the MatMul, the norm and the Add; the Add alone where the mean is answered in full
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, 4)).astype(np.float32)}
    for want, got in zip(_answers(model, feeds), _answers(pruned, feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_symbolic_inference_keeps_its_warnings_out_of_the_log(fused, caplog):
    from onnxruntime.tools import symbolic_shape_infer

    real = symbolic_shape_infer.SymbolicShapeInference._infer_impl

    def guessing(self, *args, **options):
        symbolic_shape_infer.logger.warning("Cannot determine if sequence < 0")  # what it says where it guesses
        return real(self, *args, **options)

    caplog.set_level(logging.WARNING)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(symbolic_shape_infer.SymbolicShapeInference, "_infer_impl", guessing)
        _, moved = prune_unused_rows(onnx.load(str(fused["sdpa"])))
    assert moved >= 15  # it ran, and answered
    assert not [record for record in caplog.records if "Cannot determine" in record.getMessage()]
    assert symbolic_shape_infer.logger.level == logging.NOTSET  # its level given back


@pytest.mark.parametrize("name", ["sdpa", "eager", "vit"])
def test_an_optimized_file_as_a_static_graph_knows_every_shape_and_binds_its_output_once(fused, name):
    """ONNX's shape inference knows no com.microsoft op: the static graph broke at the first SkipLayerNormalization,
    its shape arithmetic stayed unfolded and its output was allocated on every run. ONNX Runtime's symbolic shape
    inference types them from the fixed input dims."""
    from gebackend.compile.doctor import analyze
    from gebackend.compile.graph import CompiledGraph

    original = onnx.load(str(fused[name]))
    feeds = _feeds(2, name)
    shapes = {key: value.shape for key, value in feeds.items()}
    compiled = passes.compile_graph(original, shapes, 1 << 20, lambda *said: pytest.fail(f"pass skipped: {said}"))
    graph = CompiledGraph(shapes, compiled)
    assert graph.runtime_outputs == frozenset() and graph.fully_static
    assert not [node for node in compiled.graph.node if node.op_type == "Shape"]  # the shape arithmetic folded
    report = analyze(original, shapes)
    assert report.static_node_count == report.node_count and report.first_break is None
    assert report.runtime_outputs == {}
    np.testing.assert_allclose(_answers(compiled, feeds)[0], _answers(original, feeds)[0], rtol=1e-5, atol=1e-5)


def test_where_the_symbolic_inference_fails_the_static_graph_says_so_and_answers_the_same(fused, monkeypatch):
    from gebackend.config import light
    from gebackend.compile.doctor import analyze

    def fails(model):
        raise AssertionError("symbolic shape inference gave up")

    monkeypatch.setattr(light, "symbolic_shapes", fails)
    original = onnx.load(str(fused["sdpa"]))
    feeds = _feeds(2)
    shapes = {key: value.shape for key, value in feeds.items()}
    report = analyze(original, shapes)
    assert report.first_break.op_type == "SkipLayerNormalization"
    assert "its symbolic shape inference did not resolve its outputs" in report.first_break.reason
    assert "outside the ai.onnx domain" in report.runtime_outputs["logits"]  # allocated per run: still right
    compiled = passes.compile_graph(original, shapes, 1 << 20, lambda *said: pytest.fail(f"pass skipped: {said}"))
    np.testing.assert_allclose(_answers(compiled, feeds)[0], _answers(original, feeds)[0], rtol=1e-5, atol=1e-5)
