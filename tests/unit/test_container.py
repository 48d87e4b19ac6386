"""gebackend.server.container, shm and log_format: the /dev/shm estimate and check (with a fake statvfs), and the one-line-per-event log
format."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from gebackend.modelzoo import build_bert, build_resnet
from gebackend.server import container, log_format, shm
from gebackend.server.container import check_temp_exec, preflight
from gebackend.server.log_format import EventLines, apply_log_format
from gebackend.server.repository_client import flag_values
from gebackend.server.shm import check_shm, estimate_shm, python_backend_shm_settings

MiB = 1024 * 1024
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "model_repository"


def fake_statvfs(total: int, free: int | None = None, flags: int = 0):
    """A statvfs for a tmpfs of `total` bytes with `free` bytes available (4 KiB blocks), mounted with `flags`."""
    free = total if free is None else free
    return lambda path: SimpleNamespace(f_frsize=4096, f_blocks=total // 4096, f_bavail=free // 4096, f_flag=flags)


def identity(path: Path, shape: list, elem=TensorProto.FLOAT) -> None:
    x = helper.make_tensor_value_info("x", elem, shape)
    y = helper.make_tensor_value_info("y", elem, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def model(repo: Path, name: str, config: str, shape: list | None = None) -> Path:
    folder = repo / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    if shape is not None:
        identity(folder / "1" / "model.onnx", shape)
    return folder


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """The example repository's configs with freshly built models (the checkout's may not be built yet)."""
    repo = tmp_path / "examples"
    for folder in sorted(EXAMPLES.iterdir()):
        if (folder / "config.pbtxt").is_file():
            (repo / folder.name / "1").mkdir(parents=True)
            shutil.copy(folder / "config.pbtxt", repo / folder.name / "config.pbtxt")
            builder = build_bert if folder.name.startswith("bert") else build_resnet
            onnx.save(builder(), str(repo / folder.name / "1" / "model.onnx"))
    return repo


def test_the_examples_need_one_default_region_per_instance(examples: Path):
    need = estimate_shm(examples)
    assert [m.name for m in need.models] == ["bert_ge", "resnet_ge", "resnet_npu_ge"]
    assert need.instances == 3
    # batch 8 of 3x64x64 fp32 in, 8x10 out: 0.38 MiB, fits in the 1 MiB default region (measured: no growth)
    resnet = next(m for m in need.models if m.name == "resnet_ge")
    assert resnet.io_bytes == 8 * (3 * 64 * 64 + 10) * 4
    assert need.floor == 3 * MiB
    bert = next(m for m in need.models if m.name == "bert_ge")
    assert bert.unbounded, "bert's sequence dim has no bound"
    result = check_shm(need, statvfs=fake_statvfs(64 * MiB))
    assert result.ok
    assert "64.0 MiB free of 64.0 MiB" in result.message and "at least 3.0 MiB" in result.message
    assert "counted as 1 in bert_ge" in result.message


def test_large_tensors_and_instances_fail_at_start_with_the_sizes_and_the_fix(tmp_path: Path):
    # 3x1024x1024 fp32 = 12 MiB a sample, batch 4, in + out = 96 MiB an execute; 2 instances
    model(tmp_path, "big", 'backend: "ge"\nmax_batch_size: 4\ninstance_group [ { kind: KIND_CPU, count: 2 } ]\n',
          ["batch", 3, 1024, 1024])
    need = estimate_shm(tmp_path)
    (big,) = need.models
    assert (big.instances, big.io_bytes) == (2, 96 * MiB)
    assert need.floor == 2 * (1 + 96 + 2) * MiB
    result = check_shm(need, statvfs=fake_statvfs(64 * MiB))
    assert not result.ok
    message = result.message
    assert "/dev/shm has 64.0 MiB free of 64.0 MiB" in message
    assert "needs at least 198.0 MiB" in message
    assert re.search(r"--shm-size=\d+m", message) and "emptyDir" in message and "sizeLimit" in message
    assert "medium: Memory" in message
    # the recommendation: 3x the tensors per instance plus a reload of the largest model
    assert need.recommended == 2 * (2 * (1 + 288 + 2) * MiB)
    size = int(re.search(r"--shm-size=(\d+)m", message).group(1))
    assert size * MiB >= need.recommended and size % 64 == 0


def test_between_the_floor_and_the_recommendation_it_starts_and_advises(tmp_path: Path):
    model(tmp_path, "big", 'backend: "ge"\nmax_batch_size: 4\n', ["batch", 3, 1024, 1024])
    need = estimate_shm(tmp_path)
    result = check_shm(need, statvfs=fake_statvfs(256 * MiB))
    assert result.ok and need.floor < 256 * MiB < need.recommended
    assert "recommended" in result.message and "--shm-size=" in result.message


def test_free_space_not_size_counts(tmp_path: Path):
    model(tmp_path, "m", 'backend: "ge"\nmax_batch_size: 1\n', ["batch", 4])
    assert not check_shm(estimate_shm(tmp_path), statvfs=fake_statvfs(64 * MiB, free=512 * 1024)).ok


def test_shape_buckets_bound_free_dims_and_named_dims_carry_to_outputs(tmp_path: Path):
    config = ('backend: "ge"\nmax_batch_size: 8\n'
              'parameters { key: "static_model" value: { string_value: "1" } }\n'
              'parameters { key: "graph.ge.inputShape" value: { string_value: "x:-1,-1" } }\n'
              'parameters { key: "graph.ge.dynamicDims" value: { string_value: "1,1024;8,262144" } }\n')
    model(tmp_path, "buckets", config, ["batch", "n"])
    (buckets,) = estimate_shm(tmp_path).models
    assert buckets.unbounded == ()
    assert buckets.io_bytes == 8 * 262144 * 4 * 2  # 8 MiB in, 8 MiB out


def test_python_backend_settings_come_from_backend_config(tmp_path: Path):
    assert python_backend_shm_settings([]) == (MiB, MiB)
    configs = ["python,shm-default-byte-size=4194304", "python,shm-growth-byte-size=2097152", "onnxruntime,x=1"]
    assert python_backend_shm_settings(configs) == (4 * MiB, 2 * MiB)
    assert flag_values(["--backend-config=python,a=1", "--backend-config", "python,b=2", "--x"], "--backend-config") == [
        "python,a=1", "python,b=2"]
    model(tmp_path, "m", 'backend: "ge"\nmax_batch_size: 1\n', ["batch", 4])
    assert estimate_shm(tmp_path, backend_configs=configs).floor == 4 * MiB


def test_other_backends_are_not_counted_and_broken_models_count_one_instance(tmp_path: Path):
    model(tmp_path, "tf", 'backend: "tensorflow"\nmax_batch_size: 1\n', ["batch", 4])
    model(tmp_path, "ensemble", 'platform: "ensemble"\n')
    model(tmp_path, "broken", 'backend: "ge"\nmax_batch_size: \n')
    model(tmp_path, "no_file", 'backend: "ge"\ninstance_group [ { count: 3 } ]\n')
    need = estimate_shm(tmp_path)
    assert {m.name: m.instances for m in need.models} == {"broken": 1, "no_file": 3}
    assert need.floor == 4 * MiB
    assert "tensor sizes unknown for" in need.describe()


def test_the_onnxruntime_backends_models_are_ours_with_the_two_instances_triton_gives_them(tmp_path: Path, monkeypatch):
    """Served by ge unless the peer is given (server/layout.py); Triton gives that backend's models 2 CPU instances
    where the config names no count."""
    from gebackend.server.layout import EXTRA_BACKENDS_ENV

    monkeypatch.delenv(EXTRA_BACKENDS_ENV, raising=False)
    model(tmp_path, "by_backend", 'backend: "onnxruntime"\nmax_batch_size: 1\n', ["batch", 4])
    model(tmp_path, "by_platform", 'platform: "onnxruntime_onnx"\nmax_batch_size: 1\ninstance_group [ { count: 3 } ]\n',
          ["batch", 4])
    assert {m.name: m.instances for m in estimate_shm(tmp_path).models} == {"by_backend": 2, "by_platform": 3}


def test_npu_ge_configs_that_rename_tensors_use_the_declared_dims(tmp_path: Path):
    config = ('backend: "npu_ge"\nmax_batch_size: 2\n'
              'input [ { name: "in0", data_type: TYPE_FP32, dims: [ 1024, 1024 ] } ]\n'
              'output [ { name: "out0", data_type: TYPE_FP32, dims: [ 1024, 1024 ] } ]\n')
    model(tmp_path, "renamed", config, ["batch", 1024, 1024])
    (renamed,) = estimate_shm(tmp_path).models
    assert renamed.io_bytes == 2 * 2 * 4 * MiB


def test_an_unreadable_shm_dir_is_reported(tmp_path: Path):
    def broken(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    model(tmp_path, "m", 'backend: "ge"\nmax_batch_size: 1\n', ["batch", 4])
    result = check_shm(estimate_shm(tmp_path), shm_dir=tmp_path / "shm", statvfs=broken)
    assert not result.ok and "cannot read the size of" in result.message


def test_preflight_tells_the_right_channel(tmp_path: Path, monkeypatch):
    model(tmp_path, "m", 'backend: "ge"\nmax_batch_size: 1\n', ["batch", 4])
    said, failed = [], []
    monkeypatch.setattr(container, "STATVFS", fake_statvfs(64 * MiB))
    assert preflight(tmp_path, {}, [], failed.append, said.append)
    monkeypatch.setattr(container, "STATVFS", fake_statvfs(512 * 1024))
    assert not preflight(tmp_path, {}, [], failed.append, said.append)
    assert len(said) == 1 and len(failed) == 1 and "needs at least 1.0 MiB" in failed[0]
    assert preflight(tmp_path, {}, [], failed.append, said.append, shm=False)  # --no-shm-check
    assert len(said) == 1 and len(failed) == 1


def test_a_missing_repository_is_the_one_thing_said(tmp_path: Path):
    said, failed = [], []
    assert not preflight(tmp_path / "nowhere", {}, [], failed.append, said.append)
    assert said == [] and failed == [f"model repository {tmp_path / 'nowhere'} is not a folder"]


def test_a_noexec_or_read_only_temp_folder_fails_at_start(tmp_path: Path, monkeypatch):
    noexec = fake_statvfs(64 * MiB, flags=os.ST_NOEXEC | os.ST_NOSUID)
    message = check_temp_exec("/tmp", statvfs=noexec)
    assert "/tmp is mounted noexec" in message and "--tmpfs /tmp:exec" in message
    assert "read-only" in check_temp_exec("/tmp", statvfs=fake_statvfs(64 * MiB, flags=os.ST_RDONLY))
    assert check_temp_exec("/tmp", statvfs=fake_statvfs(64 * MiB, flags=os.ST_NOSUID | os.ST_NODEV)) is None
    failed = []
    monkeypatch.setattr(container, "STATVFS", noexec)
    assert not preflight(tmp_path, {}, [], failed.append, failed.append, shm=False)
    assert "noexec" in failed[0]


def test_serve_refuses_to_start_before_tritonserver(tmp_path: Path, monkeypatch, capsys):
    from gebackend.cli.main import main

    model(tmp_path, "big", 'backend: "ge"\nmax_batch_size: 4\n', ["batch", 3, 1024, 1024])
    monkeypatch.setattr(container, "STATVFS", fake_statvfs(64 * MiB))

    def no_server(*args, **kwargs):
        raise AssertionError("tritonserver must not be started")

    monkeypatch.setattr("gebackend.server.supervisor.Supervisor.start", no_server)
    assert main(["serve", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "gebackend: cannot serve" in err and "/dev/shm has 64.0 MiB free" in err and "--shm-size=" in err


# -- logs ----------------------------------------------------------------------------------------------------
STAMP = re.compile(r'^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) ([IWEV]) (\d+) ([^\]]+)\] (.*)$')


def events(text: str) -> list[tuple[str, str, str, str]]:
    out = []
    for line in text.splitlines():
        match = STAMP.match(line)
        assert match, f"not an event line: {line!r}"
        out.append((match.group(2), match.group(3), match.group(4), match.group(5)))
    return out


def test_our_lines_become_stamped_events_and_tritons_pass_unchanged():
    sink = io.StringIO()
    log = EventLines(sink, "I", clock=lambda: 0.0, pid=42)
    triton = '2026-12-01T11:37:34Z I 5783 model_lifecycle.cc:472] "loading: ident:1"\n'
    log.write(triton)
    print("gebackend: serving /models\n  HTTP     http://127.0.0.1:8000\ngebackend: 3 of 3 models ready\n  bert_ge v1: READY",
          file=log)
    print("gebackend: model 'x': stub process of instance 'x_0' (pid 1) died; reloading the model", file=log)
    log.write("+------+\n| table |\n")
    lines = sink.getvalue().splitlines(keepends=True)
    assert lines[0] == triton
    assert lines[1] == '1970-01-01T00:00:00Z I 42 gebackend] "serving /models\\n  HTTP     http://127.0.0.1:8000"\n'
    assert json.loads(lines[2].split("] ", 1)[1]) == "3 of 3 models ready\n  bert_ge v1: READY"
    assert lines[3].startswith("1970-01-01T00:00:00Z W 42 gebackend] ")
    assert lines[4:] == ["+------+\n", "| table |\n"]


def test_partial_writes_wait_for_their_newline_per_thread():
    sink = io.StringIO()
    log = EventLines(sink, "E", clock=lambda: 0.0, pid=7)
    log.write("gebackend: cannot serve /m: ")
    other = threading.Thread(target=lambda: log.write('2026-12-01T11:37:34Z I 1 x.cc:1] "meanwhile"\n'))
    other.start()
    other.join()
    log.write("no space\n")
    assert sink.getvalue().splitlines() == ['2026-12-01T11:37:34Z I 1 x.cc:1] "meanwhile"',
                                            '1970-01-01T00:00:00Z E 7 gebackend] "cannot serve /m: no space"']
    assert events(sink.getvalue())[1][:3] == ("E", "7", "gebackend")


def test_apply_log_format_asks_triton_for_iso8601_unless_told_otherwise():
    assert apply_log_format("default", ["--x"], install=False) == ["--x"]
    assert apply_log_format("iso8601", ["--x"], install=False) == ["--x", "--log-format=ISO8601"]
    assert apply_log_format("iso8601", ["--log-format=default"], install=False) == ["--log-format=default"]
    assert log_format.log_format_default({"GE_LOG_FORMAT": "ISO8601"}) == "iso8601"
    assert log_format.log_format_default({}) == "default"
    assert log_format.log_format_default({"GE_LOG_FORMAT": "json"}) == "default"


def test_an_estimator_failure_never_stops_the_server(tmp_path: Path, monkeypatch):
    model(tmp_path, "m", 'backend: "ge"\nmax_batch_size: 1\n', ["batch", 4])
    monkeypatch.setattr(container, "STATVFS", fake_statvfs(64 * MiB))
    monkeypatch.setattr(shm, "_tensors", lambda *a: {}["boom"])
    (m,) = estimate_shm(tmp_path).models
    assert m.note.startswith("KeyError") and m.instances == 1

    def broken(*args):
        raise RuntimeError("estimator bug")

    monkeypatch.setattr(container, "estimate_shm", broken)
    said = []
    assert preflight(tmp_path, {}, [], said.append, said.append)
    assert "could not estimate" in said[0] and "estimator bug" in said[0]
