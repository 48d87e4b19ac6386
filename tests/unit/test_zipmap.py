"""A classifier's ZipMap output (a sequence of maps) served as the tensor it maps (config/zipmap.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from gebackend.config.onnx_signature import read_signature, signature_of
from gebackend.config.zipmap import served_unzipped, unzipped
from gebackend.errors import ConfigError
from gebackend.modelzoo.misc import build_add_mul, build_zipmap_classifier

IRIS = Path(ort.__file__).parent / "datasets" / "logreg_iris.onnx"  # onnxmltools 1.2 (2018), shipped by onnxruntime


@pytest.mark.parametrize("labels", [("setosa", "versicolor", "virginica"), (3, 7)], ids=["strings", "ints"])
def test_the_probabilities_are_the_maps_values_in_label_order(labels, tmp_path):
    model = build_zipmap_classifier(labels)
    features = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    _, maps = ort.InferenceSession(model.SerializeToString()).run(None, {"features": features})
    signature = signature_of(model)
    assert signature.unzipped == ("probabilities",)
    probabilities = signature.output("probabilities")
    assert (probabilities.dtype.triton, probabilities.shape) == ("TYPE_FP32", ("N", len(labels)))
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    lines = []
    served = served_unzipped(path, read_signature(path), lines.append, tmp_path)
    assert lines == [f"output 'probabilities' is a ZipMap (a sequence of maps, which Triton cannot carry): served as "
                     f"the tensor it maps, FP32 [rows, classes], columns in the order of the class labels {list(labels)}"]
    label, got = ort.InferenceSession(str(served)).run(["label", "probabilities"], {"features": features})
    want = np.array([[row[k] for k in labels] for row in maps], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert list(label) == [labels[i] for i in got.argmax(axis=1)]


def test_onnxmltools_iris_classifier_shipped_with_onnxruntime(tmp_path):
    signature = read_signature(IRIS)
    assert signature.unzipped == ("probabilities",) and signature.output("probabilities").shape[-1] == 3
    served = served_unzipped(IRIS, signature, temp_parent=tmp_path)
    x = np.array([[5.1, 3.5], [6.2, 2.9], [7.7, 3.0]], np.float32)
    _, maps = ort.InferenceSession(str(IRIS)).run(None, {"float_input": x})
    (got,) = ort.InferenceSession(str(served)).run(["probabilities"], {"float_input": x})
    np.testing.assert_allclose(got, [[row[k] for k in (0, 1, 2)] for row in maps], rtol=1e-6)


def test_a_zipmap_another_node_reads_or_none_at_all_changes_nothing(tmp_path):
    model = build_zipmap_classifier()
    graph = model.graph
    graph.node.append(helper.make_node("SequenceLength", ["probabilities"], ["rows"]))
    graph.output.append(helper.make_tensor_value_info("rows", onnx.TensorProto.INT64, []))
    assert unzipped(model) is None
    also = build_zipmap_classifier()  # the mapped tensor is an output of its own: the ZipMap cannot take its place
    also.graph.output.append(helper.make_tensor_value_info("probability_tensor", onnx.TensorProto.FLOAT, ["N", 3]))
    assert unzipped(also) is None
    with pytest.raises(ConfigError, match="output 'probabilities' is a sequence_type, only tensors can be served"):
        signature_of(model)
    plain = tmp_path / "plain.onnx"
    onnx.save(build_add_mul(), str(plain))
    assert read_signature(plain).unzipped == ()
    assert served_unzipped(plain, read_signature(plain)) == plain
