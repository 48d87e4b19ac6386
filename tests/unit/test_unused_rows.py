"""compile/unused_rows.py: a selection of rows (an encoder's first token) moved up computes the same answers on fewer rows.

Hugging Face classifiers nobody here wrote (BERT and ViT, whose heads read `[CLS]`, and CLIP's vision tower with its
projection), exported by torch with random weights, as files (symbolic batch and sequence dims) and as static graphs
(through the whole pass list), answered as ONNX Runtime answers the original; small graphs for the rules that must
stop the selection (a softmax or a reduction over the kept axis, a tensor that is also an output, two selections of
one tensor) and the ones that carry it (a Reshape merging rows into a Gemm's, a Shape read of a moved tensor).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import passes
from gebackend.compile.graph import CompiledGraph
from gebackend.compile.unused_rows import pass_record, prune_unused_rows


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _same_answers(original: onnx.ModelProto, pruned: onnx.ModelProto, feeds: dict) -> None:
    for want, got in zip(_run(original, feeds), _run(pruned, feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _rows_per_matmul(model: onnx.ModelProto) -> list[tuple]:
    """The inferred output dims of every MatMul/Gemm of a static graph."""
    dims = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in model.graph.value_info}
    return [dims.get(node.output[0]) for node in model.graph.node if node.op_type in ("MatMul", "Gemm")]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("classifiers")
    layers = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)

    class Named(torch.nn.Module):
        def __init__(self, model, inputs, output):
            super().__init__()
            self.model, self.inputs, self.output = model, inputs, output

        def forward(self, *args):
            return self.model(**dict(zip(self.inputs, args)))[self.output]

    torch.manual_seed(0)
    pixels = {"pixel_values": {0: "batch"}}
    models = {
        "bert": (transformers.BertForSequenceClassification(
            transformers.BertConfig(vocab_size=1000, max_position_embeddings=128, num_labels=32, **layers)),
            ["input_ids", "attention_mask"], "logits",
            (torch.randint(0, 1000, (2, 7)), torch.ones(2, 7, dtype=torch.int64)),
            {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}),
        "vit": (transformers.ViTForImageClassification(
            transformers.ViTConfig(image_size=32, patch_size=8, num_labels=10, **layers)),
            ["pixel_values"], "logits", (torch.randn(2, 3, 32, 32),), pixels),
        "clip_vision": (transformers.CLIPVisionModelWithProjection(
            transformers.CLIPVisionConfig(image_size=32, patch_size=8, projection_dim=16, **layers)),
            ["pixel_values"], "image_embeds", (torch.randn(2, 3, 32, 32),), pixels),
        # a distilled ViT: its two heads read the class and the distillation token
        "deit": (transformers.DeiTForImageClassificationWithTeacher(
            transformers.DeiTConfig(image_size=32, patch_size=8, num_labels=10, **layers)),
            ["pixel_values"], "logits", (torch.randn(2, 3, 32, 32),), pixels),
    }
    files = {}
    for name, (model, inputs, output, args, axes) in models.items():
        files[name] = folder / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Named(model.eval(), inputs, output), args, str(files[name]), input_names=inputs,
                              output_names=[output], dynamic_axes={**axes, output: {0: "batch"}}, opset_version=17,
                              dynamo=False)
    return files


def _feeds(name: str, batch: int, length: int = 9) -> dict:
    rng = np.random.default_rng(batch)
    if name == "bert":
        mask = np.ones((batch, length), np.int64)
        mask[1:, length - 3:] = 0  # a padded second text
        return {"input_ids": rng.integers(0, 1000, (batch, length)), "attention_mask": mask}
    return {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}


@pytest.mark.parametrize("name", ["bert", "vit", "clip_vision", "deit"])
def test_a_classifier_file_computes_its_last_feed_forward_for_the_first_token_only(exports, name):
    original = onnx.load(str(exports[name]))
    pruned, moved = prune_unused_rows(original)
    assert moved >= 10  # the last layer's feed-forward and norms, at least
    for batch in (1, 3):  # and BERT at a length it was not traced with
        _same_answers(original, pruned, _feeds(name, batch))
    # the file keeps its symbolic dims: the same pruned file serves every batch
    assert [d.dim_param for d in pruned.graph.input[0].type.tensor_type.shape.dim][0] == "batch"


@pytest.mark.parametrize("name, kept", [("bert", 1), ("vit", 1), ("clip_vision", 1), ("deit", 2)])
def test_a_static_graph_runs_the_last_layer_on_the_kept_rows_and_answers_the_same(exports, name, kept):
    original = onnx.load(str(exports[name]))
    feeds = _feeds(name, 2)
    shapes = {key: value.shape for key, value in feeds.items()}
    compiled = passes.compile_graph(original, shapes, 1 << 20, lambda *said: pytest.fail(f"pass skipped: {said}"))
    _same_answers(original, compiled, feeds)
    few_rows = [dims for dims in _rows_per_matmul(compiled) if dims and len(dims) == 3 and dims[1] == kept]
    assert len(few_rows) >= 3  # the last layer's attention output and both feed-forward MatMuls, for the tokens kept
    assert CompiledGraph(shapes, compiled).fully_static  # the moved nodes' shapes inferred for the static engines


def _graph(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _float(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _weight(name, dims, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(dims).astype(np.float32), name)


def _index(name, value):
    return numpy_helper.from_array(np.array(value, np.int64), name)


def _row_model(between: list, extra_outputs=(), index=0) -> onnx.ModelProto:
    """x [2, 5, 4] @ w -> h; `between` nodes make y from h; out = y[:, index] (a Gather on axis 1)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), *between,
             helper.make_node("Gather", ["y", "i"], ["out"], axis=1)]
    return _graph(nodes, [_float("x", [2, 5, 4])], [_float("out", ["n", "m"]), *extra_outputs],
                  [_weight("w", [4, 4]), _index("i", index)])


X = {"x": np.random.default_rng(1).standard_normal((2, 5, 4)).astype(np.float32)}


@pytest.mark.parametrize("index", [0, 3, -1])
def test_a_row_wise_chain_moves_and_any_index_is_kept(index):
    model = _row_model([helper.make_node("Sigmoid", ["h"], ["s"]), helper.make_node("Mul", ["h", "s"], ["y"])],
                       index=index)  # h read twice, both for the same rows
    pruned, moved = prune_unused_rows(model)
    assert moved == 3  # the MatMul, the Sigmoid and the Mul
    _same_answers(model, pruned, X)


def test_a_softmax_over_the_kept_axis_stops_the_selection():
    model = _row_model([helper.make_node("Softmax", ["h"], ["y"], axis=1)])
    assert prune_unused_rows(model) == (model, 0)


def test_a_mean_over_the_kept_axis_keeps_what_it_reads_whole():
    model = _row_model([helper.make_node("ReduceMean", ["h"], ["m"], axes=[1]), helper.make_node("Sub", ["h", "m"], ["y"])])
    pruned, moved = prune_unused_rows(model)
    assert moved == 1  # the Sub, on the kept row of h and the whole mean
    assert any(node.op_type == "MatMul" and list(node.output) == ["h"] for node in pruned.graph.node)
    _same_answers(model, pruned, X)


def test_through_a_transpose_the_kept_rows_are_the_matmuls_columns():
    model = _row_model([helper.make_node("Transpose", ["h"], ["y"], perm=[0, 2, 1])])
    pruned, moved = prune_unused_rows(model)
    assert moved == 2  # y's axis 1 is h's last: the MatMul computes one column, from one column of its weight
    _same_answers(model, pruned, X)


def test_a_tensor_another_output_reads_in_full_is_computed_in_full():
    model = _row_model([helper.make_node("Relu", ["h"], ["y"])], extra_outputs=[_float("h", [2, 5, 4])])
    pruned, moved = prune_unused_rows(model)
    assert moved == 1  # the Relu only: h is an output of its own
    _same_answers(model, pruned, X)


@pytest.mark.parametrize("first, second, moves", [((0, None), (2, None), True), ((1, 2), (3, 5), True),
                                                  ((0, 2), (2, 5), False)])
def test_selections_of_one_tensor_move_as_their_span(first, second, moves):
    """Gathers of one row (stop None) or Slices of several, on one axis of one tensor: their span is computed (rows
    0-2, 1-4), not where it is the whole axis."""
    def selection(bounds, output):
        start, stop = bounds
        if stop is None:
            return [helper.make_node("Gather", ["y", f"{output}_i"], [output], axis=1)], [_index(f"{output}_i", start)]
        return ([helper.make_node("Slice", ["y", f"{output}_s", f"{output}_e", f"{output}_a"], [output])],
                [_index(f"{output}_s", [start]), _index(f"{output}_e", [stop]), _index(f"{output}_a", [1])])

    nodes, constants = [helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight("w", [4, 4])]
    for bounds, output in ((first, "first"), (second, "second")):
        more_nodes, more_constants = selection(bounds, output)
        nodes += more_nodes
        constants += more_constants
    outputs = [_float(output, [2, 4] if bounds[1] is None else [2, "rows", 4])
               for bounds, output in ((first, "first"), (second, "second"))]
    model = _graph(nodes, [_float("x", [2, 5, 4])], outputs, constants)
    pruned, moved = prune_unused_rows(model)
    assert moved == (1 if moves else 0)
    _same_answers(model, pruned, X)


def test_rows_merged_into_a_gemm_by_a_reshape_and_back_move_as_a_block():
    """nn.MultiheadAttention's out_proj: [S, B, D] -> [S*B, D] -> Gemm -> [S, B, D], then the first token."""
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "b"], ["g"], transB=1),
             helper.make_node("Reshape", ["g", "back"], ["y"]),
             helper.make_node("Slice", ["y", "s", "e", "a"], ["out"])]
    model = _graph(nodes, [_float("x", [5, 2, 4])], [_float("out", [2, 2, 4])],
                   [_index("flat", [10, 4]), _index("back", [5, 2, 4]), _weight("w", [4, 4]), _weight("b", [4], 2),
                    _index("s", [1]), _index("e", [3]), _index("a", [0])])
    pruned, moved = prune_unused_rows(model)
    assert moved == 3
    gemm = next(node for node in pruned.graph.node if node.op_type == "Gemm")
    assert gemm.input[0] != "f"  # reads rows 2..6 of the flat tensor: tokens 1 and 2 of both batch entries
    _same_answers(model, pruned, {"x": np.random.default_rng(2).standard_normal((5, 2, 4)).astype(np.float32)})


def test_a_shape_read_of_a_moved_tensor_still_gives_its_full_shape():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
             helper.make_node("Shape", ["y"], ["shape"]),
             helper.make_node("Gather", ["y", "i"], ["out"], axis=1)]
    model = _graph(nodes, [_float("x", ["batch", 5, 4])],
                   [_float("out", ["batch", 4]), helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                   [_weight("w", [4, 4]), _index("i", 0)])
    pruned, moved = prune_unused_rows(model)
    assert moved == 2
    _same_answers(model, pruned, X)
    assert list(_run(pruned, X)[1]) == [2, 5, 4]


def test_an_old_opset_is_left_as_it_is():
    model = _row_model([helper.make_node("Relu", ["h"], ["y"])])
    model.opset_import[0].version = 10
    assert prune_unused_rows(model) == (model, 0)


@pytest.mark.parametrize("quantization, quantizer", [("dynamic", "onnxruntime"), ("static", "onnxruntime"),
                                                     ("static", "nncf")])
def test_a_lowering_quantizes_the_file_computing_the_kept_rows_only_as_accurately(exports, tmp_path, monkeypatch,
                                                                                  quantization, quantizer):
    from gebackend.compile import precision, unused_rows

    if quantizer == "nncf":
        pytest.importorskip("nncf")
    feeds = _feeds("bert", 2)
    want = _run(onnx.load(str(exports["bert"])), feeds)[0].ravel()

    def cosine(folder: str, log) -> float:
        lowered = precision.lower_precision(exports["bert"], "int8", tmp_path / folder, log, quantization=quantization,
                                            quantizer=quantizer,
                                            samples=[_feeds("bert", 1, length) for length in (5, 9, 9, 12)])
        got = ort.InferenceSession(str(lowered), providers=["CPUExecutionProvider"]).run(None, feeds)[0].ravel()
        return float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))

    said = []
    pruned = cosine("pruned", said.append)
    assert any("node(s) compute only the rows of a sequence the outputs keep" in line for line in said), said
    for module in (precision, unused_rows):
        monkeypatch.setattr(module, "kept_rows_only", lambda model, log, what: model)
    whole = cosine("whole", lambda line: None)
    assert pruned >= whole - 0.005 and pruned >= 0.9, (pruned, whole)  # NNCF on 4 samples of a random 2-layer BERT: 0.94


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_the_pass_runs_again_on_its_own_output(exports, name):
    """A file served pruned is compiled as a static graph by the same pass: the names it adds stay unique."""
    original = onnx.load(str(exports[name]))
    pruned, _ = prune_unused_rows(original)
    feeds = _feeds(name, 2)
    again = passes.compile_graph(pruned, {key: value.shape for key, value in feeds.items()}, 1 << 20,
                                 lambda *said: pytest.fail(f"pass skipped: {said}"))
    onnx.checker.check_model(again)
    names = [node.name for node in again.graph.node if node.name]
    assert len(names) == len(set(names))
    _same_answers(original, again, feeds)


@pytest.mark.parametrize("stop, moves", [(1, False), (4, True), (8, True), (6, False)])
def test_a_reshape_merging_the_kept_axis_passes_whole_rows_only(stop, moves):
    """y = relu(x @ w) [2, 5, 4] flattened to [2, 20]; elements [0, stop) of each flat row are rows of y only when
    `stop` is a multiple of 4."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Reshape", ["r", "flat"], ["y"]), helper.make_node("Slice", ["y", "s", "e", "a"], ["out"])]
    model = _graph(nodes, [_float("x", [2, 5, 4])], [_float("out", [2, "k"])],
                   [_weight("w", [4, 4]), _index("flat", [2, 20]), _index("s", [0]), _index("e", [stop]), _index("a", [1])])
    pruned, moved = prune_unused_rows(model)
    assert moved == (3 if moves else 0)
    _same_answers(model, pruned, X)


def test_an_instance_serves_a_pruned_copy_only_where_the_file_selects_rows(exports, tmp_path):
    from gebackend.compile.unused_rows import served_kept_rows
    from gebackend.config.onnx_signature import read_signature
    from gebackend.modelzoo.misc import build_add_mul

    said = []
    bert = exports["bert"]
    served = served_kept_rows(bert, read_signature(bert), said.append)
    assert served != bert and served.name == bert.name
    assert len(said) == 1 and "node(s) compute only the rows of a sequence the outputs keep" in said[0]
    _same_answers(onnx.load(str(bert)), onnx.load(str(served)), _feeds("bert", 3))

    plain = tmp_path / "add_mul.onnx"
    onnx.save(build_add_mul(), str(plain))
    assert read_signature(plain).selections == ()
    assert served_kept_rows(plain, read_signature(plain), said.append) == plain and len(said) == 1


def test_a_file_with_external_weights_is_served_as_it_is(exports, tmp_path):
    from gebackend.compile.unused_rows import served_kept_rows
    from gebackend.config.onnx_signature import read_signature

    external = tmp_path / "model.onnx"
    onnx.save(onnx.load(str(exports["vit"])), str(external), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    signature = read_signature(external)
    assert signature.selections  # the file does select rows: the copy is what it is spared
    assert served_kept_rows(external, signature) == external


def test_a_pass_that_fails_on_the_file_leaves_it_served_as_it_is(exports, monkeypatch):
    from gebackend.compile import unused_rows
    from gebackend.config.onnx_signature import read_signature

    def fails(model):
        raise RuntimeError("boom\ntraceback lines")

    monkeypatch.setattr(unused_rows, "prune_unused_rows", fails)
    said = []
    bert = exports["bert"]
    assert unused_rows.served_kept_rows(bert, read_signature(bert), said.append) == bert
    assert said == ["the rows pass failed on the file (RuntimeError: boom); the file is served as it is"]


def test_the_doctor_reports_the_moved_nodes_apart_from_the_fold(exports, monkeypatch):
    from gebackend.compile.doctor import analyze

    model = onnx.load(str(exports["bert"]))
    shapes = {"input_ids": [2, 9], "attention_mask": [2, 9]}
    report = analyze(model, shapes)
    assert report.kept_rows_nodes >= 10
    assert f"rows: {report.kept_rows_nodes} node(s) compute only the rows" in report.format_text(brief=True)
    monkeypatch.setattr(passes, "PASSES", tuple(p for p in passes.PASSES if p.name != "rows"))
    without = analyze(model, shapes)
    assert without.kept_rows_nodes == 0 and "rows:" not in without.format_text()
    assert report.foldable_node_count == without.foldable_node_count  # the rows pass's own nodes are not the fold's


def _symbolic_model(selection: list, output_dims: list) -> onnx.ModelProto:
    """x [batch, seq, 4] @ w -> relu -> y; `selection` nodes make out from y."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]), *selection]
    return _graph(nodes, [_float("x", ["batch", "seq", 4])], [_float("out", output_dims)],
                  [_weight("w", [4, 4]), _index("i", -1), _index("s", [-3]), _index("e", [-1]), _index("one", [1]),
                   _index("end", [2 ** 63 - 1]), _index("a", [1])])


@pytest.mark.parametrize("selection, moves", [
    ([helper.make_node("Gather", ["y", "i"], ["out"], axis=1)], True),  # the last token
    ([helper.make_node("Slice", ["y", "s", "end", "a"], ["out"])], True),  # the last three
    ([helper.make_node("Slice", ["y", "s", "e", "a"], ["out"])], True),  # the two before the last
    ([helper.make_node("Slice", ["y", "one", "end", "a"], ["out"])], False),  # all but the first: no count known
], ids=["gather -1", "slice -3:", "slice -3:-1", "slice 1:"])
def test_rows_counted_from_the_end_move_on_a_sequence_of_any_length(selection, moves):
    model = _symbolic_model(selection, ["batch", 4] if selection[0].op_type == "Gather" else ["batch", "k", 4])
    pruned, moved = prune_unused_rows(model)
    assert moved == (2 if moves else 0)
    for length in (3, 4, 9):
        _same_answers(model, pruned, {"x": np.random.default_rng(length).standard_normal((2, length, 4)).astype(np.float32)})


def test_a_language_model_answering_its_last_tokens_logits_runs_its_head_on_that_token_only(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class LastLogits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -1, :]

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=500, n_embd=32, n_layer=2, n_head=4,
                                                                 n_positions=64, use_cache=False)).eval()
    path = tmp_path / "gpt2_last.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        axes = {0: "batch", 1: "sequence"}
        torch.onnx.export(LastLogits(gpt2), (torch.randint(0, 500, (2, 7)), torch.ones(2, 7, dtype=torch.int64)),
                          str(path), input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)
    model = onnx.load(str(path))
    ids = np.random.default_rng(0).integers(0, 500, (2, 9))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    compiled = passes.compile_graph(model, {name: value.shape for name, value in feeds.items()}, 1 << 20,
                                    lambda *said: pytest.fail(f"pass skipped: {said}"))
    # the head over the vocabulary and the final norm; GPT-2's Conv1D flattens batch and tokens into one axis before its
    # Gemm ([2, 9, 32] -> [18, 32]), where the last token of each text is no block of rows: the selection stops there
    assert pass_record(compiled)[0] >= 3
    assert (2, 1, 500) in _rows_per_matmul(compiled)  # the head runs on the last token only
    _same_answers(model, compiled, feeds)
