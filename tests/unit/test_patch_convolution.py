"""compile/patch_convolution.py: a patch embedding's Conv (kernel = stride, no padding) written as a MatMul answers as
the Conv does, and ONNX Runtime's dynamic int8 (through `lower_precision`) then quantizes it; the convolutions it must
leave stay. Models exported by torch (a ViT-style patch embedding and its neighbours)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.compile.patch_convolution import patches_as_matmul


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": x})[0]


def _export(tmp_path, convolution, size: int = 32):
    torch = pytest.importorskip("torch")

    class Patches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = convolution(torch), torch.nn.Linear(16, 8)

        def forward(self, image):
            return self.head(self.embed(image).flatten(2).transpose(1, 2))  # [B, patches, 16] -> [B, patches, 8]

    torch.manual_seed(0)
    path = tmp_path / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(Patches().eval(), (torch.randn(2, 3, size, size),), str(path), input_names=["image"],
                          output_names=["y"], dynamic_axes={"image": {0: "batch"}}, opset_version=14, dynamo=False)
    return path


def test_a_patch_embedding_is_a_matmul_with_the_same_answers(tmp_path):
    path = _export(tmp_path, lambda torch: torch.nn.Conv2d(3, 16, 4, stride=4))
    model = onnx.load(str(path))
    rewritten, count = patches_as_matmul(model)
    assert count == 1 and "Conv" not in [node.op_type for node in rewritten.graph.node]
    weights = {init.name: tuple(init.dims) for init in rewritten.graph.initializer}
    assert (48, 16) in weights.values()  # [C·k·k, O]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-5, atol=1e-5)


def test_the_int8_lowering_quantizes_the_patch_embedding(tmp_path):
    from gebackend.compile.precision import lower_precision

    path = _export(tmp_path, lambda torch: torch.nn.Conv2d(3, 16, 4, stride=4))
    logs = []
    lowered = onnx.load(str(lower_precision(path, "int8", tmp_path / "lowered", logs.append)))
    ops = [node.op_type for node in lowered.graph.node]
    assert "Conv" not in ops and ops.count("MatMulInteger") == 2  # the patches' product and the head's
    assert any("1 patch embedding convolution(s)" in line for line in logs)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got, want = _run(lowered, x).ravel(), _run(onnx.load(str(path)), x).ravel()
    assert got @ want / np.linalg.norm(got) / np.linalg.norm(want) > 0.999


@pytest.mark.parametrize("convolution, size", [
    (lambda torch: torch.nn.Conv2d(3, 16, 3, padding=1), 32),  # padded, stride 1
    (lambda torch: torch.nn.Conv2d(3, 16, 4, stride=2), 32),  # overlapping patches
    (lambda torch: torch.nn.Conv2d(3, 16, 4, stride=4), 30),  # the size not a multiple of the patch
    (lambda torch: torch.nn.Conv2d(3, 16, 1), 32),  # one pixel: no patch
])
def test_other_convolutions_stay(tmp_path, convolution, size):
    model = onnx.load(str(_export(tmp_path, convolution, size)))
    rewritten, count = patches_as_matmul(model)
    assert count == 0 and rewritten is model
