"""The L2-normalised output added to an encoder's ONNX file (modelzoo/normalized_output.py).

Checked against numpy's x / ||x|| (cn_clip's CLIP.forward) at both forms of ReduceL2 (axes as an attribute before
opset 18, as an input from 18 on), on a model with external data that must not be loaded or moved, and through a
hard link that must not be written through.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from gebackend.modelzoo.normalized_output import ensure_normalized_output, with_normalized_output


def encoder(opset: int, embed: int = 24) -> onnx.ModelProto:
    """x [batch, 8] -> MatMul by a seeded weight -> `unnorm` [batch, embed]."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, embed)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["unnorm"])], "enc",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("unnorm", onnx.TensorProto.FLOAT, ["batch", embed])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run(model_or_path, x):
    source = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_the_added_output_is_the_input_over_its_l2_norm(opset):
    model = with_normalized_output(encoder(opset), "unnorm", "features")
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    unnorm, features = run(model, x)
    np.testing.assert_array_equal(unnorm, run(encoder(opset), x)[0])
    np.testing.assert_allclose(features, unnorm / np.linalg.norm(unnorm, axis=-1, keepdims=True), rtol=1e-6, atol=1e-7)
    assert [(o.name, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]) for o in model.graph.output] == [
        ("unnorm", ["batch", 24]), ("features", ["batch", 24])]


def test_a_missing_source_or_a_taken_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"the graph has no output 'embeddings' to normalise \(its outputs: \['unnorm'\]\)"):
        with_normalized_output(encoder(17), "embeddings", "features")
    with pytest.raises(ValueError, match="the graph already has a tensor named 'x'"):
        with_normalized_output(encoder(17), "unnorm", "x")


def test_a_file_with_external_data_is_rewritten_without_loading_it_and_through_no_link(tmp_path):
    original = tmp_path / "export"
    original.mkdir()
    onnx.save(encoder(17), str(original / "enc.onnx"), save_as_external_data=True, location="enc.onnx.data",
              size_threshold=0)
    served = tmp_path / "served"
    served.mkdir()
    for name in ("enc.onnx", "enc.onnx.data"):
        os.link(original / name, served / name)  # as the builder links a user's export into the version folder
    before = (original / "enc.onnx").read_bytes()

    assert ensure_normalized_output(served / "enc.onnx", "unnorm", "features") is True
    assert (original / "enc.onnx").read_bytes() == before  # the link was replaced, not written through
    assert os.stat(served / "enc.onnx.data").st_ino == os.stat(original / "enc.onnx.data").st_ino  # data untouched
    assert sorted(p.name for p in served.iterdir()) == ["enc.onnx", "enc.onnx.data"]  # no temporary file left
    x = np.ones((2, 8), np.float32)
    unnorm, features = run(served / "enc.onnx", x)
    np.testing.assert_allclose(features, unnorm / np.linalg.norm(unnorm, axis=-1, keepdims=True), rtol=1e-6)
    assert ensure_normalized_output(served / "enc.onnx", "unnorm", "features") is False  # already there: unchanged
    with pytest.raises(ValueError, match=r"enc\.onnx: the graph has no output 'other'"):
        ensure_normalized_output(served / "enc.onnx", "other", "other_features")
