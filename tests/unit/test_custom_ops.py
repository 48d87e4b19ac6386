"""config.pbtxt `model_operations { op_library_filename }`: ONNX Runtime custom operator libraries, registered with
every session of the model as Triton's onnxruntime backend does; a real library (onnxruntime-extensions) runs a model
with its `NegPos` operator in both graph modes; what cannot work is refused naming the library or the engine."""

from __future__ import annotations

import numpy as np
import onnxruntime_extensions as ortx  # pyproject's test extra: a real custom operator library
import onnx
import pytest

from gebackend.config.options import parse_options
from gebackend.errors import ConfigError, ModelLoadError
from gebackend.modelzoo import build_custom_negpos
from gebackend.runtime.instance import InstanceInfo, ModelInstance

from test_instance import Log


def _config(libraries: list[str], **params: str) -> dict:
    tensor = {"data_type": "TYPE_FP32", "dims": [4]}
    return {"name": "np", "backend": "ge", "max_batch_size": 4, "input": [{"name": "x", **tensor}],
            "output": [{"name": "y", **tensor}], "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            "model_operations": {"op_library_filename": libraries},
            "parameters": {k: {"string_value": v} for k, v in params.items()}}


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "np" / "1"
    path.mkdir(parents=True)
    onnx.save(build_custom_negpos(), str(path / "model.onnx"))
    return path


def test_the_config_section_reaches_the_options():
    parsed = parse_options("np", {}, {}, {"model_operations": {"op_library_filename": ["/lib/a.so", "/lib/b.so"]}})
    assert parsed.options.session.custom_op_libraries == ("/lib/a.so", "/lib/b.so")
    assert parsed.sources["custom_op_libraries"] == "model_operations.op_library_filename"


@pytest.mark.parametrize("params", [{}, {"static_model": "1"}, {"engine": "auto"}], ids=["dynamic", "static", "auto"])
def test_a_model_with_custom_operators_runs_with_their_library(folder, params):
    log = Log()
    instance = ModelInstance.load(_config([ortx.get_library_path()], **params), folder, InstanceInfo("np_0_0"), log,
                                  pin=False)
    try:
        requests = [{"x": np.array([[-1, 2, -3, 4]], np.float32)}, {"x": np.array([[5, -6, 0, 0.5]] * 2, np.float32)}]
        for request, result in zip(requests, instance.execute(requests)):
            x = request["x"]
            np.testing.assert_array_equal(result["y"], np.where(x > 0, 2 * x, x))
        if params.get("engine") == "auto":
            assert any("engine=auto -> onnxruntime (model_operations' custom operator libraries load into ONNX Runtime"
                       in line for _, line in log.lines), log.lines
    finally:
        instance.close()


def test_without_the_library_or_with_a_missing_one_or_on_openvino_the_load_says_why(folder, tmp_path):
    with pytest.raises(ModelLoadError, match=r"NegPos.*is not a registered function/op.*; if it is a custom operator, "
                                             r"name its library in config.pbtxt: model_operations"):
        ModelInstance.load(_config([]), folder, InstanceInfo("np_0_0"), Log(), pin=False)
    missing = str(tmp_path / "nowhere.so")
    with pytest.raises(ModelLoadError, match=rf"cannot load the custom operator library {missing} \(model_operations "
                                             r"op_library_filename\)"):
        ModelInstance.load(_config([missing]), folder, InstanceInfo("np_0_0"), Log(), pin=False)
    with pytest.raises(ConfigError, match=r"holds ONNX Runtime custom operators, which engine=openvino cannot run; "
                                          r"set engine=onnxruntime"):
        ModelInstance.load(_config([ortx.get_library_path()], engine="openvino"), folder, InstanceInfo("np_0_0"), Log(),
                           pin=False)
