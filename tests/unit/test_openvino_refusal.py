"""A model OpenVINO cannot read (a convolution over a tensor whose rank only a run knows, as in a voice-activity
detector): `engine=openvino` fails its load naming the op, `engine=auto` serves it on ONNX Runtime and its load line
says why, and `gebackend tune` prunes the OpenVINO candidates with that reason and still finds a winner."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.compile.accuracy import compare
from gebackend.engines import auto_choice
from gebackend.errors import ModelLoadError
from gebackend.modelzoo.detectors import build_unranked_conv
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from tests.unit.test_instance import Log
from tests.unit.test_tune_search import Clock, FakeMeasurer, by_key, cands, run

AVX2 = {"avx2", "fma"}
OPENVINO = importlib.util.find_spec("openvino") is not None and importlib.util.find_spec("nncf") is not None
REFUSED = "OpenVINO cannot read model.onnx: conversion failed for Conv-13: The input data tensor's rank has to be known"


@pytest.fixture
def folder(tmp_path):
    version = tmp_path / "vad" / "1"
    version.mkdir(parents=True)
    onnx.save(build_unranked_conv(), str(version / "model.onnx"))
    return version


def _load(folder, **params):
    config = {"name": "vad", "backend": "ge", "parameters": {k: {"string_value": v} for k, v in params.items()}}
    return ModelInstance.load(config, folder, InstanceInfo("vad_0"), Log(), pin=False)


def test_engine_auto_chooses_again_where_openvino_refuses_the_model(folder):
    """The choice itself, the engine's refusal simulated: the model's 2 Conv would take OpenVINO (NNCF's int8)."""
    path = folder / "model.onnx"
    refusal = lambda p: "OpenVINO cannot read model.onnx: conversion failed for Conv-13"  # noqa: E731
    chosen = auto_choice.resolve("auto", "int8", path, AVX2, lambda: ("FP32", "INT8"), openvino_reads=refusal)
    assert (chosen.engine, chosen.precision_mode) == ("onnxruntime", "int8")
    assert chosen.why == ("engine=auto: OpenVINO cannot serve this model (OpenVINO cannot read model.onnx: conversion "
                          "failed for Conv-13); onnxruntime instead")
    assert chosen.refused == refusal(path)
    if OPENVINO:  # read as it is, the choice is OpenVINO's; named, the engine is kept whatever it reads
        readable = auto_choice.resolve("auto", "int8", path, AVX2, lambda: (), openvino_reads=lambda p: "")
        assert readable.engine == "openvino" and not readable.refused
    named = auto_choice.resolve("openvino", "int8", path, AVX2, lambda: (), openvino_reads=refusal)
    assert named.engine == "openvino"


@pytest.mark.skipif(not OPENVINO, reason="OpenVINO and NNCF are not installed")
def test_engine_auto_serves_on_onnxruntime_and_the_load_line_says_why(folder):
    assert auto_choice.openvino_refusal(folder / "model.onnx").startswith(REFUSED)
    instance = _load(folder, engine="auto", precision_mode="int8", quantization="static")
    try:
        assert instance.executor.spec.options.engines.engine == "onnxruntime"
        assert instance.how.startswith(f"engine=auto -> onnxruntime ({REFUSED}"), instance.how
        assert re.search(r"precision int8 static \(cosine 0\.99\d+ to fp32 on audio:\[1, 1, 16\], the default size 16; "
                         r"ONNX Runtime QDQ, 2 of 2 Conv, 1 of 1 MatMul/Gemm quantized", instance.how), instance.how
        audio = np.random.default_rng(3).standard_normal((1, 1, 400)).astype(np.float32)
        got = instance.execute([{"audio": audio}])[0]["y"]
        want = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(
            None, {"audio": audio})[0]
        assert compare("y", want, got).cosine >= 0.99
    finally:
        instance.close()
    with pytest.raises(ModelLoadError, match="rank has to be known"):  # named, OpenVINO is not replaced
        _load(folder, engine="openvino")


@pytest.mark.skipif(not OPENVINO, reason="OpenVINO and NNCF are not installed")
def test_tune_prunes_what_openvino_cannot_read_and_still_finds_a_winner(folder):
    from gebackend.tune import measure, tuned_model
    from gebackend.tune.outcome import Pruned

    (folder.parent / "config.pbtxt").write_text('name: "vad"\nbackend: "ge"\n')
    model = tuned_model.TunedModel.load(folder.parent)
    assert measure.unreadable("openvino", model).startswith(REFUSED)
    assert measure.unreadable("openvino", model).endswith("; none of its candidates on openvino can load")
    assert measure.unreadable("onnxruntime", model) == ""

    class Refusing(FakeMeasurer):
        def accuracy(self, engine, rung):
            refused = measure.unreadable(engine, model)
            if refused:
                raise Pruned(refused)
            return super().accuracy(engine, rung)

    clock = Clock()
    done = run(cands(), Refusing(clock), clock)
    on_openvino = [o for o in by_key(done).values() if o.candidate.scenario.engine == "openvino"]
    assert on_openvino and all(o.status.startswith(f"pruned: {REFUSED}") for o in on_openvino)
    assert done.winner is not None and done.winner.candidate.scenario.engine == "onnxruntime"
