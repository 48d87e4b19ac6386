"""Static graph mode keeps ONNX Runtime's fusions: the compiled (specialised, folded) graph, optimised by ORT the way the
static engine's sessions are, has the fused ops the dynamic graph gets (issue 12: the fold erased a LayerNorm's
Mul-by-ones/Add-of-zeros and the zero biases of a freshly initialised export, so LayerNormFusion and BiasGelu stopped
firing and static ran slower than dynamic); its outputs are the dynamic engine's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile.pipeline import compile_static
from gebackend.config.options import BackendOptions
from gebackend.engines.onnxruntime import OrtEngine, disabled_optimizers, session_options
from gebackend.engines.onnxruntime_static import OrtStaticEngine

HIDDEN, INNER, SEQ = 16, 32, 8
CNCLIP_TEXT_L4 = Path(__file__).resolve().parents[2] / "bench" / "models" / "cnclip_text_l4" / "model.onnx"


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def build_encoder_block(seed: int = 0) -> onnx.ModelProto:
    """A text encoder's block as torch exports it fresh: LayerNorm (gamma ones, beta zeros) written out op by op,
    Linear with a zero bias, erf-GELU, Linear with a zero bias; batch dim symbolic."""
    rng = np.random.default_rng(seed)
    inits = [
        _const("ln.weight", np.ones(HIDDEN)), _const("ln.bias", np.zeros(HIDDEN)),
        _const("two", 2.0), _const("eps", 1e-5), _const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5),
        _const("fc1.weight", rng.standard_normal((HIDDEN, INNER)) * 0.1), _const("fc1.bias", np.zeros(INNER)),
        _const("fc2.weight", rng.standard_normal((INNER, HIDDEN)) * 0.1), _const("fc2.bias", np.zeros(HIDDEN)),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["centered"]),
        helper.make_node("Pow", ["centered", "two"], ["squared"]),
        helper.make_node("ReduceMean", ["squared"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["centered", "std"], ["normed"]),
        helper.make_node("Mul", ["normed", "ln.weight"], ["scaled"]),
        helper.make_node("Add", ["scaled", "ln.bias"], ["ln_out"]),
        helper.make_node("MatMul", ["ln_out", "fc1.weight"], ["fc1_mm"]),
        helper.make_node("Add", ["fc1.bias", "fc1_mm"], ["fc1_out"]),
        helper.make_node("Div", ["fc1_out", "sqrt2"], ["g_div"]),
        helper.make_node("Erf", ["g_div"], ["g_erf"]),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"]),
        helper.make_node("Mul", ["fc1_out", "g_add"], ["g_mul"]),
        helper.make_node("Mul", ["g_mul", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "fc2.weight"], ["fc2_mm"]),
        helper.make_node("Add", ["fc2.bias", "fc2_mm"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "encoder_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SEQ, HIDDEN])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def optimized_ops(source, tmp_path: Path, name: str, static: bool) -> Counter:
    """The op types ORT runs for `source` when it builds it as the engines do (their session options and defaults)."""
    options = BackendOptions()
    so = session_options(options.session)
    so.optimized_model_filepath = str(tmp_path / f"optimized_{name}.onnx")
    if isinstance(source, onnx.ModelProto):
        source = source.SerializeToString()
    ort.InferenceSession(source if isinstance(source, bytes) else str(source), so, providers=["CPUExecutionProvider"],
                         disabled_optimizers=disabled_optimizers(options.session, static=static))
    return Counter(n.op_type for n in onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


def assert_same_fusions(dynamic: Counter, static: Counter) -> None:
    assert dynamic["LayerNormalization"] > 0
    assert static["LayerNormalization"] == dynamic["LayerNormalization"], (dynamic, static)
    # with fixed dims ORT moves a GELU's bias Add into a Gemm (MatMulAddFusion), leaving Gelu where dynamic has BiasGelu
    assert static["Gelu"] + static["BiasGelu"] == dynamic["Gelu"] + dynamic["BiasGelu"] > 0, (dynamic, static)
    for unfused in ("Pow", "ReduceMean", "Sqrt", "Erf"):  # a LayerNorm or GELU written out op by op
        assert static[unfused] == dynamic[unfused] == 0, (unfused, dynamic, static)


@pytest.mark.parametrize("batch", [1, 4])
def test_static_graph_keeps_the_dynamic_graphs_fusions(tmp_path, batch):
    path = tmp_path / "model.onnx"
    onnx.save(build_encoder_block(), str(path))
    graphs, _ = compile_static(path, [{"x": (batch, SEQ, HIDDEN)}], 1 << 20)
    assert_same_fusions(optimized_ops(path, tmp_path, "dynamic", static=False),
                        optimized_ops(graphs[0].model, tmp_path, "static", static=True))


def test_fold_keeps_identity_valued_weights(tmp_path):
    """The Mul by ones and the Adds of zeros are what ORT's fusions match: the fold leaves them in the graph."""
    path = tmp_path / "model.onnx"
    onnx.save(build_encoder_block(), str(path))
    graphs, _ = compile_static(path, [{"x": (2, SEQ, HIDDEN)}], 1 << 20)
    used = {name for node in graphs[0].model.graph.node for name in node.input}
    assert {"ln.weight", "ln.bias", "fc1.bias", "fc2.bias"} <= used


def test_static_engine_equals_dynamic_engine_on_the_block(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_encoder_block(), str(path))
    shapes = [{"x": (b, SEQ, HIDDEN)} for b in (1, 2, 4)]
    graphs, _ = compile_static(path, shapes, 1 << 20)
    static = OrtStaticEngine(graphs, BackendOptions())
    dynamic = OrtEngine(path, BackendOptions())
    try:
        assert "shared across 3 bucket(s)" in static.describe() and "prepacking kept" in static.describe()
        rng = np.random.default_rng(1)
        for shape in shapes:
            x = rng.standard_normal(shape["x"]).astype(np.float32)
            np.testing.assert_allclose(static.run({"x": x}, ["y"])[0], dynamic.run({"x": x}, ["y"])[0], rtol=1e-4, atol=1e-5)
    finally:
        static.close()
        dynamic.close()


@pytest.mark.skipif(not CNCLIP_TEXT_L4.exists(), reason="bench/models/cnclip_text_l4 not built here")
def test_cnclip_text_encoder_keeps_its_fusions(tmp_path):
    """The model of issue 12: 9 LayerNormalization and 4 GELU fusions, in both graph modes."""
    graphs, _ = compile_static(CNCLIP_TEXT_L4, [{"text": (1, 52)}], 1 << 20)
    static_path = tmp_path / "static.onnx"
    onnx.save(graphs[0].model, str(static_path))
    del graphs
    dynamic = optimized_ops(CNCLIP_TEXT_L4, tmp_path, "dynamic", static=False)
    static = optimized_ops(static_path, tmp_path, "static", static=True)
    assert_same_fusions(dynamic, static)
    assert static["LayerNormalization"] == 9 and static["Gelu"] + static["BiasGelu"] == 4
