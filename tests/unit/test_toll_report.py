"""bench/toll.py's arithmetic: the layers of a request's time, and how far each row is from the peer's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOLL = Path(__file__).resolve().parents[2] / "bench" / "toll.py"


@pytest.fixture(scope="module")
def toll():
    spec = importlib.util.spec_from_file_location("bench_toll", TOLL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _server(layers: dict[str, tuple[list[float], list[float]]]) -> dict:
    return {f"m_{layer}": {"client_p50_us": p50, "compute_infer_us": compute, "server_us": compute}
            for layer, (p50, compute) in layers.items()}


LAYERS = {
    "null": ([700, 720, 710], [180, 190, 170]),
    "naive": ([1900, 2000, 1950], [1300, 1320, 1310]),
    "ge_dynamic": ([1800, 1850, 1900], [1150, 1160, 1170]),
    "ge_1thread": ([2700, 2750, 2800], [1850, 1880, 1900]),
    "ge_nospin": ([2500, 2500, 2500], [1660, 1660, 1660]),
    "ge_static": ([1700, 1690, 1680], [1100, 1090, 1080]),
}
INPROCESS = {layer: {"engine": [800, 790], "runner": [820, 830], "instance": [900, 910]}
             for layer in ("ge_dynamic", "ge_1thread", "ge_nospin", "ge_static")}


def test_layers_are_medians_and_differences(toll):
    rows = {r["layer"]: r for r in toll.summarise("m", _server(LAYERS), INPROCESS)}
    dynamic = rows["ge_dynamic"]
    assert dynamic["client_p50_us"] == 1850 and dynamic["client_spread_us"] == 50
    assert dynamic["toll_stub_us"] == 180  # null's compute_infer
    assert dynamic["toll_bridge_us"] == pytest.approx(1160 - 180 - 905)
    assert dynamic["toll_instance_us"] == pytest.approx(905 - 795)
    assert "over_peer_p50_us" not in dynamic and "peer" not in rows


def test_with_the_peer_every_row_says_how_far_it_is_from_it(toll, tmp_path):
    server = _server({**LAYERS, "peer": ([1200, 1220, 1250], [880, 890, 900])})
    rows = toll.summarise("m", server, INPROCESS)
    by_layer = {r["layer"]: r for r in rows}
    assert list(by_layer)[-1] == "peer" and by_layer["peer"]["over_peer_p50_us"] == 0
    assert by_layer["ge_static"]["over_peer_p50_us"] == pytest.approx(1690 - 1220)
    assert by_layer["ge_static"]["over_peer_compute_us"] == pytest.approx(1090 - 890)
    assert by_layer["null"]["over_peer_compute_us"] == pytest.approx(180 - 890)
    text = toll.write_report(rows, tmp_path, {"machine": "test CPU", "rounds": 3, "requests": 10, "peer": "lib.so"})
    static_line = next(line for line in text.splitlines() if "| ge_static |" in line)
    assert static_line.rstrip().endswith("| +470 | +200 |")
    assert json.loads((tmp_path / "toll.json").read_text())["rows"][-1]["layer"] == "peer"
    assert (tmp_path / "toll.png").stat().st_size > 0


def test_without_the_peer_the_report_says_why(toll, tmp_path):
    rows = toll.summarise("m", _server(LAYERS), INPROCESS)
    text = toll.write_report(rows, tmp_path, {"machine": "test CPU", "rounds": 3, "requests": 10,
                                              "peer": "no onnxruntime backend found"})
    assert "No peer: no onnxruntime backend found" in text


def test_the_peer_model_is_the_onnxruntime_backend_on_the_same_file(toll, tmp_path):
    from gebackend.modelzoo import build_add_mul

    dirs, feeds = toll.build_repository(tmp_path / "repo", "tiny", build_add_mul(), with_peer=True)
    config = (dirs["peer"] / "config.pbtxt").read_text()
    assert 'backend: "onnxruntime"' in config and "max_batch_size: 8" in config
    assert (dirs["peer"] / "1" / "model.onnx").read_bytes() == (dirs["ge_dynamic"] / "1" / "model.onnx").read_bytes()
    assert set(feeds) == {t for t in config.split('"') if t in feeds}
    assert "peer" not in toll.build_repository(tmp_path / "repo2", "tiny", build_add_mul())[0]


def test_batched_every_layer_holds_its_execute_for_the_batch(toll, tmp_path):
    from gebackend.modelzoo import build_add_mul

    dirs, _ = toll.build_repository(tmp_path / "repo", "tiny", build_add_mul(), with_peer=True, batch=8)
    for layer, model_dir in dirs.items():
        config = (model_dir / "config.pbtxt").read_text()
        assert config.count("dynamic_batching") == 1, layer
        assert "preferred_batch_size: [ 8 ]" in config and "max_queue_delay_microseconds: 1000000" in config, layer
    unbatched, _ = toll.build_repository(tmp_path / "repo1", "tiny", build_add_mul(), with_peer=True)
    assert "dynamic_batching" not in (unbatched["null"] / "config.pbtxt").read_text()


def test_batched_report_says_what_an_execute_carried(toll, tmp_path):
    server = _server(LAYERS)
    for layer, entry in server.items():
        entry["requests_per_execute"] = [8.0, 7.5, 8.0] if layer != "m_naive" else [1.0, 1.0, 1.0]
    rows = toll.summarise("m", server, INPROCESS)
    assert {r["layer"]: r["requests_per_execute"] for r in rows}["ge_dynamic"] == 8.0
    text = toll.write_report(rows, tmp_path, {"machine": "test CPU", "rounds": 3, "requests": 16, "batch": 8,
                                              "peer": "none"})
    assert "8 requests at a time" in text
    assert "| m | ge_dynamic | 8.0 |" in text and "| m | naive | 1.0 |" in text
