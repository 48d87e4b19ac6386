"""The engine registry (engines/registry.py, its names in config/engine_names.py): one table of engines by name, each
building its own engines."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from gebackend.compile.pipeline import compile_static
from gebackend.config.options import BackendOptions
from gebackend.config.onnx_signature import signature_of
from gebackend.config.spec import build_model_spec
from gebackend.config import engine_names
from gebackend.engines import create_engine, create_static_engine, registry
from gebackend.modelzoo import build_add_mul


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_add_mul(), str(path))
    return path


def _spec(path, engine: str):
    return build_model_spec({"name": "am", "max_batch_size": 4}, signature_of(onnx.load(str(path))), path,
                            BackendOptions.make(engine=engine))


def test_every_registered_engine_builds_both_graph_modes_and_they_agree(model_path):
    names = [n for n in engine_names.names() if n != "openvino" or pytest.importorskip("openvino")]
    assert names[0] == "onnxruntime" and set(engine_names.names()) == {"onnxruntime", "openvino"}
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4), "y": np.ones((2, 4), np.float32)}
    outputs = [o.name for o in build_add_mul().graph.output]
    want = None
    for name in names:
        dynamic = create_engine(_spec(model_path, name))
        assert dynamic.name == name
        spec = _spec(model_path, name)
        graphs, _ = compile_static(model_path, [{"x": (2, 4), "y": (2, 4)}], 1 << 20)
        static = create_static_engine(spec, graphs)
        assert static.name == f"{name}-static"
        for engine in (dynamic, static):
            got = engine.run(feeds, outputs)
            want = got if want is None else want
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6)
            engine.close()


def test_each_engine_says_how_it_lowers_precision():
    ort = registry.kind("onnxruntime")
    assert not any(ort.lowers(m) for m in ("fp16", "bf16", "int8"))  # the file is lowered first (compile/precision.py)
    assert ort.precision_run("origin").ran == "f32" and ort.quantizations == ("dynamic", "static")
    pytest.importorskip("openvino")
    ov = registry.kind("openvino")
    assert ov.lowers("bf16") and ov.lowers("fp16")  # OpenVINO compiles at the precision hint
    assert not ov.lowers("int8") and ov.quantizations == ("static",) and ov.static_quantizer == "nncf"  # NNCF's file


def test_an_unknown_engine_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown engine 'tensorrt': expected one of onnxruntime, openvino"):
        registry.kind("tensorrt")


def test_the_registry_says_the_default_the_spellings_and_what_auto_prefers(monkeypatch):
    from gebackend.engines import registry

    assert engine_names.DEFAULT in engine_names.names() and engine_names.ALIASES == {"ort": "onnxruntime"}
    assert engine_names.spellings() == {**{n: n for n in engine_names.names()}, "ort": "onnxruntime", "auto": "auto"}
    assert registry.kind("ort") is registry.kind("onnxruntime")
    assert registry.kind("onnxruntime").onnxruntime_providers and not registry.kind("openvino").onnxruntime_providers
    monkeypatch.setattr(registry, "installed", lambda name: True)
    assert [registry.auto(p) for p in ("origin", "int8", "bf16", "fp16")] == ["onnxruntime", "onnxruntime", "openvino", "openvino"]
    monkeypatch.setattr(registry, "installed", lambda name: name != "openvino")  # OpenVINO absent: the default
    assert registry.auto("bf16") == engine_names.DEFAULT
    assert engine_names.CPU_ACCELERATORS == {"openvino": "openvino"}
