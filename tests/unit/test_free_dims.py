"""compile/free_dims.py: the sizes seeded inputs give an ONNX file's free dims, checked by running ONNX Runtime on
them where the old choice (one size per name, 16 for every other) made inputs the model refuses."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.compile.accuracy import random_feeds
from gebackend.compile.free_dims import concrete_shapes, conv_channels
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from tests.unit.test_instance import Log


def _model(inputs, nodes, initializers=(), outputs=("y",), output_dims=None):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, output_dims)
                                                   for o in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _runs(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _kv_cache_model():
    """optimum's decoder with a KV cache: the mask spans the cache and the new tokens, named by their sum."""
    value = lambda name, dims: helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)  # noqa: E731
    inputs = [value("past", ["batch_size", 2, "past_sequence_length", 4]),
              value("new", ["batch_size", 2, "sequence_length", 4]),
              value("mask", ["batch_size", "past_sequence_length + sequence_length"])]
    nodes = [helper.make_node("Concat", ["past", "new"], ["kv"], axis=2),
             helper.make_node("ReduceSum", ["kv", "axes"], ["summed"], keepdims=0),  # [batch, 2, past + new]
             helper.make_node("Mul", ["summed", "mask_row"], ["y"]),
             helper.make_node("Unsqueeze", ["mask", "one"], ["mask_row"])]
    return _model(inputs, nodes, [numpy_helper.from_array(np.array([3], np.int64), "axes"),
                                  numpy_helper.from_array(np.array([1], np.int64), "one")],
                  output_dims=["batch_size", 2, "past_sequence_length + sequence_length"])


def test_a_dim_named_by_a_sum_of_names_is_their_sum():
    model = _kv_cache_model()
    shapes = concrete_shapes(model, batch=2, default=5)
    assert shapes == {"past": (2, 2, 5, 4), "new": (2, 2, 5, 4), "mask": (2, 10)}
    _runs(model, random_feeds(model, batch=2, dim=5))  # before: mask [2, 5], which the model refuses


def test_the_users_dims_size_the_names_they_share():
    shapes = concrete_shapes(_kv_cache_model(), hints={"new": (-1, 2, 3, 4), "past": (-1, -1, 7, -1)})
    assert shapes["past"] == (1, 2, 7, 4) and shapes["new"] == (1, 2, 3, 4) and shapes["mask"] == (1, 10)


@pytest.mark.parametrize("expression,want", [("a + b", 7), ("2*a", 6), ("a - 1", 2), ("(b + 1) // 2", 2),
                                             ("a % 2", 1), ("unseen + 1", 17)])
def test_expressions_of_names_and_whole_numbers(expression, want):
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", expression])
    model = _model([value], [helper.make_node("Identity", ["x"], ["y"])])
    assert concrete_shapes(model, hints={"x": (3, 4, -1)})["x"] == (3, 4, want)


@pytest.mark.parametrize("expression", ["a / 0", "a ** 2", "f(a)", "a +", "0 - a"])
def test_what_is_no_such_expression_or_no_size_takes_the_default(expression):
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", expression])
    model = _model([value], [helper.make_node("Identity", ["x"], ["y"])])
    assert concrete_shapes(model, hints={"x": (3, -1)}, default=9)["x"] == (3, 9)


@pytest.mark.parametrize("op,weight,group,want", [("Conv", (8, 3, 3, 3), 1, 3), ("Conv", (8, 2, 3, 3), 4, 8),
                                                   ("ConvTranspose", (6, 4, 3, 3), 1, 6)])
def test_an_input_read_by_a_convolution_has_the_channels_of_its_weight(op, weight, group, want):
    """Hugging Face's vision exports leave `num_channels` free; 16 channels fail the first Conv."""
    value = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch_size", "num_channels", "h", "w"])
    w = numpy_helper.from_array(np.ones(weight, np.float32), "w")
    nodes = [helper.make_node("Cast", ["pixels"], ["cast"], to=TensorProto.FLOAT),
             helper.make_node(op, ["cast", "w"], ["y"], group=group)]
    model = _model([value], nodes, [w])
    assert conv_channels(model) == {("pixels", 1): want}
    assert concrete_shapes(model)["pixels"] == (1, want, 16, 16)
    _runs(model, random_feeds(model))


def test_fixed_dims_stay_and_unnamed_free_dims_take_batch_then_default():
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 5, None])
    model = _model([value], [helper.make_node("Identity", ["x"], ["y"])])
    assert concrete_shapes(model, batch=2, default=7) == {"x": (2, 5, 7)}
    # a hint never overrides a dim the file fixes
    assert concrete_shapes(model, hints={"x": (3, 9, 4)}) == {"x": (3, 5, 4)}


# ------------------------------------------------------------- through a load: config.pbtxt's dims size the seeded data


def _patch_model():
    """A ViT-like patch embedding: pixels [batch, num_channels, height, width], all free as Hugging Face exports them,
    but only 3 channels of 8 x 8 run (the Conv's weight, the stored table of 16 patch positions)."""
    rng = np.random.default_rng(0)
    value = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch_size", "num_channels", "height", "width"])
    stored = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
              for n, s in (("w", (4, 3, 2, 2)), ("positions", (1, 4, 16)), ("head", (4, 5)))]
    stored.append(numpy_helper.from_array(np.array([0, 4, -1], np.int64), "patch_shape"))
    nodes = [helper.make_node("Conv", ["pixels", "w"], ["conv"], strides=[2, 2]),
             helper.make_node("Reshape", ["conv", "patch_shape"], ["patches"]),
             helper.make_node("Add", ["patches", "positions"], ["placed"]),
             helper.make_node("Transpose", ["placed"], ["tokens"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tokens", "head"], ["y"])]
    return _model([value], nodes, stored, output_dims=["batch_size", 16, 5])


@pytest.mark.parametrize("dims", [None, (3, 8, 8)])
def test_the_accuracy_guard_checks_int8_on_the_dims_config_pbtxt_gives(tmp_path, dims):
    folder = tmp_path / "patches" / "1"
    folder.mkdir(parents=True)
    onnx_path = folder / "model.onnx"
    onnx.save(_patch_model(), str(onnx_path))
    config = {"name": "patches", "backend": "ge", "max_batch_size": 4,
              "parameters": {"precision_mode": {"string_value": "int8"}, "precision_min_cosine": {"string_value": "0.99"}}}
    if dims:
        config["input"] = [{"name": "pixels", "data_type": "TYPE_FP32", "dims": list(dims)}]
    log = Log()
    instance = ModelInstance.load(config, folder, InstanceInfo("patches_0"), log, pin=False)
    try:
        lines = " | ".join(m for _, m in log.lines)
        if dims:  # checked on [1, 3, 8, 8]: served int8
            assert instance.executor.spec.options.engines.precision_mode == "int8", lines
            assert "pixels:1,3,8,8" in lines, lines
        else:  # 3 channels (the Conv's) of no probed size (224, 320, ...) run: fp32 is served, and the reason said
            assert instance.executor.spec.options.engines.precision_mode == "origin", lines
            assert "no input size the model runs was found to check it on (pixels:[1, 3, 224, 224] (probed 224x224)" \
                in lines, lines
            assert re.search(r"precision origin \(int8: no input size the model runs was found, 16 tried; give the "
                             r"sizes as dims in config.pbtxt", instance.how), instance.how
        pixels = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
        got = instance.execute([{"pixels": pixels}])[0]["y"]
        want = _runs(_patch_model(), {"pixels": pixels})[0]
        cosine = float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine >= 0.99
    finally:
        instance.close()
