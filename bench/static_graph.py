"""Static graph mode benchmark: what compiled buckets cost in memory, and what they buy in latency, on this CPU.

Owns two in-process measurements (no server) and their report:

1. Memory (bench/static_graph_memory.py): the RSS one or eight buckets add, each way of serving them
   built in a fresh child process.
2. Latency. For the example-sized and a larger ResNet and BERT, at batch 1 and 8: plain onnxruntime
   (default options), gebackend's dynamic OrtEngine, OrtStaticEngine compiled for exactly that shape, and
   the same without prepacking, run round-robin so machine noise hits all alike. Every session runs with
   intra-op spinning off (``--spinning`` keeps ORT's default): otherwise the idle pools of the sessions just
   run keep spinning and steal cores from the one being timed. Ratios are reported, never asserted.

Writes ``static_graph.json`` and ``static_graph.png`` into ``--out`` and prints markdown tables.

    /work/main/.venv/bin/python bench/static_graph.py [--quick] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort
import psutil

from gebackend.compile.pipeline import compile_static
from gebackend.config.options import BackendOptions
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.engines.onnxruntime_static import OrtStaticEngine
from gebackend.modelzoo import build_bert, build_resnet

from static_graph_memory import (MEMORY_BUCKET_COUNTS, NO_SPINNING, Feeds, Runner,  # this folder: run as a script
                                 bert_feeds, memory_table, plain_options, run_memory)

# ---------------------------------------------------------------------------------------------- latency

LATENCY_SEQUENCE = 32
LATENCY_BATCHES = (1, 8)
VARIANTS = ("plain", "dynamic", "static", "static_noprepack")


@dataclass(frozen=True)
class LatencyModel:
    name: str
    label: str  # short, for the plot
    size: str  # "example" or "large": sets the minimum number of runs
    build: Callable[[], onnx.ModelProto]
    feeds: Callable[[int], Feeds]


def image_feeds(image_size: int) -> Callable[[int], Feeds]:
    def feeds(batch: int) -> Feeds:
        rng = np.random.default_rng(0)
        return {"image": rng.standard_normal((batch, 3, image_size, image_size), dtype=np.float32)}

    return feeds


def token_feeds(vocab_size: int) -> Callable[[int], Feeds]:
    return lambda batch: bert_feeds((batch, LATENCY_SEQUENCE), vocab_size)


LARGE_BERT = dict(hidden=256, layers=4, heads=4, intermediate=1024)
LATENCY_MODELS = (
    LatencyModel("resnet 64px", "resnet S", "example", build_resnet, image_feeds(64)),
    LatencyModel("bert", "bert S", "example", build_bert, token_feeds(1000)),
    LatencyModel("resnet w64 (2,2,2) 128px", "resnet L", "large",
                 lambda: build_resnet(width=64, blocks=(2, 2, 2), image_size=128), image_feeds(128)),
    LatencyModel("bert h256 L4", "bert L", "large", lambda: build_bert(**LARGE_BERT), token_feeds(1000)),
)


@dataclass(frozen=True)
class Budget:
    min_runs: dict[str, int]  # by LatencyModel.size
    max_runs: int
    seconds_per_case: float  # runs beyond the minimum, while they fit in this
    cap_seconds_per_case: float  # never more than this, even below the minimum (a loaded machine)
    warmup: int
    batches: dict[str, tuple[int, ...]]  # by LatencyModel.size


FULL_BUDGET = Budget({"example": 200, "large": 30}, max_runs=2000, seconds_per_case=15.0, cap_seconds_per_case=100.0,
                     warmup=5,
                     batches={"example": LATENCY_BATCHES, "large": LATENCY_BATCHES})
QUICK_BUDGET = Budget({"example": 20, "large": 3}, max_runs=300, seconds_per_case=1.5, cap_seconds_per_case=10.0,
                      warmup=1,
                      batches={"example": LATENCY_BATCHES, "large": LATENCY_BATCHES[:1]})


def build_variants(path: Path, feeds: Feeds, spinning: bool) -> dict[str, Runner]:
    """The four ways to run `path` at the shape of `feeds`; each returns every output.

    Without `spinning`, every session gets `session.intra_op.allow_spinning=0` and nothing else changed: run
    round-robin, the idle thread pools of the other variants' sessions would otherwise spin and steal the
    cores from the one being timed.
    """
    extra = {} if spinning else NO_SPINNING
    plain = ort.InferenceSession(str(path), plain_options(extra, quiet=False))  # onnxruntime's defaults
    names = [o.name for o in plain.get_outputs()]
    options = BackendOptions.make(allow_spinning="auto" if spinning else "off")
    shapes = [{name: array.shape for name, array in feeds.items()}]
    graphs, _ = compile_static(path, shapes, options.static.fold_size_limit)
    dynamic = OrtEngine(path, options)
    static = OrtStaticEngine(graphs, options)
    static_noprepack = OrtStaticEngine(graphs, options.replace(disable_prepacking=True))
    return {
        "plain": lambda f: plain.run(None, f),
        "dynamic": lambda f: dynamic.run(f, names),
        "static": lambda f: static.run(f, names),
        "static_noprepack": lambda f: static_noprepack.run(f, names),
    }


def check_agreement(runners: Mapping[str, Runner], feeds: Feeds) -> float:
    """Largest absolute difference of any variant's outputs from plain onnxruntime's."""
    reference = runners["plain"](feeds)
    worst = 0.0
    for runner in runners.values():
        for got, want in zip(runner(feeds), reference):
            worst = max(worst, float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want))))
    return worst


def time_round_robin(runners: Mapping[str, Runner], feeds: Feeds, runs: int) -> dict[str, list[float]]:
    """`runs` iterations; each runs every variant once, starting from a rotating variant. Milliseconds."""
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            started = time.perf_counter_ns()
            runners[name](feeds)
            times[name].append((time.perf_counter_ns() - started) / 1e6)
    return times


def planned_runs(runners: Mapping[str, Runner], feeds: Feeds, size: str, budget: Budget) -> int:
    """Warm every variant up, time one iteration, and fit the run count to the budget."""
    started = time.perf_counter()
    time_round_robin(runners, feeds, budget.warmup)
    per_iteration = (time.perf_counter() - started) / budget.warmup
    wanted = max(budget.min_runs[size], min(budget.max_runs, int(budget.seconds_per_case / per_iteration)))
    return max(3, min(wanted, int(budget.cap_seconds_per_case / per_iteration)))


def summarize(times: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    return {name: {"median_ms": float(np.median(t)), "p90_ms": float(np.percentile(t, 90))} for name, t in times.items()}


def ratios(stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    med = {name: s["median_ms"] for name, s in stats.items()}
    return {"static/dynamic": med["static"] / med["dynamic"],
            "dynamic/plain": med["dynamic"] / med["plain"],
            "noprepack/static": med["static_noprepack"] / med["static"]}


def measure_case(model: LatencyModel, path: Path, batch: int, budget: Budget, spinning: bool) -> dict:
    feeds = model.feeds(batch)
    runners = build_variants(path, feeds, spinning)
    max_abs_diff = check_agreement(runners, feeds)
    runs = planned_runs(runners, feeds, model.size, budget)
    stats = summarize(time_round_robin(runners, feeds, runs))
    return {"model": model.name, "label": model.label, "size": model.size, "batch": batch, "runs": runs,
            "below_minimum_runs": runs < budget.min_runs[model.size], "max_abs_diff": max_abs_diff,
            "stats": stats, "ratios": ratios(stats)}


def run_latency(quick: bool, spinning: bool, log: Callable[[str], None]) -> list[dict]:
    budget = QUICK_BUDGET if quick else FULL_BUDGET
    cases = []
    with tempfile.TemporaryDirectory(prefix="gebench-") as tmp:
        for model in LATENCY_MODELS:
            path = Path(tmp) / "model.onnx"
            onnx.save(model.build(), path)
            for batch in budget.batches[model.size]:
                started = time.perf_counter()
                case = measure_case(model, path, batch, budget, spinning)
                cases.append(case)
                r = case["ratios"]
                log(f"latency: {model.name} b{batch}: {case['runs']} runs in {time.perf_counter() - started:.1f}s, "
                    f"static/dynamic {r['static/dynamic']:.2f}, dynamic/plain {r['dynamic/plain']:.2f}, "
                    f"noprepack/static {r['noprepack/static']:.2f}, outputs agree to {case['max_abs_diff']:.1e}")
    return cases


# ----------------------------------------------------------------------------------------------- report


def latency_table(cases: list[dict], spinning: bool, env: Mapping) -> str:
    spin = "on (ORT default)" if spinning else "off in every variant"
    load = " -> ".join(f"{env[k][0]:.1f}" for k in ("load_average_at_start", "load_average_at_end"))
    lines = [f"Latency: median / p90 ms, variants run round-robin, intra-op spinning {spin}; ratios of medians; "
             f"{env['logical_cpus']} CPUs, 1-min load average {load}",
             "",
             "| model | batch | runs | plain | dynamic | static | static no-prepack | static/dynamic | dynamic/plain "
             "| noprepack/static |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cases:
        cells = [f"{c['stats'][v]['median_ms']:.3g} / {c['stats'][v]['p90_ms']:.3g}" for v in VARIANTS]
        r = c["ratios"]
        runs = f"{c['runs']}{'*' if c['below_minimum_runs'] else ''}"
        lines.append(f"| {c['model']} | {c['batch']} | {runs} | " + " | ".join(cells) +
                     f" | {r['static/dynamic']:.2f} | {r['dynamic/plain']:.2f} | {r['noprepack/static']:.2f} |")
    if any(c["below_minimum_runs"] for c in cases):
        lines += ["", "\\* fewer runs than the minimum: the case hit its time cap (a loaded machine)"]
    return "\n".join(lines)


def plot(memory: dict, cases: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem_ax, lat_ax) = plt.subplots(1, 2, figsize=(16, 6.5), gridspec_kw={"width_ratios": [1, 1.2]})
    rows = memory["rows"]
    x = np.arange(len(rows))
    width = 0.38
    for offset, n in zip((-width / 2, width / 2), MEMORY_BUCKET_COUNTS):
        values = [row["rss_delta_mib"][str(n)] for row in rows]
        bars = mem_ax.bar(x + offset, values, width, label=f"{n} bucket{'s' if n > 1 else ''}")
        mem_ax.bar_label(bars, fmt="%.0f", fontsize=8)
    mem_ax.axhline(memory["weights_mib"], color="black", linestyle=":", linewidth=1,
                   label=f"weights once ({memory['weights_mib']:.0f} MiB)")
    mem_ax.set_xticks(x, [row["mode"].replace("_", "\n") for row in rows], fontsize=8)
    mem_ax.set_ylabel("RSS increase (MiB)")
    mem_ax.set_title(f"Memory: BERT {memory['weights_mib']:.0f} MiB weights, buckets batch 1..N x seq {memory['sequence']}")
    mem_ax.legend(fontsize=8)

    labels = [f"{c['label']}\nbatch {c['batch']}" for c in cases]
    x = np.arange(len(cases))
    names = ("static/dynamic", "dynamic/plain", "noprepack/static")
    width = 0.27
    for i, name in enumerate(names):
        values = [c["ratios"][name] for c in cases]
        bars = lat_ax.bar(x + (i - 1) * width, [v - 1 for v in values], width, bottom=1.0, label=name)
        lat_ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7)
    lat_ax.axhline(1.0, color="black", linewidth=1)
    values = [c["ratios"][name] for c in cases for name in names]
    lat_ax.set_ylim(min(0.8, min(values) - 0.05), max(1.2, max(values) + 0.08))
    lat_ax.set_xticks(x, labels, fontsize=8)
    lat_ax.set_ylabel("ratio of median latencies (< 1: numerator faster)")
    lat_ax.set_title("Latency ratios on this CPU (round-robin, medians; S: example size, L: larger)")
    lat_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict:
    return {"python": platform.python_version(), "onnxruntime": ort.__version__, "onnx": onnx.__version__,
            "numpy": np.__version__, "platform": platform.platform(), "processor": platform.processor(),
            "logical_cpus": os.cpu_count(), "physical_cpus": psutil.cpu_count(logical=False),
            "load_average_at_end": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer memory variants, fewer runs, large models at batch 1 only")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="folder for the JSON and PNG")
    parser.add_argument("--spinning", action="store_true",
                        help="latency: keep ORT's intra-op spinning on (its default); round-robin then measures "
                             "the other sessions' spinning threads too")
    args = parser.parse_args(argv)

    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:5.0f}s] {message}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    memory = run_memory(args.quick, log)
    cases = run_latency(args.quick, args.spinning, log)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"quick": args.quick, "intra_op_spinning": args.spinning,
              "environment": {**environment(), "load_average_at_start": load_before}, "memory": memory, "latency": cases,
              "wall_s": time.perf_counter() - started}
    (args.out / "static_graph.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(memory, cases, args.out / "static_graph.png")
    print(memory_table(memory))
    print()
    print(latency_table(cases, args.spinning, result["environment"]))
    log(f"wrote {args.out / 'static_graph.json'} and {args.out / 'static_graph.png'} "
        f"in {result['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
