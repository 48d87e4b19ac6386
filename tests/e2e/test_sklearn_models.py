"""scikit-learn models as skl2onnx exports them (nobody here wrote the converter), served through the real server
with nothing but `backend: "ge"` in config.pbtxt, and answered as scikit-learn itself predicts: a scaled logistic
regression and a random forest on iris (their probabilities a ZipMap, which the peer refuses), a gradient-boosted
regressor on diabetes, and a character TF-IDF text classifier on Chinese and English captions (StringNormalizer, whose
locale slim machines lack, ONNX Runtime's Tokenizer, TfIdfVectorizer, ZipMap). The data sets ship inside
scikit-learn."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient

from .server import start_server

pytestmark = pytest.mark.e2e

skl2onnx = pytest.importorskip("skl2onnx")

TEXTS = ["猫坐在垫子上", "狗在公园里跑", "The cat sat on the mat", "A dog runs in the park", "猫和狗", "cats and dogs"]


def _fitted():
    """name -> (fitted estimator, its ONNX model, the rows to ask for)."""
    from sklearn.datasets import load_diabetes, load_iris
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from skl2onnx.common.data_types import StringTensorType

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    xd, yd = load_diabetes(return_X_y=True)
    xd = xd.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logreg = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
        forest = RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(x, y)
        boosted = GradientBoostingRegressor(n_estimators=20, random_state=0).fit(xd, yd)
        text = make_pipeline(TfidfVectorizer(analyzer="char"), LogisticRegression()).fit(TEXTS, [0, 1, 0, 1, 0, 1])
        return {
            "iris_logreg": (logreg, skl2onnx.to_onnx(logreg, x[:1]), x[::15]),
            "iris_forest": (forest, skl2onnx.to_onnx(forest, x[:1]), x[::15]),
            "diabetes_boosted": (boosted, skl2onnx.to_onnx(boosted, xd[:1]), xd[::40]),
            "captions": (text, skl2onnx.convert_sklearn(text, initial_types=[("text", StringTensorType([None, 1]))]),
                         np.array(TEXTS, dtype=object).reshape(-1, 1)),
        }


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("sklearn")
    models = _fitted()
    for name, (_, model, _) in models.items():
        (root / "models" / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / "models" / name / "1" / "model.onnx"))
        (root / "models" / name / "config.pbtxt").write_text('backend: "ge"\n')
    server = start_server(root / "models", root / "serve.log")
    yield server, models
    server.stop()


def _infer(client, model, rows):
    name, wire = ("text", "BYTES") if rows.dtype == object else ("X", "FP32")
    answers = []
    for row in rows:  # one request per row: the dynamic batcher groups them
        tensor = grpcclient.InferInput(name, [1, *row.shape], wire)
        tensor.set_data_from_numpy(row[None])
        answers.append(client.infer(model, [tensor]))
    return answers


@pytest.mark.parametrize("model", ["iris_logreg", "iris_forest", "captions"])
def test_a_classifier_answers_as_scikit_learn_predicts(served, model):
    server, models = served
    estimator, _, rows = models[model]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = _infer(client, model, rows)
    client.close()
    features = [str(r[0]) for r in rows] if rows.dtype == object else rows
    labels = np.array([a.as_numpy("output_label").reshape(-1)[0] for a in answers])
    probabilities = np.concatenate([a.as_numpy("output_probability") for a in answers])
    np.testing.assert_array_equal(labels, estimator.predict(features))
    np.testing.assert_allclose(probabilities, estimator.predict_proba(features), rtol=1e-4, atol=1e-5)


def test_a_regressor_answers_as_scikit_learn_predicts(served):
    server, models = served
    estimator, _, rows = models["diabetes_boosted"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got = np.concatenate([a.as_numpy("variable").reshape(-1) for a in _infer(client, "diabetes_boosted", rows)])
    client.close()
    np.testing.assert_allclose(got, estimator.predict(rows), rtol=1e-4)
