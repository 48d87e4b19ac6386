"""Static graph mode benchmark: what compiled buckets cost in memory, and what they buy in latency, on this CPU.

Owns two in-process measurements (no server) and their report:

1. Memory. A BERT-style model big enough that its weights dominate is compiled into 8 buckets (batch 1..8 at
   sequence 16). A fresh child process (this script, ``--child``) builds one way of serving 1 or 8 of those
   buckets, runs each bucket once, and reports its RSS increase: gebackend's OrtStaticEngine (weights shared
   through ``SessionOptions.add_initializer``), the same with ORT's weight prepacking off or its graph
   optimisations off, the same sharing done by hand on sessions loaded from a path instead of from bytes,
   plain unshared sessions (from a path and from bytes) and one dynamic OrtEngine. Every variant gets its own
   process so that allocator reuse between measurements cannot hide memory; the child runs with a fixed glibc
   mmap threshold so that large blocks freed (the compiled graphs, once sessions are built) go back to the OS,
   and also reports how many MiB of ONNX models Python still holds once the engine is built.
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
import gc
import json
import os
import platform
import subprocess
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
from onnx import numpy_helper

from gebackend.compile.pipeline import compile_static
from gebackend.config.options import BackendOptions
from gebackend.engines.onnxruntime import OrtEngine
from gebackend.compile.graph import CompiledGraph
from gebackend.engines.onnxruntime_static import SHARE_MIN_BYTES, OrtStaticEngine
from gebackend.modelzoo import build_add_mul, build_bert, build_resnet

Feeds = dict[str, np.ndarray]
MIB = 2**20

# ----------------------------------------------------------------------------------------------- memory

MEMORY_BERT = dict(vocab_size=30000, hidden=256, layers=4, heads=4, intermediate=1024, max_positions=128)
MEMORY_SEQUENCE = 16
MEMORY_BATCHES = tuple(range(1, 9))  # the compiled buckets: batch 1..8 at MEMORY_SEQUENCE
MEMORY_BUCKET_COUNTS = (1, 8)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # fixed threshold: freed large blocks leave RSS at once

MEMORY_MODES: dict[str, str] = {
    "static": "OrtStaticEngine (shared weights, model given to ORT as bytes)",
    "static_noprepack": "OrtStaticEngine + session.disable_prepacking=1",
    "static_noopt": "OrtStaticEngine + graph_optimization_level=disable",
    "shared_path": "shared weights by hand, sessions loaded from a path",
    "shared_path_noprepack": "shared weights by hand from a path + disable_prepacking",
    "unshared": "plain InferenceSession per bucket, from a path",
    "unshared_bytes": "plain InferenceSession per bucket, from bytes",
    "dynamic": "one dynamic OrtEngine, run at every bucket's shape",
}
QUICK_MEMORY_MODES = ("static", "static_noprepack", "shared_path", "unshared", "dynamic")


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / MIB


def memory_shapes(buckets: int) -> list[dict[str, tuple[int, int]]]:
    return [{"input_ids": (b, MEMORY_SEQUENCE), "attention_mask": (b, MEMORY_SEQUENCE)} for b in MEMORY_BATCHES[:buckets]]


def bert_feeds(shape: tuple[int, int], vocab_size: int, seed: int = 0) -> Feeds:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, vocab_size, size=shape, dtype=np.int64),
            "attention_mask": np.ones(shape, dtype=np.int64)}


def bucket_path(workdir: Path, batch: int) -> Path:
    return workdir / f"bucket_b{batch}.onnx"


def prepare_memory_models(workdir: Path) -> dict:
    """Save the memory model and its compiled buckets under `workdir`; return what its weights weigh."""
    model = build_bert(**MEMORY_BERT)
    onnx.save(model, workdir / "model.onnx")
    graphs, _ = compile_static(workdir / "model.onnx", memory_shapes(len(MEMORY_BATCHES)), BackendOptions().static.fold_size_limit)
    for batch, graph in zip(MEMORY_BATCHES, graphs):
        onnx.save(graph.model, bucket_path(workdir, batch))
    return weight_summary(graphs[0].model)


def weight_summary(model: onnx.ModelProto) -> dict:
    """Total initializer MiB and the part feeding MatMul/Gemm as B (what ORT prepacks on CPU)."""
    sizes = {init.name: numpy_helper.to_array(init).nbytes for init in model.graph.initializer}
    packed = {n.input[1] for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1}
    return {"weights_mib": sum(sizes.values()) / MIB,
            "shared_weights_mib": sum(s for s in sizes.values() if s >= SHARE_MIN_BYTES) / MIB,
            "matmul_weights_mib": sum(s for name, s in sizes.items() if name in packed) / MIB}


NO_PREPACKING = {"session.disable_prepacking": "1"}  # for the plain sessions; the engines take the options
NO_SPINNING = {"session.intra_op.allow_spinning": "0"}


def plain_options(entries: Mapping[str, str] | None = None, quiet: bool = True) -> ort.SessionOptions:
    """onnxruntime's default session options, plus `entries`; `quiet` logs errors only."""
    so = ort.SessionOptions()
    if quiet:
        so.log_severity_level = 3
    for key, value in (entries or {}).items():
        so.add_session_config_entry(key, value)
    return so


Runner = Callable[[Feeds], object]


@dataclass(frozen=True)
class Held:
    """One way of serving the buckets, as a child holds it: how to run it, and what must live as long."""

    run: Runner
    keep: object = None


def hold_static(workdir: Path, shapes, disable_prepacking: bool = False, level: str = "all") -> Held:
    graphs = [CompiledGraph(s, onnx.load(bucket_path(workdir, s["input_ids"][0]))) for s in shapes]
    engine = OrtStaticEngine(graphs, BackendOptions.make(graph_optimization_level=level, disable_prepacking=disable_prepacking))
    del graphs  # as the loader does: only what the engine itself keeps stays
    return Held(lambda feeds: engine.run(feeds, ["pooler_output"]))


def _add_shared_initializers(so: ort.SessionOptions, path: Path, shared: dict) -> None:
    """Hand `so` the weights of the graph at `path`, reusing the OrtValue of any equal weight seen before."""
    for init in onnx.load(path).graph.initializer:
        if init.ByteSize() < SHARE_MIN_BYTES:
            continue
        if init.name not in shared:
            array = numpy_helper.to_array(init)
            shared[init.name] = (array, ort.OrtValue.ortvalue_from_numpy(array))
        so.add_initializer(init.name, shared[init.name][1])


def hold_shared_path(workdir: Path, shapes, disable_prepacking: bool = False) -> Held:
    """The engine's weight sharing, but each session loaded from the graph's file instead of its bytes."""
    shared: dict = {}
    sessions = {}
    for s in shapes:
        path = bucket_path(workdir, s["input_ids"][0])
        so = plain_options(NO_PREPACKING if disable_prepacking else {})
        _add_shared_initializers(so, path, shared)
        sessions[s["input_ids"]] = ort.InferenceSession(str(path), so)
    return Held(lambda feeds: sessions[feeds["input_ids"].shape].run(None, feeds), keep=shared)


def hold_unshared(workdir: Path, shapes, from_bytes: bool = False) -> Held:
    sessions = {}
    for s in shapes:
        path = bucket_path(workdir, s["input_ids"][0])
        model = path.read_bytes() if from_bytes else str(path)
        sessions[s["input_ids"]] = ort.InferenceSession(model, plain_options())
    return Held(lambda feeds: sessions[feeds["input_ids"].shape].run(None, feeds))


def hold_dynamic(workdir: Path, shapes) -> Held:
    engine = OrtEngine(workdir / "model.onnx", BackendOptions())
    return Held(lambda feeds: engine.run(feeds, ["pooler_output"]))


HOLDERS: dict[str, Callable[[Path, list], Held]] = {
    "static": hold_static,
    "static_noprepack": lambda w, s: hold_static(w, s, disable_prepacking=True),
    "static_noopt": lambda w, s: hold_static(w, s, level="disable"),
    "shared_path": hold_shared_path,
    "shared_path_noprepack": lambda w, s: hold_shared_path(w, s, disable_prepacking=True),
    "unshared": hold_unshared,
    "unshared_bytes": lambda w, s: hold_unshared(w, s, from_bytes=True),
    "dynamic": hold_dynamic,
}


def warm_onnxruntime() -> None:
    """Pay ORT's one-time process costs (environment, kernel registries) before the baseline is taken."""
    session = ort.InferenceSession(build_add_mul().SerializeToString(), plain_options())
    x = np.zeros((1, 4), dtype=np.float32)
    session.run(None, {"x": x, "y": x})


def child_main(mode: str, buckets: int, workdir: Path) -> None:
    """Child process: RSS before and after building `mode` over `buckets` buckets and running each once."""
    warm_onnxruntime()
    shapes = memory_shapes(buckets)
    gc.collect()
    before = rss_mib()
    held = HOLDERS[mode](workdir, shapes)
    for shape in shapes:
        held.run(bert_feeds(shape["input_ids"], MEMORY_BERT["vocab_size"]))
    gc.collect()
    after = rss_mib()
    print(json.dumps({"mode": mode, "buckets": buckets, "rss_before_mib": before, "rss_delta_mib": after - before,
                      "live_model_proto_mib": live_model_proto_mib()}))


def live_model_proto_mib() -> float:
    """Serialized size of the ONNX models Python still holds: what keeping compiled graphs around costs."""
    return sum(o.ByteSize() for o in gc.get_objects() if isinstance(o, onnx.ModelProto)) / MIB


def measure_in_child(mode: str, buckets: int, workdir: Path) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--buckets", str(buckets),
               "--workdir", str(workdir)]
    done = subprocess.run(command, env={**os.environ, **MALLOC_ENV}, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"child {mode}/{buckets} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_memory(quick: bool, log: Callable[[str], None]) -> dict:
    modes = QUICK_MEMORY_MODES if quick else tuple(MEMORY_MODES)
    with tempfile.TemporaryDirectory(prefix="gebench-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        weights = prepare_memory_models(workdir)
        log(f"memory: model and {len(MEMORY_BATCHES)} buckets compiled in {time.perf_counter() - started:.1f}s, "
            f"weights {weights['weights_mib']:.1f} MiB")
        rows = []
        for mode in modes:
            measured = {n: measure_in_child(mode, n, workdir) for n in MEMORY_BUCKET_COUNTS}
            deltas = {n: m["rss_delta_mib"] for n, m in measured.items()}
            low, high = MEMORY_BUCKET_COUNTS
            rows.append({"mode": mode, "description": MEMORY_MODES[mode],
                         "rss_delta_mib": {str(n): d for n, d in deltas.items()},
                         "per_extra_bucket_mib": (deltas[high] - deltas[low]) / (high - low),
                         "live_model_proto_mib": {str(n): m["live_model_proto_mib"] for n, m in measured.items()}})
            log(f"memory: {mode:22s} " + "  ".join(f"{n} bucket(s) {d:7.1f} MiB" for n, d in deltas.items()))
    return {"model": {"builder": "build_bert", **MEMORY_BERT}, "sequence": MEMORY_SEQUENCE,
            "buckets": [f"batch {b} x seq {MEMORY_SEQUENCE}" for b in MEMORY_BATCHES], **weights, "rows": rows}


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


def memory_table(memory: dict) -> str:
    low, high = (str(n) for n in MEMORY_BUCKET_COUNTS)
    lines = [f"Memory: RSS increase of a fresh process (MiB); model weights {memory['weights_mib']:.1f} MiB, "
             f"of which MatMul/Gemm weights {memory['matmul_weights_mib']:.1f} MiB",
             "",
             f"| variant | what | {low} bucket | {high} buckets | per extra bucket | ONNX protos still held at {high} |",
             "|---|---|---:|---:|---:|---:|"]
    for row in memory["rows"]:
        d = row["rss_delta_mib"]
        lines.append(f"| {row['mode']} | {row['description']} | {d[low]:.1f} | {d[high]:.1f} | "
                     f"{row['per_extra_bucket_mib']:.1f} | {row['live_model_proto_mib'][high]:.1f} |")
    return "\n".join(lines)


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
    parser.add_argument("--child", choices=sorted(HOLDERS), help=argparse.SUPPRESS)
    parser.add_argument("--buckets", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child, args.buckets, args.workdir)
        return 0

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
