"""Models over 2 GB go to ONNX Runtime's quantizers by path (they cannot be loaded whole): the quantizers' scratch
file `<stem>-inferred.onnx` must land in a private folder, never beside the model (a read-only repository, or two
instances lowering one file at once), and the external data must still resolve. The 2 GB rule is patched to say
"large" for a small model saved with external data, as a real >2 GB file would be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.compile import precision
from gebackend.compile.calibration import random_samples
from gebackend.compile.precision import lower_precision
from test_quantize_static import build_matmul  # noqa: E402 - same folder


@pytest.fixture
def large_model(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "repo" / "mlp" / "1"
    (folder / "weights").mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save_model(build_matmul(), str(path), save_as_external_data=True, location="weights/model.onnx.data",
                    size_threshold=0)
    (folder / "model-inferred.onnx").write_text("a user's file of that name")
    monkeypatch.setattr(precision, "_large", lambda p: True)
    return path


@pytest.fixture
def inferred_paths(monkeypatch) -> list[Path]:
    seen = []
    real = onnx.shape_inference.infer_shapes_path

    def recording(model_path, output_path="", *args, **kwargs):
        seen.append(Path(output_path or model_path))
        return real(model_path, output_path, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", recording)
    return seen


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("quantization", ["dynamic", "static"])
def test_a_large_model_is_quantized_without_writing_beside_it(large_model, inferred_paths, tmp_path, quantization):
    folder = large_model.parent
    before = _listing(folder)
    samples = random_samples(large_model, count=4) if quantization == "static" else None
    out = lower_precision(large_model, "int8", tmp_path / "cache", quantization=quantization, samples=samples)

    assert inferred_paths, "the quantizer was expected to infer shapes by path for a large model"
    for written in inferred_paths:
        assert folder not in written.parents and written.parent != folder, written
    assert _listing(folder) == before  # nothing written, nothing removed, the user's *-inferred.onnx untouched
    assert not list((tmp_path / "cache").glob("quantize.*"))  # the private folder is gone

    x = np.random.default_rng(7).standard_normal((3, 64)).astype(np.float32)
    reference, lowered = _run(large_model, x), _run(out, x)
    cosine = float(np.sum(reference * lowered) / np.linalg.norm(reference) / np.linalg.norm(lowered))
    assert cosine > 0.99
    ops = {node.op_type for node in onnx.load(str(out), load_external_data=False).graph.node}
    assert ops & ({"MatMulInteger", "DynamicQuantizeMatMul"} if quantization == "dynamic" else {"QuantizeLinear"})


def test_a_small_model_goes_to_the_quantizer_loaded(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(build_matmul(), str(path))
    with precision.quantizer_source(path, tmp_path / "scratch") as source:
        assert isinstance(source, onnx.ModelProto)
    assert not (tmp_path / "scratch").exists()
