"""Unit tests for gebackend.profiling.dump_data: dump_data=1 writes one request's every node input and output."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from gebackend.config.options import parse_options
from gebackend.errors import InvalidRequest
from gebackend.modelzoo import build_resnet
from gebackend.profiling.dump_data import FirstRequestDump, exposed_model, first_request_dump, run_everything


@pytest.fixture
def resnet(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_resnet(), str(path))
    return path


def _feeds(rows=2, seed=0):
    return {"image": np.random.default_rng(seed).standard_normal((rows, 3, 64, 64)).astype(np.float32)}


def test_exposed_model_keeps_the_outputs_first_then_every_node_output():
    model = build_resnet()
    exposed = exposed_model(model)
    names = [o.name for o in exposed.graph.output]
    assert names[0] == "logits"
    assert sorted(names) == sorted({n for node in model.graph.node for n in node.output})
    assert [o.name for o in model.graph.output] == ["logits"]  # the original is untouched


def test_every_value_is_the_models(resnet):
    import onnxruntime as ort

    model, values = run_everything(resnet, _feeds())
    want = ort.InferenceSession(str(resnet), providers=["CPUExecutionProvider"]).run(["logits"], _feeds())[0]
    np.testing.assert_allclose(values["logits"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(values["image"], _feeds()["image"])
    assert values["stem.relu"].min() >= 0 and values["stem"].shape == (2, 16, 64, 64)


def _dump(tmp_path, resnet, lines):
    return FirstRequestDump("resnet", "resnet_0", resnet, str(tmp_path / "profiling"), lines.append)


def test_first_request_is_dumped_with_an_index(tmp_path, resnet):
    lines = []
    dump = _dump(tmp_path, resnet, lines)
    assert dump.offer([_feeds(1, 1), _feeds(2, 2)], [{}, {}]) is None  # done after one dump
    [index_path] = (tmp_path / "profiling" / "resnet" / "dump").glob("*_resnet_0/index.json")
    index = json.loads(index_path.read_text())
    assert index["model"] == "resnet" and index["instance"] == "resnet_0"
    model = build_resnet()
    assert [n["op_type"] for n in index["nodes"]] == [n.op_type for n in model.graph.node]
    stem = index["nodes"][0]
    assert stem["inputs"][0]["name"] == "image" and stem["inputs"][0]["shape"] == [1, 3, 64, 64]
    assert stem["inputs"][1] == {"name": "stem.weight", "kind": "initializer (in the model file)",
                                 "shape": [16, 3, 3, 3], "dtype": "float32"}
    image = np.load(index_path.parent / stem["inputs"][0]["file"])
    np.testing.assert_array_equal(image, _feeds(1, 1)["image"])  # the first request of the batch
    # a tensor two nodes read is written once, and every file the index names exists
    files = {e["file"] for n in index["nodes"] for e in n["inputs"] + n["outputs"] if "file" in e}
    assert len(files) == index["tensors_written"] == len(list(index_path.parent.glob("*.npy")))
    logits = next(e for e in index["outputs"] if e["name"] == "logits")
    assert np.load(index_path.parent / logits["file"]).shape == (1, 10)
    assert "dump_data: wrote every node's inputs and outputs of the first request" in lines[0]


def test_failed_requests_are_skipped_until_one_runs(tmp_path, resnet):
    lines = []
    dump = _dump(tmp_path, resnet, lines)
    assert dump.offer([_feeds(1)], [InvalidRequest("bad")]) is dump
    assert not (tmp_path / "profiling").exists()
    assert dump.offer([{"image": np.zeros(1)}, _feeds(1, 3)], [InvalidRequest("bad"), {}]) is None
    [index_path] = (tmp_path / "profiling").rglob("index.json")
    image = json.loads(index_path.read_text())["inputs"][0]
    np.testing.assert_array_equal(np.load(index_path.parent / image["file"]), _feeds(1, 3)["image"])


def test_a_failing_dump_is_logged_never_raised(tmp_path, resnet):
    lines = []
    dump = _dump(tmp_path, resnet, lines)
    assert dump.offer([{"image": np.zeros((1, 2), np.float32)}], [{}]) is None  # a shape the model cannot run
    assert lines and lines[0].startswith("dump_data: could not dump the first request into ")
    assert "Traceback" not in lines[0]
    assert not list((tmp_path / "profiling").rglob("index.json"))


def test_only_when_switched_on(resnet):
    spec = SimpleNamespace(name="m", path=resnet, options=parse_options("m", {}, {}).options)
    assert first_request_dump(spec, "m_0") is None
    spec.options = parse_options("m", {}, {"dump_data": "1", "profiling_dir": "/x"}).options
    dump = first_request_dump(spec, "m_0")
    assert isinstance(dump, FirstRequestDump) and dump.profiling_dir == "/x" and dump.model_path == resnet
