"""trim_padding (config/trim_padding.py, runtime/padding_trim.py): which inputs are cut, how a batch is cut, and the
load-time check that serves a model uncut when cutting would move its outputs; through ModelInstance, no Triton."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from gebackend.config import dtypes
from gebackend.config.options import parse_options
from gebackend.config.spec import TensorSpec
from gebackend.config.trim_padding import trimmed_inputs
from gebackend.errors import ConfigError
from gebackend.modelzoo import build_bert
from gebackend.modelzoo.cnclip_standin import build_cnclip_text_standin
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from gebackend.runtime.padding_trim import TrimPlan

CONTEXT = 52


class Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    warn = info


def _tensor(name, dims, labels=None, dtype="TYPE_INT64"):
    return TensorSpec(name, dtypes.from_triton(dtype), tuple(dims), tuple(labels or [None] * len(dims)))


@pytest.mark.parametrize("text, want", [("text", ("text", 0)), (" input_ids = 1 ", ("input_ids", 1)), ("", None)])
def test_the_option_is_an_input_and_a_pad_id(text, want):
    parsed = parse_options("m", {}, {"trim_padding": text}, {})
    assert parsed.options.static.trim_padding == want


@pytest.mark.parametrize("text", ["=3", "text=pad"])
def test_a_bad_option_names_the_key(text):
    with pytest.raises(ConfigError, match="trim_padding"):
        parse_options("m", {}, {"trim_padding": text}, {})


def test_the_inputs_sharing_the_sequence_dim_are_cut_with_the_ids():
    inputs = [_tensor("input_ids", [-1], ["sequence"]), _tensor("attention_mask", [-1], ["sequence"]),
              _tensor("pixels", [3, -1], [None, "width"], "TYPE_FP32"), _tensor("lengths", [1])]
    assert trimmed_inputs("m", ("input_ids", 0), inputs, batching=True) == ("input_ids", "attention_mask")
    fixed = [_tensor("text", [52]), _tensor("mask", [52]), _tensor("other", [16])]
    assert trimmed_inputs("m", ("text", 0), fixed, batching=True) == ("text", "mask")


@pytest.mark.parametrize("inputs, key, message", [
    ([_tensor("text", [52])], "ids", "names input 'ids', but the model's inputs are \\['text'\\]"),
    ([_tensor("x", [52], dtype="TYPE_FP32")], "x", "must hold integer token ids"),
    ([_tensor("text", [])], "text", "needs a sequence axis"),
    ([_tensor("ids", [-1], ["s"]), _tensor("mask2d", [-1, -1], ["s", "s"])], "ids", "on another axis too"),
])
def test_what_cannot_be_cut_is_refused_naming_the_model_and_the_input(inputs, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        trimmed_inputs("enc", (key, 0), inputs, batching=True)
    assert "model 'enc'" in str(error.value)


def test_a_batch_is_cut_after_its_longest_row_and_left_alone_without_padding():
    plan = TrimPlan("m", "ids", 0, ("ids", "mask"))
    ids = np.zeros((2, 10), np.int64)
    ids[0, :3] = [5, 6, 7]
    ids[1, :5] = [5, 0, 6, 7, 8]  # a pad id inside the text does not end it
    cut = plan.cut({"ids": ids, "mask": (ids != 0).astype(np.int64), "other": np.ones((2, 4), np.float32)})
    assert cut["ids"].shape == (2, 5) and cut["mask"].shape == (2, 5) and cut["other"].shape == (2, 4)
    assert cut["ids"].flags.c_contiguous and np.array_equal(cut["ids"], ids[:, :5])
    full = {"ids": np.ones((2, 10), np.int64)}
    assert plan.cut(full) is full
    assert plan.cut({"ids": np.zeros((1, 10), np.int64)})["ids"].shape == (1, 1)  # all padding: one position
    assert TrimPlan("m", "ids", 1, ("ids",)).cut({"ids": np.array([[4, 1, 1]])})["ids"].tolist() == [[4]]


def test_in_static_mode_a_batch_is_cut_to_a_compiled_length_whose_buckets_take_it():
    ids = np.zeros((3, 52), np.int64)
    ids[:, :10] = 7
    plan = TrimPlan("m", "ids", 0, ("ids",), (16, 32, 52))
    assert plan.cut({"ids": ids})["ids"].shape == (3, 16)
    no_16_for_3_rows = TrimPlan("m", "ids", 0, ("ids",), (16, 32, 52), fits=lambda s: s["ids"] != (3, 16))
    assert no_16_for_3_rows.cut({"ids": ids})["ids"].shape == (3, 32)
    nothing_fits = TrimPlan("m", "ids", 0, ("ids",), (16, 52), fits=lambda s: False)
    assert nothing_fits.cut({"ids": ids})["ids"].shape == (3, 52)


def _config(name, model, **params):
    def entries(values):
        return [{"name": v.name, "data_type": dtypes.from_onnx(v.type.tensor_type.elem_type).triton,
                 "dims": [d.dim_value or -1 for d in v.type.tensor_type.shape.dim[1:]]} for v in values]

    return {"name": name, "backend": "ge", "max_batch_size": 8, "input": entries(model.graph.input),
            "output": entries(model.graph.output), "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            "parameters": {k: {"string_value": v} for k, v in params.items()}}


def _load(tmp_path, name, model, **params):
    folder = tmp_path / name / "1"
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    log = Log()
    instance = ModelInstance.load(_config(name, model, **params), folder, InstanceInfo(f"{name}_0_0"), log, pin=False)
    return instance, log, folder / "model.onnx"


def _texts(lengths, context=CONTEXT, seed=3):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), context), np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, 500, n)
    return ids


class _Seen:
    """Wraps a runner to record the shapes the engine was given."""

    def __init__(self, runner):
        self.runner, self.shapes = runner, []

    def run(self, feeds):
        self.shapes.append({n: a.shape for n, a in feeds.items()})
        return self.runner.run(feeds)

    def close(self):
        self.runner.close()


@pytest.mark.parametrize("params", [{}, {"static_model": "1", "graph.ge.inputShape": "text:-1,-1",
                                         "graph.ge.dynamicDims": "1,16;1,52;4,16;4,52"}])
def test_a_masked_encoder_runs_only_its_real_tokens_and_answers_as_at_full_length(tmp_path, params):
    model = build_cnclip_text_standin()
    instance, log, path = _load(tmp_path, "text", model, trim_padding="text", **params)
    try:
        assert any("trim_padding: 'text' cut after its last token other than 0" in line and "checked at load" in line
                   for line in log.lines), log.lines
        seen = instance.executor.runner = _Seen(instance.executor.runner)
        requests = [{"text": _texts([n])} for n in (9, 3, 12)]
        results = instance.execute(requests)
        reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for request, result in zip(requests, results):
            want = reference.run(None, request)[0]
            np.testing.assert_allclose(result["unnorm_text_features"], want, rtol=1e-5, atol=1e-6)
        assert seen.shapes == [{"text": (3, 12 if not params else 16)}]
        trimmer = instance.executor.trim  # what the metrics endpoint publishes: positions sent, and cut off
        assert trimmer.positions == 3 * CONTEXT and trimmer.trimmed == 3 * (CONTEXT - (12 if not params else 16))
    finally:
        instance.close()


def test_a_model_that_reads_its_padding_is_served_uncut_saying_why(tmp_path):
    embed = helper.make_tensor("table", TensorProto.FLOAT, [500, 4], np.random.default_rng(0).random(2000).tolist())
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "text"], ["tokens"]),
         helper.make_node("ReduceMean", ["tokens"], ["mean"], axes=[1], keepdims=0)],  # pads count in the mean
        "unmasked", [helper.make_tensor_value_info("text", TensorProto.INT64, ["batch", CONTEXT])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 4])], [embed])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    instance, log, path = _load(tmp_path, "unmasked", model, trim_padding="text")
    try:
        assert any("trim_padding: not used" in line and "output 'mean' moves" in line
                   and "does not ignore its padding" in line for line in log.lines), log.lines
        assert instance.executor.trim is None
        ids = _texts([5])
        got = instance.execute([{"text": ids}])[0]["mean"]
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"text": ids})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6)
    finally:
        instance.close()


def test_an_output_that_keeps_the_sequence_axis_is_served_uncut(tmp_path):
    instance, log, _ = _load(tmp_path, "bert", build_bert(), trim_padding="input_ids")
    try:
        assert any("trim_padding: not used" in line and "output 'last_hidden_state'" in line
                   and "keeps the sequence axis" in line for line in log.lines), log.lines
        assert instance.executor.trim is None
    finally:
        instance.close()


def test_a_static_graph_without_shorter_lengths_says_what_to_add(tmp_path):
    instance, log, _ = _load(tmp_path, "text", build_cnclip_text_standin(), trim_padding="text", static_model="1")
    try:
        assert any("compiles no length of 'text' shorter than 52" in line and "graph.ge.dynamicDims" in line
                   for line in log.lines), log.lines
        assert instance.executor.trim is None
    finally:
        instance.close()


def test_buckets_shorter_than_the_config_are_refused_for_inputs_that_are_not_cut(tmp_path):
    with pytest.raises(ConfigError, match="dim 1 is fixed to 52"):
        _load(tmp_path, "text", build_cnclip_text_standin(), static_model="1",
              **{"graph.ge.inputShape": "text:-1,-1", "graph.ge.dynamicDims": "1,16;1,52"})


def _masked_projection(pad_row_scale: float) -> onnx.ModelProto:
    """Token embeddings projected by a MatMul, then a masked mean: exact under cutting in fp32, while ONNX Runtime's
    dynamic int8 scales the MatMul's input by its range over every position, the pad rows' (made large) included."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((500, 16)).astype(np.float32)
    table[0] *= pad_row_scale
    nodes = [
        helper.make_node("Gather", ["table", "text"], ["tokens"]),
        helper.make_node("MatMul", ["tokens", "weight"], ["projected"]),
        helper.make_node("Equal", ["text", "pad"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["real"]),
        helper.make_node("Cast", ["real"], ["keep2"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["keep2", "last"], ["keep"]),
        helper.make_node("Mul", ["projected", "keep"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["keep", "seq"], ["count"], keepdims=0),
        helper.make_node("Div", ["total", "count"], ["features"]),
    ]
    inits = [helper.make_tensor("table", TensorProto.FLOAT, table.shape, table.ravel().tolist()),
             helper.make_tensor("weight", TensorProto.FLOAT, [16, 8], rng.standard_normal(128).tolist()),
             helper.make_tensor("pad", TensorProto.INT64, [], [0]),
             helper.make_tensor("last", TensorProto.INT64, [1], [2]),
             helper.make_tensor("seq", TensorProto.INT64, [1], [1])]
    graph = helper.make_graph(nodes, "masked_projection",
                              [helper.make_tensor_value_info("text", TensorProto.INT64, ["batch", CONTEXT])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_lowered_model_is_cut_when_cut_it_stays_as_close_to_fp32(tmp_path):
    """int8's answer moves when the padding is cut (its activation scale saw the pad rows); what is checked is that the
    cut answer is as close to the fp32 model as the full-length one."""
    pytest.importorskip("onnxruntime.quantization")
    model = _masked_projection(pad_row_scale=20.0)
    instance, log, path = _load(tmp_path, "proj", model, trim_padding="text", precision_mode="int8")
    try:
        assert any("trim_padding: 'text' cut after its last token other than 0; checked at load: cut, the lowered "
                   "model is as close to fp32 as at the full length" in line for line in log.lines), log.lines
        ids = _texts([6, 11])
        got = instance.execute([{"text": ids}])[0]["features"]
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"text": ids})[0]
        cosine = float((got.ravel() @ want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine > 0.99
    finally:
        instance.close()
