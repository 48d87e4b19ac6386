"""Measures a `NAME+ensemble` scenario: the CN_CLIP ensemble and its bare encoder, in one server, in rounds.

One server serves the ensemble repository (gebackend.bench.ensemble) with the encoder configured as scenario NAME.
Before measuring, one request checks the wiring: the ensemble's `unnorm_*_features` for an input must equal the
bare encoder's output for the preprocessed input (`agreement`). Then, for each of `rounds` rounds and each
concurrency level, perf_analyzer drives the bare encoder (with the preprocessed tensors) and the ensemble (with
the JPEG bytes or the Chinese text), in alternating order, so slow drifts of a shared machine's load hit both
alike. Around every run a snapshot of Triton's statistics of each model (gebackend.bench.triton_stats) says where
the ensemble's time went. Reported per level: the median over rounds of each perf_analyzer figure for each target
(`rows`: the ensemble, `bare_rows`), the ensemble's throughput over the bare encoder's as the ratio of those
medians (`of_bare`) and as the median of each round's own ratio (`of_bare_paired`, which a load drifting between
rounds does not move), and the medians of the per-step breakdown (`stats`), every run kept in `runs`. There is no
in-process ceiling for these scenarios: the bare encoder on the same server is their reference.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from gebackend.bench import ensemble, perf_analyzer, triton_stats
from gebackend.bench.report import note

TARGETS = ("bare", "ensemble")


def median_rows(rows: Sequence[Mapping]) -> dict | None:
    """The median of each numeric perf_analyzer figure over rounds (each figure on its own); None if no rows."""
    rows = [r for r in rows if r]
    if not rows:
        return None
    out = {}
    for key, value in rows[0].items():
        values = [r.get(key) for r in rows]
        if key == "concurrency":
            out[key] = int(value)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = float(statistics.median(values))
    out["rounds"] = len(rows)
    return out


def median_tree(trees: Sequence[Any]) -> Any:
    """Nested dicts of numbers -> the same shape with the median of each leaf over the trees (None where none)."""
    trees = [t for t in trees if t is not None]
    if not trees:
        return None
    if isinstance(trees[0], Mapping):
        keys = list(dict.fromkeys(k for t in trees if isinstance(t, Mapping) for k in t))
        return {k: median_tree([t.get(k) for t in trees if isinstance(t, Mapping)]) for k in keys}
    numbers = [t for t in trees if isinstance(t, (int, float)) and not isinstance(t, bool)]
    return float(statistics.median(numbers)) if numbers else trees[0]


def ratio(a: Mapping | None, b: Mapping | None, key: str = "throughput") -> float | None:
    if not a or not b or not b.get(key):
        return None
    return a[key] / b[key]


def paired_ratio(bare_runs: Sequence[Mapping], ensemble_runs: Sequence[Mapping]) -> float | None:
    """The median over rounds of each round's ensemble / bare throughput: the two runs of a round are adjacent in
    time, so a load that drifts between rounds (another job on a shared machine) cancels out of each ratio."""
    bare = {x["round"]: x["row"] for x in bare_runs if x.get("row")}
    ratios = [ratio(x["row"], bare.get(x["round"])) for x in ensemble_runs if x.get("row")]
    ratios = [r for r in ratios if r is not None]
    return float(statistics.median(ratios)) if ratios else None


def order(round_index: int, level_index: int) -> tuple[str, str]:
    """Which target goes first: alternating between rounds and between levels."""
    return TARGETS if (round_index + level_index) % 2 == 0 else TARGETS[::-1]


def agreement(http_url: str, p: ensemble.Pipeline, data: ensemble.Inputs) -> dict:
    """One request to each: the ensemble's unnormalised features vs the bare encoder's, on the same input."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url)
    try:
        item = data.ensemble[0][p.input_name]
        tensor = httpclient.InferInput(p.input_name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[item.encode("utf-8") if isinstance(item, str) else item]], dtype=object))
        via_ensemble = client.infer(p.ensemble, [tensor]).as_numpy(p.encoder_output)
        array = np.asarray(data.bare[0][p.encoder_input])[None]
        bare_input = httpclient.InferInput(p.encoder_input, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
        bare_input.set_data_from_numpy(array)
        bare = client.infer(p.encoder, [bare_input]).as_numpy(p.encoder_output)
    finally:
        client.close()
    a, b = via_ensemble.ravel().astype(np.float64), bare.ravel().astype(np.float64)
    return {"cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))), "max_abs_diff": float(np.max(np.abs(a - b)))}


def run(bench, model, path: Path, scenario, result: dict, tag: str) -> dict:
    """Fill `result` (runner.Bench's scenario result) for an ensemble scenario; `bench` is the runner.Bench."""
    s = bench.settings
    try:
        p = ensemble.pipeline(model)
    except ValueError as exc:
        result.update(status="not available", reason=str(exc))
        bench.log(f"bench: {tag}: not available: {exc}")
        return result
    root = ensemble.write_repository(bench.dir / "repos" / model.name / scenario.name, model, scenario, path, s.cache)
    result["config"] = (root / p.encoder / "config.pbtxt").read_text()
    vocab = root / p.preprocess / "1" / "vocab.txt" if p.kind == "text" else None
    data = ensemble.inputs(p, s.cache, vocab)
    inputs = {"ensemble": perf_analyzer.write_input_entries(bench.dir / f"inputs_{tag}_ensemble.json", data.ensemble),
              "bare": perf_analyzer.write_input_entries(bench.dir / f"inputs_{tag}_bare.json", data.bare)}
    info = {"pipeline": p.kind, "ensemble_model": p.ensemble, "encoder_model": p.encoder, "steps": list(p.steps),
            "inputs": data.description, "rounds": s.rounds, "runs": [], "stats": {}, "of_bare": {}}
    result.update(ensemble=info, bare_rows=[])
    bench.log(f"bench: {tag}: serving the {p.ensemble} ensemble, encoder as {scenario.name.removesuffix('+ensemble')}")
    srv = bench.serve(root, tag, result, list(p.models))
    if srv is None:
        return result
    try:
        info["agreement"] = agreement(srv.http_url, p, data)
        bench.log(f"bench: {tag}: ensemble vs bare encoder on one input: cosine {info['agreement']['cosine']:.6f}")
        _rounds(bench, srv, p, inputs, info, result, tag)
    finally:
        srv.stop()
    _aggregate(info, result, s.concurrency)
    return result


def _rounds(bench, srv, p: ensemble.Pipeline, inputs: Mapping[str, Path], info: dict, result: dict, tag: str) -> None:
    s = bench.settings
    csv = {t: [] for t in TARGETS}
    for r in range(s.rounds):
        for i, level in enumerate(s.concurrency):
            for target in order(r, i):
                model = p.encoder if target == "bare" else p.ensemble
                watched = [p.encoder] if target == "bare" else list(p.models)
                work = bench.dir / "perf" / tag / f"round{r + 1}_{target}"
                work.mkdir(parents=True, exist_ok=True)
                before = triton_stats.snapshot(srv.http_url, watched)
                perf = perf_analyzer.run(bench.binary, model, srv.grpc_url, [level], work, s.perf,
                                         input_data=inputs[target], log=bench.log)
                diff = triton_stats.delta(before, triton_stats.snapshot(srv.http_url, watched))
                stats = (triton_stats.step(diff[p.encoder]) if target == "bare"
                         else triton_stats.breakdown(diff, p.ensemble, p.steps))
                row = perf.rows[0].to_dict() if perf.rows else None
                info["runs"].append({"round": r + 1, "target": target, "concurrency": level, "row": row,
                                     "unstable": bool(perf.unstable), "failures": perf.failures, "stats": stats})
                csv[target].append(perf.csv_text)
                for failure in perf.failures:
                    note(result, f"round {r + 1} {target}: {failure}")
                if row:
                    bench.log(f"bench: {tag}: round {r + 1} c={level} {target}: {row['throughput']:.1f} infer/s "
                              f"p50 {row['p50_us'] / 1000:.2f} ms")
    for target, texts in csv.items():
        (bench.dir / f"{tag}_{target}.csv").write_text(perf_analyzer.merge_csv(texts))


def _aggregate(info: dict, result: dict, concurrency: Sequence[int]) -> None:
    """Medians per target and level into `rows` / `bare_rows`, `stats`, `of_bare` and `of_bare_paired`."""
    info.setdefault("of_bare_paired", {})
    for level in concurrency:
        runs = {t: [x for x in info["runs"] if x["target"] == t and x["concurrency"] == level] for t in TARGETS}
        medians = {t: median_rows([x["row"] for x in runs[t]]) for t in TARGETS}
        if medians["ensemble"]:
            result["rows"].append(medians["ensemble"])
        if medians["bare"]:
            result["bare_rows"].append(medians["bare"])
        info["of_bare"][str(level)] = ratio(medians["ensemble"], medians["bare"])
        info["of_bare_paired"][str(level)] = paired_ratio(runs["bare"], runs["ensemble"])
        info["stats"][str(level)] = {t: median_tree([x["stats"] for x in runs[t] if x["row"]]) for t in TARGETS}
        unstable = sum(x["unstable"] for t in TARGETS for x in runs[t])
        if unstable:
            note(result, f"c={level}: {unstable} run(s) measured only with perf_analyzer's loose retry (-s 1000)")
    if not result["rows"]:
        result.update(status="failed", reason="perf_analyzer measured nothing for the ensemble")
