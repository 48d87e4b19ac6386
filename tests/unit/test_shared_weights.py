"""share_weights' decisions (engines/ort_shared_weights.py) and the file it writes, without a server: what is shared,
what is not and why, and that the shared file answers as the model's own."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.config.option_groups import BackendOptions
from gebackend.config.options import parse_options
from gebackend.engines import ort_shared_weights
from gebackend.engines.onnxruntime import OrtEngine, session_options
from gebackend.errors import ConfigError


def write_matmul(path: Path, rows: int = 256) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((rows, 64)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def decide(path: Path, cpu_only: bool = True, **options):
    session = BackendOptions.make(**options).session
    return ort_shared_weights.shared_file(path, session, cpu_only, lambda: session_options(session), ())


def test_off_and_small_models_keep_their_own_file(tmp_path):
    path = write_matmul(tmp_path / "m" / "1" / "model.onnx")
    assert decide(path, share_weights="off") == (path, "")
    assert decide(path, share_weights="auto") == (path, "")  # 64 KiB: under SHARE_MIN_BYTES
    assert not (path.parent / ".gebackend-cache").exists()


@pytest.mark.parametrize("options, cpu_only, why", [
    ({}, False, "an accelerator holds its own copy of the weights"),
    ({"disable_prepacking": True}, True, "disable_prepacking=1 (the shared file holds prepacked weights)"),
    ({"custom_op_libraries": ("libmy.so",)}, True, "the model has custom operator libraries"),
])
def test_on_says_why_it_does_not_apply(tmp_path, options, cpu_only, why):
    path = write_matmul(tmp_path / "model.onnx")
    assert decide(path, cpu_only, share_weights="on", **options) == (path, f" share_weights=on not applied: {why}")
    assert decide(path, cpu_only, share_weights="auto", **options) == (path, "")


def test_on_writes_one_file_the_next_load_reuses_and_it_answers_as_the_model(tmp_path):
    path = write_matmul(tmp_path / "m" / "1" / "model.onnx")
    shared, said = decide(path, share_weights="on")
    assert shared != path and shared.parent == path.parent / ".gebackend-cache" / "shared-weights"
    assert said.startswith(" share_weights: 0 MiB of weights mapped from model.shared.") and "(written now)" in said
    assert (shared.parent / f"{shared.stem}.weights").stat().st_size > 0
    again, said_again = decide(path, share_weights="on")
    assert again == shared and "(written by an earlier load)" in said_again
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    engine = OrtEngine(path, BackendOptions.make(share_weights="on"))
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    np.testing.assert_allclose(engine.run({"x": x}, ["y"])[0], expected, rtol=1e-5, atol=1e-6)
    assert "share_weights: 0 MiB of weights mapped from model.shared." in engine.describe()


def test_a_file_that_cannot_be_written_is_served_from_its_own_file(tmp_path, monkeypatch):
    path = write_matmul(tmp_path / "model.onnx")

    def refuse(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(ort_shared_weights, "_build", refuse)
    assert decide(path, share_weights="on") == (path, " share_weights: not shared (OSError: No space left on device)")


def test_the_option_reads_auto_and_bools():
    def parsed(value):
        return parse_options("m", {}, {"share_weights": value}, {}).options.session.share_weights

    assert [parsed(v) for v in ("auto", "1", "on", "0", "false")] == ["auto", "on", "on", "off", "off"]
    with pytest.raises(ConfigError, match="share_weights"):
        parsed("sometimes")
