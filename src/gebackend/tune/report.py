"""What `gebackend tune` writes besides the winner's config.pbtxt: report.json, report.md and tune.png.

Every candidate is a row, whatever became of it: its config in words, throughput, p50 and p99 (medians over the
refining rounds where it was a finalist, else its screening window), the spread of the rounds, its cosine to
fp32, its status ("winner", "ok", "rejected: cosine X < Y", "pruned: ...", "over budget: ...", "skipped: time
budget", "failed: ..."), and its throughput over the baseline's (your config) and over the onnxruntime backend's
where measured. The report names the CPU (gebackend.bench.runner.machine()). Where the onnxruntime backend served more
than the winner in the same rounds, the report says so first, and what the measurements say of why (`peer_verdict`).
Where the winner runs another precision or engine than the backend's exact ONNX Runtime graph, it says how much of
its gain the engines give alone in process and how much the serving layout adds (`engine_verdict`): the bound a
further tune on this CPU cannot pass without a faster precision. Where the winner's instances were measured in process
with no server beside them (the ceiling), it says what share of that the winner serves and what the ceiling is
against the onnxruntime backend (`ceiling_verdict`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.tune.numerics_order import EXACT
from gebackend.tune.outcome import Outcome
from gebackend.tune.search import Search


#: In-process time of one request under which a Python backend's own per-request transport (Triton -> backend stub ->
#: Triton, 0.14-0.21 ms on the 2-vCPU machines bench/toll.py measured) weighs as much as what a faster graph wins.
TOLL_WEIGHS_MS = 2.0


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def row(o: Outcome, baseline: Outcome | None, peer: Outcome | None) -> dict:
    c = o.candidate
    return {
        "key": c.key, "kind": c.kind, "label": c.label, "choices": {k: v for k, v in c.choices().items()},
        "status": o.status, "throughput": o.throughput, "p50_ms": o.p50_ms, "p99_ms": o.p99_ms,
        "spread": o.spread, "rounds": len(o.rounds), "cosine": o.cosine, "startup_s": o.startup_s,
        "screen": None if o.screen is None else vars(o.screen),
        "round_measurements": [vars(m) for m in o.rounds],
        "x_baseline": _ratio(o.throughput, baseline.throughput if baseline else None),
        "x_onnxruntime_backend": _ratio(o.throughput, peer.throughput if peer else None),
    }


def peer_verdict(search: Search) -> str | None:
    """What the report says where Triton's onnxruntime backend served more than the winner in the same rounds: by how
    much, and what was measured that explains it (a model small enough for the Python backend's transport to weigh,
    faster precisions rejected by the accuracy guard, candidates left unmeasured). None where it did not."""
    peer, winner = search.reference("peer"), search.winner
    if peer is None or winner is None or not peer.throughput or not winner.throughput:
        return None
    if peer.throughput <= winner.throughput:
        return None
    spread = lambda o: "" if o.spread is None else f"{o.spread * 100:.0f} %"  # noqa: E731
    lines = [f"Triton's onnxruntime backend served {peer.throughput / winner.throughput:.2f}x the winner in the same "
             f"rounds (medians of {len(winner.rounds) or 1}; spread of the rounds: the backend "
             f"{spread(peer) or '–'}, the winner {spread(winner) or '–'}): no ge config measured here beats it for "
             f"this model on this CPU at this concurrency."]
    minimum = search.settings.min_cosine
    accepted = {key: c for key, c in search.checks.items() if c.run_ms is not None and c.cosine >= minimum}
    if accepted:
        (engine, rung), fastest = min(accepted.items(), key=lambda item: item[1].run_ms)  # (engine, rung name)
        if fastest.run_ms <= TOLL_WEIGHS_MS:
            lines.append(f"One request computes in {fastest.run_ms:.2f} ms in process ({engine} {rung}, the "
                         f"fastest accepted precision): at that size a Python backend's own transport of each request "
                         f"(Triton -> backend stub -> Triton, 0.14-0.21 ms on the 2-vCPU machines measured: "
                         f"docs/tuning.md, *The toll of a Python backend*) weighs as much as a faster graph wins, and "
                         f"Triton's C++ backend does not pay it. Serving this model on the onnxruntime backend is the "
                         f"faster choice here.")
    own = search.checks.get(winner.candidate.numerics)
    own_ms = own.run_ms if own is not None else None
    faster = [] if own_ms is None else sorted(
        (c.run_ms, engine, rung, c.cosine) for (engine, rung), c in search.checks.items()
        if c.cosine < minimum and c.run_ms is not None and c.run_ms < own_ms)
    if faster:
        lines.append("Faster in process than the winner's precision but under --min-cosine " f"{minimum}, so not served: "
                     + ", ".join(f"{e} {r} ({t:.2f} ms, cosine {cos:.6f})" for t, e, r, cos in faster)
                     + "; a lower --min-cosine measures them where that accuracy suits you.")
    skipped = sum(o.status.startswith("skipped") for o in search.outcomes)
    if skipped:
        lines.append(f"{skipped} candidate(s) were not measured within the time budget: a longer --time-budget-min"
                     + (" (or a tune without --quick)" if search.settings.quick else "") + " measures them.")
    return " ".join(lines)


def engine_verdict(search: Search) -> str | None:
    """The winner's precision against ONNX Runtime's exact graph (the onnxruntime backend's engine) as the accuracy
    guard timed them in process, beside the served ratio to the backend where it was measured. None where the winner
    is the exact ONNX Runtime graph or either was not timed."""
    winner = search.winner
    if winner is None or winner.candidate.numerics == EXACT:
        return None
    own, exact = search.checks.get(winner.candidate.numerics), search.checks.get(EXACT)
    if own is None or exact is None or not own.run_ms or not exact.run_ms:
        return None
    engines = exact.run_ms / own.run_ms
    engine, rung = winner.candidate.numerics
    line = (f"In process, one request at a time on all cores (the accuracy guard's timing): {engine} {rung} "
            f"{own.run_ms:.2f} ms, ONNX Runtime's exact graph (the onnxruntime backend's engine and precision) "
            f"{exact.run_ms:.2f} ms: the engines alone give {engines:.2f}x.")
    peer = search.reference("peer")
    if peer is not None and peer.throughput and winner.throughput:
        served = winner.throughput / peer.throughput
        what = ("instances, pinning, batching and cutting your requests' padding (which the onnxruntime backend "
                "computes)" if winner.candidate.scenario.trim_padding else "instances, pinning and batching")
        line += (f" Served, the winner is {served:.2f}x the onnxruntime backend, {served / engines:.2f}x the engines' "
                 f"ratio: what {what} add or lose.")
    return line + (" More than that on this CPU needs a precision that computes faster than "
                   f"{engine} {rung} within --min-cosine {search.settings.min_cosine}.")


def ceiling_verdict(search: Search, ceiling: float | None) -> str | None:
    """The winner's served throughput against what its instances compute in process with nothing else running
    (`ceiling`, infer/s: BenchMeasurer.ceiling), and that ceiling against the onnxruntime backend where measured."""
    winner = search.winner
    if winner is None or not ceiling or not winner.throughput:
        return None
    line = (f"With no server beside them, the winner's instances compute {ceiling:.1f} infer/s in process at "
            f"concurrency {search.settings.concurrency} (pinned as served): served, it reaches "
            f"{100 * winner.throughput / ceiling:.0f} % of that.")
    peer = search.reference("peer")
    if peer is not None and peer.throughput:
        line += (f" That ceiling is {ceiling / peer.throughput:.2f}x the onnxruntime backend: the most this "
                 "precision and layout can give here, however it is served.")
    return line


def summary(search: Search, meta: Mapping, reasons: Mapping[str, str], config_text: str | None,
            ceiling: float | None = None) -> dict:
    baseline, peer = search.reference("baseline"), search.reference("peer")
    return {
        "meta": dict(meta, notes=list(search.notes), interrupted=search.interrupted),
        "winner": search.winner.candidate.key if search.winner else None,
        "peer_verdict": peer_verdict(search),
        "engine_verdict": engine_verdict(search),
        "ceiling": ceiling,
        "ceiling_verdict": ceiling_verdict(search, ceiling),
        "reasons": dict(reasons),
        "references": [row(o, baseline, peer) for o in search.references],
        "candidates": [row(o, baseline, peer) for o in search.outcomes],
        "config": config_text,
    }


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown(data: Mapping) -> str:
    meta = data["meta"]
    out = [f"# gebackend tune — {meta.get('model')} — {meta.get('started')}", "",
           f"- machine: {meta.get('machine')}",
           f"- model folder: {meta.get('model_dir')}; concurrency {meta.get('concurrency')} (batch 1 per request, gRPC)",
           f"- time budget {meta.get('time_budget_s', 0) / 60:g} min, used {meta.get('duration_s', 0):.0f} s; "
           f"min cosine {meta.get('min_cosine')}; latency budget "
           + (f"p99 ≤ {meta['latency_budget_ms']:g} ms" if meta.get("latency_budget_ms") else "none"),
           f"- perf_analyzer windows: screening {meta.get('screen')}, refining {meta.get('refine')}"]
    if meta.get("in_process_requests"):
        out.append(f"- requests: {meta.get('input_data')}; in process (the accuracy guard's cosine and timings, the "
                   f"winner's ceiling): {meta['in_process_requests']}"
                   + ("; static int8 calibrated on them" if meta.get("calibration") else ""))
    out += [f"- {note}" for note in meta.get("notes") or []]
    winner = next((r for r in data["candidates"] if r["key"] == data.get("winner")), None)
    out.append("")
    if winner:
        out += [f"**Winner: {winner['label']}** — {_fmt(winner['throughput'], '.1f')} infer/s, p99 "
                f"{_fmt(winner['p99_ms'], '.2f')} ms, {_fmt(winner['x_baseline'], '.2f', 'x')} your config"
                + (f", {_fmt(winner['x_onnxruntime_backend'], '.2f', 'x')} the onnxruntime backend"
                   if winner.get("x_onnxruntime_backend") else "") + ".", ""]
        if winner["x_baseline"] is not None and winner["x_baseline"] < 1:
            out += ["Your config measured faster than every candidate: keep it (`--apply` leaves it).", ""]
        if data.get("peer_verdict"):
            out += [data["peer_verdict"], ""]
        if data.get("engine_verdict"):
            out += [data["engine_verdict"], ""]
        if data.get("ceiling_verdict"):
            out += [data["ceiling_verdict"], ""]
        out += ["Why each choice (the winner over the best candidate measured with the other value):", ""]
        out += [f"- {dim}: {text}" for dim, text in data.get("reasons", {}).items()]
        out.append("")
    else:
        out += ["**No winner**: no candidate was measured within the budgets.", ""]
    out += ["Throughput in inferences/s and latencies in ms: medians over the refining rounds (`rounds`; spread = "
            "(max − min) / median), else the one screening window. × your config / × onnxruntime backend: "
            "throughput over theirs.", "",
            "| candidate | config | throughput | p50 | p99 | rounds | spread | cosine | status | × your config "
            "| × onnxruntime backend |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in [*data["references"], *data["candidates"]]:
        name = f"**{r['key']}**" if r["key"] == data.get("winner") else r["key"]
        out.append(f"| {name} | {r['label']} | {_fmt(r['throughput'], '.1f')} | {_fmt(r['p50_ms'], '.2f')} "
                   f"| {_fmt(r['p99_ms'], '.2f')} | {r['rounds'] or '–'} | {_fmt(None if r['spread'] is None else r['spread'] * 100, '.0f', '%')} "
                   f"| {_fmt(r['cosine'], '.6f')} | {r['status']} | {_fmt(r['x_baseline'], '.2f', 'x')} "
                   f"| {_fmt(r['x_onnxruntime_backend'], '.2f', 'x')} |")
    if data.get("config"):
        out += ["", "The winner's config.pbtxt:", "", "```", data["config"].rstrip(), "```"]
    return "\n".join(out) + "\n"


def plot(data: Mapping, path: Path) -> Path | None:
    """tune.png: throughput vs p99 of every measured candidate, the winner starred, the references squared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in [*data["references"], *data["candidates"]] if r["throughput"] and r["p99_ms"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups: dict[str, list[Mapping]] = {}
    for r in rows:
        group = r["kind"] if r["kind"] != "candidate" else r["status"].split(":")[0]
        groups.setdefault(group, []).append(r)
    styles = {"winner": dict(marker="*", s=260, color="gold", edgecolors="black", zorder=5),
              "baseline": dict(marker="s", s=90, color="tab:blue", edgecolors="black", zorder=4),
              "peer": dict(marker="s", s=90, color="black", zorder=4),
              "ok": dict(marker="o", s=45, color="tab:green"), "pruned": dict(marker="x", s=45, color="tab:gray"),
              "over budget": dict(marker="^", s=55, color="tab:red")}
    names = {"baseline": "your config", "peer": "onnxruntime backend"}
    for group, members in groups.items():
        ax.scatter([r["p99_ms"] for r in members], [r["throughput"] for r in members],
                   label=names.get(group, group), **styles.get(group, dict(marker="o", s=40, color="tab:purple")))
    for r in rows:
        ax.annotate(r["key"], (r["p99_ms"], r["throughput"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    budget = data["meta"].get("latency_budget_ms")
    if budget:
        ax.axvline(budget, color="tab:red", linestyle="--", alpha=0.6, label=f"latency budget {budget:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("inferences / s")
    ax.set_title(f"{data['meta'].get('model')}: throughput vs p99 at concurrency {data['meta'].get('concurrency')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(out: Path, data: Mapping) -> None:
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(markdown(data))
    plot(data, out / "tune.png")


__all__: Sequence[str] = ["ceiling_verdict", "engine_verdict", "markdown", "plot", "row", "summary", "write"]
