"""What a bench run reports: ratios to the naive baseline and to the in-process ceiling, summary.md, and plots.

Results are plain dicts (they go to summary.json as they are):
  result   = {"name", "title", "status": "ok" | "not available" | "failed", "reason", "notes",
              "rows": [PerfRow dict, ...] (served, by perf_analyzer), "ceiling": [PerfRow dict, ...] (in-process),
              "accuracy": {"cosine", "max_abs_diff"} | None, ...}
  model    = {"name", "description", "scenarios": [result, ...]}

The peer (Triton's C++ onnxruntime backend, gebackend.bench.peer) is a result with "peer": true. Where one ran,
every line gets `x_peer`: its throughput over the best peer scenario's at the same concurrency ("× onnxruntime
backend"; None, shown "–", where no peer scenario measured that level, failed or did not run).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence


def note(result: dict, *texts: str) -> None:
    """Append `texts` to a result's "notes" ("; "-separated; empty ones left out)."""
    result["notes"] = "; ".join(filter(None, [result.get("notes"), *texts]))


def row_at(rows: Sequence[Mapping], concurrency: int) -> Mapping | None:
    return next((r for r in rows if int(r["concurrency"]) == int(concurrency)), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def is_peer(result: Mapping) -> bool:
    return bool(result.get("peer", str(result.get("name", "")).startswith("peer")))


def peer_reference(results: Iterable[Mapping], concurrency: int | None) -> Mapping | None:
    """The best peer row at `concurrency`, as {"scenario", "throughput"}: the reference of the × column."""
    best = None
    for res in results:
        if not is_peer(res) or res.get("status") != "ok" or concurrency is None:
            continue
        row = row_at(res.get("rows") or [], concurrency)
        if row is not None and row.get("throughput") and (best is None or row["throughput"] > best["throughput"]):
            best = {"scenario": res["name"], "throughput": row["throughput"]}
    return best


def peer_ratios(model: Mapping) -> dict:
    """summary.json's `x_onnxruntime_backend`: per level, the reference peer and each scenario's throughput / its."""
    results = model.get("scenarios") or []
    levels = sorted({int(r["concurrency"]) for res in results for r in res.get("rows") or []})
    out: dict = {"reference": {}, "ratios": {}}
    for level in levels:
        ref = peer_reference(results, level)
        out["reference"][str(level)] = ref
        for res in results:
            row = row_at(res.get("rows") or [], level)
            value = _ratio(row["throughput"], ref["throughput"]) if row is not None and ref else None
            out["ratios"].setdefault(res["name"], {})[str(level)] = value
    return out


def headline_concurrency(results: Iterable[Mapping], wanted: int) -> int | None:
    """`wanted` if any scenario measured it, else the largest concurrency measured."""
    levels = sorted({int(r["concurrency"]) for res in results for r in res.get("rows") or []})
    if not levels:
        return None
    return wanted if wanted in levels else levels[-1]


def summarize(model: Mapping, wanted: int = 4, baseline: str = "naive") -> list[dict]:
    """One line per scenario at the headline concurrency: throughput, p50, p99, x baseline, % of ceiling."""
    results = model.get("scenarios") or []
    level = headline_concurrency(results, wanted)
    base = next((r for r in results if r["name"] == baseline and r.get("status") == "ok"), None)
    base_row = row_at(base["rows"], level) if base and level is not None else None
    peer_ref = peer_reference(results, level)
    lines = []
    for res in results:
        line = {"scenario": res["name"], "title": res.get("title", ""), "status": res.get("status", ""),
                "reason": res.get("reason", ""), "notes": res.get("notes", ""), "concurrency": level,
                "throughput": None, "p50_ms": None, "p99_ms": None, "x_naive": None,
                "ceiling_throughput": None, "ceiling_p50_ms": None, "of_ceiling": None,
                "saturation": None, "cosine": (res.get("accuracy") or {}).get("cosine"),
                "x_peer": None, "peer_reference": peer_ref["scenario"] if peer_ref else None}
        row = row_at(res.get("rows") or [], level) if level is not None else None
        if row is not None:
            line.update(throughput=row["throughput"], p50_ms=row["p50_us"] / 1000, p99_ms=row["p99_us"] / 1000)
            if base_row is not None:
                line["x_naive"] = _ratio(row["throughput"], base_row["throughput"])
            if peer_ref is not None:
                line["x_peer"] = _ratio(row["throughput"], peer_ref["throughput"])
        ceiling = row_at(res.get("ceiling") or [], level) if level is not None else None
        if ceiling is not None:
            line.update(ceiling_throughput=ceiling["throughput"], ceiling_p50_ms=ceiling["p50_us"] / 1000)
            if row is not None:
                line["of_ceiling"] = _ratio(row["throughput"], ceiling["throughput"])
        # at the highest concurrency both measured: served / ceiling ("saturating" load)
        served_levels = {int(r["concurrency"]) for r in res.get("rows") or []}
        common = sorted(served_levels & {int(r["concurrency"]) for r in res.get("ceiling") or []})
        if common:
            top = common[-1]
            line["saturation"] = {"concurrency": top, "ratio": _ratio(row_at(res["rows"], top)["throughput"],
                                                                        row_at(res["ceiling"], top)["throughput"])}
        lines.append(line)
    return lines


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown(summary: Mapping, wanted: int = 4) -> str:
    meta = summary.get("meta", {})
    out = [f"# gebackend bench — {meta.get('started', '')}", ""]
    if meta:
        out += [f"- machine: {meta.get('machine', '?')}",
                f"- mode: {'quick' if meta.get('quick') else 'full'}; perf_analyzer {meta.get('perf_settings', '')}; "
                f"concurrency {meta.get('concurrency')}; wall time {meta.get('duration_s', 0):.0f} s"]
        peer = meta.get("peer")
        if peer:
            out.append(f"- onnxruntime backend (the peer): {peer.get('folder')}" if peer.get("available")
                       else f"- onnxruntime backend (the peer): not compared: {peer.get('reason', '')}")
        out.append("")
    for model in summary.get("models", []):
        lines = summarize(model, wanted)
        level = lines[0]["concurrency"] if lines else None
        out += [f"## {model['name']}: {model.get('description', '')}", "",
                f"At concurrency {level} (batch 1 per request). Throughput in inferences/s, latency in ms. "
                "x naive: throughput / naive's. % ceiling: served / in-process ceiling (same engine and config, "
                "no server). bs1 Δp50: served p50 − in-process p50 at concurrency 1. × onnxruntime backend: "
                "throughput / Triton's onnxruntime backend's at the same concurrency (its best scenario"
                f"{', ' + lines[0]['peer_reference'] if lines and lines[0]['peer_reference'] else ''}; – where none ran).", "",
                "| scenario | throughput | p50 | p99 | x naive | ceiling | % ceiling | bs1 Δp50 | cos vs fp32 "
                "| × onnxruntime backend | notes |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        by_name = {r["name"]: r for r in model.get("scenarios", [])}
        for line in lines:
            res = by_name[line["scenario"]]
            notes = line["notes"]
            if line["status"] != "ok":
                notes = f"**{line['status']}**: {line['reason']}"
            elif line["saturation"] and line["saturation"]["ratio"] is not None:
                sat = line["saturation"]
                notes = "; ".join(filter(None, [notes, f"{sat['ratio'] * 100:.0f}% of ceiling at c={sat['concurrency']}"]))
            delta = bs1_delta_ms(res)
            out.append(
                f"| {line['scenario']} ({line['title']}) | {_fmt(line['throughput'], '.1f')} | {_fmt(line['p50_ms'], '.2f')} "
                f"| {_fmt(line['p99_ms'], '.2f')} | {_fmt(line['x_naive'], '.2f', 'x')} "
                f"| {_fmt(line['ceiling_throughput'], '.1f')} | {_fmt(None if line['of_ceiling'] is None else line['of_ceiling'] * 100, '.0f', '%')} "
                f"| {_fmt(delta, '+.2f')} | {_fmt(line['cosine'], '.6f')} | {peer_cell(line['x_peer'], res, line['concurrency'])} | {notes} |")
        out += ["", "All concurrency levels (served; ceiling in brackets):", "",
                "| scenario | concurrency | throughput | p50 ms | p90 ms | p99 ms | server queue ms | compute ms "
                "| × onnxruntime backend |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        ratios = peer_ratios(model)["ratios"]
        for res in model.get("scenarios", []):
            for row in res.get("rows") or []:
                ceil = row_at(res.get("ceiling") or [], row["concurrency"])
                extra = "" if ceil is None else f" [{ceil['throughput']:.1f}]"
                compute = (row.get("server_compute_input_us", 0) + row.get("server_compute_infer_us", 0)
                           + row.get("server_compute_output_us", 0)) / 1000
                out.append(f"| {res['name']} | {row['concurrency']} | {row['throughput']:.1f}{extra} | {row['p50_us'] / 1000:.2f} "
                           f"| {row['p90_us'] / 1000:.2f} | {row['p99_us'] / 1000:.2f} | {row.get('server_queue_us', 0) / 1000:.2f} | {compute:.2f} "
                           f"| {peer_cell(ratios.get(res['name'], {}).get(str(int(row['concurrency']))), res, row['concurrency'])} |")
        out += ensemble_markdown(model)
        out.append("")
    return "\n".join(out)


def peer_cell(ratio: float | None, result: Mapping, concurrency) -> str:
    """The × onnxruntime backend cell: the ratio of medians, and with --interleave the median of per-round ratios."""
    paired = (result.get("x_peer_paired") or {}).get(str(int(concurrency))) if concurrency is not None else None
    text = _fmt(ratio, ".2f", "x")
    return text if paired is None or result.get("peer") else f"{text} (paired {paired:.2f}x)"


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000


def _pct(fraction: float | None) -> str:
    return _fmt(None if fraction is None else fraction * 100, ".0f", "%")


def ensemble_lines(result: Mapping) -> list[dict]:
    """A `NAME+ensemble` result per level: bare encoder vs ensemble (medians over rounds) and where the time went."""
    info = result.get("ensemble") or {}
    preprocess = (info.get("steps") or [None])[0]
    lines = []
    for row in result.get("rows") or []:
        level = int(row["concurrency"])
        bare = row_at(result.get("bare_rows") or [], level) or {}
        stats = (info.get("stats") or {}).get(str(level)) or {}
        steps = (stats.get("ensemble") or {}).get("steps") or {}
        pre, encoder = steps.get(preprocess) or {}, steps.get(info.get("encoder_model")) or {}
        lines.append({
            "concurrency": level, "throughput": row["throughput"], "bare_throughput": bare.get("throughput"),
            "of_bare": _ratio(row["throughput"], bare.get("throughput")),
            "of_bare_paired": (info.get("of_bare_paired") or {}).get(str(level)),
            "p50_ms": row["p50_us"] / 1000, "p99_ms": row["p99_us"] / 1000,
            "bare_p50_ms": _ms(bare.get("p50_us")), "bare_p99_ms": _ms(bare.get("p99_us")),
            "preprocess_ms": _ms(pre.get("time_us")), "preprocess_latency_share": pre.get("latency_share"),
            "preprocess_work_share": pre.get("work_share"), "preprocess_batch": pre.get("avg_batch"),
            "encoder_compute_ms": _ms(encoder.get("compute_us")),
            "bare_encoder_compute_ms": _ms((stats.get("bare") or {}).get("compute_us")),
            "server_ms": _ms(((stats.get("ensemble") or {}).get("ensemble") or {}).get("success_us")),
        })
    return lines


def ensemble_markdown(model: Mapping) -> list[str]:
    results = [r for r in model.get("scenarios", []) if r.get("ensemble") and r.get("rows")]
    if not results:
        return []
    info = results[0]["ensemble"]
    out = ["", f"CN_CLIP ensemble vs the bare encoder, one server, medians of {info.get('rounds')} interleaved rounds "
           f"(ensemble inputs: {info.get('inputs')}; the bare encoder gets their preprocessed tensors). Ensemble / bare: "
           "the ratio of the median throughputs, and the median of each round's own ratio (paired: its two runs are "
           "adjacent in time, so load drifting between rounds cancels). Preprocess: "
           "queue + compute per request; its share of the ensemble's server time per request (latency: from a request's "
           "arrival to its last step's end) and of the composing models' busy time (work), from Triton's per-model "
           "statistics.", "",
           "| scenario | c | bare infer/s | ensemble infer/s | ensemble / bare: medians, paired | p50 ms bare → ens "
           "| p99 ms bare → ens | ensemble server ms | preprocess ms | preprocess share: latency / work "
           "| encoder compute ms: bare → in ens |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for res in results:
        for line in ensemble_lines(res):
            share = f"{_pct(line['preprocess_latency_share'])} / {_pct(line['preprocess_work_share'])}"
            out.append(
                f"| {res['name']} | {line['concurrency']} | {_fmt(line['bare_throughput'], '.1f')} | {line['throughput']:.1f} "
                f"| {_pct(line['of_bare'])}, {_pct(line['of_bare_paired'])} "
                f"| {_fmt(line['bare_p50_ms'], '.1f')} → {line['p50_ms']:.1f} | {_fmt(line['bare_p99_ms'], '.1f')} → {line['p99_ms']:.1f} "
                f"| {_fmt(line['server_ms'], '.2f')} | {_fmt(line['preprocess_ms'], '.2f')} | {share} "
                f"| {_fmt(line['bare_encoder_compute_ms'], '.1f')} → {_fmt(line['encoder_compute_ms'], '.1f')} |")
    return out


def bs1_delta_ms(result: Mapping) -> float | None:
    served, ceiling = row_at(result.get("rows") or [], 1), row_at(result.get("ceiling") or [], 1)
    if served is None or ceiling is None:
        return None
    return (served["p50_us"] - ceiling["p50_us"]) / 1000


def plot(summary: Mapping, out_dir: Path, wanted: int = 4) -> list[Path]:
    """throughput_<model>.png (throughput vs concurrency, ceilings dashed) and latency_<model>.png (percentiles)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for model in summary.get("models", []):
        measured = [r for r in model.get("scenarios", []) if r.get("rows")]
        if not measured:
            continue
        fig, ax = plt.subplots(figsize=(8, 5))
        for i, res in enumerate(measured):
            color = f"C{i % 10}"
            rows = res["rows"]
            peers = [r["name"] for r in measured if is_peer(r)]
            style = (dict(color=("black", "dimgray", "gray")[peers.index(res["name"]) % 3], linewidth=2.2, marker="s")
                     if is_peer(res) else dict(color=color, marker="o"))
            ax.plot([r["concurrency"] for r in rows], [r["throughput"] for r in rows], "-", **style,
                    label=res["name"] + (" (onnxruntime backend)" if is_peer(res) else ""))
            if res.get("ceiling"):
                ceil = res["ceiling"]
                ax.plot([r["concurrency"] for r in ceil], [r["throughput"] for r in ceil], "x--", color=color, alpha=0.6,
                        label=f"{res['name']} (in-process)")
        ax.set_xticks(sorted({int(r["concurrency"]) for res in measured for r in res["rows"]}))
        ax.set_xlabel("concurrency (requests in flight, batch 1 each)")
        ax.set_ylabel("inferences / s")
        ax.set_title(f"{model['name']}: throughput vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = out_dir / f"throughput_{model['name']}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

        level = headline_concurrency(measured, wanted)
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
        names, width = [r["name"] for r in measured], 0.2
        for k, (key, label) in enumerate([("p50_us", "p50"), ("p90_us", "p90"), ("p95_us", "p95"), ("p99_us", "p99")]):
            values = [(row_at(r["rows"], level) or {}).get(key, float("nan")) / 1000 for r in measured]
            left.bar([i + (k - 1.5) * width for i in range(len(names))], values, width, label=label)
        left.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        left.set_ylabel("latency (ms)")
        left.set_title(f"latency percentiles at concurrency {level}")
        left.legend()
        left.grid(axis="y", alpha=0.3)
        for i, res in enumerate(measured):
            rows = res["rows"]
            right.plot([r["concurrency"] for r in rows], [r["p50_us"] / 1000 for r in rows], "o-", color=f"C{i % 10}", label=f"{res['name']} p50")
            right.plot([r["concurrency"] for r in rows], [r["p99_us"] / 1000 for r in rows], "^:", color=f"C{i % 10}", alpha=0.6)
        right.set_xticks(sorted({int(r["concurrency"]) for res in measured for r in res["rows"]}))
        right.set_xlabel("concurrency")
        right.set_ylabel("latency (ms): p50 solid, p99 dotted")
        right.set_title("latency vs concurrency")
        right.grid(alpha=0.3)
        right.legend(fontsize=7)
        fig.suptitle(model["name"])
        fig.tight_layout()
        path = out_dir / f"latency_{model['name']}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
