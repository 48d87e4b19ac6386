"""engines/auto_choice: what precision_mode=auto and engine=auto become, by CPU flags, OpenVINO's capabilities and the
model; and the accuracy guard that serves fp32 when a lowered model is too far from it (runtime/loader.py)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend import cpu
from gebackend.config import engine_names
from gebackend.engines import auto_choice, registry
from gebackend.modelzoo import build_bert, build_resnet
from gebackend.runtime.instance import InstanceInfo, ModelInstance
from tests.unit.test_instance import Log

AVX2 = {"avx2", "fma"}
VNNI = AVX2 | {"avx512f", "avx512_vnni"}
AMX = VNNI | {"avx512_bf16", "amx_bf16", "amx_int8"}
OPENVINO = registry.installed("openvino")


def _caps(*names):
    return lambda: names


@pytest.mark.skipif(not OPENVINO, reason="openvino is not installed")
def test_bf16_only_where_openvino_reports_it():
    assert auto_choice.auto_precision("auto", AMX, _caps("FP32", "BF16", "INT8"))[0] == "bf16"
    # an AVX2-only CPU: OpenVINO reports FP32, INT8 (the AMD machines) -> int8, and the reason says no VNNI
    precision, why = auto_choice.auto_precision("auto", AVX2, _caps("FP32", "INT8"))
    assert precision == "int8" and "no VNNI" in why


def test_int8_where_there_is_no_native_bf16_and_fp32_without_avx2():
    assert auto_choice.auto_precision("onnxruntime", AMX, _caps("FP32", "BF16"))[0] == "int8"  # ORT has no bf16
    precision, why = auto_choice.auto_precision("onnxruntime", VNNI, _caps())
    assert precision == "int8" and "avx512_vnni" in why
    assert auto_choice.auto_precision("onnxruntime", {"sse4_2"}, _caps())[0] == "origin"


def test_openvino_without_vnni_keeps_matmul_models_exact(tmp_path):
    """NNCF's int8 of attention models ran at about half OpenVINO's f32 on an AVX2-only AMD EPYC: precision_mode=auto
    on engine=openvino serves such a model in fp32 there, a convolution model still in int8, and with VNNI both int8."""
    resnet, bert = tmp_path / "resnet.onnx", tmp_path / "bert.onnx"
    onnx.save(build_resnet(), str(resnet))
    onnx.save(build_bert(), str(bert))
    precision, why = auto_choice.auto_precision("openvino", AVX2, _caps("FP32", "INT8"), bert)
    assert precision == "origin" and "without VNNI" in why and "ONNX Runtime" in why
    assert auto_choice.auto_precision("openvino", AVX2, _caps("FP32", "INT8"), resnet)[0] == "int8"
    assert auto_choice.auto_precision("openvino", VNNI, _caps("FP32", "INT8"), bert)[0] == "int8"
    assert auto_choice.auto_precision("onnxruntime", AVX2, _caps(), bert)[0] == "int8"  # ORT's dynamic int8
    chosen = auto_choice.resolve("auto", "auto", bert, AVX2, _caps("FP32", "INT8"))  # engine=auto: ORT int8
    assert (chosen.engine, chosen.precision_mode) == ("onnxruntime", "int8")
    chosen = auto_choice.resolve("openvino", "auto", bert, AVX2, _caps("FP32", "INT8"))
    assert (chosen.engine, chosen.precision_mode) == ("openvino", "origin") and "without VNNI" in chosen.why


def test_the_slow_int8_rule_is_one_rule_for_auto_and_tune(tmp_path):
    """`openvino_int8_slow` says why NNCF's int8 is expected to lose (a MatMul model, AVX2 without VNNI), or ""; tune
    reads the same rule for its order (tune.tuner.slow_rungs)."""
    from gebackend.tune import space as tune_space, tuned_model
    from gebackend.tune.tuner import slow_rungs

    resnet, bert = tmp_path / "resnet.onnx", tmp_path / "bert.onnx"
    onnx.save(build_resnet(), str(resnet))
    onnx.save(build_bert(), str(bert))
    why = auto_choice.openvino_int8_slow(AVX2, bert)
    assert why.startswith("OpenVINO's int8 (NNCF) on a MatMul model (") and "without VNNI" in why
    others = [(AVX2, resnet), (VNNI, bert), ({"neon"}, bert), (AVX2, None)]  # convs, VNNI, no x86, no file
    assert [auto_choice.openvino_int8_slow(flags, path) for flags, path in others] == [""] * 4
    folder = tmp_path / "bert"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "bert"\nbackend: "ge"\nmax_batch_size: 4\n')
    onnx.save(build_bert(), str(folder / "1" / "model.onnx"))
    slow = slow_rungs(tuned_model.TunedModel.load(folder), AVX2)
    by_name = {rung.name: rung for rung in tune_space.PRECISIONS}
    assert slow("openvino", by_name["int8-static"]) == why
    assert slow("onnxruntime", by_name["int8-static"]) == slow("onnxruntime", by_name["int8"]) == ""
    assert slow("openvino", by_name["origin"]) == "" and slow_rungs(tuned_model.TunedModel.load(folder), VNNI)(
        "openvino", by_name["int8-static"]) == ""


def test_tune_measures_first_what_this_cpu_runs_natively(tmp_path):
    """tune.tuner.favoured_rungs: int8 with VNNI (NNCF's static int8 first; ONNX Runtime's dynamic int8 only for a
    MatMul model), then bf16 where OpenVINO reports BF16; on an AVX2-only CPU NNCF's static int8 of a convolution
    model only; without AVX2 nothing."""
    from gebackend.tune import space as tune_space, tuned_model
    from gebackend.tune.tuner import favoured_rungs

    by_name = {rung.name: rung for rung in tune_space.PRECISIONS}
    places = {}
    for name, build in (("bert", build_bert), ("resnet", build_resnet)):
        folder = tmp_path / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "ge"\nmax_batch_size: 4\n')
        onnx.save(build(), str(folder / "1" / "model.onnx"))
        model = tuned_model.TunedModel.load(folder)
        for flags, caps in (("vnni", ("BF16", "FP32", "INT8")), ("avx2", ("FP32", "INT8")), ("sse", ("FP32",))):
            favoured = favoured_rungs(model, {"vnni": VNNI, "avx2": AVX2, "sse": {"sse4_2"}}[flags], caps)
            for engine, rung in (("openvino", "int8-static"), ("onnxruntime", "int8"), ("openvino", "bf16"),
                                 ("onnxruntime", "origin"), ("onnxruntime", "int8-static")):
                place = favoured(engine, by_name[rung])
                places[name, flags, engine, rung] = place[0] if place else None
                if place:
                    assert place[1]  # always says why
    assert [places["bert", "vnni", e, r] for e, r in (("openvino", "int8-static"), ("onnxruntime", "int8"),
                                                       ("openvino", "bf16"))] == [0, 1, 2]
    assert places["resnet", "vnni", "onnxruntime", "int8"] is None  # dynamic int8 leaves convolutions in fp32
    assert places["resnet", "vnni", "openvino", "int8-static"] == 0
    # no VNNI, no BF16: NNCF's int8 of the convolution model only (on the MatMul model it ran at half its f32)
    assert {key: place for key, place in places.items() if key[1] == "avx2" and place is not None} == {
        ("resnet", "avx2", "openvino", "int8-static"): 0}
    assert all(place is None for (_, flags, _, _), place in places.items() if flags == "sse")
    assert all(place is None for (_, _, engine, rung), place in places.items()
               if (engine, rung) in (("onnxruntime", "origin"), ("onnxruntime", "int8-static")))
    assert favoured_rungs(model, VNNI, ())("openvino", by_name["int8-static"])[1].startswith(
        "int8 with avx512_vnni: NNCF's static int8")


def test_op_counts_are_read_once_per_file_until_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    loads = []
    real_load = onnx.load
    monkeypatch.setattr(onnx, "load", lambda *a, **kw: loads.append(a[0]) or real_load(*a, **kw))
    first = auto_choice.weighted_op_counts(path)
    assert auto_choice.weighted_op_counts(path) == first and len(loads) == 1
    onnx.save(build_bert(), str(path))
    os.utime(path, ns=(1, 1))  # another file in the same place: another size and modification time
    counts = auto_choice.weighted_op_counts(path)
    assert len(loads) == 2 and counts[1] > counts[0] and first[0] > first[1]


def test_int8_engine_follows_what_the_model_is_made_of(tmp_path):
    resnet, bert = tmp_path / "resnet.onnx", tmp_path / "bert.onnx"
    onnx.save(build_resnet(), str(resnet))
    onnx.save(build_bert(), str(bert))
    convs, matmuls = auto_choice.weighted_op_counts(resnet)
    assert convs > matmuls
    assert auto_choice.weighted_op_counts(bert)[1] > auto_choice.weighted_op_counts(bert)[0]
    assert auto_choice.auto_engine("int8", bert)[0] == "onnxruntime"
    engine, why = auto_choice.auto_engine("int8", resnet)
    if OPENVINO and auto_choice._nncf_installed():
        assert engine == "openvino" and "NNCF" in why
    else:
        assert engine == "onnxruntime"
    assert auto_choice.auto_engine("origin", resnet)[0] == engine_names.DEFAULT


def test_resolve_says_what_it_chose_and_leaves_explicit_choices_alone(tmp_path):
    path = tmp_path / "bert.onnx"
    onnx.save(build_bert(), str(path))
    explicit = auto_choice.resolve("onnxruntime", "origin", path, AMX, _caps("BF16"))
    assert (explicit.engine, explicit.precision_mode, explicit.why) == ("onnxruntime", "origin", "")
    chosen = auto_choice.resolve("auto", "auto", path, AVX2, _caps("FP32", "INT8"))
    assert (chosen.engine, chosen.precision_mode) == ("onnxruntime", "int8")
    assert "precision_mode=auto -> int8" in chosen.why and "engine=auto -> onnxruntime" in chosen.why


def _config(name: str, **params: str) -> dict:
    return {"name": name, "backend": "ge", "max_batch_size": 8,
            "parameters": {k: {"string_value": v} for k, v in params.items()}}


@pytest.fixture
def bert_dir(tmp_path):
    folder = tmp_path / "bert" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_bert(), str(folder / "model.onnx"))
    return folder


def _run(instance, version_dir):
    feeds = {"input_ids": np.arange(16, dtype=np.int64).reshape(1, 16) % 50,
             "attention_mask": np.ones((1, 16), np.int64)}
    got = instance.execute([feeds])[0]
    session = ort.InferenceSession(str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return got, dict(zip(names, session.run(names, feeds)))


def test_auto_on_this_cpu_serves_what_it_says_within_the_guard(bert_dir):
    log = Log()
    instance = ModelInstance.load(_config("bert", precision_mode="auto", engine="auto"), bert_dir,
                                  InstanceInfo("bert_0_0"), log, pin=False)
    try:
        said = [m for _, m in log.lines if "precision_mode=auto ->" in m]
        assert len(said) == 1
        expected = auto_choice.resolve("auto", "auto", bert_dir / "model.onnx", cpu.flags(),
                                       lambda: __import__("gebackend.engines.openvino", fromlist=["_"]).openvino_capabilities())
        assert f"precision_mode=auto -> {expected.precision_mode}" in said[0]
        assert instance.spec.options.engines.engine == expected.engine
        got, want = _run(instance, bert_dir)
        for name, value in want.items():
            a, b = got[name].ravel().astype(np.float64), value.ravel().astype(np.float64)
            assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= auto_choice.AUTO_MIN_COSINE
    finally:
        instance.close()


def _assert_fp32_served(instance, log, bert_dir, said: tuple[str, ...], how: str) -> None:
    """The guard refused the lowered model once, saying `said`, and the instance answers as the fp32 file exactly."""
    refused = [m for _, m in log.lines if "not served" in m]
    assert len(refused) == 1 and "serving fp32" in refused[0] and all(s in refused[0] for s in said), log.lines
    assert instance.executor.spec.options.engines.precision_mode == "origin"
    assert how in instance.how
    got, want = _run(instance, bert_dir)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)  # exact fp32, not int8


def _assert_guard_serves_fp32_and_none_fails(bert_dir, said: tuple[str, ...], how: str, fails: str) -> None:
    """With a guard (0.99) the load serves the fp32 file (`_assert_fp32_served`); without one it fails, matching
    `fails`."""
    from gebackend.errors import ModelLoadError

    log = Log()
    instance = ModelInstance.load(_config("bert", precision_mode="int8", precision_min_cosine="0.99"), bert_dir,
                                  InstanceInfo("bert_0_0"), log, pin=False)
    try:
        _assert_fp32_served(instance, log, bert_dir, said, how)
    finally:
        instance.close()
    with pytest.raises(ModelLoadError, match=fails):
        ModelInstance.load(_config("bert_no_guard", precision_mode="int8"), bert_dir, InstanceInfo("bert_1_0"), Log(),
                           pin=False)


def test_the_guard_serves_fp32_when_the_lowered_model_is_too_far(bert_dir):
    log = Log()
    # no int8 model reaches cosine 1.0 to fp32 exactly: the guard must refuse it and serve the original file
    instance = ModelInstance.load(_config("bert", precision_mode="int8", precision_min_cosine="1.0"), bert_dir,
                                  InstanceInfo("bert_0_0"), log, pin=False)
    try:
        _assert_fp32_served(instance, log, bert_dir, ("precision_min_cosine=1.0",), "accuracy guard")
    finally:
        instance.close()


def test_the_guard_serves_fp32_when_the_lowering_fails_and_without_it_the_load_fails(bert_dir, monkeypatch):
    """precision_mode=auto (whose guard is 0.99) on a model ONNX Runtime's quantizer fails on (it did on every
    transformer optimized by ONNX Runtime, `optimum-cli export onnx --optimize O2`) served fp32; it failed the load."""
    from gebackend.compile import precision

    def fails(*args, **kwargs):
        raise RuntimeError("Unable to find data type for weight_name='w'")

    monkeypatch.setattr(precision, "_int8", fails)
    _assert_guard_serves_fp32_and_none_fails(bert_dir, ("lowering failed", "Unable to find data type"),
                                             "int8 refused by a failed lowering",
                                             "precision_mode=int8: lowering model.onnx failed: RuntimeError: Unable")


def test_the_guard_serves_fp32_when_the_engine_cannot_load_the_lowered_model(bert_dir, monkeypatch):
    """OpenVINO cannot read some files NNCF writes (a QDQ pair on a tensor of unknown rank: a SegFormer export), which
    the accuracy check, run on ONNX Runtime, passed: with a guard, fp32 is served; without, the load fails."""
    from gebackend.errors import ModelLoadError
    from gebackend.runtime import loader

    real = loader._build

    def build(spec, *args, **kwargs):
        if spec.path != bert_dir / "model.onnx":
            raise ModelLoadError("OpenVINO cannot read it: conversion failed for DequantizeLinear-17: Rank of the input "
                                 "data tensor has to be known (static).")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(loader, "_build", build)
    _assert_guard_serves_fp32_and_none_fails(bert_dir, ("its engine cannot load the lowered model", "DequantizeLinear-17"),
                                             "int8 refused by its engine", "DequantizeLinear-17")


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="OpenVINO is not installed")
def test_engine_auto_falls_back_to_onnxruntime_for_a_model_openvino_cannot_read(tmp_path, monkeypatch):
    from gebackend.errors import ModelLoadError
    from gebackend.modelzoo.misc import build_zipmap_classifier

    folder = tmp_path / "classifier" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_zipmap_classifier((0, 1, 2)), str(folder / "model.onnx"))  # ai.onnx.ml: OpenVINO has no LinearClassifier
    # whatever this CPU is, engine=auto takes OpenVINO here (as it does for bf16, or int8 of a convolution model)
    monkeypatch.setattr(auto_choice, "auto_engine", lambda precision, path: ("openvino", "forced by the test"))
    log = Log()
    instance = ModelInstance.load(_config("classifier", engine="auto"), folder, InstanceInfo("classifier_0"), log,
                                  pin=False)
    try:
        said = [m for _, m in log.lines if "engine=auto: OpenVINO cannot serve this model" in m]
        assert len(said) == 1 and "LinearClassifier" in said[0] and said[0].endswith("; onnxruntime instead"), log.lines
        assert instance.spec.options.engines.engine == "onnxruntime"
        features = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
        got = instance.execute([{"features": features}])[0]
        _, maps = ort.InferenceSession(str(folder / "model.onnx")).run(None, {"features": features})
        np.testing.assert_allclose(got["probabilities"], [[row[k] for k in (0, 1, 2)] for row in maps], rtol=1e-6)
    finally:
        instance.close()
    with pytest.raises(ModelLoadError, match="OpenVINO cannot read .*LinearClassifier"):  # named, it is not replaced
        ModelInstance.load(_config("classifier", engine="openvino"), folder, InstanceInfo("classifier_0"), Log(),
                           pin=False)
