"""Static int8 (compile/quantize_static.py): ONNX Runtime's QDQ and NNCF's QDQ (run by OpenVINO) of a small conv model
and a small MatMul model stay close to fp32 on inputs they were not calibrated on; the 8-bit types follow this CPU."""

from __future__ import annotations

import platform
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from gebackend.compile import quantize_static
from gebackend.compile.accuracy import compare, random_feeds
from gebackend.compile.calibration import random_samples
from gebackend import cpu
from gebackend.errors import ModelLoadError
from gebackend.modelzoo import build_bert, build_resnet


def build_matmul(seed: int = 0) -> onnx.ModelProto:
    """x [batch, 64] -> MatMul 64x128 + bias -> Relu -> MatMul 128x32: a small MLP."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((64, 128)) / 8).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(np.zeros(128, np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((128, 32)) / 11).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 32])], [w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture(scope="module", params=["conv", "matmul"])
def model(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("q") / f"{request.param}.onnx"
    onnx.save(build_resnet(width=8, image_size=32) if request.param == "conv" else build_matmul(), str(path))
    return path


def _fresh_cosine(reference: Path, run_lowered) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"])
    worst = 1.0
    for seed in range(100, 104):  # not the calibration seeds (0..15)
        feeds = random_feeds(reference, seed=seed, batch=2)
        name = session.get_outputs()[0].name
        worst = min(worst, compare(name, session.run([name], feeds)[0], run_lowered(feeds)).cosine)
    return worst


def test_onnxruntime_static_int8_is_qdq_and_close_to_fp32(model, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "q.onnx"
    lines = []
    nodes = quantize_static.quantize("onnxruntime", model, out, random_samples(model, 16), lines.append)
    ops = Counter(node.op_type for node in onnx.load(str(out)).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0 and nodes == ops["QuantizeLinear"] + ops["DequantizeLinear"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    cosine = _fresh_cosine(model, lambda feeds: session.run(None, feeds)[0])
    assert cosine >= 0.99, cosine
    assert any("reduce_range=" in line and "QDQ" in line for line in lines), lines


def test_nncf_int8_run_by_openvino_is_qdq_and_close_to_fp32(model, tmp_path):
    ov = pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    out = tmp_path / "q.onnx"
    lines = []
    quantize_static.quantize("nncf", model, out, random_samples(model, 16), lines.append)
    ops = Counter(node.op_type for node in onnx.load(str(out)).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    compiled = ov.Core().compile_model(str(out), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    cosine = _fresh_cosine(model, lambda feeds: compiled(feeds)[0])
    assert cosine >= 0.99, cosine
    assert any("NNCF" in line and "preset PERFORMANCE" in line for line in lines), lines
    fix = quantize_static.nncf_overflow_fix()[0]
    assert any(f"overflow_fix={fix}" in line for line in lines), lines


def test_nncf_quantizes_a_model_zoo_opset_9_file_converted_to_opset_13(tmp_path):
    ov = pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    from gebackend.compile.upgrade import default_opset
    from tests.unit.test_static_engine import _legacy_cnn

    path, out = tmp_path / "legacy.onnx", tmp_path / "q.onnx"
    onnx.save(_legacy_cnn(9), str(path))  # IR 3, every weight also a graph input, opset 9: NNCF refuses < 10
    lines = []
    nodes = quantize_static.quantize("nncf", path, out, random_samples(path, 16), lines.append)
    assert lines[0] == ("precision int8: NNCF quantizes opset 10 and newer: the model's opset 9 converted to 13 with "
                        "onnx.version_converter first"), lines
    assert nodes > 0 and default_opset(onnx.load(str(out))) == 13
    compiled = ov.Core().compile_model(str(out), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert _fresh_cosine(path, lambda feeds: compiled(feeds)[0]) >= 0.99


def test_onnxruntime_quantizes_an_opset_11_file_at_opset_13_so_its_per_channel_weights_load(tmp_path):
    """paddle2onnx writes opset 11; DequantizeLinear's per-channel `axis` is opset 13's, so the file is converted
    first: quantized at opset 11, ONNX Runtime refused to load it (`Unrecognized attribute: axis`)."""
    import onnxruntime as ort
    from gebackend.compile.upgrade import default_opset

    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) / 4).astype(np.float32), "w1"),
               numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32), "w2")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
         helper.make_node("GlobalAveragePool", ["c2"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])],
        "conv11", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 16])], weights)
    path, out = tmp_path / "opset11.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), str(path))
    lines = []
    nodes = quantize_static.quantize_onnxruntime(path, out, random_samples(path, 8), lines.append)
    assert ("precision int8: per-channel weights need opset 13: the model's opset 11 converted to 13 with "
            "onnx.version_converter first") in lines, lines
    assert nodes > 0 and default_opset(onnx.load(str(out))) == 13
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert _fresh_cosine(path, lambda feeds: session.run(None, feeds)[0]) >= 0.99


def test_ort_types_follow_this_cpus_flags():
    activation, weight, reduce_range, why = quantize_static.ort_types()
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        has_vnni = bool(cpu.flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})
        assert (activation, weight) == ("QUInt8", "QInt8")
        assert reduce_range is (not has_vnni), (cpu.flags(), reduce_range)
        assert ("without VNNI" in why) is (not has_vnni)
    # the rule itself, for CPUs this machine is not
    assert quantize_static.ort_types({"avx2", "fma"}, "x86_64")[2] is True
    assert quantize_static.ort_types({"avx2", "avx512_vnni"}, "x86_64")[2] is False
    assert quantize_static.ort_types({"avx2", "avx_vnni"}, "x86_64")[:3] == ("QUInt8", "QInt8", False)
    assert quantize_static.ort_types(set(), "aarch64")[:3] == ("QInt8", "QInt8", False)


def test_nncf_overflow_fix_follows_this_cpus_flags():
    """Without VNNI, NNCF must keep every layer's weights to 7 bits (measured: an MLP's cosine 0.988 -> 0.996 on an
    AVX2-only AMD EPYC); with VNNI, NNCF's default."""
    has_vnni = bool(cpu.flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert quantize_static.nncf_overflow_fix()[0] == ("FIRST_LAYER" if has_vnni else "ENABLE")
        assert quantize_static.int8_range() == ("full" if has_vnni else "reduced")
    assert quantize_static.nncf_overflow_fix({"avx2", "fma"}, "x86_64")[0] == "ENABLE"
    assert quantize_static.nncf_overflow_fix({"avx2", "avx_vnni"}, "x86_64")[0] == "FIRST_LAYER"
    assert quantize_static.nncf_overflow_fix({"avx2", "avx512_vnni", "amx_int8"}, "x86_64")[0] == "FIRST_LAYER"
    assert quantize_static.int8_range(set(), "aarch64") == "full"
    advanced = pytest.importorskip("nncf.quantization.advanced_parameters")
    for fix in ("ENABLE", "FIRST_LAYER"):  # names NNCF has
        assert advanced.OverflowFix[fix]


def _quantized_elsewhere(path: Path) -> set[str]:
    """The op types whose activations are quantized though neither made nor read by a Conv/MatMul/Gemm: for each
    QuantizeLinear, the op that made its tensor and those that read its DequantizeLinear, where none of them is one."""
    graph = onnx.load(str(path)).graph
    made = {out: node.op_type for node in graph.node for out in node.output}
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    products = set(quantize_static.ATTENTION_GRAPH_OPS)
    out = set()
    for q in (node for node in graph.node if node.op_type == "QuantizeLinear"):
        dequantized = [node for node in graph.node if node.op_type == "DequantizeLinear" and node.input[0] == q.output[0]]
        users = set().union(*(readers.get(dq.output[0], set()) for dq in dequantized))
        if made.get(q.input[0]) not in products and not users & products:
            out |= users | {made.get(q.input[0], "graph input")}
    return out


def test_onnxruntime_static_int8_of_an_attention_graph_quantizes_only_its_products(tmp_path):
    """Quantizing every op of a transformer (residual Adds, Softmax, GELU's pieces, layer norms) costs accuracy and no
    time (the CN_CLIP encoders: cosine 0.980 -> 0.9998 at the same speed); a convolution model keeps its int8 Adds."""
    import onnxruntime as ort

    bert, resnet = tmp_path / "bert.onnx", tmp_path / "resnet.onnx"
    onnx.save(build_bert(), str(bert))
    onnx.save(build_resnet(width=8, image_size=32), str(resnet))
    lines = []
    quantize_static.quantize("onnxruntime", bert, tmp_path / "bert.q.onnx", random_samples(bert, 16), lines.append)
    assert _quantized_elsewhere(tmp_path / "bert.q.onnx") == set()
    assert any("attention graph (Softmax and MatMul found): only Conv/MatMul/Gemm quantized" in line for line in lines)
    session = ort.InferenceSession(str(tmp_path / "bert.q.onnx"), providers=["CPUExecutionProvider"])
    assert _fresh_cosine(bert, lambda feeds: session.run(None, feeds)[0]) >= 0.998
    quantize_static.quantize("onnxruntime", resnet, tmp_path / "resnet.q.onnx", random_samples(resnet, 16), lines.append)
    assert "Add" in _quantized_elsewhere(tmp_path / "resnet.q.onnx")


def test_transformers_are_told_apart_by_softmax_and_matmul():
    assert quantize_static.is_transformer(build_bert()) is True
    assert quantize_static.is_transformer(build_resnet()) is False
    assert quantize_static.is_transformer(build_matmul()) is False


def test_a_failing_quantizer_is_a_clear_load_error_without_traceback(tmp_path, monkeypatch):
    broken = tmp_path / "broken.onnx"
    model = build_matmul()
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, str(broken))
    samples = [{"x": np.zeros((1, 64), np.float32)}]
    with pytest.raises(ModelLoadError, match="quantize_static failed on broken.onnx: .*quantization=dynamic"):
        quantize_static.quantize("onnxruntime", broken, tmp_path / "o.onnx", samples, print)
    pytest.importorskip("nncf")
    good = tmp_path / "mlp.onnx"
    onnx.save(build_matmul(), str(good))
    wrong = [{"not_an_input": np.zeros((1, 64), np.float32)}]  # NNCF fails running the model on it
    # the cause named is the sample the fp32 model itself does not run, not NNCF's failure on it
    with pytest.raises(ModelLoadError, match=r"calibration sample \(not_an_input:\[1, 64\]\) does not run on mlp.onnx "
                                             r"itself .*dims in config.pbtxt, or set calibration_data"):
        quantize_static.quantize("nncf", good, tmp_path / "o2.onnx", wrong, print)
    import nncf

    def fails(*args, **kwargs):
        raise RuntimeError("no quantizer today")

    monkeypatch.setattr(nncf, "quantize", fails)
    with pytest.raises(ModelLoadError, match="NNCF could not quantize mlp.onnx for OpenVINO: RuntimeError: no quantizer "
                                             "today; .*engine=onnxruntime"):
        quantize_static.quantize("nncf", good, tmp_path / "o2.onnx", [{"x": np.zeros((1, 64), np.float32)}], print)
    with pytest.raises(ModelLoadError, match="no calibration sample"):
        quantize_static.quantize("onnxruntime", broken, tmp_path / "o3.onnx", [], print)


def test_nncf_quantizes_a_transformer_its_smoothquant_fails_on_without_it(tmp_path):
    """A MatMul whose weight the graph computes (a tied embedding's transpose as the LM head, as torch's dynamo
    exporter writes GPT-2) has no weight for NNCF's SmoothQuant, whose transformer default then fails (`'NoneType'
    object has no attribute 'shape'`) and failed the load; it is quantized again without SmoothQuant."""
    pytest.importorskip("nncf")
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    stored = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
              for name, shape in (("w", (8, 8)), ("embedding", (16, 8)))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["p"], axis=-1),
             helper.make_node("Transpose", ["embedding"], ["head"], perm=[1, 0]),
             helper.make_node("MatMul", ["p", "head"], ["y"])]
    graph = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 4, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", 4, 16])], stored)
    path, out = tmp_path / "lm.onnx", tmp_path / "lm.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    samples = [{"x": rng.standard_normal((1, 4, 8)).astype(np.float32)} for _ in range(8)]
    lines = []
    assert quantize_static.quantize("nncf", path, out, samples, lines.append) > 0
    assert any("NNCF's SmoothQuant failed on this graph" in line and "quantized without it" in line for line in lines)
    x = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32)}
    want, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, x)[0] for p in (path, out))
    assert compare("y", want, got).cosine >= 0.99
