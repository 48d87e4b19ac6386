"""torch's nn.MultiheadAttention, sequence first (CLIP's and CN_CLIP's image encoder), answering with its first token:
the rows pass on its int8 lowering, and its last layer's keys and values read through their weights for the kept query
(compile/traced_projection.py: one weight for queries, keys and values, taken apart by a chain of data movement).

An int8 model is lowered from the file, before the static graph passes run; on a file whose attention reshapes read
their targets from `Shape`s the rows pass stops before the last layer's attention there, and in the static graph of
the int8 file the selection used to stop at the first MatMulInteger: the last layer's attention and output
projection ran for every token. Exported by torch and quantized by ONNX Runtime's `quantize_dynamic` (through
`lower_precision`).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from gebackend.compile import passes
from gebackend.compile.row_rules import GraphView

from test_unused_rows import _run
from test_unused_rows_int8 import _dims


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
    # the last layer's projections (queries, keys and values in one; output) and MLP quantize the kept token only:
    # the keys and values through their weights, read back from int8
    assert _dims(static, "MatMulInteger")[-4:] == [(1, 1, 96), (1, 32), (1, 1, 64), (1, 1, 32)]
    assert _dims(static, "DynamicQuantizeLinear")[-4:] == [(1, 1, 32), (1, 32), (1, 1, 32), (1, 1, 64)]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 10, 32)).astype(np.float32)}
    want, lowered, got = _run(fp32, feeds)[0], _run(int8, feeds)[0], _run(static, feeds)[0]
    # the kept token quantized with its own range: as close to fp32 as the int8 file, and close to it
    assert _cosine(got, want) >= _cosine(lowered, want) - 1e-3
    assert _cosine(got, lowered) > 0.999
    np.testing.assert_allclose(got, lowered, atol=0.05 * float(np.abs(want).max()))


@pytest.mark.parametrize("batch", [1, 3])
def test_the_last_layer_projects_its_kept_token_only(encoder, batch):
    fp32, _ = encoder
    static = passes.compile_graph(fp32, {"x": [batch, 10, 32]}, 1 << 20, lambda name, why: pytest.fail(f"{name}: {why}"))
    products = _dims(static, "MatMul") + _dims(static, "Gemm")
    # the first layer projects queries, keys and values for every token, sequence first; the last only its queries,
    # for the kept token; its keys and values per head through the weights
    assert products.count((10, batch, 96)) == 1 and (1, batch, 32) in products
    assert (batch, 4, 32, 1) in products and (batch, 4, 8, 1) in products
    # the queries' third of the stacked weight and bias is stored as such, not cut out of it on every run
    stored = {init.name for init in static.graph.initializer}
    assert not [node for node in static.graph.node if node.op_type == "Slice" and node.input[0] in stored]
    thirds = [tuple(init.dims) for init in static.graph.initializer if init.name.endswith("_rows__rows1")]
    assert sorted(thirds) == [(32,), (32, 32)]
    feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 10, 32)).astype(np.float32)}
    np.testing.assert_allclose(_run(static, feeds)[0], _run(fp32, feeds)[0], rtol=1e-5, atol=1e-5)


def test_keys_also_read_elsewhere_keep_their_projection(encoder, monkeypatch):
    """The traced keys of the last layer (sequence first); where a tensor of their chain is read by something other
    than a selection (here: also an output), the chain stays, and the scores read the projected keys as before."""
    from gebackend.compile import unused_rows
    from gebackend.compile.kept_query_attention import kept_query_attention
    from gebackend.compile.traced_projection import trace

    fp32, _ = encoder
    monkeypatch.setattr(unused_rows, "kept_query_attention", lambda model, view=None: (model, 0))
    static = passes.compile_graph(fp32, {"x": [1, 10, 32]}, 1 << 20, lambda name, why: pytest.fail(f"{name}: {why}"))
    maker = {out: node for node in static.graph.node for out in node.output}
    scores = maker[[node for node in static.graph.node if node.op_type == "Softmax"][-1].input[0]]
    traced, _ = trace(GraphView(static), scores)
    assert (traced.kind, traced.sequence_first, traced.heads, traced.d) == ("keys", True, 4, 8)
    static.graph.output.append(onnx.helper.make_tensor_value_info(maker[scores.input[1]].input[0],
                                                                  onnx.TensorProto.FLOAT, None))
    assert trace(GraphView(static), scores) is None
    rewritten, _ = kept_query_attention(static)
    assert scores.name in {node.name for node in rewritten.graph.node}
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 10, 32)).astype(np.float32)}
    np.testing.assert_allclose(_run(rewritten, feeds)[0], _run(fp32, feeds)[0], rtol=1e-5, atol=1e-5)
