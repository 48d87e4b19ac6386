"""The pure parts of `gebackend bench`'s ensemble scenarios: perf_analyzer's input-data JSON for BYTES tensors,
Triton's statistics arithmetic, medians over rounds, the generated ensemble repository and the report.

Nothing here starts a server, perf_analyzer or a timing measurement.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from gebackend.bench import ensemble, ensemble_runner, perf_analyzer, report, scenarios, triton_stats
from gebackend.modelzoo.bench_models import models
from gebackend.config.pbtxt import load_model_config

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench" / "models"  # where the cn_clip wheel is (as in test_cnclip_preprocess.py)
EXAMPLE = ROOT / "examples" / "cnclip_repository"


# ------------------------------------------------------------------------------------ input data
def test_text_goes_as_json_strings_and_bytes_as_b64_with_tritons_length_prefix():
    assert perf_analyzer.tensor_json("一只猫") == {"content": ["一只猫"], "shape": [1]}
    assert perf_analyzer.tensor_json(["a", "乙"]) == {"content": ["a", "乙"], "shape": [2]}
    jpeg = b"\xff\xd8\xff\xe0 some jpeg"
    entry = perf_analyzer.tensor_json(jpeg)
    assert entry["shape"] == [1]
    raw = base64.b64decode(entry["content"]["b64"])
    assert raw[:4] == struct.pack("<I", len(jpeg)) and raw[4:] == jpeg
    two = base64.b64decode(perf_analyzer.tensor_json([b"ab", b"cde"])["content"]["b64"])
    assert two == b"\x02\x00\x00\x00ab\x03\x00\x00\x00cde"
    with pytest.raises(TypeError, match="str or bytes"):
        perf_analyzer.tensor_json(np.array([b"x"], dtype=object))


def test_numeric_tensors_are_lists_when_small_and_little_endian_b64_when_large():
    small = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert perf_analyzer.tensor_json(small) == {"content": [0, 1, 2, 3, 4, 5], "shape": [2, 3]}
    big = np.random.default_rng(0).standard_normal((3, 224, 224)).astype(np.float32)
    entry = perf_analyzer.tensor_json(big)
    assert entry["shape"] == [3, 224, 224]
    back = np.frombuffer(base64.b64decode(entry["content"]["b64"]), dtype="<f4").reshape(3, 224, 224)
    np.testing.assert_array_equal(back, big)
    swapped = big.astype(">f4")  # a big-endian array is sent little-endian all the same
    assert perf_analyzer.tensor_json(swapped)["content"]["b64"] == entry["content"]["b64"]


def test_bfloat16_tensors_go_as_b64_of_their_16_bit_patterns_however_small():
    import ml_dtypes

    x = np.array([[1.5, -2.0, 0.1]], dtype=ml_dtypes.bfloat16)  # perf_analyzer refuses bf16 as JSON numbers
    entry = perf_analyzer.tensor_json(x)
    assert entry["shape"] == [1, 3]
    back = np.frombuffer(base64.b64decode(entry["content"]["b64"]), dtype="<u2").view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(back.reshape(1, 3), x)


def test_input_entries_are_utf8_json_one_entry_per_request(tmp_path):
    path = perf_analyzer.write_input_entries(tmp_path / "in.json", [{"text": "北京"}, {"text": "上海"}])
    raw = path.read_bytes()
    assert "北京".encode() in raw  # readable, not \\u escapes
    assert json.loads(raw) == {"data": [{"text": {"content": ["北京"], "shape": [1]}},
                                        {"text": {"content": ["上海"], "shape": [1]}}]}


# ----------------------------------------------------------------------------------------- stats
def _stats(name, requests, success, queue, cin, cinfer, cout, executions, batches):
    """A /v2/models/<m>/stats answer (ns), `batches`: {batch size: (executions, compute ns per execution)}."""
    phase = lambda count, ns: {"count": count, "ns": ns}  # noqa: E731
    return {"model_stats": [{
        "name": name, "version": "1", "inference_count": requests, "execution_count": executions,
        "inference_stats": {"success": phase(requests, success), "fail": phase(0, 0), "queue": phase(requests, queue),
                            "compute_input": phase(requests, cin), "compute_infer": phase(requests, cinfer),
                            "compute_output": phase(requests, cout)},
        "batch_stats": [{"batch_size": bs, "compute_input": phase(n, 0), "compute_infer": phase(n, n * ns),
                         "compute_output": phase(n, 0)} for bs, (n, ns) in batches.items()],
    }]}


def test_counters_sum_phases_and_busy_time_from_batch_stats():
    c = triton_stats.counters(_stats("m", 10, 9_000, 1_000, 100, 5_000, 200, 6, {1: (2, 700), 2: (4, 1_000)}))
    assert c["requests"] == 10 and c["executions"] == 6 and c["queue_ns"] == 1_000
    assert c["compute_infer_ns"] == 5_000 and c["busy_ns"] == 2 * 700 + 4 * 1_000
    assert triton_stats.counters({"model_stats": []})["requests"] == 0


def test_breakdown_gives_per_request_means_and_latency_and_work_shares():
    before = {m: triton_stats.counters(_stats(m, 0, 0, 0, 0, 0, 0, 0, {})) for m in ("e", "pre", "enc", "norm")}
    after = {
        # 100 requests; per request: ensemble 20 ms in the server
        "e": triton_stats.counters(_stats("e", 100, 2_000_000_000, 0, 0, 0, 0, 100, {})),
        # preprocess: 1 ms queue + 4 ms compute per request, in batches of 2: 50 executions of 4 ms
        "pre": triton_stats.counters(_stats("pre", 100, 500_000_000, 100_000_000, 0, 400_000_000, 0, 50,
                                            {2: (50, 4_000_000)})),
        # encoder: 14 ms compute per request, one at a time
        "enc": triton_stats.counters(_stats("enc", 100, 1_400_000_000, 0, 0, 1_400_000_000, 0, 100, {1: (100, 14_000_000)})),
        "norm": triton_stats.counters(_stats("norm", 100, 100_000_000, 0, 0, 100_000_000, 0, 100, {1: (100, 1_000_000)})),
    }
    b = triton_stats.breakdown(triton_stats.delta(before, after), "e", ["pre", "enc", "norm"])
    assert b["ensemble"]["success_us"] == pytest.approx(20_000)
    pre = b["steps"]["pre"]
    assert (pre["queue_us"], pre["compute_us"], pre["time_us"]) == (pytest.approx(1_000), pytest.approx(4_000), pytest.approx(5_000))
    assert pre["avg_batch"] == pytest.approx(2.0) and pre["busy_ms"] == pytest.approx(200)
    assert pre["latency_share"] == pytest.approx(5 / 20)
    assert pre["work_share"] == pytest.approx(200 / (200 + 1400 + 100))
    assert b["steps"]["enc"]["latency_share"] == pytest.approx(14 / 20)
    empty = triton_stats.breakdown({}, "e", ["pre"])
    assert empty["steps"]["pre"]["latency_share"] is None and empty["steps"]["pre"]["work_share"] is None


def test_delta_counts_only_what_happened_between_snapshots():
    before = {"m": {"requests": 5, "busy_ns": 100}}
    after = {"m": {"requests": 8, "busy_ns": 160}, "n": {"requests": 2, "busy_ns": 10}}
    assert triton_stats.delta(before, after) == {"m": {"requests": 3, "busy_ns": 60}, "n": {"requests": 2, "busy_ns": 10}}


# ----------------------------------------------------------------------------------- rounds
def _row(c, thr, p50):
    return {"concurrency": c, "throughput": thr, "p50_us": p50, "p99_us": 2 * p50, "extra": {"x": "1"}}


def test_medians_over_rounds_figure_by_figure():
    m = ensemble_runner.median_rows([_row(4, 10, 300), _row(4, 30, 100), _row(4, 20, 900), None])
    assert m == {"concurrency": 4, "throughput": 20.0, "p50_us": 300.0, "p99_us": 600.0, "rounds": 3}
    assert ensemble_runner.median_rows([None]) is None
    tree = ensemble_runner.median_tree([{"a": {"b": 1, "c": None}}, {"a": {"b": 3, "c": 2.0}}, {"a": {"b": 2}}])
    assert tree == {"a": {"b": 2.0, "c": 2.0}}
    assert ensemble_runner.ratio({"throughput": 19}, {"throughput": 20}) == pytest.approx(0.95)
    assert ensemble_runner.ratio({"throughput": 19}, None) is None


def test_paired_ratio_pairs_the_runs_of_each_round():
    runs = lambda target, values: [{"round": r + 1, "target": target, "row": None if v is None else _row(4, v, 1)}  # noqa: E731
                                   for r, v in enumerate(values)]
    # round 2 ran while another job loaded the machine: both of its runs are slow, its ratio is not
    assert ensemble_runner.paired_ratio(runs("bare", [100, 50, 110]), runs("ensemble", [96, 49, 99])) == pytest.approx(0.96)
    assert ensemble_runner.paired_ratio(runs("bare", [100, None]), runs("ensemble", [90, 80])) == pytest.approx(0.9)
    assert ensemble_runner.paired_ratio([], runs("ensemble", [1])) is None


def test_rounds_alternate_which_target_goes_first():
    firsts = [ensemble_runner.order(r, i)[0] for r in range(2) for i in range(2)]
    assert firsts == ["bare", "ensemble", "ensemble", "bare"]


def test_aggregate_fills_rows_ratios_and_stats_medians():
    runs = []
    for r, (bare, ens) in enumerate([(100, 95), (50, 48), (60, 40)]):
        runs.append({"round": r + 1, "target": "bare", "concurrency": 4, "row": _row(4, bare, 1000), "unstable": False,
                     "stats": {"compute_us": 10.0 + r}})
        runs.append({"round": r + 1, "target": "ensemble", "concurrency": 4, "row": _row(4, ens, 1100), "unstable": r == 0,
                     "stats": {"steps": {"pre": {"latency_share": 0.1 * (r + 1)}}}})
    info, result = {"runs": runs, "stats": {}, "of_bare": {}}, {"rows": [], "bare_rows": [], "notes": ""}
    ensemble_runner._aggregate(info, result, [4])
    assert result["rows"][0]["throughput"] == 48 and result["bare_rows"][0]["throughput"] == 60
    assert info["of_bare"]["4"] == pytest.approx(0.8)  # the ratio of the medians
    assert info["of_bare_paired"]["4"] == pytest.approx(0.95)  # the median of 0.95, 0.96 and 0.667
    assert info["stats"]["4"]["bare"] == {"compute_us": 11.0}
    assert info["stats"]["4"]["ensemble"]["steps"]["pre"]["latency_share"] == pytest.approx(0.2)
    assert "1 run(s) measured only with perf_analyzer's loose retry" in result["notes"]


# -------------------------------------------------------------------------------- scenarios, repository
def test_any_ge_scenario_can_be_the_encoder_of_an_ensemble():
    (s,) = scenarios.select(["ge_bf16+ensemble"])
    assert s.ensemble and s.name == "ge_bf16+ensemble" and s.engine == "openvino" and s.instances == 2
    assert not scenarios.select(["ge_bf16"])[0].ensemble
    with pytest.raises(ValueError, match="only ge scenarios"):
        scenarios.select(["naive+ensemble"])
    with pytest.raises(ValueError, match="unknown scenario"):
        scenarios.select(["nope+ensemble"])


def test_only_cnclip_models_have_an_ensemble():
    known = models()
    assert {n: m.ensemble for n, m in known.items() if m.ensemble} == {
        "cnclip_image": "image", "cnclip_text": "text", "cnclip_image_l4": "image", "cnclip_text_l4": "text",
        "cnclip_image_standin": "image", "cnclip_text_standin": "text"}
    with pytest.raises(ValueError, match="not a CN_CLIP encoder"):
        ensemble.pipeline(known["resnet50"])


@pytest.mark.parametrize("kind", ["image", "text"])
def test_generated_configs_are_the_example_repositorys(kind):
    p = ensemble.PIPELINES[kind]
    for name, text in ensemble.configs(p).items():
        assert load_model_config_text(name, text) == load_model_config(EXAMPLE / name / "config.pbtxt"), name


def load_model_config_text(name: str, text: str) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name / "config.pbtxt"  # the name comes from the folder
        path.parent.mkdir()
        path.write_text(text)
        return load_model_config(path)


@pytest.mark.parametrize("kind", ["image", "text"])
def test_write_repository_serves_the_encoder_as_the_scenario(tmp_path, kind):
    model = models(tmp_path)[f"cnclip_{kind}_standin"]
    path = model.ensure(tmp_path, log=lambda m: None)
    scenario = scenarios.select(["ge_dyn_pinned+ensemble"])[0]
    root = ensemble.write_repository(tmp_path / "repo", model, scenario, path, CACHE)
    p = ensemble.PIPELINES[kind]
    assert sorted(d.name for d in root.iterdir()) == sorted(p.models)
    encoder = load_model_config(root / p.encoder / "config.pbtxt")
    assert encoder["name"] == p.encoder and encoder["instance_group"][0]["count"] == 2
    assert encoder["parameters"]["cores_per_instance"]["string_value"] == "1"
    served = root / p.encoder / "1" / "model.onnx"  # its own file, with the normalised output; the cache's unchanged
    assert [o.name for o in onnx.load(str(served)).graph.output] == [p.encoder_output, p.features]
    assert [o.name for o in onnx.load(str(path)).graph.output] == [p.encoder_output]
    assert [o["name"] for o in encoder["output"]] == [p.encoder_output, p.features]
    assert (root / p.preprocess / "1" / "vocab.txt").is_file() == (kind == "text")
    ens = load_model_config(root / p.ensemble / "config.pbtxt")
    assert [s["model_name"] for s in ens["ensemble_scheduling"]["step"]] == list(p.steps)


def test_image_inputs_are_real_jpegs_and_the_bare_encoder_gets_their_pixels(tmp_path):
    from gebackend.preprocess.image import preprocess

    data = ensemble.inputs(ensemble.PIPELINES["image"], CACHE, count=3)
    assert len(data.ensemble) == len(data.bare) == 3
    for request, bare in zip(data.ensemble, data.bare):
        jpeg = request["image"]
        image = Image.open(__import__("io").BytesIO(jpeg))
        assert image.format == "JPEG" and image.size == ensemble.IMAGE_SIZE and len(jpeg) > 50_000
        np.testing.assert_array_equal(bare["image"], preprocess(jpeg))
    assert data.ensemble[0]["image"] != data.ensemble[1]["image"]
    assert "640x480 JPEGs" in data.description


def test_text_inputs_are_chinese_captions_and_the_bare_encoder_gets_their_ids(tmp_path):
    from gebackend.modelzoo.cnclip_wheel import copy_vocab
    from gebackend.preprocess.text import CnClipTokenizer

    vocab = copy_vocab(tmp_path / "vocab.txt", CACHE)
    data = ensemble.inputs(ensemble.PIPELINES["text"], CACHE, vocab, count=4)
    texts = [r["text"] for r in data.ensemble]
    assert texts == list(ensemble.CAPTIONS[:4]) and all(isinstance(t, str) for t in texts)
    ids = np.stack([b["text"] for b in data.bare])
    np.testing.assert_array_equal(ids, CnClipTokenizer(vocab).encode(texts))
    assert ids.dtype == np.int64 and (ids[:, 0] == 101).all()  # [CLS]


# ---------------------------------------------------------------------------------------- report
def test_the_report_puts_the_ensemble_next_to_the_bare_encoder():
    steps = {"cnclip_image_preprocess": {"time_us": 12_000.0, "latency_share": 0.1, "work_share": 0.15, "avg_batch": 1.5},
             "cnclip_image_encoder": {"compute_us": 95_000.0}}
    result = {"name": "ge_bf16+ensemble", "status": "ok", "rows": [_row(4, 19.0, 200_000)],
              "bare_rows": [_row(4, 20.0, 190_000)],
              "ensemble": {"rounds": 3, "inputs": "4 JPEGs", "steps": list(steps),
                           "encoder_model": "cnclip_image_encoder", "of_bare_paired": {"4": 0.97},
                           "stats": {"4": {"bare": {"compute_us": 90_000.0},
                                           "ensemble": {"ensemble": {"success_us": 150_000.0}, "steps": steps}}}}}
    (line,) = report.ensemble_lines(result)
    assert line["of_bare"] == pytest.approx(0.95) and line["preprocess_ms"] == pytest.approx(12.0)
    assert line["encoder_compute_ms"] == pytest.approx(95) and line["bare_encoder_compute_ms"] == pytest.approx(90)
    text = "\n".join(report.ensemble_markdown({"scenarios": [result]}))
    assert "medians of 3 interleaved rounds" in text
    assert "| ge_bf16+ensemble | 4 | 20.0 | 19.0 | 95%, 97% | 190.0 → 200.0 | 380.0 → 400.0 | 150.00 | 12.00 | 10% / 15% | 90.0 → 95.0 |" in text
    assert report.ensemble_markdown({"scenarios": [{"name": "x", "rows": []}]}) == []
