"""The winner's config.pbtxt as `gebackend tune` writes it: it parses as a Triton ModelConfig (the project's parser),
keeps the original's name, inputs, outputs and other settings, round-trips every key the tuner chose, and has a
comment above each; the measured reasons; report.md / report.json; --apply keeping config.pbtxt.orig."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from gebackend.config.pbtxt import load_model_config
from gebackend.modelzoo import build_add_mul
from gebackend.tune import config_writer, report, space, tuned_model, tuner
from gebackend.tune.numerics_order import Check
from gebackend.tune.outcome import Measurement, Outcome
from gebackend.tune.search import Search, SearchSettings

ORIGINAL = """name: "addmul"
backend: "npu_ge"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "sum", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU, count: 3 } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
parameters { key: "ge.aicoreNum" value: { string_value: "1" } }
parameters { key: "session.ge.exec.precision_mode_v2" value: { string_value: "fp16" } }
parameters { key: "hang_timeout_s" value: { string_value: "60" } }
parameters { key: "profiling_dir" value: { string_value: "a \\"quoted\\" dir" } }
parameters { key: "quantization" value: { string_value: "static" } }
parameters { key: "calibration_data" value: { string_value: "calib" } }
"""


def model_dir(tmp_path: Path, config: str = ORIGINAL, model: onnx.ModelProto | None = None, name: str = "addmul") -> Path:
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    onnx.save(model if model is not None else build_add_mul(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(config)
    return folder


def pinned_static_int8() -> space.Candidate:
    int8 = next(r for r in space.PRECISIONS if r.name == "int8")
    return space.make_candidate("onnxruntime", int8, True, (2, 1), 100, 8, 2)


def test_the_written_config_parses_and_round_trips_the_chosen_keys(tmp_path):
    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    text = config_writer.config_text(model, pinned_static_int8(), {"graph": "1.18x the dynamic graph at concurrency 4"})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.pbtxt").write_text(text)
    got = load_model_config(tmp_path / "out" / "config.pbtxt")
    original = load_model_config(tmp_path / "addmul" / "config.pbtxt")
    assert got["name"] == "addmul" and got["backend"] == "ge" and got["max_batch_size"] == 8
    assert got["input"] == original["input"] and got["output"] == original["output"]
    assert got["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
    assert got["dynamic_batching"] == {"preferred_batch_size": [2, 4, 8], "max_queue_delay_microseconds": 100}
    params = {k: v["string_value"] for k, v in got["parameters"].items()}
    assert params == {
        "engine": "onnxruntime", "precision_mode": "int8", "static_model": "1",
        "graph.ge.inputShape": "x:-1,4;y:-1,4", "graph.ge.dynamicDims": "1,1;2,2;4,4;8,8",
        "cores_per_instance": "1", "intra_op_thread_count": "1",
        "hang_timeout_s": "60",  # not the tuner's: kept; its aliases (ge.aicoreNum, precision_mode_v2) are gone
        "profiling_dir": 'a "quoted" dir',  # written back escaped
        "quantization": "dynamic",  # the int8 rung's: dynamic quantization, whatever the original said
        "calibration_data": str((tmp_path / "addmul" / "calib").resolve()),  # relative to the model folder
    }


def test_every_chosen_key_has_a_comment_above_it(tmp_path):
    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    reasons = {"graph": "1.18x the dynamic graph at concurrency 4 on this CPU", "numerics": "1.50x onnxruntime origin",
               "instances": "1.10x 1 instance x 2 cores", "delay": "1.02x a 0 us queue delay"}
    lines = config_writer.config_text(model, pinned_static_int8(), reasons).splitlines()
    chosen = ["engine", "precision_mode", "static_model", "graph.ge.inputShape", "graph.ge.dynamicDims",
              "cores_per_instance", "intra_op_thread_count"]
    for key in chosen:
        at = next(i for i, line in enumerate(lines) if line.startswith(f'parameters {{ key: "{key}"'))
        above = []
        for line in reversed(lines[:at]):
            if not line.lstrip().startswith("#"):
                break
            above.append(line)
        assert above and any(f"# {key}=" in line for line in above), key
    for key in ("instance_group [", "max_queue_delay_microseconds:", "preferred_batch_size:"):
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(key))
        assert lines[at - 1].lstrip().startswith("#"), key
    text = "\n".join(lines)
    assert "# static_model=1: " in text and "chosen: 1.18x the dynamic graph at concurrency 4 on this CPU" in text
    assert text.count("chosen: 1.18x") == 1  # said once, at the dimension's first key
    assert "chosen: 1.02x a 0 us queue delay" in text and "chosen: 1.10x 1 instance x 2 cores" in text


def test_a_config_for_the_onnxruntime_backend_becomes_a_ge_config(tmp_path):
    config = ('name: "addmul"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
              'parameters { key: "intra_op_thread_count" value: { string_value: "4" } }\n')
    model = tuned_model.TunedModel.load(model_dir(tmp_path, config))
    cand = space.space(2, ("onnxruntime",), (), model.max_batch_size, 2)[0]
    (tmp_path / "c.pbtxt").write_text(config_writer.config_text(model, cand))
    got = load_model_config(tmp_path / "c.pbtxt")
    assert got["backend"] == "ge" and "platform" not in got
    assert "intra_op_thread_count" not in got["parameters"]  # one instance with all cores: the tuner's choice
    peer = config_writer.config_text(model, space.peer(model, 2))
    (tmp_path / "p.pbtxt").write_text(peer)
    assert load_model_config(tmp_path / "p.pbtxt")["backend"] == "onnxruntime"


def test_a_config_without_io_gets_max_batch_size_and_buckets_from_the_onnx_file(tmp_path):
    model = tuned_model.TunedModel.load(model_dir(tmp_path, 'backend: "ge"\n'))
    assert model.name == "addmul" and model.max_batch_size == 8 and not model.static_problem
    cand = space.space(2, ("onnxruntime",), (), model.max_batch_size, 2)[0]
    (tmp_path / "c.pbtxt").write_text(config_writer.config_text(model, cand))
    got = load_model_config(tmp_path / "c.pbtxt")
    assert got["name"] == "addmul" and got["max_batch_size"] == 8 and "input" not in got
    assert got["parameters"]["graph.ge.inputShape"]["string_value"] == "x:-1,4;y:-1,4"


def outcome(cand, throughput, status="ok", cosine=1.0):
    return Outcome(cand, status=status, cosine=cosine, screen=Measurement(throughput, 1.0, 2.0))


def test_explain_gives_the_ratio_to_the_twin_that_differs_in_one_dimension():
    cs = space.space(2, ("onnxruntime",), (), 8, 4)
    static = next(c for c in cs if c.key == "ort-static-origin-1x2-d0")
    dynamic = next(c for c in cs if c.key == "ort-dynamic-origin-1x2-d0")
    pinned = next(c for c in cs if c.key == "ort-dynamic-origin-2x1-d100")
    outcomes = [outcome(static, 118.0, "winner"), outcome(dynamic, 100.0), outcome(pinned, 50.0)]
    reasons = config_writer.explain(outcomes[0], outcomes, 4)
    assert reasons["graph"] == "1.18x the dynamic graph at concurrency 4 on this CPU (screening)"
    assert reasons["instances"] == ("2.36x 2 instances x 1 core at concurrency 4 on this CPU (screening; no twin measured, "
                                    "nearest: onnxruntime dynamic origin 2x1 core delay 100us, which also differs in "
                                    "graph, delay)")
    assert reasons["numerics"] == "no alternative was measured (pruned or out of time)"
    # a slower candidate nearer the winner (one other difference, not two) is the one compared with
    near = next(c for c in cs if c.key == "ort-static-origin-2x1-d100")
    reasons = config_writer.explain(outcomes[0], outcomes + [outcome(near, 40.0)], 4)
    assert reasons["instances"].startswith("2.95x 2 instances x 1 core at concurrency 4 on this CPU (screening; no twin "
                                           "measured, nearest: onnxruntime static origin 2x1 core delay 100us, which "
                                           "also differs in delay)")


def fake_search(tmp_path):
    cs = space.quick_set(space.space(2, ("onnxruntime",), (), 8, 4))
    base = space.Candidate("baseline", cs[0].scenario, cs[0].rung, 2, kind="baseline")
    search = Search(cs, None, SearchSettings())
    search.references = [outcome(base, 100.0)]
    search.outcomes = [outcome(cs[0], 150.0, "winner"), outcome(cs[1], 120.0),
                       Outcome(cs[2], status="rejected: cosine 0.990000 < 0.999", cosine=0.99)]
    search.winner = search.outcomes[0]
    return search


def test_report_has_every_candidate_with_status_and_ratios(tmp_path):
    search = fake_search(tmp_path)
    data = report.summary(search, {"model": "addmul", "machine": "a CPU", "concurrency": 4}, {"graph": "x"}, "cfg")
    report.write(tmp_path, data)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert [c["status"] for c in saved["candidates"]] == ["winner", "ok", "rejected: cosine 0.990000 < 0.999"]
    assert saved["winner"] == search.outcomes[0].candidate.key
    assert saved["candidates"][0]["x_baseline"] == 1.5
    md = (tmp_path / "report.md").read_text()
    assert "- machine: a CPU" in md and "rejected: cosine 0.990000 < 0.999" in md and "| 1.50x |" in md
    assert (tmp_path / "tune.png").stat().st_size > 5000


def peer_faster_search(tmp_path, peer_rounds=(300.0, 330.0), winner_ms=0.3, quick=True):
    """fake_search with the peer measured in the refining rounds beside the winner (150, 160 infer/s), the accuracy
    guard's in-process times and a faster precision rejected for accuracy."""
    search = fake_search(tmp_path)
    search.settings.quick = quick
    peer = space.Candidate("peer", search.outcomes[0].candidate.scenario, search.outcomes[0].candidate.rung, 2, kind="peer")
    search.references.append(Outcome(peer, rounds=[Measurement(t, 1.0, 2.0) for t in peer_rounds]))
    search.winner.rounds = [Measurement(150.0, 1.0, 2.0), Measurement(160.0, 1.0, 2.0)]
    search.checks = {("onnxruntime", "origin"): Check(1.0, winner_ms), ("onnxruntime", "int8"): Check(0.99, winner_ms / 2),
                     ("onnxruntime", "int8-static"): Check(0.98, winner_ms * 2)}
    search.outcomes.append(Outcome(search.outcomes[1].candidate, status="skipped: time budget"))
    return search


def test_the_report_says_when_the_onnxruntime_backend_beat_every_candidate_and_why(tmp_path):
    search = peer_faster_search(tmp_path)
    verdict = report.peer_verdict(search)
    # the ratio of the medians of the same rounds (315 / 155), the spreads, and what was measured of why
    assert verdict.startswith("Triton's onnxruntime backend served 2.03x the winner in the same rounds (medians of 2; "
                              "spread of the rounds: the backend 10 %, the winner 6 %)")
    assert "One request computes in 0.30 ms in process (onnxruntime origin, the fastest accepted precision)" in verdict
    assert ("under --min-cosine 0.999, so not served: onnxruntime int8 (0.15 ms, cosine 0.990000); a lower "
            "--min-cosine measures them") in verdict
    assert "int8-static" not in verdict  # rejected, but slower than the winner's precision: no reason to try it
    assert "1 candidate(s) were not measured within the time budget: a longer --time-budget-min (or a tune without " \
           "--quick) measures them." in verdict
    data = report.summary(search, {"model": "addmul", "machine": "a CPU", "concurrency": 4}, {}, "cfg")
    report.write(tmp_path, data)
    assert json.loads((tmp_path / "report.json").read_text())["peer_verdict"] == verdict
    assert verdict in (tmp_path / "report.md").read_text()


def test_no_peer_verdict_where_the_winner_beat_the_peer_or_none_was_measured(tmp_path):
    assert report.peer_verdict(fake_search(tmp_path)) is None  # no peer
    assert report.peer_verdict(peer_faster_search(tmp_path, peer_rounds=(150.0, 154.0))) is None  # winner's 155 above
    data = report.summary(fake_search(tmp_path), {"model": "addmul", "machine": "a CPU", "concurrency": 4}, {}, "cfg")
    assert data["peer_verdict"] is None and "onnxruntime backend served" not in report.markdown(data)


def test_the_peer_verdict_blames_the_transport_only_for_a_model_that_computes_for_little(tmp_path):
    verdict = report.peer_verdict(peer_faster_search(tmp_path, winner_ms=30.0, quick=False))
    assert verdict.startswith("Triton's onnxruntime backend served 2.03x") and "in process (" not in verdict
    assert "onnxruntime int8 (15.00 ms" in verdict and "(or a tune without --quick)" not in verdict


def test_apply_keeps_the_old_config_as_orig(tmp_path):
    folder = model_dir(tmp_path)
    search = fake_search(tmp_path)
    said = tuner.apply(folder, "backend: \"ge\"\n", search)
    assert (folder / "config.pbtxt.orig").read_text() == ORIGINAL
    assert (folder / "config.pbtxt").read_text() == 'backend: "ge"\n' and "config.pbtxt.orig" in said
    search.references[0].screen = Measurement(1000.0, 1, 2)  # your config faster: left alone
    (folder / "config.pbtxt").write_text(ORIGINAL)
    assert tuner.apply(folder, "x", search).startswith("not applied")
    assert (folder / "config.pbtxt").read_text() == ORIGINAL


def test_references_are_your_config_and_the_peer_where_found(tmp_path):
    from gebackend.bench.peer import Peer

    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    (base,) = tuner.references(model, None, 2)
    assert base.kind == "baseline" and base.config_text == ORIGINAL
    assert config_writer.config_text(model, base) == ORIGINAL  # measured exactly as written
    found = Peer(tmp_path / "onnxruntime", tmp_path / "onnxruntime" / "libtriton_onnxruntime.so")
    assert [c.kind for c in tuner.references(model, found, 2)] == ["baseline", "peer"]
    ort_config = 'name: "addmul"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
    (tmp_path / "addmul" / "config.pbtxt").write_text(ort_config)
    ort_model = tuned_model.TunedModel.load(tmp_path / "addmul")
    (on_ge,) = tuner.references(ort_model, None, 2)  # no onnxruntime backend here: your config, on ge
    (tmp_path / "b.pbtxt").write_text(on_ge.config_text)
    measured = load_model_config(tmp_path / "b.pbtxt")
    assert measured["backend"] == "ge"  # with the 2 CPU instances Triton gives the onnxruntime backend's models
    assert [(g.get("kind"), g.get("count")) for g in measured["instance_group"]] == [("KIND_CPU", 2)]
    (tmp_path / "addmul" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [ { count: 3 }, { kind: KIND_CPU } ]\n')
    (on_ge,) = tuner.references(tuned_model.TunedModel.load(tmp_path / "addmul"), None, 2)
    (tmp_path / "c.pbtxt").write_text(on_ge.config_text)
    assert [g.get("count") for g in load_model_config(tmp_path / "c.pbtxt")["instance_group"]] == [3, 2]
    assert tuner.references(ort_model, found, 2)[0].config_text == ort_config  # on the peer itself


def test_the_bench_accuracy_check_takes_a_model_without_batching(tmp_path):
    """inprocess.accuracy (the tuner's accuracy guard) sends the feeds as one request when the model does not batch."""
    import numpy as np

    from gebackend.bench import inprocess
    from gebackend.modelzoo import build_identity_fixed

    folder = tmp_path / "ident"
    (folder / "1").mkdir(parents=True)
    onnx.save(build_identity_fixed(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text('name: "ident"\nbackend: "ge"\nmax_batch_size: 0\n')
    ceiling = inprocess.Ceiling(folder, log=lambda line: None)
    try:
        feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
        assert inprocess.accuracy(ceiling, folder / "1" / "model.onnx", feeds) == {"cosine": 1.0, "max_abs_diff": 0.0}
    finally:
        ceiling.close()


def test_the_cli_refuses_a_folder_without_config_and_a_missing_peer(tmp_path, capsys):
    from gebackend.cli.main import main

    assert main(["tune", str(tmp_path)]) == 2
    assert "has no config.pbtxt" in capsys.readouterr().err
    folder = model_dir(tmp_path)
    assert main(["tune", str(folder), "--peer-backend-dir", str(tmp_path / "none")]) == 2
    assert "no onnxruntime backend in" in capsys.readouterr().err


def test_the_report_parts_the_engines_gain_from_the_servings_for_a_lowered_winner(tmp_path):
    search = peer_faster_search(tmp_path, peer_rounds=(60.0, 64.0), winner_ms=30.0)
    int8 = next(c for c in space.space(2, ("onnxruntime",), (), 8, 4) if c.numerics == ("onnxruntime", "int8"))
    search.winner.candidate = int8
    verdict = report.engine_verdict(search)
    # in process 30 ms exact against 15 ms int8: 2.00x; served 155 against 62: 2.50x, 1.25x the engines' ratio
    assert verdict == ("In process, one request at a time on all cores (the accuracy guard's timing): onnxruntime int8 "
                       "15.00 ms, ONNX Runtime's exact graph (the onnxruntime backend's engine and precision) 30.00 ms: "
                       "the engines alone give 2.00x. Served, the winner is 2.50x the onnxruntime backend, 1.25x the "
                       "engines' ratio: what instances, pinning and batching add or lose. More than that on this CPU "
                       "needs a precision that computes faster than onnxruntime int8 within --min-cosine 0.999.")
    data = report.summary(search, {"model": "addmul", "machine": "a CPU", "concurrency": 4}, {}, "cfg")
    report.write(tmp_path, data)
    assert json.loads((tmp_path / "report.json").read_text())["engine_verdict"] == verdict
    assert verdict in (tmp_path / "report.md").read_text()
    cut = next(c for c in space.space(2, ("onnxruntime",), (), 8, 4, trim=True) if c.numerics == ("onnxruntime", "int8"))
    search.winner.candidate = cut  # the peer computes the padding the winner cuts: the served ratio says so
    assert report.engine_verdict(search) == verdict.replace(
        "what instances, pinning and batching add", "what instances, pinning, batching and cutting your requests' "
        "padding (which the onnxruntime backend computes) add")


def test_no_engine_verdict_for_the_exact_graph_or_untimed_precisions(tmp_path):
    search = peer_faster_search(tmp_path)
    assert search.winner.candidate.numerics == ("onnxruntime", "origin") and report.engine_verdict(search) is None
    search.winner.candidate = next(c for c in space.space(2, ("onnxruntime",), (), 8, 4)
                                   if c.numerics == ("onnxruntime", "int8"))
    search.checks = {}  # the accuracy guard did not time them
    assert report.engine_verdict(search) is None
    assert report.summary(search, {"model": "m"}, {}, None)["engine_verdict"] is None


def test_the_report_sets_the_winner_against_its_in_process_ceiling_and_that_against_the_peer(tmp_path):
    search = peer_faster_search(tmp_path, peer_rounds=(60.0, 64.0), winner_ms=30.0)
    served = search.winner.throughput
    verdict = report.ceiling_verdict(search, 2 * served)
    assert verdict == (f"With no server beside them, the winner's instances compute {2 * served:.1f} infer/s in process "
                       f"at concurrency {search.settings.concurrency} (pinned as served): served, it reaches 50 % of "
                       f"that. That ceiling is {2 * served / 62.0:.2f}x the onnxruntime backend: the most this precision "
                       "and layout can give here, however it is served.")
    data = report.summary(search, {"model": "addmul", "machine": "a CPU", "concurrency": 4}, {}, "cfg", 2 * served)
    report.write(tmp_path, data)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["ceiling"] == 2 * served and written["ceiling_verdict"] == verdict
    assert verdict in (tmp_path / "report.md").read_text()
    assert report.ceiling_verdict(search, None) is None and report.summary(search, {"model": "m"}, {}, None)["ceiling"] is None
    search.references = [o for o in search.references if o.candidate.kind != "peer"]
    assert report.ceiling_verdict(search, 2 * served).endswith("reaches 50 % of that.")
