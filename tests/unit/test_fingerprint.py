"""Repository fingerprints (server/repository_client.py): what a SIGHUP compares. Files the server writes into a
model folder itself (byte code, hidden caches) change nothing; any file of the model does."""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

from gebackend.server.repository_client import repository_fingerprints, written_by_the_server


def _python_model(repo: Path) -> Path:
    source = repo / "pymodel" / "1" / "model.py"
    source.parent.mkdir(parents=True)
    source.write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    (repo / "pymodel" / "config.pbtxt").write_text('backend: "python"\n')
    return source


def test_byte_code_a_stub_writes_on_first_import_changes_nothing(tmp_path):
    source = _python_model(tmp_path)
    before = repository_fingerprints(tmp_path)
    # what the stub's import of model.py leaves: 1/__pycache__/model.cpython-3XX.pyc
    py_compile.compile(str(source), cfile=str(source.parent / "__pycache__" / "model.cpython-311.pyc"))
    (source.parent / "legacy.pyc").write_bytes(b"\0" * 16)
    (tmp_path / "pymodel" / ".gebackend-cache" / "precision").mkdir(parents=True)
    (tmp_path / "pymodel" / ".gebackend-cache" / "precision" / "int8.onnx").write_bytes(b"x")
    assert repository_fingerprints(tmp_path) == before


def test_a_change_to_the_model_itself_still_counts(tmp_path):
    source = _python_model(tmp_path)
    before = repository_fingerprints(tmp_path)
    source.write_text(source.read_text() + "# changed\n")
    os.utime(source, ns=(1, 1))
    after = repository_fingerprints(tmp_path)
    assert after != before
    (source.parent / "vocab_tools.py").write_text("x = 1\n")  # a new source file of the model counts
    assert repository_fingerprints(tmp_path) != after


def test_what_counts_as_written_by_the_server():
    assert written_by_the_server(Path("1/__pycache__/model.cpython-311.pyc"))
    assert written_by_the_server(Path("__pycache__/x.txt"))
    assert written_by_the_server(Path(".gebackend-cache/tensorrt-abc/engine.plan"))
    assert written_by_the_server(Path("1/old.pyo"))
    assert not written_by_the_server(Path("1/model.onnx"))
    assert not written_by_the_server(Path("1/model.py"))
    assert not written_by_the_server(Path("config.pbtxt"))
