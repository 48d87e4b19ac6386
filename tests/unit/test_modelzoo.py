"""Unit tests for gebackend.modelzoo: every builder runs on onnxruntime with dynamic shapes, plus the repository writer."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.modelzoo import (
    EXAMPLE_MODELS,
    build_add_mul,
    build_bert,
    build_example_repository,
    build_identity_fixed,
    build_resnet,
)
from gebackend.modelzoo.__main__ import main as modelzoo_main

TOL = dict(rtol=1e-4, atol=1e-5)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _assert_rows_independent(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    batched = _run(sess, feeds)
    for i in range(next(iter(feeds.values())).shape[0]):
        single = _run(sess, {k: v[i : i + 1] for k, v in feeds.items()})
        for name, out in single.items():
            np.testing.assert_allclose(out[0], batched[name][i], **TOL, err_msg=f"{name} row {i}")


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def resnet() -> ort.InferenceSession:
    return _session(build_resnet())


@pytest.fixture(scope="module")
def bert() -> ort.InferenceSession:
    return _session(build_bert())


@pytest.mark.parametrize(
    "builder", [build_resnet, build_bert, build_add_mul, build_identity_fixed], ids=lambda b: b.__name__
)
def test_models_are_valid_and_deterministic(builder):
    model = builder()
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert model.ir_version == 9
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert builder().SerializeToString() == model.SerializeToString()


def test_signatures():
    resnet, bert = build_resnet(), build_bert()
    assert [(i.name, _dims(i)) for i in resnet.graph.input] == [("image", ["batch", 3, 64, 64])]
    assert [(o.name, _dims(o)) for o in resnet.graph.output] == [("logits", ["batch", 10])]
    assert [(i.name, _dims(i)) for i in bert.graph.input] == [
        ("input_ids", ["batch", "sequence"]),
        ("attention_mask", ["batch", "sequence"]),
    ]
    assert [(o.name, _dims(o)) for o in bert.graph.output] == [
        ("last_hidden_state", ["batch", "sequence", 64]),
        ("pooler_output", ["batch", 64]),
    ]
    assert [(i.name, _dims(i)) for i in build_identity_fixed().graph.input] == [("x", [2, 3])]


@pytest.mark.parametrize("batch", [1, 3])
def test_resnet(resnet, batch):
    rng = np.random.default_rng(batch)
    images = rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)
    logits = _run(resnet, {"image": images})["logits"]
    assert logits.shape == (batch, 10) and logits.dtype == np.float32
    assert np.isfinite(logits).all() and np.abs(logits).max() > 1e-3

    other = _run(resnet, {"image": rng.uniform(0, 1, images.shape).astype(np.float32)})["logits"]
    assert not np.allclose(logits, other, **TOL)
    _assert_rows_independent(resnet, {"image": images})


def _bert_feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    for i in range(batch):  # right-pad each row by a different amount
        mask[i, seq - i :] = 0
    return {"input_ids": rng.integers(0, 1000, (batch, seq), dtype=np.int64), "attention_mask": mask}


@pytest.mark.parametrize("seq", [7, 16])
@pytest.mark.parametrize("batch", [1, 3])
def test_bert(bert, batch, seq):
    feeds = _bert_feeds(batch, seq)
    out = _run(bert, feeds)
    assert out["last_hidden_state"].shape == (batch, seq, 64)
    assert out["pooler_output"].shape == (batch, 64)
    for value in out.values():
        assert value.dtype == np.float32 and np.isfinite(value).all()

    other = _run(bert, _bert_feeds(batch, seq, seed=1))
    for name, value in out.items():
        assert not np.allclose(value, other[name], **TOL), name
    _assert_rows_independent(bert, feeds)


def test_bert_attention_mask_matters(bert):
    feeds = _bert_feeds(2, 10)
    feeds["attention_mask"][:] = 1
    full = _run(bert, feeds)
    feeds["attention_mask"][:, 5:] = 0
    masked = _run(bert, feeds)
    assert not np.allclose(full["last_hidden_state"][:, 0], masked["last_hidden_state"][:, 0], **TOL)
    assert not np.allclose(full["pooler_output"], masked["pooler_output"], **TOL)

    # Masked-out positions must not influence unmasked ones.
    feeds["input_ids"][:, 5:] = (feeds["input_ids"][:, 5:] + 1) % 1000
    changed_padding = _run(bert, feeds)
    np.testing.assert_allclose(
        changed_padding["last_hidden_state"][:, :5], masked["last_hidden_state"][:, :5], **TOL
    )


@pytest.mark.parametrize("batch", [1, 3])
def test_add_mul(batch):
    sess = _session(build_add_mul())
    rng = np.random.default_rng(batch)
    x, y = (rng.standard_normal((batch, 4)).astype(np.float32) for _ in range(2))
    out = _run(sess, {"x": x, "y": y})
    np.testing.assert_allclose(out["sum"], x + y, **TOL)
    np.testing.assert_allclose(out["product"], x * y, **TOL)
    _assert_rows_independent(sess, {"x": x, "y": y})


def test_identity_fixed():
    sess = _session(build_identity_fixed())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_run(sess, {"x": x})["y"], x)
    with pytest.raises(Exception):
        sess.run(None, {"x": np.zeros((3, 3), np.float32)})


def test_build_example_repository(tmp_path):
    assert set(EXAMPLE_MODELS) == {"resnet_ge", "bert_ge", "resnet_npu_ge"}
    for name in EXAMPLE_MODELS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    (tmp_path / "unknown_model").mkdir()
    (tmp_path / "unknown_model" / "config.pbtxt").write_text('name: "unknown_model"\n')
    (tmp_path / "bert_ge_noconfig").mkdir()
    (tmp_path / "stray_file.txt").write_text("not a model dir")

    expected = sorted(tmp_path / name / "1" / "model.onnx" for name in EXAMPLE_MODELS)
    written = build_example_repository(tmp_path)
    assert sorted(written) == expected
    for path in written:
        onnx.checker.check_model(onnx.load(path))
    assert not (tmp_path / "unknown_model" / "1").exists()

    assert build_example_repository(str(tmp_path)) == []

    stale = tmp_path / "bert_ge" / "1" / "model.onnx"
    stale.write_bytes(b"stale")
    assert build_example_repository(tmp_path) == []
    assert stale.read_bytes() == b"stale"
    assert sorted(build_example_repository(tmp_path, force=True)) == expected
    assert stale.read_bytes() != b"stale"


def test_main_prints_written_paths(tmp_path, capsys):
    (tmp_path / "resnet_ge").mkdir()
    (tmp_path / "resnet_ge" / "config.pbtxt").write_text('name: "resnet_ge"\n')
    target = tmp_path / "resnet_ge" / "1" / "model.onnx"

    assert modelzoo_main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(target)]
    assert modelzoo_main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""
    assert modelzoo_main([str(tmp_path), "--force"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(target)]
