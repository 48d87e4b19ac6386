"""The pure parts of `gebackend bench`: perf_analyzer CSV parsing, summary ratios, scenario configs.

Nothing here runs perf_analyzer, a server or a timing measurement.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gebackend.bench import perf_analyzer, report, scenarios
from gebackend.modelzoo.bench_models import models
from gebackend.config.onnx_signature import read_signature
from gebackend.config.pbtxt import load_model_config

# What perf_analyzer 2.41 writes with -f (microseconds), one level per run.
CSV_C1 = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait
1,1558.1,12,180,21,45,300,15,4,560,780,900,1990,640,0,0
"""
CSV_C4 = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait
4,3224.7,14,400,280,50,400,20,5,1020,1720,2500,6240,1200,0,0
"""


def test_parse_csv_reads_throughput_and_percentiles_in_microseconds():
    (row,) = perf_analyzer.parse_csv(CSV_C1)
    assert row.concurrency == 1
    assert row.throughput == pytest.approx(1558.1)
    assert (row.p50_us, row.p90_us, row.p95_us, row.p99_us, row.avg_us) == (560, 780, 900, 1990, 640)
    assert row.server_queue_us == 21 and row.server_compute_infer_us == 300
    assert row.extra["request/response"] == "0"


def test_parse_csv_ignores_metrics_tables_and_sorts_by_concurrency():
    text = CSV_C4 + "\nServer Metrics\nsomething,else\n1,2\n"
    merged = perf_analyzer.merge_csv([text, CSV_C1])
    assert merged.count("Concurrency,") == 1
    rows = perf_analyzer.parse_csv(merged)
    assert [r.concurrency for r in rows] == [1, 4]
    assert perf_analyzer.parse_csv("") == []


def test_command_line_has_the_model_url_and_levels(tmp_path):
    settings = perf_analyzer.PerfSettings(measurement_interval_ms=1500, stability_percentage=25, max_trials=5)
    cmd = perf_analyzer.command(Path("/x/perf_analyzer"), "m", "localhost:9", 4, tmp_path / "o.csv", settings,
                                shapes={"ids": (16,)}, input_data=tmp_path / "in.json")
    text = " ".join(cmd)
    for part in ("-m m", "-u localhost:9", "-i grpc", "--concurrency-range 4:4:1", "--measurement-interval 1500",
                 "-s 25", "-r 5", "--shape ids:16", f"--input-data {tmp_path / 'in.json'}"):
        assert part in text


def test_input_data_json_drops_the_batch_dim(tmp_path):
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(1, 2, 4)}
    data = json.loads(perf_analyzer.write_input_data(tmp_path / "in.json", feeds).read_text())
    assert data["data"][0]["x"]["shape"] == [2, 4]
    assert data["data"][0]["x"]["content"] == list(range(8))


def test_environment_puts_tools_lib_first(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    binary = tmp_path / "bin" / "perf_analyzer"
    binary.write_text("")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/other")
    assert perf_analyzer.environment(binary)["LD_LIBRARY_PATH"] == f"{tmp_path / 'lib'}:/other"


def _row(c, thr, p50=1000.0, p99=2000.0):
    return {"concurrency": c, "throughput": thr, "p50_us": p50, "p90_us": p50, "p95_us": p99, "p99_us": p99, "avg_us": p50}


def _model():
    return {"name": "m", "description": "d", "scenarios": [
        {"name": "naive", "title": "n", "status": "ok", "rows": [_row(1, 100), _row(4, 200)], "ceiling": []},
        {"name": "ge_static", "title": "s", "status": "ok", "rows": [_row(1, 150, 800), _row(4, 500)],
         "ceiling": [_row(1, 160, 500), _row(4, 520)], "accuracy": {"cosine": 0.9999, "max_abs_diff": 1e-3}},
        {"name": "ge_bf16", "title": "b", "status": "not available", "reason": "no engine", "rows": [], "ceiling": []},
    ]}


def test_summary_ratios_to_naive_and_ceiling():
    lines = {line["scenario"]: line for line in report.summarize(_model(), wanted=4)}
    assert lines["naive"]["x_naive"] == pytest.approx(1.0)
    static = lines["ge_static"]
    assert static["concurrency"] == 4
    assert static["x_naive"] == pytest.approx(2.5)
    assert static["of_ceiling"] == pytest.approx(500 / 520)
    assert static["saturation"] == {"concurrency": 4, "ratio": pytest.approx(500 / 520)}
    assert static["p50_ms"] == pytest.approx(1.0) and static["cosine"] == 0.9999
    assert lines["ge_bf16"]["throughput"] is None and lines["ge_bf16"]["status"] == "not available"
    assert report.bs1_delta_ms(_model()["scenarios"][1]) == pytest.approx(0.3)


def test_summary_falls_back_to_the_largest_level_and_markdown_says_why_a_row_is_missing():
    lines = report.summarize(_model(), wanted=16)
    assert lines[0]["concurrency"] == 4
    text = report.markdown({"meta": {}, "models": [_model()]}, wanted=4)
    assert "| ge_static (s) | 500.0 | 1.00 | 2.00 | 2.50x | 520.0 | 96% | +0.30 | 0.999900 |" in text
    assert "**not available**: no engine" in text


def test_plots_are_written(tmp_path):
    paths = report.plot({"models": [_model()]}, tmp_path)
    assert sorted(p.name for p in paths) == ["latency_m.png", "throughput_m.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.fixture(scope="module")
def bert_small(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    model = models(cache)["bert_small"]
    return model, model.ensure(cache, log=lambda m: None)


def test_bucket_parameters_cover_every_input(bert_small):
    model, _ = bert_small
    params = scenarios.bucket_parameters(model, (1, 4))
    assert params == {"graph.ge.inputShape": "input_ids:-1,16;attention_mask:-1,16", "graph.ge.dynamicDims": "1,1;4,4"}


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_every_scenario_writes_a_config_triton_can_parse(bert_small, tmp_path, name):
    model, path = bert_small
    scenario = scenarios.SCENARIOS[name]
    repo = scenarios.write_repository(tmp_path, model, scenario, path)
    config = load_model_config(repo / model.name / "config.pbtxt")
    assert config["name"] == model.name and config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["input_ids", "attention_mask"]
    assert [o["name"] for o in config["output"]] == [o.name for o in read_signature(path).outputs]
    assert (repo / model.name / "1" / "model.onnx").resolve() == path.resolve()
    params = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
    if scenario.backend == "python":
        assert config["backend"] == "python" and "dynamic_batching" not in config and not params
        assert (repo / model.name / "1" / "model.py").read_text().startswith('"""The naive baseline')
        return
    assert config["backend"] == "ge"
    assert config["instance_group"][0]["count"] == scenario.instances
    assert int(config["dynamic_batching"].get("max_queue_delay_microseconds", 0)) == scenario.max_queue_delay_us
    assert [int(b) for b in config["dynamic_batching"].get("preferred_batch_size", [])] == list(scenario.preferred_batch_sizes)
    assert (params.get("static_model") == "1") == scenario.static
    assert params.get("engine", "onnxruntime") == scenario.engine
    assert params.get("precision_mode", "origin") == scenario.precision
    assert params.get("trim_padding") == ("input_ids" if scenario.trim_padding else None)  # the first token-id input


def test_generated_ge_config_loads_as_the_backend_reads_it(bert_small, tmp_path):
    from gebackend.bench.inprocess import Ceiling

    model, path = bert_small
    repo = scenarios.write_repository(tmp_path, model, scenarios.SCENARIOS["ge_batching"], path)
    ceiling = Ceiling(repo / model.name, log=lambda m: None)  # loads as the backend loads
    spec = ceiling.spec
    ceiling.close()
    assert spec.static and spec.batching and spec.max_batch_size == 8
    assert sorted(s["input_ids"][0] for s in spec.static_shapes) == [1, 2, 4, 8]


def test_preferred_batch_sizes_are_buckets():
    for scenario in scenarios.SCENARIOS.values():
        if scenario.buckets:
            assert set(scenario.preferred_batch_sizes) <= set(scenario.buckets)


def test_missing_pinning_falls_back_to_unpinned_instances(monkeypatch):
    monkeypatch.setattr(scenarios, "feature_missing", lambda f: "absent" if f == "pinning" else None)
    scenario, missing = scenarios.availability(scenarios.SCENARIOS["ge_pinned"])
    assert missing is None and scenario.instances == 2 and scenario.cores_per_instance == 0
    assert "NOT pinned" in scenario.title and "absent" in scenario.notes


def test_missing_engine_makes_the_scenario_not_available(monkeypatch):
    monkeypatch.setattr(scenarios, "feature_missing", lambda f: "no OpenVINO engine" if f == "openvino" else None)
    _, missing = scenarios.availability(scenarios.SCENARIOS["ge_bf16"])
    assert missing == "not available: no OpenVINO engine"
    _, missing = scenarios.availability(replace(scenarios.SCENARIOS["ge_int8"]))
    assert missing is None


def test_trim_padding_scenarios_need_a_token_id_input():
    for name in ("ge_trim", "ge_trim_pinned", "ge_int8_trim"):
        _, missing = scenarios.availability(scenarios.SCENARIOS[name], model=models()["resnet_small"])
        assert missing == "not available: trim_padding cuts token ids, and resnet_small has no integer input"
        assert scenarios.availability(scenarios.SCENARIOS[name], model=models()["cnclip_text_l4"])[1] is None


@pytest.mark.parametrize("texts", ["random", "captions"])
def test_text_encoder_requests_are_random_ids_or_padded_chinese_captions(tmp_path, texts):
    from gebackend.bench.ensemble import CAPTIONS
    from gebackend.bench.runner import Bench, BenchSettings

    bench = Bench(BenchSettings(out=tmp_path, texts=texts, cache=Path(__file__).resolve().parents[2] / "bench" / "models"))
    bench.dir.mkdir(parents=True)
    requests, input_data = bench._inputs(models()["cnclip_text_l4"])
    entries = json.loads(input_data.read_text())["data"]
    ids = np.array([e["text"]["content"] for e in entries])
    assert all(feeds["text"].shape == (1, 52) for feeds in requests) and ids.shape[1] == 52
    # the in-process ceiling sends what perf_analyzer sends: every entry, in the same order
    np.testing.assert_array_equal(np.concatenate([feeds["text"] for feeds in requests]), ids)
    if texts == "random":
        assert len(entries) == 1 and (ids > 0).all()  # every position a token: nothing to trim
        return
    assert len(entries) == len(CAPTIONS) and (ids[:, 0] == 101).all()  # [CLS], then the caption, then [PAD] = 0
    lengths = (ids != 0).sum(axis=1)
    assert 10 < lengths.min() and lengths.max() < 30 and (ids[:, 30:] == 0).all()
    _, bare = bench._inputs(models()["resnet_small"])  # not a text encoder: its random inputs as before
    assert len(json.loads(bare.read_text())["data"]) == 1


def test_sample_inputs_are_valid_token_ids():
    model = models()["cnclip_text"]
    feeds = model.sample_inputs(3)
    assert feeds["text"].shape == (3, 52) and feeds["text"].dtype == np.int64
    assert feeds["text"].min() >= 1 and feeds["text"].max() < 21128


def test_ceiling_cpu_plan_splits_cores_like_pinned_instances(monkeypatch):
    from gebackend.bench import inprocess

    monkeypatch.setattr(inprocess.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert inprocess.plan_cpus(1) == [None]
    assert inprocess.plan_cpus(2) == [frozenset({0, 1}), frozenset({2, 3})]
    assert inprocess.plan_cpus(2, cores_per_instance=1) == [frozenset({0}), frozenset({1})]
    assert inprocess.plan_cpus(3, cores_per_instance=2) == [frozenset({0, 1}), frozenset({2, 3}), frozenset({0, 1})]


def test_clients_are_split_over_instance_processes():
    from gebackend.bench.inprocess import split_clients

    assert split_clients(4, 2) == [2, 2]
    assert split_clients(1, 2) == [1, 0]
    assert split_clients(5, 3) == [2, 2, 1]


def test_a_two_instance_ceiling_runs_one_pinned_process_per_instance(tmp_path):
    """Both processes answer (the rate is theirs together) and the outputs are the model's."""
    from gebackend.bench.inprocess import Ceiling

    tiny = models(tmp_path)["tiny"]
    scenario = replace(scenarios.SCENARIOS["ge_dyn_pinned"], cores_per_instance=0, intra_op_threads=1)
    repo = scenarios.write_repository(tmp_path / "repo", tiny, scenario, tiny.ensure(tmp_path, lambda m: None))
    ceiling = Ceiling(repo / "tiny", log=lambda m: None)
    try:
        assert ceiling.instances == 2 and len(ceiling.instances_here) == 1
        feeds = tiny.sample_inputs(1)
        np.testing.assert_allclose(ceiling.run_once(feeds)["sum"], feeds["x"] + feeds["y"])
        row = ceiling.measure([feeds], concurrency=2, seconds=1.0, warmup=0.3)
        one = ceiling.measure([feeds], concurrency=1, seconds=1.0, warmup=0.3)
    finally:
        ceiling.close()
    assert row.concurrency == 2 and row.throughput > 100 and row.p50_us > 0
    assert one.throughput > 100
    assert ceiling.last_latencies_us.size == one.throughput * 1.0


def test_the_ceiling_sends_the_requests_in_turn_as_perf_analyzer_does(tmp_path):
    """With several requests (captions of several lengths) each client takes the next one, so the ceiling runs the
    mix that is served, not the first request again and again."""
    from gebackend.bench.inprocess import Ceiling, RoundRobin

    turns = RoundRobin(["a", "b", "c"], start=4)
    assert [turns.take() for _ in range(5)] == ["b", "c", "a", "b", "c"]
    with pytest.raises(ValueError):
        RoundRobin([])
    tiny = models(tmp_path)["tiny"]
    path = tiny.ensure(tmp_path, lambda m: None)
    repo = scenarios.write_repository(tmp_path / "repo", tiny, scenarios.SCENARIOS["ge_dynamic"], path)
    ceiling = Ceiling(repo / "tiny", log=lambda m: None)
    sent = []
    execute = ceiling.instances_here[0].execute

    def recording(batch):
        sent.extend(float(request["x"].ravel()[0]) for request in batch)
        return execute(batch)

    ceiling.instances_here[0].execute = recording
    requests = [{k: np.full_like(v, n) for k, v in tiny.sample_inputs(1).items()} for n in (1.0, 2.0, 3.0)]
    try:
        ceiling.measure(requests, concurrency=1, seconds=0.3, warmup=0.1)
    finally:
        ceiling.close()
    assert len(sent) > 6
    assert sent[:6] == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    assert set(sent) == {1.0, 2.0, 3.0}


def test_serving_a_scenario_marks_what_failed_and_stops_the_server(tmp_path, monkeypatch):
    import time

    from gebackend.bench import runner, server

    class Fake:
        def __init__(self, failures):
            self.started, self._failures, self.stopped = time.monotonic() - 2.0, failures, False

        def failures(self):
            return self._failures

        def stop(self):
            self.stopped = True

    bench = runner.Bench(runner.BenchSettings(out=tmp_path), log=lambda m: None)
    served = []

    def start(repo, log_path, timeout=600, extra_backends=None):
        served.append(Fake(next(failures)))
        return served[-1]

    monkeypatch.setattr(server, "start", start)
    failures = iter([{}, {"other": "x"}, {"m": "bad file"}, {"e": "boom", "pre": "no vocab", "other": "x"}])
    ok = {}
    assert bench.serve(tmp_path, "t", ok, ["m"]) is served[0] and not served[0].stopped
    assert ok["startup_s"] >= 2.0 and "status" not in ok
    assert bench.serve(tmp_path, "t", {}, ["m"]) is served[1]  # another model failing is not this scenario's
    one, many = {}, {}
    assert bench.serve(tmp_path, "t", one, ["m"]) is None and served[2].stopped
    assert (one["status"], one["reason"]) == ("failed", "model failed to load: bad file")
    assert bench.serve(tmp_path, "t", many, ["e", "pre", "enc"]) is None and served[3].stopped
    assert many["reason"] == "model e failed to load: boom; model pre failed to load: no vocab"

    def refuses(*args, **kwargs):
        raise server.ServeError("gebackend serve exited with 1:\nthe tail")

    monkeypatch.setattr(server, "start", refuses)
    broken = {}
    assert bench.serve(tmp_path, "t", broken, ["m"]) is None
    assert (broken["status"], broken["reason"]) == ("failed", "gebackend serve exited with 1: (see logs)")


def test_median_seconds_calls_at_least_the_least_and_gives_the_median_of_the_calls():
    from gebackend.bench.inprocess import median_seconds

    calls = []
    sleeps = iter([0.0, 0.02, 0.0, 0.0, 0.0])
    assert median_seconds(lambda: calls.append(time.sleep(next(sleeps))), seconds=0.0) < 0.015  # 0, 0.02, 0: median 0
    assert len(calls) == 3
