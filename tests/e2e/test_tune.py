"""`gebackend tune --quick` through the real CLI on a tiny MLP built here: every candidate ends with a status in
report.json, the winner's config.pbtxt serves through the real server with answers equal to onnxruntime's, and a
strict --min-cosine rejects the int8 rung in the accuracy guard (before any server is started for it).

Numbers are not asserted (a shared machine): statuses, files and served answers are.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from gebackend.config.pbtxt import load_model_config

from .server import start_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """name: "mlp"
backend: "ge"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 16 ] } ]
"""


def build_mlp(seed: int = 0) -> onnx.ModelProto:
    """y = relu(x @ w1) @ w2, x [batch, 64]: MatMuls, so int8 quantization changes the answers a little."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((64, 16)) * 0.2).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def quick_tune(model_dir: Path, out: Path, *extra: str, minutes: float = 3) -> subprocess.CompletedProcess:
    """`gebackend tune MODEL_DIR --quick` through the real CLI, `minutes` at concurrency 2, only exact rungs accepted
    (0.9999999: the winner can be compared with the ONNX file; on a CPU with VNNI the lowered rungs are measured first
    and would win); it must succeed. A test that needs no more than its first candidates measured gives it 1.5
    minutes: the checks before the first server take about 20 s and a candidate about 10 s on a 2-core machine."""
    cmd = [sys.executable, "-m", "gebackend.cli.main", "tune", str(model_dir), "--quick", "--time-budget-min", str(minutes),
           "--concurrency", "2", *extra, "--min-cosine", "0.9999999", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def test_tune_quick_finds_a_winner_that_serves_right_and_rejects_int8(tmp_path):
    model_dir = tmp_path / "repo" / "mlp"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(build_mlp(), str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(CONFIG)
    out = tmp_path / "tune"
    done = quick_tune(model_dir, out)
    assert done.stdout.strip() == str(out / "report.md")
    data = json.loads((out / "report.json").read_text())

    # every candidate has a final status; the int8 rung is rejected by the accuracy guard and never served
    statuses = {c["key"]: c["status"] for c in data["candidates"]}
    assert len(statuses) >= 4 and "not run" not in statuses.values()
    allowed = ("winner", "ok", "rejected: ", "pruned: ", "over budget: ", "skipped: ", "failed: ")
    assert all(s.startswith(allowed) for s in statuses.values()), statuses
    int8 = [c for c in data["candidates"] if c["choices"]["numerics"] == ["onnxruntime", "int8"]]
    assert int8, statuses
    for c in int8:
        assert c["status"].startswith("rejected: cosine ") and c["status"].endswith(" < 0.9999999")
        assert 0.999 <= c["cosine"] < 0.9999999  # the default --min-cosine would have kept it
        assert not (out / "logs" / f"{c['key']}.serve.log").exists()
    assert data["references"][0]["kind"] == "baseline" and data["references"][0]["throughput"] > 0
    assert data["meta"]["machine"] and data["meta"]["machine"] in (out / "report.md").read_text()
    winner = data["winner"]
    assert statuses[winner] == "winner"
    assert (out / "tune.png").stat().st_size > 5000
    # the engines' share of the gain is said for a winner off ONNX Runtime's exact graph, and only for one
    numerics = next(c for c in data["candidates"] if c["key"] == winner)["choices"]["numerics"]
    if numerics == ["onnxruntime", "origin"]:
        assert data["engine_verdict"] is None
    else:
        assert data["engine_verdict"].startswith(f"In process, one request at a time on all cores (the accuracy guard's "
                                                 f"timing): {numerics[0]} {numerics[1]} ")
        assert f"tune: {data['engine_verdict']}" in done.stderr
    # the winner's instances measured in process with no server beside them, and served against that ceiling
    assert data["ceiling"] > 0, done.stderr[-3000:]
    assert data["ceiling_verdict"].startswith(f"With no server beside them, the winner's instances compute "
                                              f"{data['ceiling']:.1f} infer/s in process at concurrency ")
    assert data["ceiling_verdict"] in (out / "report.md").read_text()
    # the accuracy guard timed every accepted precision in process, and the screening order says so
    order = [n for n in data["meta"]["notes"] if n.startswith("screening order by the time of one request in process: ")]
    assert len(order) == 1, data["meta"]["notes"]
    assert "onnxruntime origin " in order[0] and "onnxruntime int8 " not in order[0]  # int8 was rejected: not ordered
    assert re.search(r"\[accuracy\] onnxruntime origin \.\.\. cosine 1\.000000, \d+\.\d ms a request in process", done.stderr)
    for line in done.stderr.splitlines():
        if line.startswith("[") and "infer/s" in line:
            assert " ... " in line and " p99 " in line

    # the winner's config serves the model through the real server, answers equal to onnxruntime's
    config = out / "config.pbtxt"
    parsed = load_model_config(config)
    assert parsed["name"] == "mlp" and parsed["backend"] == "ge"
    assert parsed["input"] == load_model_config(model_dir / "config.pbtxt")["input"]
    serve_repo = tmp_path / "serve"
    (serve_repo / "mlp" / "1").mkdir(parents=True)
    shutil.copy(model_dir / "1" / "model.onnx", serve_repo / "mlp" / "1" / "model.onnx")
    shutil.copy(config, serve_repo / "mlp" / "config.pbtxt")
    server = start_server(serve_repo, tmp_path / "serve.log")
    try:
        x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = client.infer("mlp", [tensor]).as_numpy("y")
    finally:
        server.stop()
    expected = ort.InferenceSession(str(model_dir / "1" / "model.onnx")).run(["y"], {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_tune_with_padded_requests_cuts_them_in_every_candidate_and_the_winner(tmp_path):
    """--input-data with texts padded to the context (as CN_CLIP's tokenizer sends them): every candidate runs
    trim_padding, the winner's config keeps it, and served, the winner answers as the ONNX file at full length."""
    from gebackend.modelzoo.cnclip_standin import build_cnclip_text_standin

    model_dir = tmp_path / "repo" / "text"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(build_cnclip_text_standin(), str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text('name: "text"\nbackend: "ge"\nmax_batch_size: 8\ndynamic_batching { }\n')
    rng = np.random.default_rng(8)
    rows = [[101, *rng.integers(670, 8000, n).tolist(), 102] + [0] * (50 - n) for n in (9, 14, 5, 18)]
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps({"data": [{"text": {"content": r, "shape": [52]}} for r in rows]}))
    out = tmp_path / "tune"
    done = quick_tune(model_dir, out, "--input-data", str(requests), minutes=1.5)  # the winner compared at full length below
    assert ("tune: your requests' 'text' ends in padding (the longest uses 20 of its 52 positions): every candidate "
            "cuts each batch to its longest request (trim_padding=text, checked at load); static candidates, whose "
            "batch buckets keep the full length, are measured last") in done.stderr
    sent = "your 4 requests, in turn, as perf_analyzer sends them"
    assert f"tune: in process (the accuracy guard's cosine and timings, the winner's ceiling): {sent}" in done.stderr
    data = json.loads((out / "report.json").read_text())
    assert data["meta"]["input_data"] == str(requests) and "trim_padding=text" in data["meta"]["trim_padding"]
    assert data["meta"]["in_process_requests"] == sent and sent in (out / "report.md").read_text()
    guards = list((out / "repos").glob("accuracy-*/text/config.pbtxt"))  # timed cut, as the candidates are served
    assert guards and all(load_model_config(g)["parameters"]["trim_padding"]["string_value"] == "text" for g in guards)
    assert data["meta"]["calibration"] == str(requests)  # static int8 calibrated on the requests measured with
    for guard in (g for g in guards if "int8-static" in g.parent.parent.name):
        assert load_model_config(guard)["parameters"]["calibration_data"]["string_value"] == str(requests)
    measured = [c for c in data["candidates"] if (out / "logs" / f"{c['key']}.serve.log").exists()]
    assert measured
    for c in measured:  # each candidate's server cut its batches (or, static, said why it could not)
        log = (out / "logs" / f"{c['key']}.serve.log").read_text()
        assert "trim_padding: 'text' cut after its last token other than 0" in log or \
            "compiles no length of 'text' shorter than 52" in log, c["key"]
    parsed = load_model_config(out / "config.pbtxt")
    assert parsed["parameters"]["trim_padding"]["string_value"] == "text"

    serve_repo = tmp_path / "serve"
    (serve_repo / "text" / "1").mkdir(parents=True)
    shutil.copy(model_dir / "1" / "model.onnx", serve_repo / "text" / "1" / "model.onnx")
    shutil.copy(out / "config.pbtxt", serve_repo / "text" / "config.pbtxt")
    server = start_server(serve_repo, tmp_path / "serve.log")
    try:
        ids = np.array(rows[:2], dtype=np.int64)
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("text", list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids)
        got = client.infer("text", [tensor]).as_numpy("unnorm_text_features")
        log = server.output()
    finally:
        server.stop()
    expected = ort.InferenceSession(str(model_dir / "1" / "model.onnx")).run(None, {"text": ids})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    if parsed["parameters"]["static_model"]["string_value"] == "0":
        assert "trim_padding: 'text' cut after its last token other than 0" in log


def tune_bert(tmp_path: Path, lengths, seed: int) -> tuple[Path, subprocess.CompletedProcess, Path, dict]:
    """A quick tune of a BERT whose input_ids and attention_mask are [batch, sequence], with --input-data of texts of
    `lengths` tokens: its folder, the run, and a measured static candidate's config (the file and its parameters)."""
    from gebackend.modelzoo import build_bert

    model_dir = tmp_path / "repo" / "bert"
    (model_dir / "1").mkdir(parents=True)
    onnx.save(build_bert(), str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text('name: "bert"\nbackend: "ge"\nmax_batch_size: 8\n')
    rng = np.random.default_rng(seed)
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps({"data": [
        {"input_ids": {"content": rng.integers(1, 1000, n).tolist(), "shape": [n]},
         "attention_mask": {"content": [1] * n, "shape": [n]}} for n in lengths]}))
    out = tmp_path / "tune"
    done = quick_tune(model_dir, out, "--input-data", str(requests), minutes=1.5)
    data = json.loads((out / "report.json").read_text())
    static = [c for c in data["candidates"] if c["choices"]["graph"] == "static" and c["throughput"]]
    assert static, [(c["key"], c["status"]) for c in data["candidates"]]
    config = out / "repos" / static[0]["key"] / "bert" / "config.pbtxt"  # the config that was measured
    return model_dir, done, config, {k: v["string_value"] for k, v in load_model_config(config)["parameters"].items()}


def serves_like_the_file(tmp_path: Path, model_dir: Path, config: Path, cases) -> str:
    """Serve the model with `config` through the real server: requests of (rows, length) in `cases` answer every output
    as the ONNX file does; the server's log."""
    serve_repo = tmp_path / "serve"
    (serve_repo / "bert" / "1").mkdir(parents=True)
    shutil.copy(model_dir / "1" / "model.onnx", serve_repo / "bert" / "1" / "model.onnx")
    shutil.copy(config, serve_repo / "bert" / "config.pbtxt")
    reference = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    rng = np.random.default_rng(11)
    server = start_server(serve_repo, tmp_path / "serve.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for rows, length in cases:
            feeds = {"input_ids": rng.integers(1, 1000, (rows, length)).astype(np.int64),
                     "attention_mask": np.ones((rows, length), np.int64)}
            tensors = []
            for name, value in feeds.items():
                tensors.append(httpclient.InferInput(name, list(value.shape), "INT64"))
                tensors[-1].set_data_from_numpy(value)
            result = client.infer("bert", tensors)
            for name, expected in zip(("last_hidden_state", "pooler_output"), reference.run(None, feeds)):
                np.testing.assert_allclose(result.as_numpy(name), expected, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{name}, {rows} x {length}")
        return server.output()
    finally:
        server.stop()


def test_tune_of_a_model_with_a_sequence_dim_compiles_the_requests_length_and_serves_any_length(tmp_path):
    """With --input-data of one length, the static candidates compile their buckets at that length and are measured;
    served, the static config answers that length from its buckets and any other from the dynamic graph
    (bucket_fallback=dynamic), as the ONNX file does."""
    model_dir, done, config, parameters = tune_bert(tmp_path, (12, 12, 12), seed=3)
    assert ("tune: static candidates compile the variable dims at the dims every request sends, input_ids [12]; "
            "attention_mask [12]: those of your requests (--input-data); a request of other dims runs on the dynamic "
            "graph beside them (bucket_fallback=dynamic)") in done.stderr
    assert parameters["graph.ge.inputShape"] == "input_ids:-1,12;attention_mask:-1,12"
    assert parameters["bucket_fallback"] == "dynamic" and parameters["static_model"] == "1"
    log = serves_like_the_file(tmp_path, model_dir, config, ((1, 12), (2, 7)))  # a bucket's length, and one no bucket has
    assert "static graph, buckets [" in log and "fallback=dynamic" in log


def test_tune_with_requests_of_several_lengths_compiles_them_and_pads_each_request_up(tmp_path):
    """--input-data of texts of 7, 12 and 20 tokens: the static candidates compile those lengths, each request padded up
    to the next (bucket_paddable_dims=sequence, checked at load); served, that config answers a bucket's length, one
    padded up to a bucket and one longer than every bucket (the dynamic graph) as the ONNX file does."""
    model_dir, done, config, parameters = tune_bert(tmp_path, (7, 12, 20, 12), seed=4)
    assert ("tune: static candidates compile 'sequence' at the lengths [7, 12, 20] of your requests (--input-data), "
            "each request padded up to the next (bucket_paddable_dims=sequence, checked at load") in done.stderr
    assert parameters["graph.ge.inputShape"] == "input_ids:-1,-1;attention_mask:-1,-1"
    assert parameters["graph.ge.dynamicDims"].startswith("1,7,1,7;1,12,1,12;1,20,1,20;2,7,2,7;")
    assert parameters["bucket_paddable_dims"] == "sequence" and parameters["bucket_fallback"] == "dynamic"
    log = serves_like_the_file(tmp_path, model_dir, config, ((1, 12), (2, 9), (1, 25)))  # 9: padded up to 12
    assert "bucket_paddable_dims=sequence: checked at load" in log
