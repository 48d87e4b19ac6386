"""Unit tests for `gebackend analyze`, run in-process on models saved to a temp folder."""

from __future__ import annotations

import json

import onnx
import pytest

from gebackend.cli.main import main
from gebackend.modelzoo import build_bert, build_mod_constant, build_nonzero


@pytest.fixture()
def mod_path(tmp_path):
    path = tmp_path / "mod.onnx"
    onnx.save(build_mod_constant(), path)
    return path


def test_text_report_names_the_mod_group(mod_path, capsys):
    assert main(["analyze", str(mod_path)]) == 0
    out = capsys.readouterr().out
    assert "foldable constant subgraphs: 1 (2 nodes)" in out
    assert "Mod '/attn/Mod' = 2 (Add, Mod)" in out
    assert "unresolved inputs: x dim 0 ('batch')" in out


def test_json_report(mod_path, capsys):
    assert main(["analyze", str(mod_path), "--json", "--shape", "x:3,4"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("node_count", "static_node_count", "first_break", "foldable", "foldable_node_count",
                "unresolved_inputs", "host_ops", "shapes"):
        assert key in data
    assert data["shapes"] == {"x": [3, 4]}
    assert (data["node_count"], data["static_node_count"], data["first_break"]) == (1, 1, None)
    assert data["foldable"][0]["sink_op"] == "Mod" and data["foldable"][0]["value"] == 2


def test_fix_writes_the_folded_model(mod_path, tmp_path, capsys):
    out_path = tmp_path / "out" / "fixed.onnx"
    assert main(["analyze", str(mod_path), "--fix", str(out_path)]) == 0
    assert "folding removed 2 node(s)" in capsys.readouterr().out
    fixed = onnx.load(str(out_path))
    assert [n.op_type for n in fixed.graph.node] == ["Gather"]
    assert [v.name for v in fixed.graph.input] == ["x"]
    assert [d.dim_param for d in fixed.graph.input[0].type.tensor_type.shape.dim][0] == "batch"


def test_shape_flag_reaches_the_doctor(tmp_path, capsys):
    path = tmp_path / "nz.onnx"
    onnx.save(build_nonzero(), path)
    assert main(["analyze", str(path), "--shape", "x:2,4"]) == 0
    assert "first node where static breaks: #1 NonZero 'nz' (inputs: x): data-dependent output shape" in capsys.readouterr().out


def test_config_buckets_give_the_shapes(tmp_path, capsys):
    model_dir = tmp_path / "bert_static"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(build_bert(), model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(
        'backend: "ge"\nmax_batch_size: 4\n'
        'parameters { key: "graph.ge.inputShape" value: { string_value: "input_ids:-1,-1;attention_mask:-1,-1" } }\n'
        'parameters { key: "graph.ge.dynamicDims" value: { string_value: "1,16,1,16;4,32,4,32" } }\n'
    )
    code = main(["analyze", str(model_dir / "1" / "model.onnx"), "--config", str(model_dir / "config.pbtxt")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "compiles 2 shape set(s); analysing the first" in out
    assert "shapes: input_ids=[1, 16], attention_mask=[1, 16]" in out
    assert "first node where static breaks: none" in out
    assert "graph mode at load: static graph, 2 shape set(s), each built on ONNX Runtime" in out


def _bert_folder(tmp_path, config: str):
    model_dir = tmp_path / "bert"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(build_bert(), model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir / "1" / "model.onnx", model_dir / "config.pbtxt"


def test_static_model_with_a_free_dim_reports_the_dynamic_graph_the_load_serves(tmp_path, capsys):
    model, config = _bert_folder(tmp_path, 'backend: "ge"\nmax_batch_size: 4\n'
                                           'parameters { key: "static_model" value: { string_value: "1" } }\n')
    code = main(["analyze", str(model), "--config", str(config)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "compiles 0 shape set(s)" in out
    assert ("graph mode at load: dynamic graph: static_model=1 needs every input shape fixed, but input 'input_ids' "
            "dim 1 ('sequence') is free and no bucket fixes it") in out


def test_a_static_graph_onnx_runtime_refuses_reports_the_fallback(tmp_path, capsys, monkeypatch):
    import onnxruntime as ort

    def refuses(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Node (If_0) Op (If) [TypeInferenceError]")

    monkeypatch.setattr(ort, "InferenceSession", refuses)
    model, config = _bert_folder(tmp_path, 'backend: "ge"\nmax_batch_size: 2\n'
                                           'input [ { name: "input_ids", dims: [ 8 ] }, { name: "attention_mask", dims: [ 8 ] } ]\n'
                                           'parameters { key: "static_model" value: { string_value: "1" } }\n')
    code = main(["analyze", str(model), "--config", str(config), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    mode = json.loads(out)["graph_mode_at_load"]
    assert mode.startswith("dynamic graph: the static graph could not be built (") and "TypeInferenceError" in mode


def test_a_bucket_onnx_runtime_refuses_reports_the_others_serving(tmp_path, capsys, monkeypatch):
    import onnxruntime as ort

    real = ort.InferenceSession

    def second_refused(model, *args, **kwargs):  # the graph compiled for 4 x 32 tokens
        if isinstance(model, bytes):
            first = onnx.load_from_string(model).graph.input[0].type.tensor_type.shape.dim
            if [d.dim_value for d in first] == [4, 32]:
                raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Node (If_0) Op (If) [TypeInferenceError]")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", second_refused)
    model, config = _bert_folder(tmp_path, 'backend: "ge"\nmax_batch_size: 4\n'
        'parameters { key: "graph.ge.inputShape" value: { string_value: "input_ids:-1,-1;attention_mask:-1,-1" } }\n'
        'parameters { key: "graph.ge.dynamicDims" value: { string_value: "1,16,1,16;4,32,4,32" } }\n')
    assert main(["analyze", str(model), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert ("graph mode at load: static graph, 1 of 2 shape set(s); bucket [input_ids:[4, 32]; attention_mask:[4, 32]] "
            "could not be built (RuntimeError: ") in out, out


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.onnx")]) == 2
    err = capsys.readouterr().err
    assert "cannot read ONNX file" in err and "nope.onnx" in err


@pytest.mark.parametrize("shape, message", [
    ("x=3,4", "is not NAME:D0,D1"),
    ("y:3,4", "'y': not a graph input; the inputs are x"),
    ("x:3,5", "dim 1 is fixed to 4 in the model, not 5"),
])
def test_bad_shape_exits_2(mod_path, capsys, shape, message):
    assert main(["analyze", str(mod_path), "--shape", shape]) == 2
    assert message in capsys.readouterr().err


def test_bad_size_limit_is_a_usage_error(mod_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(mod_path), "--size-limit", "0"])
    assert exc.value.code == 2
    assert "at least 1 byte" in capsys.readouterr().err


def test_the_doctor_names_initializers_listed_as_graph_inputs(tmp_path, capsys):
    from gebackend.modelzoo import build_scale_shift

    path = tmp_path / "ss.onnx"
    onnx.save(build_scale_shift(), path)
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("note: 3 initializer(s) are also graph inputs (W, scale, shift), as old exporters wrote them: as the file "
            "stands ONNX Runtime neither folds nor prepacks them") in out, out


def test_the_doctor_says_nothing_of_defaults_where_there_are_none(mod_path, capsys):
    assert main(["analyze", str(mod_path)]) == 0
    assert "also graph inputs" not in capsys.readouterr().out


def test_the_report_names_the_request_limits_the_models_tables_set(tmp_path, capsys):
    """The token ids' range and the longest input, as the request check enforces them (config/index_bounds.py)."""
    path = tmp_path / "bert.onnx"
    onnx.save(build_bert(), path)
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("request limits (checked on every request): input_ids values in [-1000, 999] (the 1000 rows of "
            "'embeddings.word' that Gather 'embeddings.tokens' reads), dim 1 at most 128") in out
    assert main(["analyze", str(path), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["request_limits"]) == ["input_ids"]


def test_a_model_without_such_tables_says_none_were_found(mod_path, capsys):
    from gebackend.compile.doctor import analyze

    assert main(["analyze", str(mod_path)]) == 0
    assert "request limits: none found (no input indexes a table stored in the model)" in capsys.readouterr().out
    assert "request limits" not in analyze(build_mod_constant()).format_text(brief=True)  # the load log: only found ones
