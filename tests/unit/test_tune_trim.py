"""`gebackend tune --input-data`: the user's requests are what every candidate is measured with, and padded token ids
in them make every ge candidate cut each batch's padding (trim_padding), the dynamic graph first; tune/requests.py
reads perf_analyzer's format and says what is wrong with a file it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gebackend.config.pbtxt import load_model_config
from gebackend.modelzoo.cnclip_standin import build_cnclip_text_standin
from gebackend.tune import config_writer, requests, space, tuned_model, tuner

from test_tune_config import model_dir

CONFIG = 'name: "text"\nbackend: "ge"\nmax_batch_size: 8\ndynamic_batching { }\n'


def _folder(tmp_path: Path, config: str = CONFIG) -> Path:
    return model_dir(tmp_path, config, build_cnclip_text_standin(), "text")


def _requests(tmp_path: Path, rows, name="text", plain=False) -> Path:
    entries = [{name: row if plain else {"content": row, "shape": [len(row)]}} for row in rows]
    path = tmp_path / "requests.json"
    path.write_text(json.dumps({"data": entries}))
    return path


def _padded(n: int) -> list[int]:
    return [101] + [700 + i for i in range(n - 2)] + [102] + [0] * (52 - n)


def test_padded_requests_say_how_much_of_the_context_they_use(tmp_path):
    assert requests.padding(_requests(tmp_path, [_padded(9), _padded(17)]), "text") == (17, 52)
    assert requests.padding(_requests(tmp_path, [_padded(9)], plain=True), "text") == (9, 52)
    assert requests.padding(_requests(tmp_path, [[5] * 52]), "text") is None  # the whole context: nothing to cut
    assert requests.padding(_requests(tmp_path, [_padded(9)], name="ids"), "text") is None  # not that input
    b64 = tmp_path / "b64.json"
    b64.write_text(json.dumps({"data": [{"text": {"content": {"b64": "AAAA"}, "shape": [1]}}]}))
    assert requests.padding(b64, "text") is None


@pytest.mark.parametrize("text, message", [("not json", "not JSON"), ('{"data": []}', "perf_analyzer's format"),
                                            ('[1, 2]', "perf_analyzer's format")])
def test_a_file_that_is_not_perf_analyzer_input_data_is_named(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"--input-data {path}: .*{message}"):
        requests.read(path)
    with pytest.raises(ValueError, match="cannot read it"):
        requests.read(tmp_path / "absent.json")


def test_tune_trims_only_for_padded_requests_and_a_config_that_does_not_set_it(tmp_path):
    model = tuned_model.TunedModel.load(_folder(tmp_path))
    padded = _requests(tmp_path, [_padded(9), _padded(17)])
    why = tuner.trims(model, padded)
    assert "the longest uses 17 of its 52 positions" in why and "trim_padding=text" in why
    assert tuner.trims(model, None) == ""
    assert tuner.trims(model, _requests(tmp_path, [[5] * 52])) == ""
    own = tuned_model.TunedModel.load(_folder(tmp_path / "own", CONFIG + 'parameters { key: "trim_padding" value: { '
                                                           'string_value: "text=0" } }\n'))
    assert tuner.trims(own, padded) == ""  # the user's own option is kept as it is, in every candidate


def test_trimming_candidates_put_the_dynamic_graph_first_and_write_the_option(tmp_path):
    model = tuned_model.TunedModel.load(_folder(tmp_path))
    plain = space.space(2, ("onnxruntime",), (), 8, 4)
    cut = space.space(2, ("onnxruntime",), (), 8, 4, trim=True)
    assert plain[0].scenario.static and not cut[0].scenario.static
    first_static = next(i for i, c in enumerate(cut) if c.scenario.static)
    assert first_static == sum(not c.scenario.static for c in cut)  # every dynamic candidate before any static one
    assert all(c.scenario.trim_padding for c in cut) and not any(c.scenario.trim_padding for c in plain)
    text = config_writer.config_text(model, cut[0])
    (tmp_path / "out.pbtxt").write_text(text)
    params = {k: v["string_value"] for k, v in load_model_config(tmp_path / "out.pbtxt")["parameters"].items()}
    assert params["trim_padding"] == "text" and params["static_model"] == "0"
    assert "# trim_padding=text: each batch cut to its longest request's tokens" in text


def test_a_bad_input_data_file_stops_the_tune_before_any_server(tmp_path, capsys):
    from gebackend.cli.main import main

    folder = _folder(tmp_path)
    with pytest.raises(ValueError, match="cannot read it"):
        tuner.run(tuner.TuneSettings(folder, input_data=tmp_path / "absent.json", out=tmp_path / "out"))
    assert not (tmp_path / "out" / "logs").exists()
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["tune", str(folder), "--input-data", str(bad), "--out", str(tmp_path / "out2")]) == 2
    assert f"gebackend tune: --input-data {bad}: not JSON" in capsys.readouterr().err


def test_the_in_process_timings_read_the_users_requests_or_say_why_not(tmp_path):
    model = tuned_model.TunedModel.load(_folder(tmp_path))
    rows = [_padded(9), _padded(17), _padded(12)]
    sent, said = tuner.in_process_requests(model, _requests(tmp_path, rows))
    assert said == ("your 3 requests, in turn, as perf_analyzer sends them (the accuracy guard compares on 1 seeded "
                    "random one beside them: fewer than 4 are a thin check)")
    four, said = tuner.in_process_requests(model, _requests(tmp_path, rows + rows[:1]))
    assert len(four) == 4 and said == "your 4 requests, in turn, as perf_analyzer sends them"
    _, said = tuner.in_process_requests(model, _requests(tmp_path, rows[:1]))
    assert said.endswith("(the accuracy guard compares on 3 seeded random ones beside it: fewer than 4 are a thin check)")
    assert [feeds["text"].tolist() for feeds in sent] == [[row] for row in rows]  # batch dim 1: the model batches
    assert tuner.in_process_requests(model, None) == (None, "the seeded request perf_analyzer sends")
    none, why = tuner.in_process_requests(model, _requests(tmp_path, rows, name="ids"))
    assert none is None and why.startswith("the seeded request, not yours: your requests could not be read as the "
                                           "model's inputs") and "input 'text' is missing" in why
    many, said = tuner.in_process_requests(model, _requests(tmp_path, rows * 30))
    assert len(many) == requests.IN_PROCESS_LIMIT and said.startswith(f"the first {requests.IN_PROCESS_LIMIT} of your")


def test_the_tune_parses_its_input_data_once_and_again_only_when_it_changes(tmp_path, monkeypatch):
    """The shapes the requests send, their padding and the in-process requests are read from one parse (a file of
    many images was parsed three times); a file rewritten since is read again."""
    model = tuned_model.TunedModel.load(_folder(tmp_path))
    parsed = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: parsed.append(len(text)) or loads(text, *a, **k))
    path = _requests(tmp_path, [_padded(9), _padded(17)])
    model = model.with_requests(requests.read(path))
    assert tuner.trims(model, path) and tuner.in_process_requests(model, path)[0] is not None
    assert len(parsed) == 1
    path = _requests(tmp_path, [_padded(9), _padded(17), _padded(30)])
    sent, _ = tuner.in_process_requests(model, path)
    assert len(sent) == 3 and len(parsed) == 2
    assert requests.padding(path, "text") == (30, 52) and len(parsed) == 2
    none, why = tuner.in_process_requests(model, tmp_path / "absent.json")
    assert none is None and why.startswith("the seeded request, not yours: your requests could not be read: "
                                           f"--input-data {tmp_path / 'absent.json'}: cannot read it")


def test_the_accuracy_guard_times_and_the_ceiling_runs_the_users_requests_cut_as_served(tmp_path, monkeypatch):
    """Timed on the seeded full-length request, a rung's order and the winner's ceiling were those of requests
    nobody serves where the user's are cut: the guard's instance cuts padding as every candidate does, and both
    send the user's requests in turn."""
    from gebackend.bench import inprocess, perf_analyzer
    from gebackend.bench.perf_analyzer import PerfRow
    from gebackend.tune import measure

    monkeypatch.setattr(perf_analyzer, "find_perf_analyzer", lambda: Path("/nonexistent/perf_analyzer"))
    model = tuned_model.TunedModel.load(_folder(tmp_path))
    rows = [_padded(9), _padded(17)]
    sent, _ = tuner.in_process_requests(model, _requests(tmp_path, rows))
    timed, measured = [], []
    run_once = inprocess.Ceiling.run_once
    monkeypatch.setattr(inprocess.Ceiling, "run_once",
                        lambda self, feeds: timed.append(feeds["text"][0].tolist()) or run_once(self, feeds))
    monkeypatch.setattr(inprocess.Ceiling, "measure",
                        lambda self, reqs, *a, **k: measured.append(reqs) or PerfRow(4, 50.0, 1.0, 1.0, 1.0, 1.0, 1.0))
    measurer = measure.BenchMeasurer(model, tmp_path / "out", 4, requests=sent, trim=True)
    check = measurer.accuracy("onnxruntime", space.PRECISIONS[0])
    assert check.cosine > 0.9999 and check.run_ms > 0
    assert timed[:4] == rows + rows  # in turn, from the first
    guard = load_model_config(next((tmp_path / "out" / "repos").glob("accuracy-*/text/config.pbtxt")))
    assert guard["parameters"]["trim_padding"]["string_value"] == "text"  # as every candidate
    cand = space.make_candidate("onnxruntime", space.PRECISIONS[0], False, (1, 0), 0, 8, 2, trim=True)
    assert measurer.ceiling(cand) == 50.0
    assert [r["text"][0].tolist() for r in measured[0]] == rows
    seeded = measure.BenchMeasurer(model, tmp_path / "out2", 4)
    assert len(seeded.requests) == 1 and seeded.requests[0]["text"].shape == (1, 52) and not seeded.trim
    measurer.in_process_times()


def test_static_int8_calibrates_on_the_users_requests_and_the_guard_compares_on_them(tmp_path, monkeypatch):
    """With --input-data the static int8 rungs calibrate on the requests they are measured with (calibration_data in
    every such candidate's config, the winner's too), and the accuracy guard compares with fp32 on those requests."""
    from gebackend.bench import inprocess, perf_analyzer
    from gebackend.tune import measure

    model = tuned_model.TunedModel.load(_folder(tmp_path))
    path = _requests(tmp_path, [_padded(9), _padded(17), _padded(12)])
    sent, _ = tuner.in_process_requests(model, path)
    calibrated = tuner.calibrated_on_requests(model, sent, path)
    assert calibrated.calibration == str(path)
    assert tuner.calibrated_on_requests(model, None, path) is model  # unreadable as inputs: seeded samples
    own = tuned_model.TunedModel.load(_folder(tmp_path / "own", CONFIG + 'parameters { key: "calibration_data" value: '
                                                               '{ string_value: "calib" } }\n'))
    assert tuner.calibrated_on_requests(own, sent, path) is own  # the user's own calibration data is kept
    by_rung = {c.rung.name: c for c in space.space(2, ("onnxruntime",), (), 8, 4, trim=True)}
    written = tmp_path / "static.pbtxt"
    written.write_text(config_writer.config_text(calibrated, by_rung["int8-static"]))
    assert load_model_config(written)["parameters"]["calibration_data"]["string_value"] == str(path)
    assert "# calibration_data=" + str(path) + ": static int8 calibrated on your requests" in written.read_text()
    for rung in ("origin", "int8"):  # nothing to calibrate
        assert "calibration_data" not in config_writer.config_text(calibrated, by_rung[rung])

    monkeypatch.setattr(perf_analyzer, "find_perf_analyzer", lambda: Path("/nonexistent/perf_analyzer"))
    compared = []
    accuracy_on = inprocess.accuracy_on
    monkeypatch.setattr(inprocess, "accuracy_on", lambda ceiling, onnx_path, requests: compared.append(
        [r["text"][0].tolist() for r in requests]) or accuracy_on(ceiling, onnx_path, requests))
    measurer = measure.BenchMeasurer(calibrated, tmp_path / "out", 4, requests=sent, trim=True, min_cosine=0.99)
    check = measurer.accuracy("onnxruntime", by_rung["int8-static"].rung)
    # the user's 3 requests and a seeded random one beside them (fewer than 4 are a thin check)
    assert compared[0][:3] == [_padded(9), _padded(17), _padded(12)] and len(compared) == 1 and check.cosine > 0.99
    assert len(compared[0]) == 4 and len(compared[0][3]) == 52 and 0 not in compared[0][3][1:]  # seeded: no padding
    guard = load_model_config(next((tmp_path / "out" / "repos").glob("accuracy-*int8-static*/text/config.pbtxt")))
    assert guard["parameters"]["calibration_data"]["string_value"] == str(path)
    measurer.in_process_times()
    seeded = measure.BenchMeasurer(model, tmp_path / "out2", 4)
    seeded.accuracy("onnxruntime", by_rung["origin"].rung)
    seeded.in_process_times()
    assert len(compared) == 2 and len(compared[1]) == 4  # without the user's requests: 4 seeded random ones
    assert not any(row in compared[0][:3] for row in compared[1])
