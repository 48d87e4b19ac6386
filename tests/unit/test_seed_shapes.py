"""compile/seed_shapes.py and compile/shape_sources.py: the sizes every invented input takes, in order (config.pbtxt's
dims, model_warmup, calibration_data, the file's metadata, probed sizes), the first that runs on ONNX Runtime chosen
and named; none running said; the verdict kept per file so a model's instances probe once."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from gebackend.compile import seed_shapes as seeding
from gebackend.compile.seed_shapes import seed_shapes, short
from gebackend.compile.shape_sources import image_axes, free_axes
from gebackend.config import dtypes
from gebackend.config.spec import TensorSpec
from gebackend.modelzoo import build_bert
from gebackend.modelzoo.detectors import build_detector_neck


def _save(tmp_path, model, name="model.onnx"):
    folder = tmp_path / name.split(".")[0] / "1"
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def _runs(path, side):
    runner = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return runner.run(None, {"images": np.zeros((1, 3, side, side), np.float32)})[0].shape


def _images(dims):
    return (TensorSpec("images", dtypes.from_triton("TYPE_FP32"), tuple(dims), (None,) * len(dims)),)


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    monkeypatch.setattr(seeding, "_VERDICTS", {})


def test_a_detector_neck_is_probed_past_the_sizes_it_refuses(tmp_path):
    path = _save(tmp_path, build_detector_neck())
    with pytest.raises(Exception, match="Concat"):
        _runs(path, 224)  # 224 is no multiple of 64: the Concat's sides differ, as YOLOv8's do off multiples of 32
    chosen = seed_shapes(path, batching=True)
    assert (chosen.shapes, chosen.source, chosen.runs) == ({"images": (1, 3, 320, 320)}, "probed 320x320", True)
    assert chosen.phrase() == "images:[1, 3, 320, 320], probed 320x320"
    assert _runs(path, 320) == (1, 4, 320, 320)


def test_the_files_metadata_comes_before_probing(tmp_path):
    path = _save(tmp_path, build_detector_neck(metadata={"imgsz": "[640, 640]", "stride": "64"}))
    chosen = seed_shapes(path, batching=True)
    assert chosen.shapes == {"images": (1, 3, 640, 640)} and chosen.source == "the file's metadata imgsz=[640, 640]"
    # a metadata size the model refuses is passed over for the next source
    refused = _save(tmp_path, build_detector_neck(metadata={"imgsz": "[224, 224]"}), "refused.onnx")
    assert seed_shapes(refused, batching=True).source == "probed 320x320"


def test_model_warmup_and_calibration_data_come_before_the_metadata(tmp_path):
    path = _save(tmp_path, build_detector_neck(metadata={"imgsz": "640"}))
    warmup = [{"name": "w", "batch_size": 1, "inputs": {"images": {"data_type": "TYPE_FP32", "dims": [3, 384, 448]}}}]
    chosen = seed_shapes(path, batching=True, warmup=warmup)
    assert (chosen.shapes["images"], chosen.source) == ((1, 3, 384, 448), "model_warmup")
    sample = {"images": np.zeros((1, 3, 256, 512), np.float32)}
    assert seed_shapes(path, batching=True, sample=sample).shapes["images"] == (1, 3, 256, 512)
    assert seed_shapes(path, batching=True, sample=sample).source == "calibration_data"


def test_the_configs_dims_win_and_need_no_probe(tmp_path, monkeypatch):
    path = _save(tmp_path, build_detector_neck())
    monkeypatch.setattr(seeding, "_probe", lambda *a: pytest.fail("nothing is free: nothing to probe"))
    chosen = seed_shapes(path, _images((3, 128, 192)), batching=True)
    assert (chosen.shapes, chosen.source, chosen.runs) == ({"images": (1, 3, 128, 192)}, "the config's dims", None)
    # the config's height with the width free: the probes size the width only, the config's height kept
    monkeypatch.undo()
    half = seed_shapes(path, _images((3, 128, -1)), batching=True)
    assert (half.shapes["images"], half.source) == ((1, 3, 128, 320), "probed 320")


def test_no_size_that_runs_is_said_with_what_was_tried(tmp_path):
    from tests.unit.test_free_dims import _patch_model  # runs at 8 x 8 only (a table of 16 patch positions)

    path = _save(tmp_path, _patch_model())
    chosen = seed_shapes(path, batching=True)
    assert chosen.runs is False and chosen.tried == 16 and chosen.shapes == {"pixels": (1, 3, 16, 16)}
    assert chosen.why.startswith("pixels:[1, 3, 224, 224] (probed 224x224): Add: Attempting to broadcast an axis")
    assert chosen.why.endswith("; and 14 more")


def test_other_free_dims_keep_the_default_16_where_it_runs(tmp_path):
    chosen = seed_shapes(_save(tmp_path, build_bert()), batching=True)
    assert chosen.shapes == {"input_ids": (1, 16), "attention_mask": (1, 16)}
    assert (chosen.source, chosen.runs) == ("the default size 16", True)


def test_a_model_of_fixed_dims_is_not_probed(tmp_path, monkeypatch):
    monkeypatch.setattr(seeding, "_probe", lambda *a: pytest.fail("nothing is free: nothing to probe"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])]))
    chosen = seed_shapes(_save(tmp_path, model))
    assert (chosen.shapes, chosen.source, chosen.runs) == ({"x": (2, 5)}, "the file's dims", None)


def test_the_verdict_is_kept_beside_the_model_so_instances_probe_once(tmp_path, monkeypatch):
    path = _save(tmp_path, build_detector_neck())
    first = seed_shapes(path, batching=True)
    assert list((path.parent / ".gebackend-cache" / "shapes").glob("*.json"))
    monkeypatch.setattr(seeding, "_VERDICTS", {})  # another instance's process: only the file on disk is shared
    monkeypatch.setattr(seeding, "_probe", lambda *a: pytest.fail("probed again"))
    again = seed_shapes(path, batching=True)
    assert again == first and again.source == "probed 320x320"


def test_image_sides_are_told_from_other_free_dims():
    value = lambda name, dims: helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)  # noqa: E731
    graph = helper.make_graph([helper.make_node("Identity", [n], [f"{n}_out"]) for n in ("nchw", "nhwc", "kv", "line")],
                              "g", [value("nchw", ["b", 3, "h", "w"]), value("nhwc", ["b", "h", "w", 3]),
                                    value("kv", ["b", 2, "past", 4]), value("line", ["b", 3, 48, "w"])],
                              [value(f"{n}_out", None) for n in ("nchw", "nhwc", "kv", "line")])
    model = helper.make_model(graph)
    assert image_axes(model, free_axes(model, {})) == {"nchw": (2, 3), "nhwc": (1, 2), "line": (3,)}


def test_onnx_runtimes_error_is_said_in_one_line():
    error = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Concat node. "
             "Name:'/model.11/Concat' Status Message: concatbase.h:135 PrepareForComputeImpl Non concat axis "
             "dimensions must match: Axis 2 has mismatched dimensions of 64 and 16\n")
    assert short(RuntimeError(error)) == ("Concat '/model.11/Concat': Non concat axis dimensions must match: Axis 2 "
                                          "has mismatched dimensions of 64 and 16")
