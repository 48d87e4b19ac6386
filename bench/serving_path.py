"""Where a served request's time goes under load, per batch: Triton's queue and batches, the hand-over to the backend's
process, gebackend's own work, the engine, and the time each process's threads spent waiting for a core.

For each configuration (the naive Python model, `ge` dynamic, `ge` with dynamic batching; resnet_small by default)
a fresh `gebackend serve` runs perf_analyzer at each --concurrency; around each run it reads

- Triton's statistics (`/v2/models/<m>/stats`): executions, the batch sizes its batcher formed, queue time per request,
  compute time per execution (`batch_stats`: from tritonserver handing a batch to the stub to its responses back);
- gebackend's phases (`gebackend_execute_seconds_total{phase}` on /metrics: read, prepare, engine, respond); what
  Triton's compute time counts beyond them is the hand-over between tritonserver and the stub (`transport`);
- each process's threads from /proc: how many, their CPU sets, their time on a core and their run-queue wait
  (`/proc/<pid>/task/*/schedstat`: the time runnable but not running, waiting for a core), per execution.

Rounds are interleaved (naive, ge, ge+batching, each --variant, naive, ...); medians are reported.

    .venv/bin/python bench/serving_path.py [--model resnet_small] [--concurrency 1,4] [--rounds 2] [--interval-ms 2000]
        [--variant nospin:allow_spinning=off ...]

Writes serving_path.json, serving_path.md and serving_path.png into --out (default bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import psutil

from gebackend.bench import perf_analyzer, scenarios, triton_stats
from gebackend.bench import server as bench_server
from gebackend.bench.runner import machine
from gebackend.modelzoo.bench_models import models as bench_models
from gebackend.runtime.phase_clock import PHASES

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("naive", "ge_dynamic", "ge_batching")


def our_phases(metrics_port: int, model: str) -> dict[str, float]:
    """gebackend's per-phase seconds and executions of `model` (zeros for a model it does not serve)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = dict.fromkeys((*PHASES, "executions"), 0.0)
    for line in text.splitlines():
        if f'model="{model}"' not in line:
            continue
        phase = re.search(r'^gebackend_execute_seconds_total\{.*phase="(\w+)"', line)
        if phase:
            found[phase.group(1)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gebackend_executions_total{"):
            found["executions"] = float(line.rsplit(" ", 1)[1])
    return found


def threads(root_pid: int) -> dict[str, dict]:
    """Per process of the server tree (the CLI, tritonserver, each stub): thread count, CPU sets, time on a core and
    run-queue wait (ns), summed over its threads."""
    out: dict[str, dict] = {}
    for process in [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]:
        try:
            name = process.name()
            if process.pid == root_pid:
                label = "cli"
            elif name == "tritonserver":
                label = "tritonserver"
            elif name.startswith("triton_python"):
                label = f"stub {process.pid}"
            else:
                continue
            ran, waited, cpus = 0, 0, set()
            tids = os.listdir(f"/proc/{process.pid}/task")
            for tid in tids:
                try:
                    fields = Path(f"/proc/{process.pid}/task/{tid}/schedstat").read_text().split()
                    ran, waited = ran + int(fields[0]), waited + int(fields[1])
                    cpus.add(tuple(sorted(os.sched_getaffinity(int(tid)))))
                except (OSError, IndexError, ValueError):
                    continue
            out[label] = {"threads": len(tids), "cpu_sets": sorted(cpus), "run_ns": ran, "wait_ns": waited}
        except (psutil.Error, OSError):
            continue
    return out


def batch_sizes(http_url: str, model: str) -> dict[int, int]:
    stats = triton_stats.fetch(http_url, model)
    sizes: dict[int, int] = {}
    for entry in stats.get("model_stats") or []:
        for batch in entry.get("batch_stats") or []:
            sizes[int(batch["batch_size"])] = sizes.get(int(batch["batch_size"]), 0) + int(
                (batch.get("compute_infer") or {}).get("count", 0))
    return sizes


def measure(config: str, scenario: scenarios.Scenario, model, onnx_path: Path, work: Path, binary: Path, concurrencies,
            interval_ms: int) -> list[dict]:
    repo = scenarios.write_repository(Path(tempfile.mkdtemp(prefix=f"{config}-", dir=work)), model, scenario, onnx_path)
    srv = bench_server.start(repo, repo / "serve.log")
    rows = []
    try:
        inputs = perf_analyzer.write_input_data(work / "inputs.json", model.sample_inputs(1))
        settings = perf_analyzer.PerfSettings(measurement_interval_ms=interval_ms, stability_percentage=40, max_trials=4)
        for level in concurrencies:
            stats0, ours0 = triton_stats.snapshot(srv.http_url, [model.name]), our_phases(srv.metrics_port, model.name)
            sizes0, threads0 = batch_sizes(srv.http_url, model.name), threads(srv.process.pid)
            (work / config).mkdir(exist_ok=True)
            perf = perf_analyzer.run(binary, model.name, srv.grpc_url, [level], work / config, settings, input_data=inputs,
                                     log=lambda line: None)
            time.sleep(1.2)  # gebackend publishes its metrics once a second
            diff = triton_stats.delta(stats0, triton_stats.snapshot(srv.http_url, [model.name]))[model.name]
            ours1, threads1 = our_phases(srv.metrics_port, model.name), threads(srv.process.pid)
            sizes1 = batch_sizes(srv.http_url, model.name)
            executions = max(1, diff["executions"])
            row = {"config": config, "concurrency": level,
                   "throughput": perf.rows[0].throughput if perf.rows else 0.0,
                   "executions": diff["executions"], "avg_batch": diff["inferences"] / executions,
                   "batch_sizes": {str(k): v - sizes0.get(k, 0) for k, v in sorted(sizes1.items()) if v - sizes0.get(k, 0)},
                   "queue_us_per_request": diff["queue_ns"] / 1000 / max(1, diff["requests"]),
                   "compute_us_per_batch": diff["busy_ns"] / 1000 / executions}
            ours = {phase: (ours1[phase] - ours0[phase]) * 1e6 / executions for phase in PHASES}
            served_by_us = ours1["executions"] - ours0["executions"] > 0
            row.update({f"{phase}_us_per_batch": ours[phase] if served_by_us else None for phase in PHASES})
            row["transport_us_per_batch"] = row["compute_us_per_batch"] - sum(ours.values()) if served_by_us else None
            row["core_wait_us_per_batch"] = {
                label: (entry["wait_ns"] - threads0.get(label, {}).get("wait_ns", 0)) / 1000 / executions
                for label, entry in threads1.items()}
            row["cpu_us_per_batch"] = {
                label: (entry["run_ns"] - threads0.get(label, {}).get("run_ns", 0)) / 1000 / executions
                for label, entry in threads1.items()}
            row["threads"] = {label: {"threads": e["threads"], "cpu_sets": e["cpu_sets"]} for label, e in threads1.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        srv.stop()
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    table = []
    for config in dict.fromkeys(r["config"] for r in rows):
        for level in sorted({r["concurrency"] for r in rows}):
            same = [r for r in rows if r["config"] == config and r["concurrency"] == level]
            if not same:
                continue

            def median(key):
                values = [r[key] for r in same if r[key] is not None]
                return statistics.median(values) if values else None

            def stubs(key):
                return statistics.median(sum(v for k, v in r[key].items() if k.startswith("stub")) for r in same)

            def server(key):
                return statistics.median(r[key].get("tritonserver", 0.0) for r in same)

            throughputs = [r["throughput"] for r in same]
            table.append({"config": config, "concurrency": level, "throughput": statistics.median(throughputs),
                          "spread": (max(throughputs) - min(throughputs)) / statistics.median(throughputs)
                          if statistics.median(throughputs) else 0.0,
                          **{key: median(key) for key in ("avg_batch", "queue_us_per_request", "compute_us_per_batch",
                                                          *(f"{p}_us_per_batch" for p in PHASES),
                                                          "transport_us_per_batch")},
                          "stub_cpu_us_per_batch": stubs("cpu_us_per_batch"),
                          "server_cpu_us_per_batch": server("cpu_us_per_batch"),
                          "stub_core_wait_us_per_batch": stubs("core_wait_us_per_batch"),
                          "server_core_wait_us_per_batch": server("core_wait_us_per_batch"),
                          "batch_sizes": same[-1]["batch_sizes"], "threads": same[-1]["threads"]})
    return table


def _us(value) -> str:
    return "–" if value is None else f"{value:.0f}"


def report(table: list[dict], meta: dict) -> str:
    lines = [f"# Serving path, per batch ({meta['model']})", "",
             f"Machine: {meta['machine']}. {meta['rounds']} round(s) interleaved, medians; perf_analyzer over gRPC, "
             f"{meta['interval_ms']} ms windows. Times in microseconds per batch Triton ran (queue: per request).", "",
             "| config | c | infer/s | spread | avg batch | queue | Triton compute | transport | read | prepare | engine "
             "| respond | stub CPU | tritonserver CPU | stub waiting for a core | tritonserver waiting for a core |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['config']} | {r['concurrency']} | {r['throughput']:.1f} | {r['spread']:.0%} | "
                     f"{r['avg_batch']:.2f} | {_us(r['queue_us_per_request'])} | {_us(r['compute_us_per_batch'])} | "
                     f"{_us(r['transport_us_per_batch'])} | {_us(r['read_us_per_batch'])} | "
                     f"{_us(r['prepare_us_per_batch'])} | {_us(r['engine_us_per_batch'])} | "
                     f"{_us(r['respond_us_per_batch'])} | {_us(r['stub_cpu_us_per_batch'])} | "
                     f"{_us(r['server_cpu_us_per_batch'])} | {_us(r['stub_core_wait_us_per_batch'])} | "
                     f"{_us(r['server_core_wait_us_per_batch'])} |")
    lines += ["", "Batch sizes Triton formed (last round) and threads per process:", ""]
    for r in table:
        threads_text = "; ".join(f"{label}: {e['threads']} threads on CPUs {e['cpu_sets']}" for label, e in r["threads"].items())
        lines.append(f"- {r['config']} c={r['concurrency']}: batches {r['batch_sizes']}; {threads_text}")
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ["transport", *PHASES]
    labels = [f"{r['config']}\nc={r['concurrency']}" for r in table]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(table)), 4))
    bottom = [0.0] * len(table)
    for part in parts:
        values = [r[f"{part}_us_per_batch"] or 0.0 for r in table]
        ax.bar(labels, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    naive = [r["compute_us_per_batch"] if r["read_us_per_batch"] is None else 0.0 for r in table]
    ax.bar(labels, naive, label="naive model (compute, not broken down)", color="lightgrey")
    ax.set_ylabel("µs per batch")
    ax.set_title("Where a batch's time goes (Triton's compute time, split)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet_small", help="a bench model (gebackend bench --list)")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="also `ge` dynamic with these config.pbtxt parameters, e.g. nospin:allow_spinning=off")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / "models")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model = bench_models(args.cache)[args.model]
    onnx_path = model.ensure(args.cache)
    binary = perf_analyzer.find_perf_analyzer()
    args.out.mkdir(parents=True, exist_ok=True)
    configs = {name: scenarios.SCENARIOS[name] for name in CONFIGS}
    for variant in args.variant:
        name, _, keys = variant.partition(":")
        options = tuple(tuple(item.split("=", 1)) for item in keys.split(",") if item)
        configs[name] = replace(scenarios.SCENARIOS["ge_dynamic"], name=name, options=options)
    rows = []
    with tempfile.TemporaryDirectory(prefix="serving-path-") as work:
        for _ in range(args.rounds):
            for name, scenario in configs.items():
                rows += measure(name, scenario, model, onnx_path, Path(work), binary, levels, args.interval_ms)
    meta = {"model": args.model, "machine": machine(), "rounds": args.rounds, "interval_ms": args.interval_ms,
            "concurrency": levels, "variants": args.variant}
    table = summarize(rows)
    (args.out / "serving_path.json").write_text(json.dumps({"meta": meta, "rows": rows, "table": table}, indent=1))
    text = report(table, meta)
    (args.out / "serving_path.md").write_text(text)
    plot(table, args.out / "serving_path.png")
    print(text)


if __name__ == "__main__":
    main()
