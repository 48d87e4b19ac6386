"""The static ONNX Runtime engine: compiled graphs give the dynamic engine's outputs, weights are held once."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.compile.pipeline import compile_static
from gebackend.config.options import BackendOptions
from gebackend.engines.base import EngineInputError
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.engines.onnxruntime_static import OrtStaticEngine
from gebackend.modelzoo import build_bert, build_identity_fixed, build_resnet

CASES = {
    "resnet": (build_resnet, [{"image": (b, 3, 64, 64)} for b in (1, 4)]),
    "bert": (build_bert, [{"input_ids": (b, s), "attention_mask": (b, s)} for b in (1, 4) for s in (8, 32)]),
    "identity": (build_identity_fixed, [{"x": (2, 3)}]),
}


def feeds_for(shapes, rng):
    feeds = {}
    for name, shape in shapes.items():
        if name == "input_ids":
            feeds[name] = rng.integers(0, 1000, size=shape, dtype=np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones(shape, np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("case", sorted(CASES))
def test_static_engine_equals_dynamic_engine(case, tmp_path):
    build, shape_sets = CASES[case]
    path = tmp_path / "model.onnx"
    onnx.save(build(), str(path))
    logged = []
    graphs, report = compile_static(path, shape_sets, 1 << 20, logged.append)
    assert len(logged) == len(shape_sets) and report.first_break is None
    static = OrtStaticEngine(graphs, BackendOptions())
    dynamic = OrtEngine(path, BackendOptions())
    outputs = [o.name for o in ort.InferenceSession(str(path)).get_outputs()]
    rng = np.random.default_rng(0)
    for shapes in shape_sets:
        feeds = feeds_for(shapes, rng)
        for _ in range(2):  # the bound buffers are reused: a second run must not see the first's data
            got = static.run(feeds, outputs)
            want = dynamic.run(feeds, outputs)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            feeds = feeds_for(shapes, rng)


def test_outputs_are_not_overwritten_by_the_next_run(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    graphs, _ = compile_static(path, [{"image": (1, 3, 64, 64)}], 1 << 20)
    engine = OrtStaticEngine(graphs, BackendOptions())
    rng = np.random.default_rng(1)
    first = engine.run(feeds_for({"image": (1, 3, 64, 64)}, rng), ["logits"])[0]
    kept = first.copy()
    engine.run(feeds_for({"image": (1, 3, 64, 64)}, rng), ["logits"])
    np.testing.assert_array_equal(first, kept)


def test_unknown_shape_is_an_input_error(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    graphs, _ = compile_static(path, [{"image": (1, 3, 64, 64)}], 1 << 20)
    engine = OrtStaticEngine(graphs, BackendOptions())
    with pytest.raises(EngineInputError, match=r"\[2, 3, 64, 64\]"):
        engine.run({"image": np.zeros((2, 3, 64, 64), np.float32)}, ["logits"])


def test_weights_are_held_once_across_buckets(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_bert(hidden=64), str(path))
    one, _ = compile_static(path, [{"input_ids": (1, 16), "attention_mask": (1, 16)}], 1 << 20)
    many, _ = compile_static(path, [{"input_ids": (b, 16), "attention_mask": (b, 16)} for b in range(1, 9)], 1 << 20)
    single = OrtStaticEngine(one, BackendOptions())
    eight = OrtStaticEngine(many, BackendOptions())
    assert single.shared_weight_bytes > 200_000
    assert eight.shared_weight_bytes == single.shared_weight_bytes


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="CUDAExecutionProvider is not available (CPU-only onnxruntime or no GPU): CUDA-graph capture is exercised on a GPU machine",
)
def test_cuda_graph_static_engine_equals_cpu(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    shapes = [{"image": (b, 3, 64, 64)} for b in (1, 4)]
    graphs, _ = compile_static(path, shapes, 1 << 20)
    gpu = OrtStaticEngine(graphs, BackendOptions(), providers=[("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"])
    assert "cuda_graph=on" in gpu.describe()
    cpu = OrtEngine(path, BackendOptions())
    rng = np.random.default_rng(2)
    for shape in shapes:
        for _ in range(3):  # replays of the captured graph see new inputs
            feeds = feeds_for(shape, rng)
            np.testing.assert_allclose(gpu.run(feeds, ["logits"])[0], cpu.run(feeds, ["logits"])[0], rtol=1e-3, atol=1e-4)


def test_graph_capture_is_requested_from_accelerator_providers():
    from gebackend.engines.onnxruntime_static import _with_graph_capture

    assert _with_graph_capture(("CUDAExecutionProvider", {"device_id": "0"})) == (
        "CUDAExecutionProvider", {"device_id": "0", "enable_cuda_graph": "1"})
    assert _with_graph_capture("CANNExecutionProvider") == ("CANNExecutionProvider", {"enable_cann_graph": "1"})
    assert _with_graph_capture("CPUExecutionProvider") == "CPUExecutionProvider"


@pytest.mark.parametrize(
    "engine,precision,expected",
    [("auto", "origin", "onnxruntime"), ("auto", "int8", "onnxruntime"), ("onnxruntime", "bf16", "onnxruntime"),
     ("openvino", "origin", "openvino")],
)
def test_engine_choice(engine, precision, expected):
    from gebackend.engines import engine_name

    assert engine_name(BackendOptions(engine=engine, precision_mode=precision)) == expected


def test_auto_engine_takes_openvino_for_bf16_when_installed():
    pytest.importorskip("openvino")
    from gebackend.engines import engine_name

    assert engine_name(BackendOptions(engine="auto", precision_mode="bf16")) == "openvino"


def test_out_of_range_token_id_is_the_requests_fault(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_bert(), str(path))
    graphs, _ = compile_static(path, [{"input_ids": (1, 4), "attention_mask": (1, 4)}], 1 << 20)
    engine = OrtStaticEngine(graphs, BackendOptions())
    with pytest.raises(EngineInputError, match="out of data bounds"):
        engine.run({"input_ids": np.array([[1, 2, 5000, 3]]), "attention_mask": np.ones((1, 4), np.int64)}, ["pooler_output"])


def test_only_the_source_files_weights_are_shared(tmp_path):
    """Constants made by folding stay with their session: overriding them broke ORT on CN_CLIP's ViT."""
    path = tmp_path / "model.onnx"
    onnx.save(build_bert(), str(path))
    original = {init.name for init in onnx.load(str(path)).graph.initializer}
    graphs, _ = compile_static(path, [{"input_ids": (2, 16), "attention_mask": (2, 16)}], 1 << 20)
    folded = {i.name for i in graphs[0].model.graph.initializer} - original
    assert folded, "folding should have made new constants"
    engine = OrtStaticEngine(graphs, BackendOptions())
    assert set(engine._shared) <= original
