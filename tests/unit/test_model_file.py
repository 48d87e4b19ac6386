"""Unit tests for gebackend.config.model_file: locating a model's folder, version and ONNX file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gebackend.config.model_file import (
    REPOSITORY_ENV_VAR,
    find_model_file,
    latest_version_dir,
    version_dir_of_stub,
    model_dir_in_repositories,
)
from gebackend.errors import ConfigError


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"onnx")
    return path


def test_model_onnx_preferred(tmp_path):
    _touch(tmp_path / "a.onnx")
    expected = _touch(tmp_path / "model.onnx")
    _touch(tmp_path / "b.onnx")
    assert find_model_file(tmp_path) == expected
    assert find_model_file(str(tmp_path)) == expected


def test_first_sorted_onnx_when_no_model_onnx(tmp_path):
    _touch(tmp_path / "zeta.onnx")
    _touch(tmp_path / "beta.onnx")
    _touch(tmp_path / "gamma.onnx")
    _touch(tmp_path / "alpha.txt")
    (tmp_path / "aaa.onnx").mkdir()  # a folder named like a model is not a model file
    assert find_model_file(tmp_path) == tmp_path / "beta.onnx"


def test_a_model_folder_holds_model_onnx_as_the_onnxruntime_backend_reads_it(tmp_path):
    inside = _touch(tmp_path / "model.onnx" / "model.onnx")
    _touch(tmp_path / "model.onnx" / "weights.bin")
    assert find_model_file(tmp_path) == inside
    named = _touch(tmp_path / "big.onnx" / "model.onnx")  # default_model_filename naming a folder
    assert find_model_file(tmp_path, "big.onnx") == named
    (tmp_path / "empty.onnx").mkdir()
    with pytest.raises(ConfigError, match=r"empty.onnx is a folder without model.onnx in it"):
        find_model_file(tmp_path, "empty.onnx")


def test_default_model_filename_honoured(tmp_path):
    _touch(tmp_path / "model.onnx")
    expected = _touch(tmp_path / "custom.onnx")
    assert find_model_file(tmp_path, "custom.onnx") == expected


def test_default_model_filename_missing_is_an_error_even_with_other_files(tmp_path):
    _touch(tmp_path / "model.onnx")
    _touch(tmp_path / "other.onnx")
    with pytest.raises(ConfigError) as info:
        find_model_file(tmp_path, "custom.onnx")
    assert "custom.onnx" in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_no_onnx_file(tmp_path):
    _touch(tmp_path / "model.plan")
    with pytest.raises(ConfigError) as info:
        find_model_file(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert "model.onnx" in str(info.value)


def test_missing_version_folder(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        find_model_file(tmp_path / "1")


def test_latest_version_dir_is_numerically_highest(tmp_path):
    for name in ("1", "2", "9", "10", "03"):
        (tmp_path / name).mkdir()
    (tmp_path / "100").write_text("a file, not a version")
    (tmp_path / "latest").mkdir()
    (tmp_path / "v11").mkdir()
    assert latest_version_dir(tmp_path) == tmp_path / "10"
    assert latest_version_dir(str(tmp_path)) == tmp_path / "10"


def test_latest_version_dir_single(tmp_path):
    (tmp_path / "1").mkdir()
    assert latest_version_dir(tmp_path) == tmp_path / "1"


def test_latest_version_dir_none(tmp_path):
    (tmp_path / "latest").mkdir()
    (tmp_path / "1").write_text("not a folder")
    with pytest.raises(ConfigError) as info:
        latest_version_dir(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(ConfigError):
        latest_version_dir(tmp_path / "missing")


def test_version_dir_of_stub_is_the_version_the_stub_serves(tmp_path):
    model = tmp_path / "repo" / "multi"
    for name in ("1", "2"):
        (model / name).mkdir(parents=True)
    assert version_dir_of_stub(str(model / "1" / "model.py")) == model / "1"
    assert version_dir_of_stub(str(model / "2" / "model.py")) == model / "2"
    # no argument, a version folder that is gone, a plain script: none (the caller falls back to the latest version)
    for stub_path in (None, "", str(model / "7" / "model.py"), "/usr/bin/python3"):
        assert version_dir_of_stub(stub_path) is None, stub_path


def test_model_dir_in_repositories(tmp_path):
    first, second = tmp_path / "repo1", tmp_path / "repo2"
    (first / "resnet").mkdir(parents=True)
    (second / "resnet").mkdir(parents=True)
    (second / "bert").mkdir(parents=True)
    (second / "bert" / "config.pbtxt").write_text('name: "bert"\n')
    environ = {REPOSITORY_ENV_VAR: os.pathsep.join([str(first), "", str(second)])}
    assert model_dir_in_repositories("resnet", environ) == first / "resnet"
    assert model_dir_in_repositories("bert", environ) == second / "bert"


def test_model_dir_in_repositories_missing_model(tmp_path):
    (tmp_path / "other").mkdir()
    with pytest.raises(ConfigError) as info:
        model_dir_in_repositories("resnet", {REPOSITORY_ENV_VAR: str(tmp_path)})
    assert "'resnet'" in str(info.value)
    assert str(tmp_path) in str(info.value)
    assert REPOSITORY_ENV_VAR in str(info.value)


@pytest.mark.parametrize("environ", [{}, {REPOSITORY_ENV_VAR: ""}])
def test_model_dir_in_repositories_unset(environ):
    with pytest.raises(ConfigError) as info:
        model_dir_in_repositories("resnet", environ)
    assert "unset" in str(info.value)
    assert "'resnet'" in str(info.value)
