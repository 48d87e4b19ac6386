"""`gebackend bench --interleave`'s pure parts: the order of the rounds, the paired ratios and the report cell."""

from __future__ import annotations

import pytest

from gebackend.bench import interleaved_runner as il
from gebackend.bench import report


def test_each_scenario_takes_each_place_over_the_rounds():
    names = ["a", "b", "c", "peer"]
    orders = [il.rotation(names, r, 0) for r in range(4)]
    for order in orders:
        assert sorted(order) == sorted(names)
    for name in names:
        assert {order.index(name) for order in orders} == {0, 1, 2, 3}, (name, orders)
    assert il.rotation([], 3, 1) == []
    assert il.rotation(names, 0, 1) != il.rotation(names, 0, 0)  # levels of one round start elsewhere too


def _run(round_, scenario, level, throughput):
    return {"round": round_, "scenario": scenario, "concurrency": level,
            "row": None if throughput is None else {"throughput": throughput}}


def test_paired_ratios_divide_by_the_best_peer_of_the_same_round():
    runs = [_run(1, "peer", 4, 10.0), _run(1, "peer_batching", 4, 20.0), _run(1, "ge", 4, 30.0),
            _run(2, "peer", 4, 5.0), _run(2, "peer_batching", 4, 4.0), _run(2, "ge", 4, 10.0),
            _run(3, "peer", 4, 10.0), _run(3, "ge", 4, None),  # a failed run has no ratio
            _run(1, "ge", 1, 3.0)]  # no peer at that level in that round: no ratio either
    paired = il.paired_peer_ratios(runs, ["peer", "peer_batching"])
    assert paired["ge"] == {"4": pytest.approx(1.75)}  # median of 30/20 and 10/5
    assert paired["peer_batching"] == {"4": pytest.approx((1.0 + 0.8) / 2)}
    assert il.paired_peer_ratios(runs, []) == {}


def test_the_report_cell_shows_the_paired_ratio_beside_the_ratio_of_medians():
    result = {"name": "ge", "x_peer_paired": {"4": 1.234}}
    assert report.peer_cell(1.2, result, 4) == "1.20x (paired 1.23x)"
    assert report.peer_cell(1.2, result, 1) == "1.20x"
    assert report.peer_cell(1.0, {"peer": True, "x_peer_paired": {"4": 1.0}}, 4) == "1.00x"
    assert report.peer_cell(None, {}, 4) == "–"


def test_an_interrupted_run_keeps_the_medians_of_what_it_measured():
    from gebackend.bench import scenarios

    ge, peer = scenarios.select(["ge_dynamic"])[0], scenarios.PEERS["peer"]
    ready = [(ge, {"name": ge.name, "rows": [], "notes": "", "status": "ok"}),
             (peer, {"name": peer.name, "rows": [], "notes": "", "status": "ok", "peer": True})]
    runs = [{**_run(1, "ge_dynamic", 4, 30.0), "unstable": False}, {**_run(1, "peer", 4, 20.0), "unstable": False},
            {**_run(2, "ge_dynamic", 4, 10.0), "unstable": True}]  # round 2 stopped before the peer ran
    il._aggregate(ready, runs, rounds=3, concurrency=[4])
    result = ready[0][1]
    assert result["rows"][0]["throughput"] == pytest.approx(20.0) and result["rounds"] == 2
    assert result["x_peer_paired"] == {"4": pytest.approx(1.5)}  # round 1 only: round 2 has no peer
    assert "interleaved: medians of 2 round(s) in one server; no in-process ceiling (interrupted: 3 asked)" in result["notes"]
    assert "c=4: 1 run(s) measured only with perf_analyzer's loose retry" in result["notes"]
