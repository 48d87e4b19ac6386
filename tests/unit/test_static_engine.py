"""The static ONNX Runtime engine: compiled graphs give the dynamic engine's outputs, weights are held once; static mode
serves what dynamic mode serves (old opsets, failing passes, data-dependent output shapes, strings, scalars)."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile.pipeline import compile_static
from gebackend.config.onnx_signature import read_signature
from gebackend.config.options import BackendOptions
from gebackend.config.spec import build_model_spec
from gebackend.engines.base import EngineInputError
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.engines.onnxruntime_static import OrtStaticEngine
from gebackend.errors import ModelLoadError
from gebackend.modelzoo import build_bert, build_identity_fixed, build_nonzero, build_resnet
from gebackend.runtime.loader import load_executor
from gebackend.runtime.runners import InternalError

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


def test_a_bucket_failing_on_the_shared_weights_holds_its_own_copy(tmp_path, monkeypatch):
    """ONNX Runtime ran a QDQ int8 ViT from its file but failed every run once its position embedding was handed in
    with add_initializer ("Attempting to broadcast an axis by a dimension other than 1"; bench cnclip_image_l4
    ge_int8_static on an AVX2-only EPYC). Here a shared value of the wrong shape fails the same way: the warm-up
    finds it, the bucket is rebuilt on its file's own weights, and serves the right answer."""
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(width=8, image_size=32), str(path))
    graphs, _ = compile_static(path, [{"image": (b, 3, 32, 32)} for b in (1, 2)], 1 << 20)
    prepare = OrtStaticEngine._prepare

    def corrupting(self, number, graph):
        prepared = prepare(self, number, graph)
        for key, (array, _) in list(self._shared.items()):
            self._shared[key] = (array, ort.OrtValue.ortvalue_from_numpy(np.zeros(array.size, array.dtype)))
        return prepared

    monkeypatch.setattr(OrtStaticEngine, "_prepare", corrupting)
    static = OrtStaticEngine(graphs, BackendOptions())
    monkeypatch.undo()
    dynamic = OrtEngine(path, BackendOptions())
    outputs = [o.name for o in ort.InferenceSession(str(path)).get_outputs()]
    feeds = feeds_for({"image": (2, 3, 32, 32)}, np.random.default_rng(0))
    np.testing.assert_allclose(static.run(feeds, outputs)[0], dynamic.run(feeds, outputs)[0], rtol=1e-4, atol=1e-5)
    assert "2 bucket(s) failed on the shared weights and hold their own copy" in static.describe(), static.describe()


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
    """A plain providers list (no spec) still gets graph capture on its first entry (engines/providers/)."""
    from gebackend.engines.providers import as_selection

    shapes = {"x": (1, 4)}
    cuda = as_selection([("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"])
    assert cuda.for_bucket(0, shapes, capture=True) == [
        ("CUDAExecutionProvider", {"device_id": "0", "enable_cuda_graph": "1"}), "CPUExecutionProvider"]
    assert cuda.run_config(3, captured=True) == {"gpu_graph_id": "3"}
    assert as_selection(["CANNExecutionProvider"]).for_bucket(0, shapes, True) == [
        ("CANNExecutionProvider", {"enable_cann_graph": "1"})]
    assert as_selection(["CPUExecutionProvider"]).for_bucket(0, shapes, True) == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    "engine,precision,expected",
    [("auto", "origin", "onnxruntime"), ("auto", "int8", "onnxruntime"), ("onnxruntime", "bf16", "onnxruntime"),
     ("openvino", "origin", "openvino")],
)
def test_engine_choice(engine, precision, expected):
    from gebackend.engines import engine_name

    assert engine_name(BackendOptions.make(engine=engine, precision_mode=precision).engines) == expected


def test_auto_engine_takes_openvino_for_bf16_when_installed():
    pytest.importorskip("openvino")
    from gebackend.engines import engine_name

    assert engine_name(BackendOptions.make(engine="auto", precision_mode="bf16").engines) == "openvino"


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


# ------------------------------------------------------------- every model dynamic mode takes (old opsets, failing passes)

ENGINES = ["onnxruntime"] + (["openvino"] if importlib.util.find_spec("openvino") else [])


def _served(path, static: bool, engine: str = "onnxruntime", max_batch_size: int = 0, dims=None, **options):
    """The executor a server builds for this file (config.pbtxt as a dict), and the load log."""
    config = {"name": "m", "max_batch_size": max_batch_size}
    if dims is not None:
        signature = {t.name: t for t in read_signature(path).inputs}
        config["input"] = [{"name": n, "data_type": signature[n].dtype.triton, "dims": list(d)} for n, d in dims.items()]
    opts = BackendOptions.make(engine=engine, static_model=static, **options)
    spec = build_model_spec(config, read_signature(path), path, opts)
    log: list[str] = []
    executor, how = load_executor(spec, log=log.append)
    return executor, log


def _answer(executor, feeds):
    (result,) = executor.execute([feeds])
    assert not isinstance(result, Exception), result
    return result


def _legacy_cnn(opset: int) -> onnx.ModelProto:
    """A model-zoo style CNN: IR 3, every initializer also listed as a graph input, opset 6 or 7."""
    rng = np.random.default_rng(7)
    weights = {"conv_w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
               "conv_b": rng.standard_normal(4).astype(np.float32),
               "skip_w": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
               "fc_w": rng.standard_normal((4, 5)).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["data", "conv_w", "conv_b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["data", "skip_w"], ["s"], kernel_shape=[1, 1]),
        helper.make_node("Sum", ["r", "s"], ["a"]),  # ONNX Runtime has no Add(6) kernel: Sum runs at opset 6 and 7
        helper.make_node("GlobalAveragePool", ["a"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "fc_w"], ["scores"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    graph = helper.make_graph(
        nodes, "legacy",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, 8, 8])]
        + [helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)) for i in inits],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("opset", [6, 7])
def test_an_old_opset_model_serves_static_as_dynamic(opset, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_legacy_cnn(opset), str(path))
    dynamic, _ = _served(path, static=False, max_batch_size=4)
    static, log = _served(path, static=True, max_batch_size=4)
    assert not [line for line in log if "WARNING" in line], log  # opset 6 is upgraded to 7, then folded
    data = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    want = _answer(dynamic, {"data": data})["scores"]
    got = _answer(static, {"data": data})["scores"]  # batch 3 runs padded in the batch-4 bucket
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert abs(float(want[0, 0])) > 0  # a real answer, not zeros


def test_a_failing_fold_is_skipped_with_one_warning_and_the_model_serves(tmp_path, monkeypatch):
    from gebackend.compile import fold

    def broken(model, size_limit):
        raise AttributeError("'NoneType' object has no attribute 'opset_import'")

    monkeypatch.setattr(fold, "fold_constants", broken)
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    static, log = _served(path, static=True, max_batch_size=4)  # batch buckets 1, 2, 4: three graphs
    warnings = [line for line in log if "WARNING" in line]
    assert warnings == ["WARNING: static graph pass 'fold' skipped: onnxslim failed: AttributeError: 'NoneType' object "
                        "has no attribute 'opset_import'; the graph is not folded"]
    assert "graph doctor: note: pass 'fold' skipped" in "\n".join(log)
    image = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = OrtEngine(path, BackendOptions()).run({"image": image}, ["logits"])[0]
    np.testing.assert_allclose(_answer(static, {"image": image})["logits"], want, rtol=1e-4, atol=1e-5)


def test_a_failing_shape_inference_is_skipped_and_the_model_serves(tmp_path, monkeypatch):
    def gives_up(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] gave up")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", gives_up)
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    static, log = _served(path, static=True, max_batch_size=1)
    warnings = [line for line in log if "WARNING" in line and "'shape inference'" in line]
    assert len(warnings) == 1 and "InferenceError: [ShapeInferenceError] gave up" in warnings[0], log
    image = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = OrtEngine(path, BackendOptions()).run({"image": image}, ["logits"])[0]
    np.testing.assert_allclose(_answer(static, {"image": image})["logits"], want, rtol=1e-4, atol=1e-5)


def test_an_unconvertible_old_opset_is_served_unfolded(tmp_path, monkeypatch):
    from gebackend.compile import upgrade

    def no_adapter(model, target=7):
        raise RuntimeError("adapter_lookup: Assertion `false` failed: No Adapter For Relu")

    monkeypatch.setattr(upgrade, "upgrade_opset", no_adapter)
    path = tmp_path / "model.onnx"
    onnx.save(_legacy_cnn(6), str(path))
    static, log = _served(path, static=True, max_batch_size=2)
    warnings = [line for line in log if "WARNING" in line]
    assert len(warnings) == 2, log
    assert "pass 'upgrade' skipped: converting opset 6 to 7 with onnx.version_converter failed: RuntimeError" in warnings[0]
    assert warnings[1].endswith("pass 'fold' skipped: onnxslim needs opset >= 7 and the model has opset 6; the graph is not folded")
    data = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    dynamic, _ = _served(path, static=False, max_batch_size=2)
    np.testing.assert_allclose(_answer(static, {"data": data})["scores"], _answer(dynamic, {"data": data})["scores"],
                               rtol=1e-5, atol=1e-5)


def test_a_static_graph_the_engine_refuses_serves_the_dynamic_graph_with_one_warning(tmp_path, monkeypatch):
    import gebackend.runtime.loader as loader

    def refuses(*args, **kwargs):  # as ONNX Runtime refused a specialised file whose If holds an LSTM
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(loader, "create_static_engine", refuses)
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    executor, log = _served(path, static=True, max_batch_size=2)
    warnings = [line for line in log if "WARNING" in line]
    assert len(warnings) == 1, log
    assert "the static graph could not be built (IndexError: tuple index out of range)" in warnings[0]
    assert "served on the dynamic graph" in warnings[0]
    image = np.random.default_rng(4).standard_normal((2, 3, 64, 64)).astype(np.float32)
    want = OrtEngine(path, BackendOptions()).run({"image": image}, ["logits"])[0]
    np.testing.assert_allclose(_answer(executor, {"image": image})["logits"], want, rtol=1e-5, atol=1e-6)


def test_a_bucket_the_engine_refuses_runs_on_the_dynamic_graph_beside_the_others(tmp_path, monkeypatch):
    import gebackend.runtime.loader as loader

    real = loader.create_static_engine

    def refuses_batch_4(spec, graphs, *args, **kwargs):
        if any(graph.shapes["image"][0] == 4 for graph in graphs):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Node (If_0) Op (If) [TypeInferenceError]")
        return real(spec, graphs, *args, **kwargs)

    monkeypatch.setattr(loader, "create_static_engine", refuses_batch_4)
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    config = {"name": "m", "max_batch_size": 4}
    spec = build_model_spec(config, read_signature(path), path, BackendOptions.make(static_model=True))
    log: list[str] = []
    executor, how = load_executor(spec, log=log.append)
    warnings = [line for line in log if "WARNING" in line]
    assert len(warnings) == 1 and "bucket [image:[4, 3, 64, 64]] could not be built (RuntimeError: " in warnings[0], log
    assert "TypeInferenceError" in warnings[0] and "run on the dynamic graph beside the other buckets" in warnings[0]
    assert "static graph, buckets [image:[1, 3, 64, 64] | image:[2, 3, 64, 64]], fallback=dynamic" in how, how
    for rows in (1, 3, 4):  # 3 and 4 were the refused bucket's
        image = np.random.default_rng(rows).standard_normal((rows, 3, 64, 64)).astype(np.float32)
        want = OrtEngine(path, BackendOptions()).run({"image": image}, ["logits"])[0]
        np.testing.assert_allclose(_answer(executor, {"image": image})["logits"], want, rtol=1e-4, atol=1e-5)


def test_a_free_dim_with_static_model_serves_the_dynamic_graph(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_bert(), str(path))
    executor, log = _served(path, static=True, max_batch_size=2)
    warnings = [line for line in log if "WARNING" in line]
    assert len(warnings) == 1 and "dim 1 ('sequence') is free and no bucket fixes it" in warnings[0], log
    feeds = {"input_ids": np.ones((2, 5), np.int64), "attention_mask": np.ones((2, 5), np.int64)}
    want = OrtEngine(path, BackendOptions()).run(feeds, ["pooler_output"])[0]
    np.testing.assert_allclose(_answer(executor, feeds)["pooler_output"], want, rtol=1e-5, atol=1e-6)


def test_a_model_neither_graph_can_build_is_a_load_error_naming_both(tmp_path, monkeypatch):
    import gebackend.runtime.loader as loader

    def crashes(*args, **kwargs):
        raise IndexError("tuple index out of range")

    def refuses(*args, **kwargs):
        raise ModelLoadError("engine=onnxruntime cannot load it")

    monkeypatch.setattr(loader, "create_static_engine", crashes)
    monkeypatch.setattr(loader, "create_engine", refuses)
    path = tmp_path / "model.onnx"
    onnx.save(build_identity_fixed(), str(path))
    with pytest.raises(ModelLoadError, match=r"static graph mode could not build model 'm': IndexError: tuple index out "
                                             r"of range; nor could the dynamic graph: engine=onnxruntime cannot"):
        _served(path, static=True)


# ------------------------------------------------------------------------------------ data-dependent output shapes


def _nonzero_model() -> onnx.ModelProto:
    """idx = NonZero(Relu(x)) for x float32 [6], and y = x + 1: how many entries are positive decides idx's shape."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["idx"], name="nz"),
         helper.make_node("Add", ["x", "one"], ["y"])], "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, "count"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_nonzero_output_has_each_runs_own_shape_in_static_mode(engine, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_nonzero_model(), str(path))
    static, log = _served(path, static=True, engine=engine)
    text = "\n".join(log)
    assert "outputs with a runtime shape (allocated on every run, not bound once): idx (NonZero 'nz': " \
           "data-dependent output shape)" in text
    for x in ([1, -1, 2, 0, 3, -4], [-1, -1, 5, -2, -3, -4], [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 1]):
        x = np.array(x, np.float32)
        got = _answer(static, {"x": x})
        np.testing.assert_array_equal(got["idx"], np.array(np.nonzero(np.maximum(x, 0))))
        np.testing.assert_array_equal(got["y"], x + 1)


def test_an_input_that_sets_an_output_shape_is_served_static(tmp_path):
    """y = Reshape(x, shape): the request's own values decide y's shape, in one compiled graph."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]), helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])  # what the exporter saw once
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    static, log = _served(path, static=True)
    assert "y (Reshape 'reshape': output shape depends on the runtime values of input 'shape')" in "\n".join(log)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, 3], [12, 1], [1, 12]):
        np.testing.assert_array_equal(_answer(static, {"x": x, "shape": np.array(shape)})["y"], x.reshape(shape))


def test_a_bound_output_at_the_wrong_size_is_answered_and_allocated_per_run_from_then_on(tmp_path):
    """A graph whose output shape inference got wrong: the request still gets the right answer."""
    model = build_identity_fixed()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    graphs, _ = compile_static(path, [{"x": (2, 3)}], 1 << 20)
    name = graphs[0].model.graph.output[0].name
    dims = graphs[0].model.graph.output[0].type.tensor_type.shape.dim
    dims[0].dim_value, dims[1].dim_value = 3, 2  # a wrong static shape
    engine = OrtStaticEngine(graphs, BackendOptions())
    (bound,) = engine._swap.serving.values()
    assert bound.outputs[name].shape == (3, 2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(engine.run({"x": x}, [name])[0], want)
    assert bound.outputs[name] is None  # allocated per run from now on
    np.testing.assert_array_equal(engine.run({"x": x + 1}, [name])[0], want + 1)


def test_string_tensors_run_in_static_mode(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("StringConcat", ["a", "b"], ["ab"])], "strings",
        [helper.make_tensor_value_info("a", TensorProto.STRING, [2]), helper.make_tensor_value_info("b", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("ab", TensorProto.STRING, [2])])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    static, _ = _served(path, static=True)
    got = _answer(static, {"a": np.array(["ab", "x"], dtype=object), "b": np.array(["c", "yz"], dtype=object)})["ab"]
    assert got.tolist() == ["abc", "xyz"]


def test_a_scalar_first_input_compiles_static(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Mul", ["s", "x"], ["y"])], "scalar",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    static, _ = _served(path, static=True)
    got = _answer(static, {"s": np.array(2.0, np.float32), "x": np.array([1, 2, 3], np.float32)})["y"]
    np.testing.assert_array_equal(got, [2, 4, 6])


def test_a_data_sized_output_of_a_batching_model_is_refused_not_cut_wrong(tmp_path):
    """indices = NonZero(x) of x [batch, 4]: its dim 0 counts nonzeros, not rows, so padded rows cannot be cut off it."""
    path = tmp_path / "model.onnx"
    onnx.save(build_nonzero(), str(path))
    static, _ = _served(path, static=True, max_batch_size=4)
    x = np.array([[1, 0, 2, 0], [0, 0, 3, 0], [5, 6, 7, 8]], np.float32)  # 7 nonzeros, 3 rows padded to 4
    (result,) = static.execute([{"x": x}])
    assert isinstance(result, InternalError)
    assert "output 'indices' has shape [7, 2], whose dim 0 is not the batch of 4 rows" in str(result)


def test_a_graph_that_fails_to_build_leaves_no_folder_behind(tmp_path):
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="example.custom")], "custom",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)])
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    graphs, _ = compile_static(path, [{"x": (2,)}], 1 << 20)
    parent = tmp_path / "temp"
    parent.mkdir()
    with pytest.raises(ModelLoadError, match=r"ONNX Runtime cannot build the static graph for \{'x': \(2,\)\}"):
        OrtStaticEngine(graphs, BackendOptions(), temp_parent=parent)
    assert list(parent.iterdir()) == []


@pytest.mark.parametrize("user, expected", [
    ({}, ("on", "on")),  # several buckets: spin within a run, stop when it returns
    ({"force_spinning_stop": "off"}, ("off", "off")),  # no stop asked for: no spinning, as before
    ({"allow_spinning": "off"}, ("off", "auto")),  # the user's settings stand
    ({"allow_spinning": "on"}, ("on", "auto")),
])
def test_bucket_sessions_spin_within_a_run_and_stop_when_it_returns(tmp_path, user, expected):
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    shapes = [{"image": (b, 3, 64, 64)} for b in (1, 2)]
    graphs, _ = compile_static(path, shapes, 1 << 20)
    engine = OrtStaticEngine(graphs, BackendOptions.make(**user))
    session = engine._options.session
    assert (session.allow_spinning, session.force_spinning_stop) == expected
    text = engine.describe()
    assert f"allow_spinning={expected[0]}" in text
    single = OrtStaticEngine(compile_static(path, shapes[:1], 1 << 20)[0], BackendOptions())
    assert single._options.session.allow_spinning == "auto"  # one session: ORT's default


@pytest.mark.parametrize("user, expected", [
    ({}, ("on", "on")),  # buckets with a pool each spin within a run: the dynamic graph beside them too
    ({"force_spinning_stop": "off"}, ("off", "off")),
    ({"allow_spinning": "on"}, ("on", "auto")),  # the user's settings stand, for it as for the buckets
])
@pytest.mark.parametrize("beside", [{"bucket_fallback": "dynamic"}, {}])  # the fallback, or bucket_plan=measured's
def test_the_dynamic_graph_beside_the_buckets_spins_as_they_do(tmp_path, monkeypatch, user, expected, beside):
    from gebackend.runtime import loader

    made = []  # the session options of every dynamic-graph engine the load makes beside the buckets

    def recording(spec, *args, **kwargs):
        engine = create(spec, *args, **kwargs)
        made.append(engine._options.session)
        return engine

    create = loader.create_engine
    monkeypatch.setattr(loader, "create_engine", recording)
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    static, log = _served(path, static=True, max_batch_size=4, **beside, **user)  # outside a stub: a pool per bucket
    static.close()
    assert len(made) == 1, log  # the fallback, which bucket_plan=measured times too; else the candidate it times
    assert (made[0].allow_spinning, made[0].force_spinning_stop) == expected
