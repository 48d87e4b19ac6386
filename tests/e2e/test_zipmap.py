"""scikit-learn classifiers as skl2onnx and onnxmltools export them (their probabilities a ZipMap: a sequence of maps,
which Triton cannot carry and Triton's onnxruntime backend refuses) served through the real server with bare configs:
the probabilities come back as the FP32 [rows, classes] tensor the ZipMap maps, batched, in both graph modes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gebackend.modelzoo.misc import build_zipmap_classifier

from .server import start_server

pytestmark = pytest.mark.e2e

IRIS = Path(ort.__file__).parent / "datasets" / "logreg_iris.onnx"
LABELS = ("setosa", "versicolor", "virginica")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("zipmap")
    repo = root / "models"
    static = 'parameters { key: "static_model" value: { string_value: "1" } }\n'
    for name, extra in (("classifier", ""), ("classifier_static", static)):
        (repo / name / "1").mkdir(parents=True)
        onnx.save(build_zipmap_classifier(LABELS), str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.pbtxt").write_text(f'backend: "ge"\n{extra}')
    (repo / "classifier_labels" / "1").mkdir(parents=True)  # Triton's classification extension on the tensor
    onnx.save(build_zipmap_classifier(LABELS), str(repo / "classifier_labels" / "1" / "model.onnx"))
    (repo / "classifier_labels" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (repo / "classifier_labels" / "config.pbtxt").write_text(
        'backend: "ge"\noutput [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]\n')
    (repo / "iris" / "1").mkdir(parents=True)
    shutil.copy(IRIS, repo / "iris" / "1" / "model.onnx")
    (repo / "iris" / "config.pbtxt").write_text('backend: "ge"\n')
    running = start_server(repo, root / "serve.log")
    yield running, repo
    running.stop()


def _want(path, feeds, labels):
    label, maps = ort.InferenceSession(str(path)).run(None, feeds)
    return label, np.array([[row[k] for k in labels] for row in maps], np.float32)


def test_a_classifiers_probabilities_are_served_batched_as_a_tensor(server):
    running, repo = server
    rows = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    want_label, want = _want(repo / "classifier" / "1" / "model.onnx", {"features": rows}, LABELS)
    client = grpcclient.InferenceServerClient(running.grpc_url)
    for model in ("classifier", "classifier_static"):
        config = client.get_model_config(model, as_json=True)["config"]
        assert config["max_batch_size"] == 8, config
        outputs = {o["name"]: (o["data_type"], o["dims"]) for o in config["output"]}
        assert outputs == {"label": ("TYPE_STRING", ["1"]), "probabilities": ("TYPE_FP32", ["3"])}, outputs
        for row in range(3):  # one request per row: the batcher stacks them
            tensor = grpcclient.InferInput("features", [1, 4], "FP32")
            tensor.set_data_from_numpy(rows[row:row + 1])
            result = client.infer(model, [tensor])
            np.testing.assert_allclose(result.as_numpy("probabilities")[0], want[row], rtol=1e-6)
            assert result.as_numpy("label").reshape(-1)[0].decode() == want_label[row]
    client.close()
    assert (f"model 'classifier': output 'probabilities' is a ZipMap (a sequence of maps, which Triton cannot carry): "
            f"served as the tensor it maps, FP32 [rows, classes], columns in the order of the class labels "
            f"{list(LABELS)}") in running.output()


def test_the_iris_classifier_onnxruntime_ships_answers_as_its_maps(server):
    running, _ = server
    x = np.array([[5.1, 3.5], [6.2, 2.9], [7.7, 3.0]], np.float32)
    _, want = _want(IRIS, {"float_input": x}, (0, 1, 2))
    client = httpclient.InferenceServerClient(running.http_url)
    tensor = httpclient.InferInput("float_input", [3, 2], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("iris", [tensor])
    np.testing.assert_allclose(result.as_numpy("probabilities"), want, rtol=1e-6)
    client.close()


def test_a_label_file_gives_the_top_classes_by_name(server):
    running, repo = server
    rows = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    _, want = _want(repo / "classifier_labels" / "1" / "model.onnx", {"features": rows}, LABELS)
    client = httpclient.InferenceServerClient(running.http_url)
    tensor = httpclient.InferInput("features", [2, 4], "FP32")
    tensor.set_data_from_numpy(rows)
    result = client.infer("classifier_labels", [tensor],
                          outputs=[httpclient.InferRequestedOutput("probabilities", class_count=2)])
    got = [[entry.decode().split(":") for entry in row] for row in result.as_numpy("probabilities")]
    for row, entries in enumerate(got):
        order = np.argsort(-want[row])[:2]
        assert [(int(i), name) for _, i, name in entries] == [(int(i), LABELS[i]) for i in order], got
        np.testing.assert_allclose([float(score) for score, _, _ in entries], want[row][order], rtol=1e-5)
    client.close()

