"""The OpenVINO engine: equal to ONNX Runtime in f32 (dynamic and static), explicit precision, input errors, profiling."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

ov = pytest.importorskip("openvino")

import onnxruntime as ort  # noqa: E402

from gebackend.compile.pipeline import compile_static  # noqa: E402
from gebackend.config.options import BackendOptions  # noqa: E402
from gebackend.engines import create_engine, create_static_engine  # noqa: E402
from gebackend.engines.base import EngineInputError  # noqa: E402
from gebackend.engines.openvino import PROVIDER, OvEngine, core, resolve_precision  # noqa: E402
from gebackend.engines.openvino_static import OvStaticEngine  # noqa: E402

from gebackend.modelzoo import build_bert, build_resnet  # noqa: E402
from gebackend.profiling import load_capture, render  # noqa: E402

RTOL = ATOL = 1e-4
CASES = {
    "resnet": (build_resnet, [{"image": (b, 3, 64, 64)} for b in (1, 4)]),
    "bert": (build_bert, [{"input_ids": (b, s), "attention_mask": (b, s)} for b, s in ((1, 8), (4, 32))]),
}
CAPABILITIES = list(core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def feeds_for(shapes, rng):
    feeds = {}
    for name, shape in shapes.items():
        if name == "input_ids":
            feeds[name] = rng.integers(0, 1000, size=shape, dtype=np.int64)
        elif name == "attention_mask":
            mask = np.ones(shape, np.int64)
            mask[0, shape[1] // 2:] = 0  # some padding: the mask must matter
            feeds[name] = mask
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.fixture(scope="module", params=sorted(CASES))
def model(request, tmp_path_factory):
    """(case, path, shape sets, ONNX Runtime session, output names)."""
    build, shape_sets = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    onnx.save(build(), str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return SimpleNamespace(case=request.param, path=path, shapes=shape_sets, ort=session,
                           outputs=[o.name for o in session.get_outputs()])


def assert_equal_to_ort(engine, model, rng, runs=2):
    for shapes in model.shapes:
        for _ in range(runs):  # buffers and the request are reused: a second run must not see the first's data
            feeds = feeds_for(shapes, rng)
            got = engine.run(feeds, model.outputs)
            want = model.ort.run(model.outputs, feeds)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ------------------------------------------------------------------------------ f32 equals ONNX Runtime


def test_dynamic_engine_equals_onnxruntime(model):
    engine = OvEngine(model.path, BackendOptions())
    assert_equal_to_ort(engine, model, np.random.default_rng(0))
    line = engine.describe()
    assert line.startswith("OpenVINO ") and "precision=f32 (precision_mode=origin)" in line, line
    assert "streams=1" in line and "hint=LATENCY" in line


@pytest.mark.parametrize("shared_source", [False, True], ids=["per-graph", "source"])
def test_static_engine_equals_onnxruntime(model, shared_source):
    graphs, _ = compile_static(model.path, model.shapes, 1 << 20)
    engine = OvStaticEngine(graphs, BackendOptions(), source=model.path if shared_source else None)
    assert_equal_to_ort(engine, model, np.random.default_rng(1))
    line = engine.describe()
    assert f"static graph, {len(graphs)} compiled shape(s)" in line and "precision=f32" in line, line


def test_outputs_are_copies(model):
    graphs, _ = compile_static(model.path, model.shapes[:1], 1 << 20)
    rng = np.random.default_rng(2)
    for engine in (OvEngine(model.path, BackendOptions()), OvStaticEngine(graphs, BackendOptions())):
        first = engine.run(feeds_for(model.shapes[0], rng), model.outputs)
        kept = [a.copy() for a in first]
        engine.run(feeds_for(model.shapes[0], rng), model.outputs)
        for a, k in zip(first, kept):
            np.testing.assert_array_equal(a, k)


def test_read_only_and_strided_feeds(model):
    """Triton may hand over read-only or non-contiguous arrays: the engine copies them instead of failing."""
    engine = OvEngine(model.path, BackendOptions())
    feeds = feeds_for(model.shapes[-1], np.random.default_rng(7))
    want = model.ort.run(model.outputs, feeds)
    odd = {}
    for name, array in feeds.items():
        wide = np.repeat(array, 2, axis=-1)[..., ::2]  # the same values, not contiguous
        assert not wide.flags.c_contiguous
        wide.setflags(write=False)
        odd[name] = wide
    for g, w in zip(engine.run(odd, model.outputs), want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_factory_dispatches_to_openvino(model):
    spec = SimpleNamespace(path=model.path, options=BackendOptions.make(engine="openvino"))
    assert isinstance(create_engine(spec), OvEngine)
    graphs, _ = compile_static(model.path, model.shapes[:1], 1 << 20)
    assert isinstance(create_static_engine(spec, graphs), OvStaticEngine)


# ------------------------------------------------------------------------------ precision


def test_origin_is_f32_although_this_cpu_defaults_to_bf16(model):
    """OpenVINO picks bf16 by itself on CPUs with BF16; origin must not."""
    engine = OvEngine(model.path, BackendOptions.make(precision_mode="origin"))
    assert engine._swap.serving.property("INFERENCE_PRECISION_HINT") == ov.Type.f32


@pytest.mark.skipif("BF16" not in CAPABILITIES, reason="this CPU has no BF16")
def test_bf16_is_close_to_f32_and_reported(model):
    f32 = OvEngine(model.path, BackendOptions())
    bf16 = OvEngine(model.path, BackendOptions.make(precision_mode="bf16"))
    graphs, _ = compile_static(model.path, model.shapes, 1 << 20)
    bf16_static = OvStaticEngine(graphs, BackendOptions.make(precision_mode="bf16"))
    for engine in (bf16, bf16_static):
        assert "precision=bf16 (precision_mode=bf16)" in engine.describe(), engine.describe()
    rng = np.random.default_rng(3)
    for shapes in model.shapes:
        feeds = feeds_for(shapes, rng)
        want = f32.run(feeds, model.outputs)
        for engine in (bf16, bf16_static):
            for g, w in zip(engine.run(feeds, model.outputs), want):
                assert g.dtype == w.dtype  # the outputs keep the model's type
                assert cosine(g, w) >= 0.99


def test_fp16_runs_f16_or_says_why_not(model):
    engine = OvEngine(model.path, BackendOptions.make(precision_mode="fp16"))
    line = engine.describe()
    if "FP16" in CAPABILITIES:
        assert "precision=f16 (precision_mode=fp16)" in line, line
    else:
        assert "fp16 requested, this CPU has no FP16: ran " in line, line


def test_precision_fallbacks_without_capabilities():
    assert resolve_precision("fp16", ["FP32", "BF16"]).hint == ov.Type.bf16
    fallback = resolve_precision("fp16", ["FP32"])
    assert fallback.hint == ov.Type.f32 and fallback.note == "fp16 requested, this CPU has no FP16: ran f32"
    assert resolve_precision("bf16", ["FP32"]).hint == ov.Type.f32
    assert resolve_precision("origin", ["FP32", "BF16", "FP16"]).hint == ov.Type.f32


def test_int8_compiles_the_qdq_file_at_f32(model):
    """int8 on OpenVINO is a QDQ file NNCF wrote first (runtime/loader.py): compiled with the f32 hint, said so."""
    chosen = resolve_precision("int8", ["FP32", "INT8"])
    assert chosen.hint == ov.Type.f32 and chosen.note.startswith("int8 static (NNCF, QDQ)")
    engine = OvEngine(model.path, BackendOptions.make(precision_mode="int8"))
    assert "precision=f32 (precision_mode=int8; int8 static (NNCF, QDQ)" in engine.describe()
    engine.close()


def test_threads_follow_intra_op_thread_count(model):
    assert "threads=1," in OvEngine(model.path, BackendOptions.make(intra_op_thread_count=1)).describe()


# ------------------------------------------------------------------------------ input errors


def test_bad_inputs_are_input_errors(model):
    engine = OvEngine(model.path, BackendOptions())
    shapes = model.shapes[0]
    good = feeds_for(shapes, np.random.default_rng(4))
    first = next(iter(shapes))
    bad_rank = {**good, first: good[first][..., None]}
    with pytest.raises(EngineInputError, match=f"input '{first}' has shape .* rank"):
        engine.run(bad_rank, model.outputs)
    wrong = np.int32 if good[first].dtype == np.int64 else np.float64
    with pytest.raises(EngineInputError, match=f"input '{first}' has type"):
        engine.run({**good, first: good[first].astype(wrong)}, model.outputs)
    with pytest.raises(EngineInputError, match="unknown input"):
        engine.run({**good, "nope": good[first]}, model.outputs)
    if len(good) > 1:
        with pytest.raises(EngineInputError, match="missing input"):
            engine.run({first: good[first]}, model.outputs)
    if model.case == "resnet":  # channels are fixed in the ONNX file
        with pytest.raises(EngineInputError, match="dim 1 must be 3"):
            engine.run({"image": np.zeros((1, 4, 64, 64), np.float32)}, model.outputs)
    np.testing.assert_allclose(engine.run(good, model.outputs)[0], model.ort.run(model.outputs, good)[0],
                               rtol=RTOL, atol=ATOL)  # still serving after refusals


def test_static_engine_refuses_shapes_it_was_not_compiled_for(model):
    graphs, _ = compile_static(model.path, model.shapes, 1 << 20)
    engine = OvStaticEngine(graphs, BackendOptions())
    shapes = {n: (s[0] + 1, *s[1:]) for n, s in model.shapes[0].items()}
    compiled = str([{n: list(s) for n, s in g.shapes.items()} for g in graphs])
    with pytest.raises(EngineInputError, match="no static graph was compiled") as info:
        engine.run(feeds_for(shapes, np.random.default_rng(5)), model.outputs)
    assert compiled in str(info.value)
    good = feeds_for(model.shapes[0], np.random.default_rng(5))
    first = next(iter(good))
    wrong = np.int32 if good[first].dtype == np.int64 else np.float64
    with pytest.raises(EngineInputError, match="has type"):
        engine.run({**good, first: good[first].astype(wrong)}, model.outputs)


def _counter_model(path: Path, dtype: int) -> Path:
    """y = x + 2 for a 64-bit x [n] (a timestamp in milliseconds, an id past 2**31, a float64)."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "two"], ["y"])], "counter",
                              [helper.make_tensor_value_info("x", dtype, ["n"])],
                              [helper.make_tensor_value_info("y", dtype, ["n"])], [helper.make_tensor("two", dtype, [], [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("dtype, big, low, high", [
    (onnx.TensorProto.INT64, np.int64(1_733_400_000_000), -(2**31), 2**31 - 1),  # a time in ms: past 32 bits
    (onnx.TensorProto.INT64, np.int64(-(2**33) + 5), -(2**31), 2**31 - 1),
    (onnx.TensorProto.UINT64, np.uint64(2**31), 0, 2**31 - 1),
    (onnx.TensorProto.DOUBLE, np.float64(1e300), -float(np.finfo(np.float32).max), float(np.finfo(np.float32).max)),
])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_64_bit_value_openvino_would_narrow_wrongly_is_refused_not_answered_wrong(tmp_path, dtype, big, low, high,
                                                                                       mode):
    path = _counter_model(tmp_path / "counter.onnx", dtype)
    numpy_type = type(big)
    if mode == "dynamic":
        engine = OvEngine(path, BackendOptions())
    else:
        graphs, _ = compile_static(path, [{"x": (3,)}], 1 << 20)
        engine = OvStaticEngine(graphs, BackendOptions())
    plain = core().compile_model(str(path), "CPU").create_infer_request()
    plain.infer({"x": np.array([5, big, 7], numpy_type)})
    assert plain.get_output_tensor(0).data[1] != big + 2  # what OpenVINO itself answers: cut to 32 bits
    inside = np.array([low, 5, high - 2], numpy_type)
    np.testing.assert_array_equal(engine.run({"x": inside}, ["y"])[0], inside + numpy_type(2))
    with pytest.raises(EngineInputError) as info:
        engine.run({"x": np.array([5, big, 7], numpy_type)}, ["y"])
    message = str(info.value)
    assert f"input 'x' holds {big} at [1]" in message and f"[{low}, {high}]" in message
    assert "engine=onnxruntime" in message
    if numpy_type is np.float64:  # only finite values are refused: NaN and infinities are not out of range
        got = engine.run({"x": np.array([np.nan, np.inf, 2.0])}, ["y"])[0]
        assert np.isnan(got[0]) and got[2] == 4.0


# ------------------------------------------------------------------------------ profiling


def _capture(root: Path, sessions, requests) -> Path:
    capture = root / "profiling" / "m" / "20261129-000000"
    folder = capture / "instances" / "m_0_0"
    folder.mkdir(parents=True)
    for s in sessions:
        s.file = Path(s.file.replace(folder / s.file.name))
    (folder / "sessions.json").write_text(json.dumps([s.to_dict() for s in sessions]))
    (folder / "requests.json").write_text(json.dumps(requests))
    return capture


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_profiling_writes_what_the_report_reads(model, mode, tmp_path):
    if mode == "dynamic":
        engine = OvEngine(model.path, BackendOptions())
    else:
        graphs, _ = compile_static(model.path, model.shapes, 1 << 20)
        engine = OvStaticEngine(graphs, BackendOptions())
    rng = np.random.default_rng(6)
    assert engine.stop_profiling() == []  # not profiling: nothing to stop
    engine.start_profiling(tmp_path / "ort-engine0")
    requests, runs = [], 3
    for _ in range(runs):
        feeds = feeds_for(model.shapes[-1], rng)
        t0 = time.monotonic_ns()
        got = engine.run(feeds, model.outputs)
        requests.append({"start_ns": t0, "end_ns": time.monotonic_ns(), "requests": 1, "rows": 1, "errors": 0})
        np.testing.assert_allclose(got[0], model.ort.run(model.outputs, feeds)[0], rtol=RTOL, atol=ATOL)
    sessions = engine.stop_profiling()
    assert len(sessions) == (1 if mode == "dynamic" else len(model.shapes))
    assert all(s.mode == mode and s.file.is_file() for s in sessions)

    used = sessions[-1]  # the last shape set ran (static: its bucket is the last)
    events = json.loads(used.file.read_text())
    run_events = [e for e in events if e["cat"] == "Session"]
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(run_events) == runs and all(e["name"] == "model_run" and e["ph"] == "X" for e in run_events)
    assert nodes and all(e["name"].endswith("_kernel_time") and e["ph"] == "X" for e in nodes)
    assert all(e["args"]["provider"] == PROVIDER and e["args"]["op_name"] for e in nodes)
    assert all(set(e["args"]) >= {"input_type_shape", "output_type_shape"} for e in nodes)
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in events)
    assert used.start_ns <= requests[0]["start_ns"]  # on time.monotonic_ns(), before the first run
    if mode == "static":
        assert used.graph.startswith("static ") and set(used.static_nodes) == set(used.node_order)

    capture = _capture(tmp_path, sessions, requests)
    loaded = load_capture(capture)
    assert len(loaded.runs()) == runs
    measured = loaded.runs()
    assert all(r.kernels for r in measured)
    assert measured[0].kernel_us <= measured[0].dur_us  # the first run's own node times
    assert sum(r.kernel_us for r in measured[1:]) <= sum(r.dur_us for r in measured[1:])  # later: their average
    assert "same clock" in loaded.clock_note or "share one clock" in loaded.clock_note, loaded.clock_note
    paths = render(capture)
    with paths["op_summary"].open() as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["provider"] for r in rows} == {PROVIDER}
    calls = {int(r["calls"]) for r in rows}
    assert max(calls) == runs and min(calls) >= 1  # dynamic shapes: some nodes only run on a new shape

    after = feeds_for(model.shapes[0], rng)  # profiling off again: the plain model serves
    np.testing.assert_allclose(engine.run(after, model.outputs)[0], model.ort.run(model.outputs, after)[0],
                               rtol=RTOL, atol=ATOL)
    assert engine.stop_profiling() == []


def test_an_input_openvinos_reader_renames_is_a_load_error_not_a_refusal_of_every_request(tmp_path):
    """OpenVINO folds SequenceAt of a sequence it builds from the inputs down to input Y, and names that port after the
    output: Y is gone (the onnx wheel's simple/test_sequence_model1)."""
    from onnx import TensorProto, helper, numpy_helper

    from gebackend.config.onnx_signature import read_signature
    from gebackend.config.spec import build_model_spec
    from gebackend.errors import ModelLoadError
    from gebackend.runtime.loader import load_executor

    tensors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("X", "Y")]
    nodes = [helper.make_node("SequenceConstruct", ["X", "Y"], ["seq"]), helper.make_node("SequenceAt", ["seq", "one"], ["out"])]
    graph = helper.make_graph(nodes, "seq", tensors, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.array(1, np.int64), "one")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    spec = build_model_spec({"name": "seq", "max_batch_size": 0}, read_signature(path), path,
                            BackendOptions.make(engine="openvino"))
    with pytest.raises(ModelLoadError, match=r"engine=openvino lost the model's input\(s\) \['Y'\] \(its ports are named "
                                             r"\['X', 'out'\]\).*serve it with engine=onnxruntime"):
        load_executor(spec)
    executor, _ = load_executor(build_model_spec({"name": "seq", "max_batch_size": 0}, read_signature(path), path,
                                                 BackendOptions.make(engine="onnxruntime")))
    x, y = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(executor.execute([{"X": x, "Y": y}])[0]["out"], y)
    executor.close()


def test_a_conversion_failure_names_each_op_with_its_reason(tmp_path):
    """A module exported in training mode keeps its Dropouts active (torch's dynamo exporter writes training_mode
    True), which OpenVINO refuses; its report ends in a summary naming the ops, the reason in the block before, and
    the load said only the summary (`Conversion is failed for: Dropout-20`)."""
    from onnx import helper, numpy_helper

    from gebackend.errors import ModelLoadError

    stored = [numpy_helper.from_array(np.array(0.1, np.float32), "ratio"),
              numpy_helper.from_array(np.array(True), "training")]
    graph = helper.make_graph([helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])], stored)
    path = tmp_path / "dropout.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    with pytest.raises(ModelLoadError) as info:
        OvEngine(path, BackendOptions())
    assert "conversion failed for Dropout-20: Training mode is not supported for Dropout op" in str(info.value)
