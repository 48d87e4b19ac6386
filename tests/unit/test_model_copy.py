"""config/model_copy.py: the engines' copy of a model file, shared by the instances of one server (a server temp folder
given), private to the process otherwise; external data linked beside it."""

from __future__ import annotations

import onnx

import os

from gebackend.config import model_copy
from gebackend.config.model_copy import write_model_copy
from gebackend.modelzoo import build_add_mul, build_scale_shift


def _saved(tmp_path, model, **external) -> tuple:
    path = tmp_path / "repo" / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), **external)
    return path, onnx.load(str(path), load_external_data=False)


def test_instances_of_one_server_share_one_copy_of_the_same_bytes(tmp_path):
    path, model = _saved(tmp_path, build_scale_shift(), save_as_external_data=True, location="weights.bin",
                         size_threshold=0)
    server = tmp_path / "server-temp"
    server.mkdir()
    first = write_model_copy(model, path, server, "ge-test-")
    written = first.stat().st_mtime_ns
    second = write_model_copy(model, path, server, "ge-test-")
    assert second == first and second.stat().st_mtime_ns == written  # found, not written again
    assert first.parts[-3:] == ("m", "1", "model.onnx") and (first.parent / "weights.bin").is_file()
    assert onnx.load(str(first)).graph.initializer[0].name == model.graph.initializer[0].name  # onnx reads it
    onnx.load(str(path))  # and the user's own file still (onnx refuses a file with a second hard link)
    assert not [p for p in server.iterdir() if p.name.startswith(".")]  # no half-built folder left
    other = onnx.ModelProto()
    other.CopyFrom(model)
    other.graph.name = "changed"
    assert write_model_copy(other, path, server, "ge-test-") != first  # other bytes: another copy


def test_outside_a_server_each_process_writes_its_own(tmp_path):
    path, model = _saved(tmp_path, build_add_mul())
    first, second = (write_model_copy(model, path, None, "ge-test-") for _ in range(2))
    assert first != second and first.is_file() and second.is_file()


def test_the_last_process_using_a_shared_copy_removes_it(tmp_path):
    path, model = _saved(tmp_path, build_add_mul())
    server = tmp_path / "server-temp"
    server.mkdir()
    copy = write_model_copy(model, path, server, "ge-test-")
    root = copy.parents[2]
    other = root.with_name(root.name + ".users") / str(os.getppid())  # another live process using it (a sibling)
    other.touch()
    model_copy._leave(root)  # what this process does when it ends
    assert copy.is_file()  # the sibling still uses it
    other.unlink()
    (root.with_name(root.name + ".users") / "999999999").touch()  # a user that died without leaving
    write_model_copy(model, path, server, "ge-test-")  # this process again
    model_copy._leave(root)
    assert not root.exists() and not root.with_name(root.name + ".users").exists()
