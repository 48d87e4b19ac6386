"""compile/unused_rows.py on int8 graphs: the rows pass moves a selection through the ops ONNX Runtime's quantizers
write (DynamicQuantizeLinear, MatMulInteger, QuantizeLinear, DequantizeLinear).

An int8 model is lowered from the file, before the static graph passes run; on a file whose attention reshapes read
their targets from `Shape`s (torch's `nn.MultiheadAttention`, sequence first, as CN_CLIP's image encoder) the rows
pass stops before the last layer's attention there, and in the static graph of the int8 file the selection used to
stop at the first MatMulInteger: the last layer's attention and output projection ran for every token. Exported by
torch and quantized by ONNX Runtime's `quantize_dynamic` (through `lower_precision`); small graphs for what must stop
the selection.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile import passes
from gebackend.compile.row_rules import GraphView
from gebackend.compile.unused_rows import prune_unused_rows


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _dims(model: onnx.ModelProto, op_type: str) -> list[tuple]:
    view = GraphView(model)
    return [view.dims.get(node.output[0]) for node in model.graph.node if node.op_type == op_type]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """Two pre-norm blocks of torch's nn.MultiheadAttention, sequence first, answering with the first token; the file
    and its int8 lowering (ONNX Runtime's dynamic quantization, as precision_mode=int8 lowers it)."""
    torch = pytest.importorskip("torch")
    from gebackend.compile.precision import lower_precision

    class Block(torch.nn.Module):
        def __init__(self, width: int = 32, heads: int = 4) -> None:
            super().__init__()
            self.norm, self.attn = torch.nn.LayerNorm(width), torch.nn.MultiheadAttention(width, heads)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                           torch.nn.Linear(2 * width, width))

        def forward(self, x):
            h = self.norm(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(x)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.Sequential(Block(), Block())

        def forward(self, x):  # [batch, tokens, width] -> the first token, through a sequence-first stack
            return self.blocks(x.permute(1, 0, 2))[0]

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mha")
    path = folder / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(Encoder().eval(), (torch.randn(2, 10, 32),), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}}, opset_version=14, dynamo=False)
    lowered = lower_precision(path, "int8", folder / "lowered")
    return onnx.load(str(path)), onnx.load(str(lowered))


def test_int8_static_graph_runs_the_last_attention_for_the_kept_token_only(encoder):
    fp32, int8 = encoder
    static = passes.compile_graph(int8, {"x": [1, 10, 32]}, 1 << 20, lambda name, why: pytest.fail(f"{name}: {why}"))
    assert _dims(static, "Softmax") == [(1, 4, 10, 10), (1, 4, 1, 10)]  # the last layer's scores: one query row
    # the last layer's output projection and MLP quantize and multiply the kept token only
    assert _dims(static, "MatMulInteger")[-3:] == [(1, 32), (1, 1, 64), (1, 1, 32)]
    assert _dims(static, "DynamicQuantizeLinear")[-3:] == [(1, 32), (1, 1, 32), (1, 1, 64)]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 10, 32)).astype(np.float32)}
    want, lowered, got = _run(fp32, feeds)[0], _run(int8, feeds)[0], _run(static, feeds)[0]
    # the kept token quantized with its own range: as close to fp32 as the int8 file, and close to it
    assert _cosine(got, want) >= _cosine(lowered, want) - 1e-3
    assert _cosine(got, lowered) > 0.999
    np.testing.assert_allclose(got, lowered, atol=0.05 * float(np.abs(want).max()))


def _quantized_rows(scale_is_output: bool = False, zero_point_per_row: bool = False, tokens: int = 6) -> onnx.ModelProto:
    """x [1, tokens, 8] -> DynamicQuantizeLinear -> MatMulInteger (int8 weight) -> Cast -> Mul(scale) -> token 0."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.integers(-127, 128, (8, 4)).astype(np.int8), "w")
    weight_zero = numpy_helper.from_array(np.array(0, np.int8), "w_zero")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero"])]
    zero = "zero"
    if zero_point_per_row:
        nodes.append(helper.make_node("Expand", ["zero", "rows"], ["zero_rows"]))
        zero = "zero_rows"
    nodes += [
        helper.make_node("MatMulInteger", ["q", "w", zero, "w_zero"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_f", "scale"], ["scaled"]),
        helper.make_node("Gather", ["scaled", "first"], ["y"], axis=1),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]
    if scale_is_output:
        outputs.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "int8_rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, 8])],
                              outputs, [weight, weight_zero, numpy_helper.from_array(np.array(0, np.int64), "first"),
                                        numpy_helper.from_array(np.array([tokens], np.int64), "rows")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dynamic_quantization_moved_quantizes_the_kept_rows_with_their_own_range():
    model = _quantized_rows()
    pruned, moved = prune_unused_rows(model)
    assert moved == 4 and _dims(pruned, "DynamicQuantizeLinear") == [(1, 1, 8)]
    x = np.random.default_rng(2).standard_normal((1, 6, 8)).astype(np.float32)
    x[0, 3] *= 20  # a row far from the kept one: the whole tensor's range would quantize the kept row coarsely
    got = _run(pruned, {"x": x})[0]
    alone = _run(_quantized_rows(tokens=1), {"x": np.ascontiguousarray(x[:, :1])})[0]
    np.testing.assert_array_equal(got, alone)  # row 0 quantized on its own
    assert not np.allclose(got, _run(model, {"x": x})[0], atol=1e-3)  # and not as the whole tensor quantized it


@pytest.mark.parametrize("what", ["the scale is an output", "a zero point per row"])
def test_a_quantization_the_kept_rows_cannot_describe_stops_the_selection(what):
    model = _quantized_rows(scale_is_output=what == "the scale is an output",
                            zero_point_per_row=what == "a zero point per row")
    pruned, _ = prune_unused_rows(model)
    assert _dims(pruned, "DynamicQuantizeLinear") == [(1, 6, 8)]  # the MatMulInteger after it, for the kept row only
    if what == "a zero point per row":
        assert _dims(pruned, "MatMulInteger") == [(1, 6, 4)]
        return  # ONNX Runtime's MatMulInteger takes a zero point per tensor only: the graph is the spec's, not run
    x = np.random.default_rng(3).standard_normal((1, 6, 8)).astype(np.float32)
    for got, want in zip(_run(pruned, {"x": x}), _run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def _qdq_rows(axis: int | None) -> onnx.ModelProto:
    """x [1, 6, 8] -> QuantizeLinear -> DequantizeLinear (scale per tensor, or per slice of `axis`) -> MatMul -> token 0."""
    rng = np.random.default_rng(4)
    size = 1 if axis is None else (1, 6, 8)[axis]
    scale = numpy_helper.from_array(np.full(size, 0.02, np.float32).reshape(() if axis is None else (size,)), "s")
    zero = numpy_helper.from_array(np.full(size, 3, np.uint8).reshape(() if axis is None else (size,)), "z")
    per_axis = {} if axis is None else {"axis": axis}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **per_axis),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **per_axis),
        helper.make_node("MatMul", ["d", "w"], ["m"]),
        helper.make_node("Gather", ["m", "first"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "qdq_rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [scale, zero, numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
                               numpy_helper.from_array(np.array(0, np.int64), "first")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("axis, rows", [(None, 1), (2, 1), (1, 6)])
def test_quantize_dequantize_pass_rows_unless_their_scales_run_along_them(axis, rows):
    model = _qdq_rows(axis)
    pruned, _ = prune_unused_rows(model)
    assert _dims(pruned, "QuantizeLinear") == [(1, rows, 8)] and _dims(pruned, "DequantizeLinear") == [(1, rows, 8)]
    x = np.random.default_rng(5).standard_normal((1, 6, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(pruned, {"x": x})[0], _run(model, {"x": x})[0])
