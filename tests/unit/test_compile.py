"""Unit tests for gebackend.compile: specialise, upgrade, fold, runtime shapes and the graph doctor, checked on values."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import doctor, fold, passes, upgrade
from gebackend.compile.doctor import analyze, fix
from gebackend.compile.fold import fold_constants
from gebackend.compile.runtime_shapes import reads_shape_values, runtime_shaped, runtime_shaped_outputs
from gebackend.compile.specialize import specialize
from gebackend.errors import ConfigError
from gebackend.modelzoo import (
    build_bert,
    build_constant_of_shape_weight,
    build_mod_constant,
    build_nonzero,
    build_resnet,
)

BERT_SHAPES = {"input_ids": [2, 16], "attention_mask": [2, 16]}


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def _fully_known(model: onnx.ModelProto) -> dict[str, bool]:
    types = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    return {
        o: o in types and all(d.HasField("dim_value") for d in types[o].type.tensor_type.shape.dim)
        for n in model.graph.node for o in n.output
    }


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def bert() -> onnx.ModelProto:
    return build_bert()


# ------------------------------------------------------------------------------------------- specialise


def test_specialize_fixes_input_dims_and_fills_value_info(bert):
    special = specialize(bert, BERT_SHAPES)
    assert [_dims(v) for v in special.graph.input] == [[2, 16], [2, 16]]
    assert _dims(special.graph.output[0]) == [2, 16, 64]
    assert _dims(special.graph.output[1]) == [2, 64]
    by_name = {v.name: _dims(v) for v in special.graph.value_info}
    assert by_name["embeddings.tokens"] == [2, 16, 64]
    assert by_name["encoder.0.probs"] == [2, 4, 16, 16]
    # The input model is untouched.
    assert _dims(bert.graph.input[0]) == ["batch", "sequence"]


def test_specialize_then_fold_knows_every_node_output_shape(bert):
    folded = fold_constants(specialize(bert, BERT_SHAPES))
    known = _fully_known(folded)
    assert known and all(known.values()), [o for o, k in known.items() if not k]
    # Shape arithmetic (Shape, Gather, Range, Concat...) is gone; the math is not.
    ops = {n.op_type for n in folded.graph.node}
    assert not ops & {"Shape", "Range", "Concat"}
    assert {"MatMul", "Softmax", "LayerNormalization"} <= ops
    ids = np.random.default_rng(0).integers(0, 1000, size=(2, 16), dtype=np.int64)
    mask = np.ones((2, 16), dtype=np.int64)
    mask[1, 10:] = 0
    for got, want in zip(_run(folded, {"input_ids": ids, "attention_mask": mask}),
                         _run(bert, {"input_ids": ids, "attention_mask": mask})):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_specialize_keeps_inputs_it_was_not_given(bert):
    special = specialize(bert, {"input_ids": [2, 16]})
    assert _dims(special.graph.input[0]) == [2, 16]
    assert _dims(special.graph.input[1]) == ["batch", "sequence"]


def test_specialize_unknown_name_lists_the_inputs(bert):
    with pytest.raises(ConfigError, match=r"'token_ids'.*not a graph input.*input_ids, attention_mask"):
        specialize(bert, {"token_ids": [2, 16]})


def test_specialize_wrong_rank():
    with pytest.raises(ConfigError, match=r"'x'.*rank 3.*\[batch, 4\] has rank 2"):
        specialize(build_mod_constant(), {"x": [2, 4, 1]})


def test_specialize_conflicting_fixed_dim_names_input_dim_and_values():
    with pytest.raises(ConfigError, match=r"'x'.*dim 1 is fixed to 4 in the model, not 5"):
        specialize(build_mod_constant(), {"x": [2, 5]})


@pytest.mark.parametrize("dims", [[0, 4], [-1, 4], [2.0, 4]])
def test_specialize_rejects_non_positive_or_non_int_dims(dims):
    with pytest.raises(ConfigError, match="int > 0"):
        specialize(build_mod_constant(), {"x": dims})


# ------------------------------------------------------------------------------------------------ fold


def test_fold_removes_the_constant_mod_subgraph_and_keeps_outputs():
    model = build_mod_constant()
    folded = fold_constants(model)
    assert [n.op_type for n in folded.graph.node] == ["Gather"]
    index = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}["/attn/Mod"]
    assert index.tolist() == 2
    assert [v.name for v in folded.graph.input] == ["x"] and [v.name for v in folded.graph.output] == ["y"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (got,), (want,) = _run(folded, {"x": x}), _run(model, {"x": x})
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got, x[:, 2])
    assert len(model.graph.node) == 3  # the input model is untouched


def test_fold_respects_the_size_limit_for_big_constants():
    model = build_constant_of_shape_weight(1024)
    kept = fold_constants(model)
    assert "ConstantOfShape" in [n.op_type for n in kept.graph.node]
    assert len(kept.SerializeToString()) < 100_000
    everything = fold_constants(model, size_limit=None)
    assert "ConstantOfShape" not in [n.op_type for n in everything.graph.node]
    assert len(everything.SerializeToString()) > 4 * 1024 * 1024
    x = np.random.default_rng(0).normal(size=(2, 1024)).astype(np.float32)
    (a,), (b,), (c,) = _run(model, {"x": x}), _run(kept, {"x": x}), _run(everything, {"x": x})
    np.testing.assert_allclose(b, a, rtol=1e-5)
    np.testing.assert_allclose(c, a, rtol=1e-5)
    np.testing.assert_allclose(a, np.repeat(x.sum(axis=1, keepdims=True) * 0.01, 1024, axis=1), rtol=1e-4, atol=1e-5)


def test_fold_rejects_a_zero_size_limit():
    with pytest.raises(ValueError, match="at least 1 byte"):
        fold_constants(build_mod_constant(), size_limit=0)


def test_resnet_initializer_names_and_values_survive_specialize_and_fold():
    model = build_resnet()
    folded = fold_constants(specialize(model, {"image": [1, 3, 64, 64]}))
    before = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_fold_keeps_an_unused_graph_input():
    f = onnx.TensorProto.FLOAT
    model = _model(
        [helper.make_node("Relu", ["a"], ["y"])],
        [helper.make_tensor_value_info("a", f, [2]), helper.make_tensor_value_info("unused", f, [2])],
        [helper.make_tensor_value_info("y", f, [2])],
    )
    folded = fold_constants(model)
    assert [v.name for v in folded.graph.input] == ["a", "unused"]
    assert [v.name for v in folded.graph.output] == ["y"]


def test_fold_keeps_equal_initializers_apart():
    f = onnx.TensorProto.FLOAT
    w = np.ones((4, 4), np.float32)
    model = _model(
        [helper.make_node("MatMul", ["x", "w1"], ["a"], name="m1"),
         helper.make_node("MatMul", ["x", "w2"], ["b"], name="m2"),
         helper.make_node("Add", ["a", "b"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", f, ["n", 4])],
        [helper.make_tensor_value_info("y", f, ["n", 4])],
        [numpy_helper.from_array(w, "w1"), numpy_helper.from_array(w.copy(), "w2")],
    )
    folded = fold_constants(model)
    assert [list(n.input) for n in folded.graph.node] == [["x", "w1"], ["x", "w2"], ["a", "b"]]
    assert [i.name for i in folded.graph.initializer] == ["w1", "w2"]


# ---------------------------------------------------------------------------------------------- doctor


def test_doctor_finds_the_mod_group_with_its_value():
    report = analyze(build_mod_constant())
    assert len(report.foldable) == 1
    group = report.foldable[0]
    assert (group.sink, group.sink_op) == ("/attn/Mod", "Mod")
    assert group.nodes == ["/attn/Add", "/attn/Mod"] and group.op_types == ["Add", "Mod"]
    assert (group.value, group.dtype, group.shape, group.folded) == (2, "int64", [], True)
    assert report.foldable_node_count == 2
    assert (report.original_node_count, report.node_count) == (3, 1)
    text = report.format_text()
    assert "foldable constant subgraphs: 1 (2 nodes)" in text
    assert "Mod '/attn/Mod' = 2 (Add, Mod)" in text
    # the load log's form: what the fold removed is counted, not listed
    brief = report.format_text(brief=True)
    assert "foldable constant subgraphs: 1 (2 nodes), all folded into the static graph" in brief
    assert "Mod '/attn/Mod' = 2" not in brief


def test_doctor_describes_a_big_constant_by_shape_and_says_it_stays():
    report = analyze(build_constant_of_shape_weight(1024))
    (group,) = report.foldable
    assert (group.sink_op, group.dtype, group.shape, group.value, group.folded) == (
        "ConstantOfShape", "float32", [1024, 1024], None, False)
    assert "ConstantOfShape 'weight' = float32[1024, 1024]" in report.format_text()
    assert "not folded" in report.format_text()
    brief = report.format_text(brief=True)  # what the fold left is what the load log lists
    assert "1 of them left unfolded:" in brief and "ConstantOfShape 'weight' = float32[1024, 1024]" in brief
    assert analyze(build_constant_of_shape_weight(16), size_limit=None).foldable[0].folded is True


def test_doctor_names_an_onnx_ml_op_as_such_not_as_a_custom_op():
    from pathlib import Path

    import onnxruntime

    iris = onnx.load(str(Path(onnxruntime.__file__).parent / "datasets" / "logreg_iris.onnx"))  # ai.onnx.ml only
    brk = analyze(iris).first_break
    assert brk is not None and brk.reason == ("ONNX-ML op ai.onnx.ml::LinearClassifier: onnx's shape inference does not "
                                              "resolve its outputs"), brk


def test_doctor_nonzero_breaks_static_with_a_data_dependent_shape():
    report = analyze(build_nonzero(), {"x": [2, 4]})
    assert report.unresolved_inputs == []
    assert (report.node_count, report.static_node_count) == (3, 1)
    brk = report.first_break
    assert (brk.index, brk.name, brk.op_type, brk.inputs) == (1, "nz", "NonZero", ["x"])
    assert "data-dependent" in brk.reason
    assert "first node where static breaks: #1 NonZero 'nz' (inputs: x): data-dependent output shape" in report.format_text()


def test_doctor_bert_without_shapes_lists_unresolved_inputs(bert):
    report = analyze(bert)
    assert report.unresolved_inputs == [
        {"input": "input_ids", "dim": 0, "dim_param": "batch"},
        {"input": "input_ids", "dim": 1, "dim_param": "sequence"},
        {"input": "attention_mask", "dim": 0, "dim_param": "batch"},
        {"input": "attention_mask", "dim": 1, "dim_param": "sequence"},
    ]
    assert report.static_node_count < report.node_count
    assert report.first_break is not None
    assert "'input_ids' has unresolved dim 0 ('batch')" in report.first_break.reason
    assert "graph input left symbolic" in report.first_break.reason


def test_doctor_bert_with_shapes_is_fully_static(bert):
    report = analyze(bert, BERT_SHAPES)
    assert report.static_node_count == report.node_count > 0
    assert report.first_break is None and report.unresolved_inputs == [] and report.is_static
    assert report.shapes == BERT_SHAPES
    assert f"nodes: {report.node_count}, static: {report.node_count}/{report.node_count}" in report.format_text()


def test_doctor_names_an_input_whose_values_decide_a_shape():
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    model = _model(
        [helper.make_node("Cast", ["s"], ["s64"], name="cast", to=i64),
         helper.make_node("Reshape", ["x", "s64"], ["y"], name="reshape")],
        [helper.make_tensor_value_info("x", f, [2, 4]), helper.make_tensor_value_info("s", f, [2])],
        [helper.make_tensor_value_info("y", f, ["a", "b"])],
    )
    brk = analyze(model).first_break
    assert (brk.index, brk.op_type, brk.name) == (1, "Reshape", "reshape")
    assert brk.reason == "output shape depends on runtime values of input s64"


def test_doctor_report_to_dict_is_json():
    report = analyze(build_nonzero(), {"x": [2, 4]})
    data = json.loads(json.dumps(report.to_dict()))
    assert data["first_break"]["op_type"] == "NonZero"
    assert data["shapes"] == {"x": [2, 4]}
    for key in ("node_count", "static_node_count", "foldable", "foldable_node_count", "unresolved_inputs", "host_ops"):
        assert key in data


def test_host_ops_not_checked_without_an_accelerator():
    report = analyze(build_mod_constant())
    assert report.host_ops is None
    assert report.host_ops_note == "no accelerator execution provider available"
    assert "host ops: not checked (no accelerator execution provider available)" in report.format_text()


def test_host_ops_lists_cpu_nodes_from_the_placement(monkeypatch):
    class Node:
        def __init__(self, name, op_type):
            self.name, self.op_type, self.domain = name, op_type, ""

    class Subgraph:
        def __init__(self, ep, nodes):
            self.ep_name, self._nodes = ep, nodes

        def get_nodes(self):
            return self._nodes

    class FakeSession:
        def __init__(self, model, sess_options=None, providers=None, disabled_optimizers=None):
            assert providers == ["FakeExecutionProvider", "CPUExecutionProvider"]

        def get_providers(self):
            return ["FakeExecutionProvider", "CPUExecutionProvider"]

        def get_provider_graph_assignment_info(self):
            return [Subgraph("FakeExecutionProvider", [Node("a", "MatMul")]),
                    Subgraph("CPUExecutionProvider", [Node("nz", "NonZero")])]

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["FakeExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    hosts, note = doctor.host_ops(build_nonzero())
    assert hosts == [{"name": "nz", "op_type": "NonZero", "provider": "CPUExecutionProvider"}]
    assert "FakeExecutionProvider" in note


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_host_ops_failure_is_a_note_not_an_error(monkeypatch, capsys):
    # An unknown provider: onnxruntime warns, falls back to the CPU alone, and that is no placement.
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["FakeExecutionProvider", "CPUExecutionProvider"])
    hosts, note = doctor.host_ops(build_nonzero())
    assert hosts is None
    assert note == "could not place the model on an accelerator: FakeExecutionProvider did not start"


def test_fix_folds_the_mod_model():
    model = build_mod_constant()
    fixed, removed = fix(model)
    assert removed == 2
    assert [n.op_type for n in fixed.graph.node] == ["Gather"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(_run(fixed, {"x": x})[0], _run(model, {"x": x})[0])


# -------------------------------------------------------------------------------- runtime shapes, old files

def _graph(nodes, inputs, outputs, initializers=(), opset=17, ir=9) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "t", inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def test_runtime_shapes_follow_data_dependent_ops_and_their_consumers():
    special = specialize(build_nonzero(), {"x": [2, 4]})
    assert runtime_shaped(special) == {"nz": "NonZero 'nz': data-dependent output shape",
                                       "indices": "NonZero 'nz': data-dependent output shape"}  # the Transpose of it too
    assert list(runtime_shaped_outputs(special)) == ["indices"]
    assert reads_shape_values(special) == {}  # zeros are a fine warm-up for NonZero


def test_runtime_shapes_shape_of_a_static_tensor_is_a_compile_time_value():
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    model = _graph(
        [helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"], name="r1"),
         helper.make_node("Reshape", ["x", "t"], ["q"], name="r2"), helper.make_node("Relu", ["q"], ["out2"]),
         helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", axis=1)],
        [helper.make_tensor_value_info("x", f, [3, 4]), helper.make_tensor_value_info("y", f, [4, 3]),
         helper.make_tensor_value_info("t", i64, [2]), helper.make_tensor_value_info("k", i64, [1])],
        [helper.make_tensor_value_info(n, f, None) for n in ("r", "out2", "v")])
    special = specialize(model, {"x": [3, 4], "y": [4, 3], "t": [2], "k": [1]})
    assert _dims(special.graph.output[0]) == [4, 3]
    outputs = runtime_shaped_outputs(special)
    assert list(outputs) == ["out2", "v"]
    assert outputs["out2"] == "Reshape 'r2': output shape depends on the runtime values of input 't'"
    assert outputs["v"] == "TopK 'topk': output shape depends on the runtime values of input 'k'"
    assert reads_shape_values(special) == {"t": "Reshape 'r2'", "k": "TopK 'topk'"}


def test_specialize_drops_a_wrong_declared_output_shape_and_infers_the_real_one():
    f = TensorProto.FLOAT
    model = _graph([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", f, ["n", 3])],
                   [helper.make_tensor_value_info("y", f, [3, 2])])  # the exporter's claim: wrong
    assert _dims(specialize(model, {"x": [2, 3]}).graph.output[0]) == [2, 3]


def test_an_ir3_file_gets_ir4_semantics_and_its_initializer_inputs_go():
    model = _legacy_model(7)
    assert [v.name for v in model.graph.input] == ["x", "w"]
    raised = upgrade.raise_ir_version(model)
    assert raised.ir_version == 4 and [v.name for v in raised.graph.input] == ["x"]
    onnx.checker.check_model(raised)
    assert model.ir_version == 3  # the input model is untouched
    current = build_mod_constant()
    assert upgrade.raise_ir_version(current) is current  # IR >= 4: untouched, not copied


def _legacy_model(opset: int) -> onnx.ModelProto:
    """y = Relu(Sum(x, w)): a tiny IR-3 file whose initializer w is listed as a graph input too."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) - 2, "w")
    nodes = [helper.make_node("Sum", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return _graph(nodes, [helper.make_tensor_value_info("x", f, ["n", 3]), helper.make_tensor_value_info("w", f, [2, 3])],
                  [helper.make_tensor_value_info("y", f, ["n", 3])], [w], opset=opset, ir=3)


@pytest.mark.parametrize("opset", [6, 7])
def test_old_opsets_go_through_every_pass_and_compute_the_same(opset):
    model = _legacy_model(opset)
    said = []
    compiled = passes.compile_graph(model, {"x": [2, 3]}, 1 << 20, lambda name, why: said.append((name, why)))
    assert said == []
    assert upgrade.default_opset(compiled) == 7 and compiled.ir_version >= 4
    x = np.array([[1, -1, 0], [2, 0.5, -3]], np.float32)
    np.testing.assert_allclose(_run(compiled, {"x": x})[0], np.maximum(x + np.arange(6).reshape(2, 3) - 2, 0))


def test_a_model_without_an_ai_onnx_opset_is_not_folded_and_says_why():
    ml = helper.make_model(
        helper.make_graph([helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="MAX")], "ml",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]),
        opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    said = []
    compiled = passes.compile_graph(ml, {"x": [2, 3]}, 1 << 20, lambda name, why: said.append((name, why)))
    assert said == [("fold", "the model imports no ai.onnx opset (only ai.onnx.ml), which onnxslim's shape inference "
                             "needs; the graph is not folded")]
    x = np.array([[1, 2, 4], [-8, 2, 1]], np.float32)
    np.testing.assert_allclose(_run(compiled, {"x": x})[0], x / x.max(axis=1, keepdims=True))


def test_doctor_lists_outputs_with_a_runtime_shape_and_skipped_passes(monkeypatch):
    report = analyze(build_nonzero(), {"x": [2, 4]})
    assert report.runtime_outputs == {"indices": "NonZero 'nz': data-dependent output shape"}
    assert ("outputs with a runtime shape (allocated on every run, not bound once): indices (NonZero 'nz': "
            "data-dependent output shape)") in report.format_text()
    assert json.loads(json.dumps(report.to_dict()))["runtime_outputs"] == report.runtime_outputs
    monkeypatch.setattr(fold, "fold_constants", lambda model, limit: 1 / 0)
    broken = analyze(build_mod_constant(), {"x": [2, 4]})
    assert broken.notes == ["pass 'fold' skipped: onnxslim failed: ZeroDivisionError: division by zero; the graph is not folded"]
    assert broken.node_count == 3


def test_fix_upgrades_an_opset6_file_then_folds():
    fixed, removed = fix(_legacy_model(6))
    assert upgrade.default_opset(fixed) == 7 and removed == 0
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(_run(fixed, {"x": x})[0], np.maximum(x + np.arange(6).reshape(2, 3) - 2, 0))


def test_the_pipeline_fills_what_the_static_engines_need_of_each_graph(tmp_path, bert):
    from gebackend.compile.pipeline import compile_static

    path = tmp_path / "bert.onnx"
    onnx.save(bert, str(path))
    shapes = [{"input_ids": (1, 16), "attention_mask": (1, 16)}, {"input_ids": (4, 32), "attention_mask": (4, 32)}]
    graphs, report = compile_static(path, shapes, None)
    assert [dict(g.dim_overrides) for g in graphs] == [{"batch": 1, "sequence": 16}, {"batch": 4, "sequence": 32}]
    for graph in graphs:
        assert graph.fully_static and not graph.runtime_outputs and not graph.reads_shape_values
        assert len(graph.static_nodes) == len(graph.model.graph.node)
    nonzero = tmp_path / "nonzero.onnx"
    onnx.save(build_nonzero(), str(nonzero))
    (graph,), _ = compile_static(nonzero, [{"x": (2, 4)}], None)
    assert graph.runtime_outputs == {"indices"} and not graph.fully_static
    assert graph.dim_overrides == {"batch": 2}  # the nonzero model names its dim 0


def test_one_registered_pass_list_is_what_the_load_and_the_doctor_run(monkeypatch):
    from gebackend.compile.graph_pass import GraphPass, PassSkipped

    assert [p.name for p in passes.PASSES] == ["specialise", "upgrade", "fold", "rows"]
    ran = []

    class Marks(GraphPass):
        name = "mark"

        def run(self, model, context):
            ran.append(dict(context.shapes or {}))
            marked = onnx.ModelProto()
            marked.CopyFrom(model)
            marked.doc_string = "marked"
            return marked

    class Refuses(GraphPass):
        name = "refuse"

        def run(self, model, context):
            raise PassSkipped("not for this model")

    monkeypatch.setattr(passes, "PASSES", passes.PASSES + (Marks(), Refuses()))
    said = []
    compiled = passes.compile_graph(build_mod_constant(), {"x": [2, 4]}, 1 << 20, lambda n, why: said.append((n, why)))
    assert compiled.doc_string == "marked" and ran == [{"x": [2, 4]}]
    assert said == [("refuse", "not for this model")]
    report = analyze(build_mod_constant(), {"x": [2, 4]})  # the doctor runs the same list
    assert len(ran) == 2 and report.notes == ["pass 'refuse' skipped: not for this model"]
