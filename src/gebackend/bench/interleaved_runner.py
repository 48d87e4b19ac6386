"""`gebackend bench --interleave`: every scenario of a model in one server, measured in interleaved rounds.

The default bench serves each scenario in its own server, one after the other, the peer last. On a shared machine
whose load drifts, that order biases the ratios. Here one server holds every scenario of the model that can run,
each as its own model `<model>__<scenario>` (the peer's on Triton's onnxruntime backend, laid out beside ours),
and each of `rounds` rounds drives every scenario once per concurrency level, the order rotated from round to
round so that no scenario always runs first. Models that are not driven sit
idle (an idle ONNX Runtime or OpenVINO session holds memory, not cores). Pinned scenarios are pinned as alone:
only one model runs at a time, and the server's core ledger gives every instance its own core where there are
enough (control/core_ledger.py).

Reported per scenario and level, as the sequential bench reports them: the median of each perf_analyzer figure
over the rounds (`rows`, which the summary table and the × onnxruntime backend column read), every run kept in
`runs`, and `x_peer_paired`: the median over rounds of the scenario's throughput over the best peer scenario's in
the same round, a ratio that a load drifting between rounds does not move. Not measured here: the in-process
ceiling (it loads one model at a time, beside no server).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.bench import perf_analyzer, scenarios, server
from gebackend.bench.ensemble_runner import median_rows
from gebackend.bench.report import note

SEPARATOR = "__"


def served_name(model_name: str, scenario_name: str) -> str:
    """The model name a scenario is served under in the shared repository."""
    return f"{model_name}{SEPARATOR}{scenario_name}"


def rotation(names: Sequence[str], round_index: int, level_index: int) -> list[str]:
    """`names` shifted by one place a round (levels start one further on): over len(names) rounds each scenario
    takes each place once; every next len(names) rounds run in reverse, so neighbours change too."""
    if not names:
        return []
    shift = (round_index + level_index) % len(names)
    turned = list(names[shift:]) + list(names[:shift])
    return turned[::-1] if (round_index // len(names)) % 2 else turned


def paired_peer_ratios(runs: Sequence[Mapping], peers: Sequence[str]) -> dict[str, dict[str, float | None]]:
    """{scenario: {level: median over rounds of throughput / the best peer's in the same round and level}}."""
    reference: dict[tuple[int, int], float] = {}
    for run in runs:
        if run["scenario"] in peers and run.get("row"):
            key = (run["round"], run["concurrency"])
            reference[key] = max(reference.get(key, 0.0), run["row"]["throughput"])
    ratios: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        ref = reference.get((run["round"], run["concurrency"]))
        if run.get("row") and ref:
            ratios.setdefault(run["scenario"], {}).setdefault(run["concurrency"], []).append(run["row"]["throughput"] / ref)
    return {name: {str(level): float(statistics.median(values)) for level, values in sorted(levels.items())}
            for name, levels in ratios.items()}


def run(bench, model, path: Path, chosen: Sequence[scenarios.Scenario], input_data: Path, results: list) -> list[dict]:
    """Fill `results` (the model entry's scenario list, runner.Bench's) with `chosen` for `model`, measured in one
    server in rounds. Interrupted (Ctrl-C, SIGTERM), what the rounds measured so far is still aggregated."""
    s = bench.settings
    ready = []
    for scenario in chosen:
        scenario, result, _ = bench.prepare(model, scenario)
        results.append(result)  # in place: the summary keeps what was measured if a round is interrupted
        if result["status"] != "ok":
            continue
        if scenario.ensemble:
            result.update(status="not available", reason="ensemble scenarios are measured without --interleave")
            continue
        ready.append((scenario, result))
    if not ready:
        return results
    root = bench.dir / "repos" / model.name / "interleaved"
    for scenario, result in ready:
        named = replace(model, name=served_name(model.name, scenario.name))
        scenarios.write_repository(root, named, scenario, path)
        result["config"] = (root / named.name / "config.pbtxt").read_text()
        result["served_as"] = named.name
        if scenario.is_peer and bench.peer is not None:
            note(result, f"backend from {bench.peer.folder}", *bench.peer.warnings)
    tag = f"{model.name}_interleaved"
    bench.log(f"bench: {tag}: serving {len(ready)} scenarios in one server, {s.rounds} interleaved round(s)")
    extra = bench.peer.extra_backends if bench.peer is not None and any(sc.is_peer for sc, _ in ready) else None
    try:
        srv = server.start(root, bench.dir / "logs" / f"{tag}.serve.log", timeout=s.startup_timeout,
                           extra_backends=extra)
    except server.ServeError as exc:
        bench.log(f"bench: {tag}: {exc}")
        for _, result in ready:
            result.update(status="failed", reason=str(exc).splitlines()[0] + " (see logs)")
        return results
    startup_s = round(time.monotonic() - srv.started, 1)
    failed = srv.failures()  # a model that did not load loses only itself; the others are measured
    for _, result in ready:
        result["startup_s"] = startup_s
        if result["served_as"] in failed:
            result.update(status="failed", reason=f"model failed to load: {failed[result['served_as']]}")
            bench.log(f"bench: {tag}: {result['name']}: {result['reason']}")
    ready = [(sc, result) for sc, result in ready if result["status"] == "ok"]
    names = [result["served_as"] for _, result in ready]
    by_name = {result["served_as"]: (scenario, result) for scenario, result in ready}
    runs: list[dict] = []
    try:
        for r in range(s.rounds):
            for i, level in enumerate(s.concurrency):
                for name in rotation(names, r, i):
                    scenario, result = by_name[name]
                    work = bench.dir / "perf" / tag / f"round{r + 1}_{scenario.name}"
                    work.mkdir(parents=True, exist_ok=True)
                    perf = perf_analyzer.run(bench.binary, name, srv.grpc_url, [level], work, s.perf,
                                             input_data=input_data, log=lambda _line: None)
                    row = perf.rows[0].to_dict() if perf.rows else None
                    runs.append({"round": r + 1, "scenario": scenario.name, "concurrency": level, "row": row,
                                 "unstable": bool(perf.unstable), "failures": perf.failures})
                    for failure in perf.failures:
                        note(result, f"round {r + 1}: {failure}")
                    if row:
                        bench.log(f"bench: {tag}: round {r + 1} c={level} {scenario.name}: {row['throughput']:.1f} "
                                  f"infer/s p50 {row['p50_us'] / 1000:.2f} ms")
    finally:
        srv.stop()
        _aggregate(ready, runs, s.rounds, s.concurrency)
    return results


def _aggregate(ready: Sequence[tuple[scenarios.Scenario, dict]], runs: Sequence[dict], rounds: int,
               concurrency: Sequence[int]) -> None:
    """Each scenario's runs, medians per level and paired ratios into its result entry."""
    measured = max((x["round"] for x in runs), default=0)
    paired = paired_peer_ratios(runs, [sc.name for sc, _ in ready if sc.is_peer])
    for scenario, result in ready:
        mine = [x for x in runs if x["scenario"] == scenario.name]
        result.update(runs=mine, rounds=measured, x_peer_paired=paired.get(scenario.name, {}))
        for level in concurrency:
            row = median_rows([x["row"] for x in mine if x["concurrency"] == level])
            if row:
                result["rows"].append(row)
            unstable = sum(x["unstable"] for x in mine if x["concurrency"] == level)
            if unstable:
                note(result, f"c={level}: {unstable} run(s) measured only with perf_analyzer's loose retry (-s 1000)")
        note(result, f"interleaved: medians of {measured} round(s) in one server; no in-process ceiling"
                      + (f" (interrupted: {rounds} asked)" if measured < rounds else ""))
        if not result["rows"]:
            result.update(status="failed", reason="perf_analyzer measured nothing in any round")
