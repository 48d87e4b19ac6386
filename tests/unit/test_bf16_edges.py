"""Static int8 of a model with bfloat16 inputs and outputs (compile/bf16_edges.py): both quantizers calibrate on
numpy arrays, which have no bfloat16, so they get a float32-edged copy; the quantized file has the bfloat16 edges
back, int8 products inside, and answers close to the fp32 model's. Before, both failed with ONNX Runtime's
"Numpy_type 256 can't be converted to MLDataType"."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

from gebackend.compile import bf16_edges
from gebackend.compile.quantize_static import count_qdq, quantize
from gebackend.compile import bfloat16
from gebackend.modelzoo import build_bf16_mlp, build_add_mul

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_float_edges_round_trip_to_the_same_graph():
    model = build_bf16_mlp()
    edges = bf16_edges.find(model)
    assert edges == bf16_edges.Edges(("x",), ("y",)) and not bf16_edges.find(build_add_mul())
    edged = onnx.ModelProto()
    edged.CopyFrom(model)
    bf16_edges.to_float(edged, edges)
    onnx.checker.check_model(edged, full_check=True)
    assert [(v.name, v.type.tensor_type.elem_type) for v in edged.graph.input] == [(f"x{bf16_edges.SUFFIX}", onnx.TensorProto.FLOAT)]
    assert [v.name for v in edged.graph.output] == [f"y{bf16_edges.SUFFIX}", "y32"]
    bf16_edges.restore(edged, edges)
    assert edged.SerializeToString() == model.SerializeToString()


def test_float_samples_are_exact_and_renamed():
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(BF16)
    (sample,) = bf16_edges.Edges(("x",), ("y",)).float_samples([{"x": x, "other": np.ones(1)}])
    assert set(sample) == {f"x{bf16_edges.SUFFIX}", "other"} and sample[f"x{bf16_edges.SUFFIX}"].dtype == np.float32
    np.testing.assert_array_equal(sample[f"x{bf16_edges.SUFFIX}"].astype(BF16), x)


@pytest.mark.parametrize("quantizer", ["onnxruntime", "nncf"])
def test_each_quantizer_takes_bfloat16_edges_and_gives_them_back(tmp_path, quantizer):
    import onnxruntime as ort

    path = tmp_path / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(build_bf16_mlp(), str(path))
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 64)).astype(BF16)} for _ in range(8)]
    out, lines = tmp_path / "cache" / "int8.onnx", []
    out.parent.mkdir()
    nodes = quantize(quantizer, path, out, samples, lines.append)
    quantized = onnx.load(str(out))
    assert nodes > 0 and count_qdq(quantized) == nodes
    assert [(v.name, v.type.tensor_type.elem_type) for v in quantized.graph.input] == [("x", onnx.TensorProto.BFLOAT16)]
    assert [(v.name, v.type.tensor_type.elem_type) for v in quantized.graph.output] == [
        ("y", onnx.TensorProto.BFLOAT16), ("y32", onnx.TensorProto.FLOAT)]
    assert "bfloat16 input(s) and output(s) x, y were float32 for the quantizer" in " ".join(lines)
    assert list(tmp_path.joinpath("cache").iterdir()) == [out]  # the float32 copy is gone
    x = rng.standard_normal((4, 64)).astype(BF16)
    names = ["y", "y32"]
    got = bfloat16.run(ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]), names, {"x": x})
    want = bfloat16.run(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), names, {"x": x})
    assert got[0].dtype == BF16 and got[1].dtype == np.float32
    for ours, ref in zip(got, want):
        ours, ref = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
        cosine = ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref))
        assert cosine > 0.99  # int8 of random weights, calibrated on 8 samples
        assert not np.array_equal(ours, ref)  # int8 ran: not the fp32 answer
