"""The lowered-precision cache (compile/precision_cache.py): keyed by the model's bytes and the precision options,
reused without quantizing again, rebuilt when corrupt, moved to GE_CACHE_DIR when the model's folder is not writable;
and `quantization` resolved per engine (compile/precision.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from gebackend.compile import precision, precision_cache
from gebackend.config.options import BackendOptions, parse_options
from gebackend.engines.registry import kind
from gebackend.errors import ConfigError, ModelLoadError
from gebackend.modelzoo import build_resnet


@pytest.fixture()
def model(tmp_path) -> Path:
    path = tmp_path / "repo" / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    (path.parent.parent / "config.pbtxt").write_text('backend: "ge"\n')
    onnx.save(build_resnet(width=8, image_size=32), str(path))
    return path


@pytest.fixture()
def counting(monkeypatch):
    """Counts the real lowerings (precision.lower_precision) the cache runs."""
    calls = []
    real = precision.lower_precision

    def counted(*args, **kwargs):
        calls.append(kwargs.get("quantization"))
        return real(*args, **kwargs)

    monkeypatch.setattr(precision, "lower_precision", counted)
    return calls


def _lower(model, log=None, environ=None, **options):
    engines = BackendOptions.make(**{"precision_mode": "int8", "calibration_samples": 4, **options}).engines
    return precision_cache.lowered_model("m", model, engines, kind(engines.engine), True, None,
                                         (log if log is not None else (lambda line: None)), environ=environ or {})


def test_options_parse_and_refuse_bad_values():
    parsed = parse_options("m", {}, {"quantization": "STATIC", "calibration_data": " calib ", "calibration_samples": "8"})
    assert (parsed.options.engines.quantization, parsed.options.engines.calibration_data,
            parsed.options.engines.calibration_samples) == ("static", "calib", 8)
    assert BackendOptions().engines.quantization == "auto" and BackendOptions().engines.calibration_samples == 32
    with pytest.raises(ConfigError, match="quantization"):
        parse_options("m", {}, {"quantization": "fast"})
    with pytest.raises(ConfigError, match="calibration_samples"):
        parse_options("m", {}, {"calibration_samples": "0"})


def test_quantization_auto_and_the_openvino_refusal():
    ort, ov = kind("onnxruntime"), kind("openvino")
    assert precision.resolve_quantization("auto", "", ort) == "dynamic"
    assert precision.resolve_quantization("auto", "calib", ort) == "static"
    assert precision.resolve_quantization("auto", "", ov) == "static"
    assert precision.resolve_quantization("dynamic", "calib", ort) == "dynamic"
    with pytest.raises(ModelLoadError, match="quantization=dynamic is not available with engine=openvino"):
        precision.resolve_quantization("dynamic", "", ov)


def test_key_changes_with_the_bytes_and_the_options(model, tmp_path):
    base = precision_cache.cache_key(model, {"mode": "int8", "quantization": "static"})
    assert precision_cache.cache_key(model, {"mode": "int8", "quantization": "static"}) == base
    assert precision_cache.cache_key(model, {"mode": "int8", "quantization": "dynamic"}) != base
    assert precision_cache.cache_key(model, {"mode": "int8", "quantization": "static", "samples": "8"}) != base
    data = tmp_path / "x.npy"
    np.save(data, np.zeros(3, np.float32))
    with_data = precision_cache.cache_key(model, {"mode": "int8", "quantization": "static"}, [data])
    np.save(data, np.ones(3, np.float32))
    assert precision_cache.cache_key(model, {"mode": "int8", "quantization": "static"}, [data]) not in (base, with_data)
    onnx.save(build_resnet(width=8, image_size=32, seed=1), str(model))  # same shape, other weights
    assert precision_cache.cache_key(model, {"mode": "int8", "quantization": "static"}) != base


def test_a_new_lowering_does_not_serve_the_old_lowerings_entries(model, monkeypatch):
    options = {"mode": "int8", "quantization": "static"}
    before = precision_cache.cache_key(model, options)
    monkeypatch.setattr(precision_cache, "LOWERING_VERSION", precision_cache.LOWERING_VERSION + "+1")
    assert precision_cache.cache_key(model, options) != before


def test_second_load_reuses_without_quantizing(model, counting):
    lines = []
    first = _lower(model, lines.append, quantization="static")
    assert first.event == "quantized" and counting == ["static"]
    assert first.path.parent == model.parent / ".gebackend-cache" / "precision"
    second = _lower(model, lines.append, quantization="static")
    assert second.event == "reused" and second.path == first.path
    assert counting == ["static"]  # not called again
    assert any("quantized in" in line and f"cached at {first.path}" in line for line in lines), lines
    assert any(f"reused the int8 model cached at {first.path}" in line for line in lines), lines
    assert any("seeded random" in line and "real inputs give better scales" in line for line in lines), lines
    dynamic = _lower(model, quantization="dynamic")  # other options: another entry
    assert dynamic.event == "quantized" and dynamic.path != first.path and counting == ["static", "dynamic"]


@pytest.mark.parametrize("quantization", ["static", "dynamic"])
def test_a_cpu_of_the_other_int8_range_gets_its_own_entry(model, counting, monkeypatch, quantization):
    """A repository on storage shared by a VNNI machine and an AVX2-only one: the 8-bit file made on one is not the
    7-bit one the other needs (compile/quantize_static.int8_range), static or dynamic."""
    from gebackend.compile import quantize_static

    here = _lower(model, quantization=quantization)
    other = "full" if quantize_static.int8_range() == "reduced" else "reduced"
    monkeypatch.setattr(quantize_static, "int8_range", lambda flags=None, machine=None: other)
    there = _lower(model, quantization=quantization)
    assert there.event == "quantized" and there.path != here.path and counting == [quantization, quantization]
    monkeypatch.undo()
    assert _lower(model, quantization=quantization).path == here.path and len(counting) == 2  # reused again


def test_models_linked_into_several_repositories_share_one_entry(model, tmp_path, counting):
    linked = []
    for candidate in ("a", "b"):  # as the bench and tune lay out their candidates: the model file symlinked
        path = tmp_path / "candidates" / candidate / "m" / "1" / "model.onnx"
        path.parent.mkdir(parents=True)
        path.symlink_to(model)
        linked.append(_lower(path, quantization="static"))
    assert [lowered.event for lowered in linked] == ["quantized", "reused"] and counting == ["static"]
    assert linked[0].path.parent == model.parent / ".gebackend-cache" / "precision"


def test_a_copy_the_engines_load_keeps_its_entry_and_calibration_data_beside_the_repositorys_file(model, tmp_path,
                                                                                                  counting):
    calib = model.parent.parent / "calib"  # relative calibration_data: beside the repository's config.pbtxt
    calib.mkdir()
    np.save(calib / "image.npy", np.random.default_rng(3).standard_normal((3, 3, 32, 32)).astype(np.float32))
    events = []
    for instance in ("a", "b"):  # each instance (and each restart) writes its own copy in a temporary folder
        copy = tmp_path / f"tmp-{instance}" / "m" / "1" / "model.onnx"
        copy.parent.mkdir(parents=True)
        copy.write_bytes(model.read_bytes())
        engines = BackendOptions.make(precision_mode="int8", calibration_samples=4, calibration_data="calib").engines
        lowered = precision_cache.lowered_model("m", copy, engines, kind(engines.engine), True, None, lambda m: None,
                                                environ={}, home=model)
        assert lowered.path.parent == model.parent / ".gebackend-cache" / "precision"
        events.append(lowered.event)
    assert events == ["quantized", "reused"] and counting == ["static"]


def test_concurrent_loads_quantize_once(model, counting):
    results = []
    threads = [threading.Thread(target=lambda: results.append(_lower(model, quantization="static"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.event for r in results) == ["quantized", "reused", "reused"]
    assert counting == ["static"] and len({r.path for r in results}) == 1


def test_corrupt_entry_is_rebuilt(model, counting):
    first = _lower(model, quantization="static")
    first.path.write_bytes(b"\x08not an onnx file" * 10)
    lines = []
    again = _lower(model, lines.append, quantization="static")
    assert again.event == "quantized" and counting == ["static", "static"]
    assert any("does not load as ONNX" in line and "rebuilding" in line for line in lines), lines
    assert onnx.load(str(again.path)).graph.node


def test_unwritable_model_folder_goes_to_ge_cache_dir(model, tmp_path, counting):
    (model.parent / ".gebackend-cache").write_text("a file where the cache folder would go")  # mkdir fails, even as root
    cache = tmp_path / "cache"
    lowered = _lower(model, environ={"GE_CACHE_DIR": str(cache)}, quantization="dynamic")
    assert lowered.path.parent == cache / "m" / "precision"
    assert _lower(model, environ={"GE_CACHE_DIR": str(cache)}, quantization="dynamic").event == "reused"


def test_calibration_data_gives_the_accuracy_check_its_first_sample(model, counting):
    calib = model.parent.parent / "calib"
    calib.mkdir()
    images = np.random.default_rng(3).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.save(calib / "image.npy", images)
    lowered = _lower(model, calibration_data="calib")  # relative: the folder holding config.pbtxt; auto -> static
    assert lowered.quantization == "static" and counting == ["static"]
    np.testing.assert_array_equal(lowered.check_feeds["image"], images[:1])
    np.save(calib / "image.npy", images[::-1].copy())  # other data: a new entry
    assert _lower(model, calibration_data="calib").event == "quantized"
    bad = model.parent.parent / "bad"
    bad.mkdir()
    with pytest.raises(ModelLoadError, match="model 'm': calibration_data .*bad: input 'image' is missing"):
        _lower(model, calibration_data="bad")
