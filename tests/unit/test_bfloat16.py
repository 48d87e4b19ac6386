"""bfloat16 inputs and outputs (TYPE_BF16) through every engine and graph mode (compile/bfloat16.py): ONNX Runtime's and
OpenVINO's Python APIs take and give bfloat16 only as 16-bit buffers; answers equal numpy's own (ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

from gebackend.compile.accuracy import random_feeds
from gebackend.config import dtypes
from gebackend.modelzoo import build_bf16_affine
from gebackend.runtime.instance import InstanceInfo, ModelInstance

from test_instance import Log

BF16 = np.dtype(ml_dtypes.bfloat16)


def _reference(x: np.ndarray) -> dict[str, np.ndarray]:
    y32 = x.astype(np.float32) * 2 + 1
    return {"y": y32.astype(BF16), "y32": y32}


@pytest.mark.parametrize("params", [{}, {"static_model": "1"}, {"engine": "openvino"},
                                    {"engine": "openvino", "static_model": "1"}],
                         ids=["ort", "ort_static", "openvino", "openvino_static"])
def test_bf16_inputs_and_outputs_run_batched_on_every_engine(tmp_path, params):
    folder = tmp_path / "bf" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_bf16_affine(), str(folder / "model.onnx"))
    tensors = [{"name": "x", "data_type": "TYPE_BF16", "dims": [4]}]
    outputs = [{"name": "y", "data_type": "TYPE_BF16", "dims": [4]}, {"name": "y32", "data_type": "TYPE_FP32", "dims": [4]}]
    config = {"name": "bf", "backend": "ge", "max_batch_size": 4, "input": tensors, "output": outputs,
              "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
              "parameters": {k: {"string_value": v} for k, v in params.items()}}
    instance = ModelInstance.load(config, folder, InstanceInfo("bf_0_0"), Log(), pin=False)
    try:
        rng = np.random.default_rng(0)
        requests = [{"x": rng.standard_normal((rows, 4)).astype(BF16)} for rows in (1, 2)]
        results = instance.execute(requests)  # two requests: batched into one run of 3 rows
        for request, result in zip(requests, results):
            want = _reference(request["x"])
            assert result["y"].dtype == BF16 and result["y32"].dtype == np.float32
            # within one bfloat16 step: OpenVINO's Cast rounds some values the other way than numpy's
            np.testing.assert_allclose(result["y"].astype(np.float32), want["y"].astype(np.float32), rtol=2 ** -7)
            np.testing.assert_allclose(result["y32"], want["y32"], rtol=1e-6)
        wrong = instance.execute([{"x": np.ones((1, 4), np.float32)}])[0]
        assert "expected data type BF16, got float32" in str(wrong)
    finally:
        instance.close()


def test_the_type_table_and_random_feeds_know_bfloat16(tmp_path):
    assert dtypes.from_onnx(onnx.TensorProto.BFLOAT16).triton == "TYPE_BF16"
    path = tmp_path / "bf.onnx"
    onnx.save(build_bf16_affine(), str(path))
    feeds = random_feeds(path)
    assert feeds["x"].dtype == BF16 and np.isfinite(feeds["x"].astype(np.float32)).all()


def test_the_benchs_accuracy_check_runs_a_bf16_model(tmp_path):
    """bench/tune's in-process accuracy against plain ONNX Runtime (its reference session takes bfloat16 through
    OrtValues; it failed with "Numpy_type 256 can't be converted to MLDataType")."""
    from gebackend.bench import inprocess

    folder = tmp_path / "bf"
    (folder / "1").mkdir(parents=True)
    onnx.save(build_bf16_affine(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text('name: "bf"\nbackend: "ge"\nmax_batch_size: 4\n'
                                         'input [ { name: "x" data_type: TYPE_BF16 dims: [ 4 ] } ]\n'
                                         'output [ { name: "y" data_type: TYPE_BF16 dims: [ 4 ] }, '
                                         '{ name: "y32" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    ceiling = inprocess.Ceiling(folder, log=lambda line: None)
    try:
        feeds = {"x": np.random.default_rng(2).standard_normal((3, 4)).astype(BF16)}
        assert inprocess.accuracy(ceiling, folder / "1" / "model.onnx", feeds) == {"cosine": 1.0, "max_abs_diff": 0.0}
    finally:
        ceiling.close()
