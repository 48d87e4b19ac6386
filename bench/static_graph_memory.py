"""Static graph mode benchmark, part 1: what compiled buckets cost in memory (run by bench/static_graph.py).

A BERT-style model big enough that its weights dominate is compiled into 8 buckets (batch 1..8 at sequence 16).
A fresh child process (this module, ``--child``) builds one way of serving 1 or 8 of those buckets, runs each
bucket once, and reports its RSS increase: gebackend's OrtStaticEngine (weights shared through
``SessionOptions.add_initializer``), the same with ORT's weight prepacking off or its graph optimisations off,
the same sharing done by hand on sessions loaded from a path instead of from bytes, plain unshared sessions
(from a path and from bytes) and one dynamic OrtEngine. Every variant gets its own process so that allocator
reuse between measurements cannot hide memory; the child runs with a fixed glibc mmap threshold so that large
blocks freed (the compiled graphs, once sessions are built) go back to the OS, and also reports how many MiB of
ONNX models Python still holds once the engine is built. Also owns the helpers the latency part shares (plain
session options, BERT feeds).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
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
from gebackend.modelzoo import build_add_mul, build_bert

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


def main(argv: list[str] | None = None) -> int:
    """The child process's entry: ``--child MODE --buckets N --workdir DIR`` prints one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=sorted(HOLDERS), required=True)
    parser.add_argument("--buckets", type=int, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    child_main(args.child, args.buckets, args.workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
