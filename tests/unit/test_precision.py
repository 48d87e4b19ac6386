"""Precision modes on ONNX Runtime, the accuracy report, and ORT tuning that must reach the sessions."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from gebackend.cli.main import main
from gebackend.compile.accuracy import accuracy_report, compare, random_feeds
from gebackend.compile.pipeline import compile_static
from gebackend.compile.precision import lower_precision
from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions, parse_options
from gebackend.config.spec import build_model_spec
from gebackend.engines.onnxruntime import OrtEngine, disabled_optimizers
from gebackend.compile.graph import dim_overrides
from gebackend.engines.onnxruntime_static import OrtStaticEngine
from gebackend.errors import ModelLoadError
from gebackend.modelzoo import build_add_mul, build_bert, build_resnet
from gebackend.runtime.loader import load_executor

BUILDERS = {"bert": build_bert, "resnet": build_resnet}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("precision")
    paths = {}
    for name, build in BUILDERS.items():
        paths[name] = folder / f"{name}.onnx"
        onnx.save(build(), str(paths[name]))
    return paths


def _outputs(path: Path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("model", sorted(BUILDERS))
@pytest.mark.parametrize("mode, floor", [("int8", 0.99), ("fp16", 0.999)])
def test_lowered_model_loads_and_stays_close(models, tmp_path, model, mode, floor):
    path = models[model]
    lowered = lower_precision(path, mode, tmp_path)
    assert lowered != path and lowered.parent == tmp_path
    ops = Counter(n.op_type for n in onnx.load(str(lowered)).graph.node)
    if mode == "int8":
        assert ops["MatMulInteger"] >= 1 and ops["ConvInteger"] == 0  # Conv stays fp32 (ConvInteger is slow)
    else:
        assert ops["Cast"] >= 2
    feeds = random_feeds(path, batch=3, seed=1)
    names = _outputs(path)
    got = OrtEngine(lowered, BackendOptions()).run(feeds, names)
    want = OrtEngine(path, BackendOptions()).run(feeds, names)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == np.float32  # fp16 keeps fp32 inputs and outputs
        assert _cosine(g, w) >= floor
    report = accuracy_report(path, lowered, feeds)
    assert report.cosine >= floor and 0 < report.max_abs_diff < 1


@pytest.mark.parametrize("quantization", ["dynamic", "static"])
def test_int8_of_a_transformer_fused_by_onnxruntimes_optimizer(models, tmp_path, quantization):
    """`optimum-cli export onnx --optimize O2` and onnxruntime.transformers' optimizer fuse a transformer into
    com.microsoft ops (SkipLayerNormalization, BiasGelu), whose outputs ONNX shape inference cannot type: ONNX
    Runtime's quantizers failed on them ("Unable to find data type for weight_name"), and the load with them."""
    from onnxruntime.transformers.optimizer import optimize_model

    from gebackend.compile import quantize_static

    fused = tmp_path / "bert_fused.onnx"
    optimize_model(str(models["bert"]), model_type="bert", num_heads=0, hidden_size=0).save_model_to_file(str(fused))
    assert any(n.domain == "com.microsoft" for n in onnx.load(str(fused)).graph.node)
    feeds = random_feeds(fused, batch=2, seed=1)
    if quantization == "dynamic":
        lowered = lower_precision(fused, "int8", tmp_path)
        quantized_ops = ("MatMulInteger", "DynamicQuantizeMatMul")
    else:
        lowered = tmp_path / "static.onnx"
        quantize_static.quantize("onnxruntime", fused, lowered, [feeds], print)
        quantized_ops = ("QuantizeLinear",)
    assert sum(n.op_type in quantized_ops for n in onnx.load(str(lowered)).graph.node) >= 1
    assert accuracy_report(fused, lowered, feeds).cosine >= 0.99


def test_bf16_on_onnxruntime_is_refused_pointing_to_openvino(models, tmp_path):
    with pytest.raises(ModelLoadError, match=r"bf16.*engine=openvino"):
        lower_precision(models["bert"], "bf16", tmp_path)
    assert not list(tmp_path.iterdir())


def test_origin_is_the_file_itself(models, tmp_path):
    assert lower_precision(models["bert"], "origin", tmp_path) == models["bert"]


def test_quantizer_does_not_talk_through_the_root_logger(models, tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO):
        lower_precision(models["resnet"], "int8", tmp_path)
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()]
    assert capsys.readouterr().out == ""


def test_int8_logs_what_it_quantized(models, tmp_path):
    logged = []
    lower_precision(models["bert"], "int8", tmp_path, logged.append)
    assert any(re.search(r"precision int8: .* 13 of 13 node\(s\) with constant weights quantized", m) for m in logged)


@pytest.mark.parametrize("int8_range", ["reduced", "full"])
def test_dynamic_int8_weights_are_per_channel_and_7_bit_where_the_cpu_saturates(models, tmp_path, monkeypatch,
                                                                                 int8_range):
    """On x86 without VNNI AVX2's u8*s8 pairs saturate: the 4-layer CN_CLIP image encoder's full-range weights gave
    cosine 0.9947, 7-bit per-channel ones 0.99985 at the same speed. The range follows the CPU (as static int8)."""
    from onnx import numpy_helper

    from gebackend.compile import quantize_static

    monkeypatch.setattr(quantize_static, "int8_range", lambda flags=None, machine=None: int8_range)
    logged = []
    out = lower_precision(models["bert"], "int8", tmp_path, logged.append)
    model = onnx.load(str(out))
    inits = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    weights = [inits[node.input[1]] for node in model.graph.node if node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul")
               and node.input[1] in inits]
    assert len(weights) == 13 and all(w.dtype == np.int8 for w in weights)  # 12 MatMul, the pooler's Gemm
    top = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert top <= 64 if int8_range == "reduced" else top == 127
    zero_points = [inits[node.input[3]] for node in model.graph.node if node.op_type == "MatMulInteger"]
    assert len(zero_points) == 13 and all(z.ndim == 1 and z.size == w.shape[1] for z, w in zip(zero_points, weights))
    scales = [inits[name] for name in inits if name.endswith("weight_scale")]  # one per column too
    assert len(scales) == 13 and all(s.ndim == 1 and s.size > 1 for s in scales)
    bits = "7-bit (reduce_range" if int8_range == "reduced" else "full 8-bit"
    assert any(f"QInt8 weights per channel, {bits}" in line for line in logged), logged


# ------------------------------------------------------------------------------------------- accuracy report


def test_identical_models_report_no_difference(models):
    path = models["bert"]
    report = accuracy_report(path, path, random_feeds(path))
    assert report.max_abs_diff == 0.0 and report.cosine == pytest.approx(1.0, abs=1e-12)
    assert [o.name for o in report.per_output] == ["last_hidden_state", "pooler_output"]
    assert report.input_shapes == {"input_ids": (1, 16), "attention_mask": (1, 16)}
    assert report.format_text().startswith("max_abs_diff=0 cosine=1.000000 (seeded random input input_ids:1,16 ")
    assert json.loads(json.dumps(report.to_dict()))["outputs"][0]["cosine"] == pytest.approx(1.0)


def test_compare_values():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    same = compare("y", a, a)
    assert same.max_abs_diff == 0 and same.cosine == pytest.approx(1.0)
    scaled = compare("y", a, 2 * a)
    assert scaled.max_abs_diff == 3 and scaled.cosine == pytest.approx(1.0)
    assert compare("y", a, -a).cosine == pytest.approx(-1.0)
    assert compare("y", np.zeros(3), np.zeros(3)).cosine == 1.0
    assert compare("y", a, np.zeros(3)).cosine == 0.0
    assert np.isnan(compare("y", a, np.array([np.nan, 1, 1])).cosine)
    with pytest.raises(ModelLoadError, match="shape"):
        compare("y", a, a[:2])


def test_random_feeds_follow_the_signature_and_stay_in_range(models):
    bert = random_feeds(models["bert"], seed=3)
    assert bert["input_ids"].dtype == np.int64 and bert["input_ids"].shape == (1, 16)
    assert 0 <= bert["input_ids"].min() and bert["input_ids"].max() < 100
    assert (bert["attention_mask"] == 1).all()
    np.testing.assert_array_equal(bert["input_ids"], random_feeds(models["bert"], seed=3)["input_ids"])  # seeded
    image = random_feeds(models["resnet"], batch=2)["image"]
    assert image.dtype == np.float32 and image.shape == (2, 3, 64, 64) and abs(float(image.mean())) < 0.1
    fixed = random_feeds(models["bert"], {"input_ids": (4, 32), "attention_mask": (4, 32)})
    assert fixed["input_ids"].shape == (4, 32)


def test_random_token_ids_stay_below_a_small_embedding_table(tmp_path):
    path = tmp_path / "tiny_vocab.onnx"
    onnx.save(build_bert(vocab_size=10), str(path))
    ids = random_feeds(path, batch=8, dim=32)["input_ids"]
    assert ids.max() < 10 and ids.max() >= 5
    report = accuracy_report(path, path, random_feeds(path))  # runs: no index out of range
    assert report.max_abs_diff == 0


# ------------------------------------------------------------------------------------------------- loader


def _spec(path: Path, model: onnx.ModelProto, **options):
    parsed = parse_options(path.stem, {}, {k: str(v) for k, v in options.items()}).options
    return build_model_spec({"name": path.stem, "max_batch_size": 4}, signature_of(model), path, parsed)


@pytest.mark.parametrize("static", [False, True])
def test_loader_serves_the_lowered_model_and_logs_its_accuracy(models, static):
    path = models["bert"]
    options = {"precision_mode": "int8"}
    if static:
        options.update({"graph.ge.inputShape": "input_ids:-1,16;attention_mask:-1,16", "graph.ge.dynamicDims": "1,1;4,4"})
    logged = []
    executor, how = load_executor(_spec(path, build_bert(), **options), log=logged.append)
    # the line says what ran: the cosine, on which inputs and whence their sizes, the quantizer and the ops it quantized
    source = "the first bucket's shape" if static else "the default size 16"
    assert re.match(r"precision int8 \(cosine 0\.99\d+ to fp32 on input_ids:\[1, 16\] attention_mask:\[1, 16\], "
                    + source + r"; ONNX Runtime dynamic, 13 of 13 MatMul/Gemm quantized\), "
                    + ("static" if static else "dynamic") + " graph", how), how
    # dynamic: batch 1 and 16 for the other named dims; static: the first bucket (here the same shape)
    assert any(m.startswith("precision int8 vs fp32: max_abs_diff=") and "input_ids:1,16" in m for m in logged), logged
    feeds = random_feeds(path, {"input_ids": (2, 16), "attention_mask": (2, 16)}, seed=5)
    got = executor.execute([feeds])[0]
    want = dict(zip(_outputs(path), OrtEngine(path, BackendOptions()).run(feeds, _outputs(path))))
    for name, value in want.items():
        assert _cosine(got[name], value) >= 0.99
    executor.close()


def test_loader_refuses_bf16_on_onnxruntime_and_leaves_no_folder(models, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(ModelLoadError, match="engine=openvino"):
        load_executor(_spec(models["bert"], build_bert(), precision_mode="bf16"))
    assert not list(tmp_path.glob("lowered-*"))


def test_origin_precision_loads_the_file_unchanged(models):
    executor, how = load_executor(_spec(models["bert"], build_bert()))
    assert how.startswith("dynamic graph, onnxruntime")
    executor.close()


# ------------------------------------------------------------------------------------- gebackend analyze


def test_analyze_prints_the_precision_report(models, capsys):
    assert main(["analyze", str(models["bert"]), "--precision", "int8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^precision int8 \(onnxruntime\) vs fp32: max_abs_diff=\S+ cosine=0\.99\d+ "
                     r"\(seeded random input input_ids:1,16 attention_mask:1,16, seed 0\)$", out, re.M), out
    assert re.search(r"^  pooler_output: max_abs_diff=\S+ cosine=0\.99\d+", out, re.M), out


def test_analyze_precision_json_uses_the_given_shapes(models, capsys):
    assert main(["analyze", str(models["resnet"]), "--precision", "fp16", "--json", "--shape", "image:2,3,64,64"]) == 0
    result = json.loads(capsys.readouterr().out)["precision"]
    assert result["mode"] == "fp16" and result["input_shapes"] == {"image": [2, 3, 64, 64]}
    assert result["cosine"] >= 0.999 and result["outputs"][0]["name"] == "logits"


def test_analyze_bf16_on_onnxruntime_is_a_clear_error(models, capsys):
    assert main(["analyze", str(models["bert"]), "--precision", "bf16"]) == 2
    assert "engine=openvino" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ ORT engine tuning


def _profiled_op_types(engine, feeds, names, prefix: Path) -> Counter:
    engine.start_profiling(prefix)
    engine.run(feeds, names)
    sessions = engine.stop_profiling()
    ops = Counter()
    for session in sessions:
        for event in json.loads(session.file.read_text()):
            if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
                ops[event["args"]["op_name"]] += 1
    return ops


@pytest.mark.parametrize("setting, fused", [(None, False), ("none", True), ("SkipLayerNormFusion", False),
                                            ("LayerNormFusion", True)])
def test_disabled_optimizers_reach_the_static_session(models, tmp_path, setting, fused):
    """The fused op ORT makes of Add + LayerNormalization appears in the profile only where the fusion is on."""
    path = models["bert"]
    shapes = {"input_ids": (2, 16), "attention_mask": (2, 16)}
    graphs, _ = compile_static(path, [shapes], 1 << 20)
    options = parse_options("bert", {}, {"disabled_optimizers": setting} if setting else {}).options
    engine = OrtStaticEngine(graphs, options)
    ops = _profiled_op_types(engine, random_feeds(path, shapes), _outputs(path), tmp_path / "p")
    assert ops["LayerNormalization"] + ops["SkipLayerNormalization"] > 0, ops
    assert (ops["SkipLayerNormalization"] > 0) is fused, ops
    assert ("disabled_optimizers=SkipLayerNormFusion (default" in engine.describe()) is (setting is None)


def test_disabled_optimizers_reach_the_dynamic_session(models, tmp_path):
    path = models["bert"]
    feeds = random_feeds(path)
    plain = _profiled_op_types(OrtEngine(path, BackendOptions()), feeds, _outputs(path), tmp_path / "a")
    off = OrtEngine(path, parse_options("b", {}, {"disabled_optimizers": "GemmActivationFusion"}).options)
    assert "disabled_optimizers=GemmActivationFusion (disabled_optimizers)" in off.describe()
    unfused = _profiled_op_types(off, feeds, _outputs(path), tmp_path / "b")
    assert plain["FusedGemm"] == 1 and unfused["FusedGemm"] == 0 and unfused["Gemm"] == 1, (plain, unfused)


def test_default_disabled_optimizers_by_mode_and_device():
    assert disabled_optimizers(BackendOptions().session, static=True) == ["SkipLayerNormFusion"]
    assert disabled_optimizers(BackendOptions().session, static=False) == []
    assert disabled_optimizers(BackendOptions().session, static=True, device="cuda") == []
    none = parse_options("m", {}, {"disabled_optimizers": "none"}).options
    assert none.session.disabled_optimizers == () and disabled_optimizers(none.session, static=True) == []
    both = parse_options("m", {"disabled_optimizers": "A, B"}, {}).options
    assert disabled_optimizers(both.session, static=False) == ["A", "B"]


def test_dim_overrides_name_the_original_dims_of_each_bucket():
    inputs = [("input_ids", ("batch", "sequence")), ("attention_mask", ("batch", "sequence")), ("x", (3, None))]
    assert dim_overrides(inputs, {"input_ids": (4, 32), "attention_mask": (4, 32), "x": (3, 5)}) == {"batch": 4, "sequence": 32}
    assert dim_overrides(inputs, {"input_ids": (4, 32), "attention_mask": (4, 16)}) == {"batch": 4}  # clash: left out


def test_allow_spinning_reaches_the_session_options():
    from gebackend.engines.onnxruntime import session_options

    assert session_options(BackendOptions.make(allow_spinning="off").session).get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"
    assert session_options(BackendOptions.make(allow_spinning="on").session).get_session_config_entry(
        "session.intra_op.allow_spinning") == "1"


def test_force_spinning_stop_reaches_the_session_options():
    from gebackend.config.options import parse_options
    from gebackend.engines.onnxruntime import session_options

    parsed = parse_options("m", {}, {"force_spinning_stop": "1"}).options
    assert parsed.session.force_spinning_stop == "on"
    assert session_options(parsed.session).get_session_config_entry("session.force_spinning_stop") == "1"


def test_static_engine_with_overrides_equals_dynamic(tmp_path):
    path = tmp_path / "add_mul.onnx"
    onnx.save(build_add_mul(), str(path))
    sig = [(t.name, t.shape) for t in signature_of(build_add_mul()).inputs]
    shapes = {t: (2, 4) for t, _ in sig}
    graphs, _ = compile_static(path, [shapes], 1 << 20)
    graphs[0].dim_overrides = dim_overrides(sig, shapes)
    engine = OrtStaticEngine(graphs, BackendOptions())
    feeds = {n: np.full(s, 2, np.float32) for n, s in shapes.items()}
    names = _outputs(path)
    for g, w in zip(engine.run(feeds, names), OrtEngine(path, BackendOptions()).run(feeds, names)):
        np.testing.assert_array_equal(g, w)


def test_analyze_bf16_on_openvino_reports_its_accuracy_and_what_ran(models, capsys):
    """On a CPU with BF16 the bf16 outputs move a little from fp32; on one without (AVX2-only), OpenVINO runs f32:
    the outputs equal fp32's and the report says so."""
    pytest.importorskip("openvino")
    from gebackend.engines.openvino import openvino_capabilities

    assert main(["analyze", str(models["bert"]), "--precision", "bf16", "--engine", "openvino"]) == 0
    out = capsys.readouterr().out
    if "BF16" in openvino_capabilities():
        assert re.search(r"^precision bf16 \(openvino\) vs fp32: max_abs_diff=\S+ cosine=0\.99\d+ ", out, re.M), out
        assert re.search(r"^precision bf16 on this CPU \(.+\): ran bf16$", out, re.M), out
    else:
        assert re.search(r"^precision bf16 \(openvino\) vs fp32: max_abs_diff=\S+ cosine=1\.000000 ", out, re.M), out
        assert re.search(r"^precision bf16 on this CPU \(.+\): bf16 requested, this CPU has no BF16: ran f32$", out, re.M), out


def test_analyze_bf16_on_a_cpu_without_bf16_says_it_ran_f32(models, capsys, monkeypatch):
    """What an AVX2-only CPU reports (OpenVINO: `FP32, INT8`), on any CPU: f32 ran, the outputs equal fp32's."""
    pytest.importorskip("openvino")
    from gebackend.engines import openvino as ov_engine

    monkeypatch.setattr(ov_engine, "openvino_capabilities", lambda: ("FP32", "INT8"))
    assert main(["analyze", str(models["bert"]), "--precision", "bf16", "--engine", "openvino", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["precision"]
    assert report["ran"] == "f32" and report["note"] == "bf16 requested, this CPU has no BF16: ran f32", report
    assert report["cosine"] > 0.999999 and report["max_abs_diff"] < 1e-4, report
