"""Calibration samples for static int8 (compile/calibration.py): each calibration_data format, the errors naming the
model, input and file, and the seeded random samples."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from gebackend.compile import calibration
from gebackend.errors import ModelLoadError


def _two_inputs(path: Path) -> Path:
    """image float32 [batch, 3, 4, 4] and ids int64 [batch, 5] -> their sums (the model reads both)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["image"], ["a"], keepdims=0),
         helper.make_node("Cast", ["ids"], ["f"], to=onnx.TensorProto.FLOAT),
         helper.make_node("ReduceSum", ["f"], ["b"], keepdims=0)],
        "two",
        [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, ["batch", 3, 4, 4]),
         helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["batch", 5])],
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, []),
         helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [])])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture()
def model(tmp_path) -> Path:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "ge"\n')
    return _two_inputs(tmp_path / "m" / "1" / "model.onnx")


def test_relative_paths_resolve_against_the_folder_holding_config_pbtxt(model):
    assert calibration.model_folder(model) == model.parent.parent
    assert calibration.resolve("calib", model) == model.parent.parent / "calib"
    assert calibration.resolve("/abs/calib", model) == Path("/abs/calib")


def test_stacked_npy_per_input_gets_the_batch_dim_and_casts(model, tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    images = np.arange(4 * 3 * 4 * 4, dtype=np.float64).reshape(4, 3, 4, 4)  # float64: cast to float32
    np.save(folder / "image.npy", images)
    np.save(folder / "ids.npy", np.arange(20, dtype=np.int32).reshape(4, 5))  # int32: cast to int64
    samples = calibration.load_samples("m", model, folder, batching=True)
    assert len(samples) == 4
    assert samples[2]["image"].shape == (1, 3, 4, 4) and samples[2]["image"].dtype == np.float32
    np.testing.assert_array_equal(samples[2]["image"][0], images[2].astype(np.float32))
    assert samples[3]["ids"].dtype == np.int64 and samples[3]["ids"].tolist() == [[15, 16, 17, 18, 19]]
    assert len(calibration.load_samples("m", model, folder, batching=True, limit=3)) == 3
    assert calibration.data_files(folder) == [folder / "ids.npy", folder / "image.npy"]


def test_subfolder_of_npy_files_one_sample_each_sorted_by_name(model, tmp_path):
    folder = tmp_path / "calib"
    for name in ("image", "ids"):
        (folder / name).mkdir(parents=True)
    for k in (2, 0, 1):  # written out of order: read by name
        np.save(folder / "image" / f"s{k}.npy", np.full((1, 3, 4, 4), k, np.float32))  # with its batch dim
        np.save(folder / "ids" / f"s{k}.npy", np.full((5,), k, np.int64))  # without
    samples = calibration.load_samples("m", model, folder, batching=True)
    assert [float(s["image"].mean()) for s in samples] == [0.0, 1.0, 2.0]
    assert [s["ids"].shape for s in samples] == [(1, 5)] * 3 and samples[2]["ids"][0, 0] == 2


def test_perf_analyzer_json_flat_content_and_b64(model, tmp_path):
    image = np.linspace(0, 1, 48, dtype=np.float32)
    document = {"data": [
        {"image": image.tolist(), "ids": [1, 2, 3, 4, 5]},
        {"image": {"content": image.tolist(), "shape": [3, 4, 4]}, "ids": {"content": [5, 4, 3, 2, 1], "shape": [5]}},
        {"image": {"b64": base64.b64encode(image.tobytes()).decode()}, "ids": {"b64": base64.b64encode(
            np.array([7, 7, 7, 7, 7], np.int64).tobytes()).decode()}},
    ]}
    file = tmp_path / "data.json"
    file.write_text(json.dumps(document))
    samples = calibration.load_samples("m", model, file, batching=True)
    assert len(samples) == 3
    for sample in samples:
        assert sample["image"].shape == (1, 3, 4, 4) and sample["image"].dtype == np.float32
        np.testing.assert_allclose(sample["image"].ravel(), image, rtol=1e-6)
        assert sample["ids"].shape == (1, 5) and sample["ids"].dtype == np.int64
    assert samples[1]["ids"].tolist() == [[5, 4, 3, 2, 1]] and samples[2]["ids"].tolist() == [[7] * 5]
    # with a limit, the entries past it are not decoded: a broken one there is not read (tune's 64 requests of many)
    document["data"].append({"image": [0.0] * 5, "ids": [1]})
    file.write_text(json.dumps(document))
    assert [s["ids"].tolist() for s in calibration.load_samples("m", model, file, True, limit=2)] == \
        [[[1, 2, 3, 4, 5]], [[5, 4, 3, 2, 1]]]
    with pytest.raises(ModelLoadError, match=r"\[data 3\]: input 'image' has 5 values"):
        calibration.load_samples("m", model, file, True, limit=4)


@pytest.mark.parametrize("case, wanted", [
    ("missing", ["input 'ids' is missing", "ids.npy"]),
    ("dtype", ["input 'ids'", "float32", "cannot be cast to int64"]),
    ("rank", ["input 'image'", "rank 2", "rank 4", "float32 [batch, 3, 4, 4]"]),
    ("dims", ["input 'image'", "dim 2 is 5", "needs 4"]),
])
def test_bad_folder_names_model_input_file_and_expectation(model, tmp_path, case, wanted):
    folder = tmp_path / "calib"
    folder.mkdir()
    image = {"rank": np.zeros((2, 3, 16), np.float32), "dims": np.zeros((2, 1, 3, 5, 4), np.float32)}.get(
        case, np.zeros((2, 3, 4, 4), np.float32))
    np.save(folder / "image.npy", image)
    if case != "missing":
        np.save(folder / "ids.npy", np.zeros((2, 5), np.float32 if case == "dtype" else np.int64))
    with pytest.raises(ModelLoadError) as caught:
        calibration.load_samples("m", model, folder, batching=True)
    message = str(caught.value)
    assert "model 'm'" in message and str(folder) in message
    for part in wanted:
        assert part in message, message


def test_bad_json_names_the_input_and_entry(model, tmp_path):
    file = tmp_path / "data.json"
    file.write_text(json.dumps({"data": [{"image": [0.0] * 48, "ids": [1, 2, 3]}]}))
    with pytest.raises(ModelLoadError, match=r"data\.json \[data 0\]: input 'ids' has 3 values, which do not fill"):
        calibration.load_samples("m", model, file, batching=True)
    file.write_text(json.dumps({"data": [{"image": [0.0] * 48}]}))
    with pytest.raises(ModelLoadError, match="input 'ids' is missing"):
        calibration.load_samples("m", model, file, batching=True)
    file.write_text("{not json")
    with pytest.raises(ModelLoadError, match="not a readable JSON file"):
        calibration.load_samples("m", model, file, batching=True)
    with pytest.raises(ModelLoadError, match="does not exist"):
        calibration.load_samples("m", model, tmp_path / "nowhere", batching=True)


def test_random_samples_are_seeded_one_seed_per_sample(model):
    first = calibration.random_samples(model, 5)
    again = calibration.random_samples(model, 5)
    assert len(first) == 5
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a["image"], b["image"])
    assert not np.array_equal(first[0]["image"], first[1]["image"])  # a different seed per sample
    assert first[0]["image"].shape == (1, 3, 4, 4) and first[0]["ids"].dtype == np.int64
