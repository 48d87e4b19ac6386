"""Optional inputs (config/optional_inputs.py): the ONNX file's overridable initializers, served as Triton's
onnxruntime backend serves them; reconciled with config.pbtxt, checked per request, filled with the file's values by
the instance, run from the copy the engines load (listed defaults plain inputs, the others constants)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.config.onnx_signature import signature_of
from gebackend.config.optional_inputs import Defaults, served_model
from gebackend.config.options import BackendOptions
from gebackend.config.pbtxt import load_model_config
from gebackend.config.spec import build_model_spec, reconcile
from gebackend.errors import ConfigError, InvalidRequest
from gebackend.modelzoo import SCALE_SHIFT_OPTIONAL, build_add_mul, build_scale_shift, scale_shift_reference
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from gebackend.runtime.validation import validate_request

from test_instance import Log


OUTPUT = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def _config(text: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.pbtxt"
        path.write_text('name: "ss"\nbackend: "ge"\n' + text)
        return load_model_config(path)


def test_the_signature_lists_the_defaults_of_ir_4_and_later_only():
    model = build_scale_shift()
    signature = signature_of(model)
    assert [t.name for t in signature.inputs] == ["x"]
    assert [t.name for t in signature.defaults] == ["W", "scale", "shift"]
    model.ir_version = 3  # IR 3 listed every initializer as an input: none of them can be fed
    assert signature_of(model).defaults == ()


def test_listed_defaults_are_optional_inputs_and_auto_complete_adds_none():
    signature = signature_of(build_scale_shift())
    listed = reconcile("ss", _config("max_batch_size: 0\n" + SCALE_SHIFT_OPTIONAL + OUTPUT), signature, 8)
    assert [(t.name, t.dims, t.optional) for t in listed.inputs] == [
        ("x", (-1, 4), False), ("scale", (4,), True), ("shift", (4,), True)]
    completed = reconcile("ss", _config(""), signature, 8)  # as the onnxruntime backend completes it: x only
    assert [t.name for t in completed.inputs] == ["x"] and completed.max_batch_size == 8
    required = reconcile("ss", _config('max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] },'
                                       ' { name: "W" data_type: TYPE_FP32 dims: [ 4, 4 ] } ]\n'), signature, 8)
    assert [(t.name, t.optional) for t in required.inputs] == [("x", False), ("W", False)]


def test_an_optional_input_without_a_default_or_on_a_batching_model_is_refused_naming_why():
    signature = signature_of(build_scale_shift())
    no_default = 'max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] optional: true } ]\n'
    with pytest.raises(ConfigError, match=r"model 'ss': input 'x' is `optional: true` in config.pbtxt but the ONNX "
                                          r"file has no default for it .*'W', 'scale', 'shift'.*remove `optional: true`"):
        reconcile("ss", _config(no_default), signature, 8)
    batched = 'max_batch_size: 8\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },' \
              ' { name: "scale" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]\n'
    with pytest.raises(ConfigError, match=r"model 'ss': optional input\(s\) \['scale'\] need a model without batching "
                                          r"\(max_batch_size: 0\)"):
        reconcile("ss", _config(batched), signature, 8)
    with pytest.raises(ConfigError, match=r"optional input\(s\) \['scale'\] need a model without batching"):
        reconcile("ss", _config(batched.replace("max_batch_size: 8\n", "")), signature, 8)  # batching by auto-complete


def test_a_request_may_leave_an_optional_input_out_but_not_a_required_one(tmp_path):
    config = _config("max_batch_size: 0\n" + SCALE_SHIFT_OPTIONAL + OUTPUT)
    spec = build_model_spec(config, signature_of(build_scale_shift()), tmp_path / "model.onnx", BackendOptions())
    validate_request(spec, {"x": X})
    validate_request(spec, {"x": X, "shift": np.zeros(4, np.float32)})
    with pytest.raises(InvalidRequest, match=r"model 'ss', input 'scale': expected shape \[4\]"):
        validate_request(spec, {"x": X, "scale": np.zeros(5, np.float32)})
    with pytest.raises(InvalidRequest, match=r"model 'ss': input 'x' is missing"):
        validate_request(spec, {"scale": np.ones(4, np.float32)})


def test_the_served_copy_feeds_listed_defaults_and_folds_the_others(tmp_path):
    path = tmp_path / "ss" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(build_scale_shift(), str(path))
    lines: list[str] = []
    copy, defaults = served_model(_config("max_batch_size: 0\n" + SCALE_SHIFT_OPTIONAL + OUTPUT), path,
                                  signature_of(build_scale_shift()), lines.append, tmp_path)
    assert copy != path and copy.name == "model.onnx" and tmp_path in copy.parents
    session = ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x", "scale", "shift"]
    assert session.get_overridable_initializers() == []  # W: a constant ONNX Runtime may fold and prepack
    assert sorted(defaults.values) == ["scale", "shift"]
    assert lines == ["optional input(s) ['scale', 'shift']: a request that leaves one out runs on the ONNX file's value",
                     "1 initializer(s) listed as graph inputs but not in config.pbtxt served as constants "
                     "(foldable, prepacked)"]
    shift = np.full(4, -1.0, np.float32)
    for feeds, want in [({"x": X}, scale_shift_reference(X)),
                        ({"x": X, "shift": shift}, scale_shift_reference(X, shift=shift))]:
        np.testing.assert_allclose(session.run(None, dict(defaults.fill(feeds)))[0], want, rtol=1e-6)


def test_a_model_without_defaults_is_served_from_its_own_file(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_add_mul(), str(path))
    copy, defaults = served_model({"input": []}, path, signature_of(build_add_mul()))
    assert copy == path and not defaults
    feeds = {"x": X}
    assert Defaults({}).fill(feeds) is feeds


@pytest.mark.parametrize("params", [{}, {"static_model": "1"}, {"engine": "openvino"}])
def test_an_instance_fills_left_out_optional_inputs_with_the_files_values(tmp_path, params):
    folder = tmp_path / "ss" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_scale_shift(), str(folder / "model.onnx"))
    text = "max_batch_size: 0\n" + SCALE_SHIFT_OPTIONAL.replace("-1, 4", "2, 4") + OUTPUT.replace("-1, 4", "2, 4")
    config = _config(text + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                                    for k, v in params.items()))
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    instance = ModelInstance.load(config, folder, InstanceInfo("ss_0_0"), Log(), pin=False)
    try:
        scale, shift = np.full(4, 2.0, np.float32), np.full(4, -3.0, np.float32)
        results = instance.execute([{"x": X}, {"x": X, "scale": scale}, {"x": X, "scale": scale, "shift": shift},
                                    {"x": X, "shift": np.zeros(3, np.float32)}])
        for got, want in zip(results, [scale_shift_reference(X), scale_shift_reference(X, scale),
                                       scale_shift_reference(X, scale, shift)]):
            np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
        assert isinstance(results[3], InvalidRequest) and "input 'shift'" in str(results[3])
    finally:
        instance.close()


def test_an_int8_model_served_from_a_copy_keeps_its_cache_and_calibration_data_beside_the_repositorys_file(tmp_path):
    folder = tmp_path / "ss" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_scale_shift(), str(folder / "model.onnx"))
    calib = tmp_path / "ss" / "calib"  # relative calibration_data: the folder holding config.pbtxt
    calib.mkdir()
    # the optional inputs left out: calibrated on the file's values, as requests leaving them out run
    np.save(calib / "x.npy", np.stack([X * k for k in (1.0, 1.1, -1.0, 0.5)]))
    params = {"precision_mode": "int8", "calibration_data": "calib"}
    config = _config("max_batch_size: 0\n" + SCALE_SHIFT_OPTIONAL + OUTPUT
                     + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items()))
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    for event in ("quantized", "reused"):  # a second instance (or a restart) quantizes nothing again
        lines: list[str] = []
        log = Log()
        log.info = lines.append
        instance = ModelInstance.load(config, folder, InstanceInfo("ss_0_0"), log, pin=False)
        try:
            got = instance.execute([{"x": X}])[0]["y"]
        finally:
            instance.close()
        assert any(f"cached at {folder / '.gebackend-cache' / 'precision'}" in line and event in line
                   for line in lines), lines
        np.testing.assert_allclose(got, scale_shift_reference(X), atol=0.1)


def test_defaults_kept_as_external_data_are_read_and_the_copy_links_the_rest(tmp_path):
    path = tmp_path / "ss" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(build_scale_shift(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    config = _config("max_batch_size: 0\n" + SCALE_SHIFT_OPTIONAL + OUTPUT)
    copy, defaults = served_model(config, path, signature_of(onnx.load(str(path), load_external_data=False)),
                                  temp_parent=tmp_path)
    assert (copy.parent / "weights.bin").is_file()  # W, now a constant, still reads its bytes from there
    np.testing.assert_array_equal(defaults.values["scale"], [1, 2, 3, 4])
    session = ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, dict(defaults.fill({"x": X})))[0], scale_shift_reference(X), rtol=1e-6)


def test_a_static_graph_loads_from_a_copy_whose_weights_are_external_data(tmp_path):
    """The static pipeline reads the copy with onnx, which refuses a hard-linked external data file."""
    folder = tmp_path / "ss" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_scale_shift(), str(folder / "model.onnx"), save_as_external_data=True, location="w.bin",
              size_threshold=0)
    fixed = SCALE_SHIFT_OPTIONAL.replace("-1, 4", "2, 4") + OUTPUT.replace("-1, 4", "2, 4")
    config = _config("max_batch_size: 0\n" + fixed + 'parameters { key: "static_model" value: { string_value: "1" } }\n')
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    instance = ModelInstance.load(config, folder, InstanceInfo("ss_0_0"), Log(), pin=False)
    try:
        assert instance.spec.static
        np.testing.assert_allclose(instance.execute([{"x": X}])[0]["y"], scale_shift_reference(X), rtol=1e-5)
    finally:
        instance.close()
