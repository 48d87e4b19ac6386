"""The peer in the bench (Triton's C++ onnxruntime backend): detection, layout, generated config and the × column.

No real peer exists here: a fake backend folder (an empty libtriton_onnxruntime.so) stands in for it. Nothing here
starts tritonserver, perf_analyzer or a timing measurement; the fake is never loaded.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from gebackend.bench import peer, report, scenarios
from gebackend.modelzoo.bench_models import models
from gebackend.bench.runner import Bench, BenchSettings
from gebackend.cli.main import main as cli_main
from gebackend.config.pbtxt import load_model_config
from gebackend.server import layout


def fake_backends(root: Path) -> Path:
    """A backends folder as NGC's: onnxruntime/ with the backend library and the ORT it ships (a relative link)."""
    folder = root / "onnxruntime"
    folder.mkdir(parents=True)
    (folder / peer.LIBRARY).write_bytes(b"")
    (folder / "libonnxruntime.so.1").write_bytes(b"ort")
    (folder / "libonnxruntime.so").symlink_to("libonnxruntime.so.1")
    return root


# ------------------------------------------------------------------------------------------ detection
def test_a_backends_folder_or_the_onnxruntime_folder_itself_is_detected(tmp_path):
    root = fake_backends(tmp_path / "backends")
    for given in (root, root / "onnxruntime"):
        found = peer.find(given)
        assert found.folder == root / "onnxruntime" and found.library == root / "onnxruntime" / peer.LIBRARY
        assert found.extra_backends == {"onnxruntime": root / "onnxruntime"}
        assert peer.missing(given) is None
    assert all(isinstance(w, str) for w in peer.find(root).warnings)  # ldd cannot read an empty file: said, not raised


def test_a_folder_without_the_library_gives_the_clear_message(tmp_path):
    (tmp_path / "onnxruntime").mkdir()
    expected = f"no onnxruntime backend in {tmp_path}: expected {tmp_path}/onnxruntime/libtriton_onnxruntime.so"
    with pytest.raises(peer.PeerMissing) as err:
        peer.find(tmp_path)
    assert str(err.value) == expected
    assert peer.missing(tmp_path) == expected
    assert peer.lookup(tmp_path) == (None, expected)
    assert peer.describe(None, expected) == {"backend": "onnxruntime", "available": False, "reason": expected}


def test_the_default_folders_are_the_environment_variable_then_ngcs(tmp_path, monkeypatch):
    monkeypatch.setattr(peer, "DEFAULT_DIRS", (tmp_path / "opt" / "tritonserver" / "backends",))
    assert peer.candidates(environ={}) == [tmp_path / "opt" / "tritonserver" / "backends"]
    reason = peer.missing(environ={})
    assert reason.startswith("no onnxruntime backend found (looked in ") and "--peer-backend-dir" in reason
    root = fake_backends(tmp_path / "mine")
    environ = {peer.ENV_VAR: str(root)}
    assert peer.candidates(environ=environ)[0] == root
    assert peer.find(environ=environ, check_links=False).folder == root / "onnxruntime"
    with pytest.raises(peer.PeerMissing):  # an explicit DIR is the only one looked in
        peer.find(tmp_path / "elsewhere", environ=environ)


def test_ldd_findings_are_sentences(tmp_path):
    folder = tmp_path / "onnxruntime"
    ldd = (f"\tlinux-vdso.so.1 (0x00007ffd)\n"
           f"\tlibtritonserver.so => not found\n"
           f"\tlibonnxruntime.so.1 => {folder}/libonnxruntime.so.1 (0x00007f)\n"
           f"\tlibcudart.so.12 => not found\n"
           f"\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n")
    links = peer.parse_ldd(ldd)
    assert links == {"libtritonserver.so": None, "libonnxruntime.so.1": f"{folder}/libonnxruntime.so.1",
                     "libcudart.so.12": None}
    folder.mkdir()
    (warning,) = peer.resolve_warnings(links, folder)  # libtritonserver.so is the layout's to provide
    assert warning == "libtriton_onnxruntime.so links libraries the loader does not find: libcudart.so.12"
    foreign = peer.resolve_warnings({"libonnxruntime.so.1": "/usr/lib/libonnxruntime.so.1"}, folder)
    assert foreign == ["libtriton_onnxruntime.so takes ONNX Runtime from outside its folder: "
                       "libonnxruntime.so.1 from /usr/lib/libonnxruntime.so.1"]
    assert "does not link libonnxruntime" in peer.resolve_warnings({"libc.so.6": "/lib/libc.so.6"}, folder)[0]


def test_ldd_missing_or_failing_is_never_a_traceback(tmp_path):
    library = tmp_path / peer.LIBRARY
    library.write_bytes(b"")
    assert peer.link_warnings(library, ldd="") == []
    (said,) = peer.link_warnings(library, ldd=str(tmp_path / "no-such-ldd"))
    assert said.startswith("ldd could not check libtriton_onnxruntime.so")


# --------------------------------------------------------------------------------------------- layout
def fake_triton(tmp_path: Path) -> SimpleNamespace:
    python = tmp_path / "wheel" / "backends" / "python"
    python.mkdir(parents=True)
    (python / "libtriton_python.so").write_bytes(b"py")
    (python / "triton_python_backend_utils.py").write_text("# utils\n")
    stub = tmp_path / "wheel" / "triton_python_backend_stub"
    stub.write_bytes(b"stub")
    libs = tmp_path / "wheel" / "nvidia_pytriton.libs"
    libs.mkdir()
    (libs / "libtritonserver-717102f0.so").write_bytes(b"server")
    return SimpleNamespace(python_backend=python, stub=lambda: stub, libs=libs)


def test_the_layout_copies_the_peer_beside_our_backends(tmp_path):
    triton = fake_triton(tmp_path)
    plain = layout.lay_out_backends(triton, tmp_path / "plain")
    source = fake_backends(tmp_path / "ngc") / "onnxruntime"
    backends = layout.lay_out_backends(triton, tmp_path / "with", {"onnxruntime": source})
    copied = backends / "onnxruntime"
    assert (copied / peer.LIBRARY).is_file() and not (copied / peer.LIBRARY).is_symlink()  # a real file, not a link
    assert os.readlink(copied / "libonnxruntime.so") == "libonnxruntime.so.1"  # kept: it stays inside the folder
    assert (copied / "libonnxruntime.so.1").read_bytes() == b"ort"
    assert (copied / "libtritonserver.so").resolve() == (triton.libs / "libtritonserver-717102f0.so").resolve()
    # Python backend and ours untouched: the same entries as without the peer.
    assert sorted(p.relative_to(backends).as_posix() for p in backends.rglob("*") if "onnxruntime" not in p.parts) == \
        sorted(p.relative_to(plain).as_posix() for p in plain.rglob("*") if "onnxruntime" not in p.parts)
    assert (backends / "python" / "triton_python_backend_stub").is_symlink()
    assert not (backends / "python" / "libtriton_python.so").is_symlink()
    assert (backends / "ge" / "model.py").read_text() == layout.ADAPTER.read_text()
    # without the peer, Triton's onnxruntime backend's name is ours too: its models are served by ge, unchanged
    assert (plain / "onnxruntime" / "model.py").read_text() == layout.ADAPTER.read_text()
    assert not (copied / "model.py").exists()


def test_the_peers_configs_name_a_backend_that_is_ours_unless_the_peer_is_given(tmp_path, monkeypatch):
    from gebackend.server import shm

    assert layout.backend_of({"backend": "onnxruntime"}) == layout.backend_of({"platform": "onnxruntime_onnx"}) == "onnxruntime"
    assert layout.backend_of({"backend": "ge", "platform": "onnxruntime_onnx"}) == "ge"
    assert layout.backend_of({"platform": "tensorflow_savedmodel"}) == ""
    monkeypatch.delenv(layout.EXTRA_BACKENDS_ENV, raising=False)
    assert "onnxruntime" in shm.python_based_backends()  # its instances are our stubs: /dev/shm is sized for them
    monkeypatch.setenv(layout.EXTRA_BACKENDS_ENV, f"onnxruntime={tmp_path}")
    assert "onnxruntime" not in shm.python_based_backends() and "ge" in shm.python_based_backends()


def test_a_backend_library_linked_from_outside_becomes_a_real_file(tmp_path):
    real = tmp_path / "build" / "libtriton_onnxruntime.so.real"
    real.parent.mkdir()
    real.write_bytes(b"lib")
    source = tmp_path / "onnxruntime"
    source.mkdir()
    (source / peer.LIBRARY).symlink_to(real)
    copied = layout.copy_backend(source, tmp_path / "backends" / "onnxruntime")
    assert not (copied / peer.LIBRARY).is_symlink() and (copied / peer.LIBRARY).read_bytes() == b"lib"


def test_extra_backends_reach_gebackend_serve_through_the_environment(tmp_path):
    env = layout.extra_backends_env({"onnxruntime": tmp_path / "ort"})
    assert layout.extra_backends_from_env(env) == {"onnxruntime": (tmp_path / "ort").resolve()}
    assert layout.extra_backends_env({}) == {} and layout.extra_backends_from_env({}) == {}
    with pytest.raises(ValueError, match="replace one of ours"):
        layout.lay_out_backends(fake_triton(tmp_path), tmp_path / "x", {"ge": tmp_path})


# -------------------------------------------------------------------------------------------- configs
@pytest.fixture(scope="module")
def bert_small(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    model = models(cache)["bert_small"]
    return model, model.ensure(cache, log=lambda m: None)


def _config(tmp_path, bert_small, scenario):
    model, path = bert_small
    repo = scenarios.write_repository(tmp_path, model, scenario, path)
    assert (repo / model.name / "1" / "model.onnx").resolve() == path.resolve()
    assert not (repo / model.name / "1" / "model.py").exists()
    config = load_model_config(repo / model.name / "config.pbtxt")
    return config, {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}


def test_the_peer_config_is_the_onnxruntime_backends(bert_small, tmp_path):
    config, params = _config(tmp_path / "a", bert_small, scenarios.PEERS["peer"])
    assert config["backend"] == "onnxruntime" and config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["input_ids", "attention_mask"]
    assert config["instance_group"][0]["count"] == 1 and "dynamic_batching" not in config and params == {}


def test_the_batching_peer_batches_as_the_comparable_rung(bert_small, tmp_path):
    rung = scenarios.SCENARIOS["ge_dyn_batching"]
    config, params = _config(tmp_path / "b", bert_small, scenarios.PEERS["peer_batching"])
    batching = config["dynamic_batching"]
    assert [int(b) for b in batching["preferred_batch_size"]] == list(rung.preferred_batch_sizes)
    assert int(batching["max_queue_delay_microseconds"]) == rung.max_queue_delay_us
    assert params == {}  # none of ge's (static_model, engine, ...): the peer does not read them
    pinned = replace(scenarios.PEERS["peer_batching"], instances=2, intra_op_threads=1)
    config, params = _config(tmp_path / "c", bert_small, pinned)
    assert config["instance_group"][0]["count"] == 2 and params == {"intra_op_thread_count": "1"}


def test_the_default_instances_peer_leaves_the_count_to_triton(bert_small, tmp_path):
    """No instance_group in its file: Triton's default count for the backend decides (2 CPU instances for it)."""
    chosen = scenarios.PEERS["peer_default_instances"]
    model, path = bert_small
    repo = scenarios.write_repository(tmp_path, model, chosen, path)
    lines = (repo / model.name / "config.pbtxt").read_text().splitlines()
    assert not [line for line in lines if "instance_group" in line and not line.startswith("#")]
    config, params = _config(tmp_path / "d", bert_small, chosen)
    batching = scenarios.PEERS["peer_batching"]
    assert "instance_group" not in config and params == {}
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == batching.max_queue_delay_us
    assert chosen.name not in scenarios.PEER_SCENARIOS  # measured when named, not beside every ladder


def test_the_lending_scenario_is_the_pinned_one_lending(bert_small, tmp_path):
    config, params = _config(tmp_path / "e", bert_small, scenarios.SCENARIOS["ge_dyn_lend"])
    _, pinned = _config(tmp_path / "f", bert_small, scenarios.SCENARIOS["ge_dyn_pinned"])
    assert config["instance_group"][0]["count"] == 2 and params == {**pinned, "lend_idle_cores": "on"}


def test_peer_scenarios_are_selectable_but_never_ensembles_nor_ceilings():
    assert [s.name for s in scenarios.select(["naive", "peer_batching"])] == ["naive", "peer_batching"]
    assert all(s.is_peer and not s.is_ge for s in scenarios.PEERS.values())
    with pytest.raises(ValueError, match="only ge scenarios"):
        scenarios.select(["peer+ensemble"])


def test_peer_availability_follows_the_folder(tmp_path):
    root = fake_backends(tmp_path / "backends")
    assert scenarios.availability(scenarios.PEERS["peer"], root)[1] is None
    _, missing = scenarios.availability(scenarios.PEERS["peer"], tmp_path / "empty")
    assert missing == (f"not available: no onnxruntime backend in {tmp_path / 'empty'}: "
                       f"expected {tmp_path / 'empty'}/onnxruntime/libtriton_onnxruntime.so")


def test_the_peer_runs_beside_the_ladder_where_found(tmp_path):
    bench = Bench(BenchSettings(scenarios=("naive", "ge_dynamic"), out=tmp_path))
    assert [s.name for s in bench.chosen()] == ["naive", "ge_dynamic"]  # nothing found
    bench.peer = peer.find(fake_backends(tmp_path / "b"), check_links=False)
    assert [s.name for s in bench.chosen()] == ["naive", "ge_dynamic", "peer", "peer_batching"]
    bench.settings = replace(bench.settings, with_peer=False)
    assert [s.name for s in bench.chosen()] == ["naive", "ge_dynamic"]
    bench.settings = replace(bench.settings, with_peer=True, scenarios=("peer",))
    assert [s.name for s in bench.chosen()] == ["peer", "peer_batching"]


def test_the_cli_refuses_a_peer_folder_without_the_backend(tmp_path, capsys):
    assert cli_main(["bench", "--peer-backend-dir", str(tmp_path)]) == 2
    assert f"no onnxruntime backend in {tmp_path}: expected" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- report
def _row(c, thr):
    return {"concurrency": c, "throughput": thr, "p50_us": 1000.0, "p90_us": 1000.0, "p95_us": 2000.0,
            "p99_us": 2000.0, "avg_us": 1000.0}


def _model(peer_batching_status="ok"):
    return {"name": "m", "description": "d", "scenarios": [
        {"name": "naive", "title": "n", "status": "ok", "rows": [_row(1, 100), _row(4, 200)], "ceiling": [], "peer": False},
        {"name": "ge_dynamic", "title": "g", "status": "ok", "rows": [_row(1, 150), _row(4, 600)], "ceiling": [],
         "peer": False},
        {"name": "peer", "title": "p", "status": "ok", "rows": [_row(1, 300), _row(4, 400)], "ceiling": [], "peer": True},
        {"name": "peer_batching", "title": "pb", "status": peer_batching_status, "reason": "model failed to load: x",
         "rows": [_row(4, 500)] if peer_batching_status == "ok" else [], "ceiling": [], "peer": True},
    ]}


def test_the_column_is_throughput_over_the_best_peer_at_the_same_concurrency():
    lines = {line["scenario"]: line for line in report.summarize(_model(), wanted=4)}
    assert lines["ge_dynamic"]["x_peer"] == pytest.approx(600 / 500) and lines["ge_dynamic"]["peer_reference"] == "peer_batching"
    assert lines["naive"]["x_peer"] == pytest.approx(200 / 500)
    assert lines["peer"]["x_peer"] == pytest.approx(400 / 500) and lines["peer_batching"]["x_peer"] == pytest.approx(1.0)
    ratios = report.peer_ratios(_model())
    assert ratios["reference"] == {"1": {"scenario": "peer", "throughput": 300}, "4": {"scenario": "peer_batching", "throughput": 500}}
    assert ratios["ratios"]["ge_dynamic"] == {"1": pytest.approx(0.5), "4": pytest.approx(1.2)}
    assert ratios["ratios"]["peer_batching"]["1"] is None  # it did not measure c=1


def test_a_failed_or_absent_peer_gives_dashes():
    failed = _model("failed")
    lines = {line["scenario"]: line for line in report.summarize(failed, wanted=4)}
    assert lines["ge_dynamic"]["x_peer"] == pytest.approx(600 / 400)  # the peer that ran is the reference
    for result in failed["scenarios"]:
        if result["name"] == "peer":
            result.update(status="not available", rows=[])
    assert all(line["x_peer"] is None for line in report.summarize(failed, wanted=4))
    text = report.markdown({"meta": {"peer": peer.describe(None, "no onnxruntime backend found")}, "models": [failed]}, 4)
    assert "| bs1 Δp50 | cos vs fp32 | × onnxruntime backend | notes |" in text
    assert "| ge_dynamic (g) | 600.0 | 1.00 | 2.00 | 3.00x | – | – | – | – | – |" in text
    assert "- onnxruntime backend (the peer): not compared: no onnxruntime backend found" in text
    assert report.peer_ratios(failed)["reference"] == {"1": None, "4": None}


def test_markdown_and_plots_show_the_peer(tmp_path):
    summary = {"meta": {}, "models": [_model()]}
    text = report.markdown(summary, wanted=4)
    assert "| ge_dynamic (g) | 600.0 | 1.00 | 2.00 | 3.00x | – | – | – | – | 1.20x |" in text
    assert "its best scenario, peer_batching" in text
    assert "| ge_dynamic | 1 | 150.0 | 1.00 | 1.00 | 2.00 | 0.00 | 0.00 | 0.50x |" in text
    paths = report.plot(summary, tmp_path)
    assert sorted(p.name for p in paths) == ["latency_m.png", "throughput_m.png"]


def test_the_onnxruntime_backends_own_command_line_keys_are_named_as_not_read(tmp_path):
    args = ["onnxruntime,enable-global-threadpool=1", "python,shm-default-byte-size=1048576", "default-max-batch-size=4"]
    note = layout.peer_config_note(args, {})
    assert note.startswith("--backend-config onnxruntime,enable-global-threadpool=1: for Triton's onnxruntime backend")
    assert "not read" in note and "ge,KEY=VALUE" in note and "python," not in note
    assert layout.peer_config_note(args, {"onnxruntime": tmp_path}) is None  # the real backend reads them
    assert layout.peer_config_note(args[1:], {}) is None
