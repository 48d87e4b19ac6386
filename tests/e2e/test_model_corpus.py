"""Whole models from the onnx wheel's model cases (tests/conformance/model_cases.py) served through the real server:
model-zoo architectures of 2017 (IR 3, opset 9, every weight a `ConstantOfShape` and every constant also listed as a
graph input) and two PyTorch exports at opset 6 (which ONNX Runtime cannot load as they are: `ge` converts them to
opset 7), each in a repository with nothing but `backend: "ge"` in config.pbtxt (auto-complete reads the rest),
dynamic and `static_model=1`, one request over HTTP with the case's input, the answer compared with the shipped
reference at its tolerance. The in-process conformance test runs every case; this proves a user's repository of
such files loads as it is and answers right.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from conformance import corpus, model_cases  # tests/ is on sys.path (tests/e2e is a package)

from .server import start_server

pytestmark = pytest.mark.e2e

OPSET_6 = ("pytorch-converted/test_PReLU_2d_multiparam", "pytorch-operator/test_operator_addmm")
SERVED = ("light/bvlc_alexnet", "light/densenet121", "light/inception_v1", "light/resnet50", "light/squeezenet", *OPSET_6)


def _model_name(case_name: str, static: bool) -> str:
    return case_name.replace("/", "_") + ("_static" if static else "")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    repo = root / "models"
    cases = [c for c in model_cases.load_model_cases() if c.name in SERVED]
    if not cases:
        pytest.skip("this onnx wheel ships no light models (onnx/backend/test/data/light)")
    for case in cases:
        for static in (False, True):
            folder = repo / _model_name(case.name, static)
            (folder / "1").mkdir(parents=True)
            onnx.save(case.model, str(folder / "1" / "model.onnx"))
            extra = 'parameters { key: "static_model" value: { string_value: "1" } }\n' if static else ""
            (folder / "config.pbtxt").write_text(f'backend: "ge"\n{extra}')
    server = start_server(repo, root / "serve.log")
    yield server, cases
    server.stop()


def test_model_zoo_architectures_load_with_bare_configs_and_answer_as_the_reference(served):
    server, cases = served
    assert len(cases) == len(SERVED), [c.name for c in cases]
    client = httpclient.InferenceServerClient(server.http_url)
    wrong = []
    for case in cases:
        for static in (False, True):
            model = _model_name(case.name, static)
            config = client.get_model_config(model)
            served_inputs = [i["name"] for i in config["input"]]
            # the constants the file also lists as inputs are no inputs a client must send
            assert served_inputs == corpus.input_names(case.model), (model, served_inputs)
            inputs = []
            for name, value in corpus.feeds(case).items():
                tensor = httpclient.InferInput(name, list(value.shape), "FP32")
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            result = client.infer(model, inputs)
            got = [result.as_numpy(o.name) for o in case.model.graph.output]
            why = corpus.compare(case.outputs, got, case.rtol, case.atol)
            if why:
                wrong.append(f"{model}: {why}")
    client.close()
    assert not wrong, "\n".join(wrong)


def test_an_opset_6_file_is_served_converted_and_the_load_log_says_so(served):
    server, _ = served
    log = server.output()
    for case in OPSET_6:
        model = _model_name(case, static=False)
        loaded = [line for line in log.splitlines() if f"model '{model}' instance" in line and " loaded " in line]
        assert loaded and all("opset 6 converted to 7 with onnx.version_converter" in line for line in loaded), loaded


def test_a_request_of_another_shape_is_refused_naming_the_model_and_input(served):
    server, cases = served
    client = httpclient.InferenceServerClient(server.http_url)
    case = next(c for c in cases if c.name == "light/resnet50")
    name = corpus.input_names(case.model)[0]
    tensor = httpclient.InferInput(name, [1, 3, 112, 112], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3, 112, 112), np.float32))
    for static in (False, True):
        model = _model_name(case.name, static)
        with pytest.raises(Exception) as refused:
            client.infer(model, [tensor])
        text = str(refused.value)
        assert model in text and name in text and "224" in text, text
    client.close()
