"""ONNX Runtime tuning measurements behind gebackend's defaults: disabled optimizers, dim overrides, precision.

In-process, no server. Every variant is a session over the same model and the same feed; variants run
round-robin (the order reversed every other round) so machine noise hits all alike, and each session runs
with intra-op spinning off (an idle spinning pool steals cores from the session being timed). Two clocks:

* wall time with `--threads` intra-op threads (default 2: this machine's cores);
* CPU time of the calling thread with 1 intra-op thread (ORT then runs every kernel on the calling thread),
  which a noisy neighbour on a shared machine disturbs far less than wall time.

Variants for the static text encoder (`--what static`):
    dynamic             the file as given, dims symbolic (ORT does not fuse SkipLayerNormalization here)
    override            the file as given, dims fixed by SessionOptions.add_free_dimension_override_by_name
    static              gebackend's static graph: specialised and folded (compile/pipeline.py)
    static+override     the same plus the overrides (nothing left to override: expected equal)
    ...-noSLN           the same with disabled_optimizers=["SkipLayerNormFusion"]
Every variant gets `--replicas` sessions, timed alike: two sessions over one graph can differ by ~10%
(memory layout), so a difference smaller than the spread of the replica medians is noise.
The kernel itself (`--what sln-kernel`): a graph of one Add + LayerNormalization on [batch, sequence, hidden]
(`--hidden`), which ORT fuses into SkipLayerNormalization unless SkipLayerNormFusion is disabled; fused vs
unfused, CPU time of 1 thread. Kernels of ~0.1 ms run thousands of times, so this is the robust measurement
on a noisy machine; the model-level one shows the same direction inside a ~10% noise band.
Variants for precision (`--what precision`): fp32, int8 (dynamic, QInt8 weights, MatMul/Gemm only),
int8-all (Conv too), int8-uint8, fp16 (keep_io_types).

    .venv/bin/python bench/ort_tuning.py --what static --runs 200
    .venv/bin/python bench/ort_tuning.py --what sln-kernel --runs 2000 --clock cpu --replicas 3
    .venv/bin/python bench/ort_tuning.py --what precision --runs 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from gebackend.compile.pipeline import compile_static
from gebackend.modelzoo import build_bert, build_resnet

SLN = ["SkipLayerNormFusion"]


def _session(src, threads: int, disabled=(), overrides=None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for name, value in (overrides or {}).items():
        so.add_free_dimension_override_by_name(name, value)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))


def _time(variants: dict, feeds: dict, runs: int, clock) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Round-robin runs of every session; per variant all times, and the median of each replica session."""
    sessions = [(name, replica) for name, replicas in variants.items() for replica in replicas]
    for _, session in sessions:
        for _ in range(5):
            session.run(None, feeds)
    times: list[list[float]] = [[] for _ in sessions]
    order = list(range(len(sessions)))
    for number in range(runs):
        for i in (order if number % 2 == 0 else order[::-1]):
            start = clock()
            sessions[i][1].run(None, feeds)
            times[i].append(clock() - start)
    pooled: dict[str, list[float]] = {name: [] for name in variants}
    per_replica: dict[str, list[float]] = {name: [] for name in variants}
    for (name, _), values in zip(sessions, times):
        pooled[name] += values
        per_replica[name].append(statistics.median(values))
    return pooled, per_replica


def _table(title: str, measured, base: str) -> list[dict]:
    times, per_replica = measured
    rows = []
    reference = statistics.median(times[base])
    print(f"\n{title}\n| variant | median ms | p25 | p75 | replica medians ms | speed vs {base} |\n|---|---|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        p25, p75 = np.percentile(values, [25, 75])
        replicas = [m * 1e3 for m in per_replica[name]]
        rows.append({"variant": name, "median_ms": median * 1e3, "p25_ms": p25 * 1e3, "p75_ms": p75 * 1e3,
                     "replica_medians_ms": replicas, "speed_vs_base": reference / median - 1})
        print(f"| {name} | {median * 1e3:.3f} | {p25 * 1e3:.3f} | {p75 * 1e3:.3f} | "
              f"{' '.join(f'{r:.2f}' for r in replicas)} | {reference / median - 1:+.1%} |")
    return rows


def _static_variants(threads: int, batch: int, sequence: int, replicas: int) -> tuple[dict, dict]:
    model = build_bert(hidden=256, layers=4, heads=4, intermediate=1024)
    folder = Path(tempfile.mkdtemp(prefix="ort-tuning-"))
    path = folder / "bert.onnx"
    onnx.save(model, str(path))
    shapes = {i.name: (batch, sequence) for i in model.graph.input}
    static = compile_static(path, [shapes], 1 << 20)[0][0].model.SerializeToString()
    overrides = {"batch": batch, "sequence": sequence}
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.integers(0, 100, (batch, sequence)).astype(np.int64) for i in model.graph.input}
    recipes = {
        "dynamic": (str(path), (), None),
        "override": (str(path), (), overrides),
        "override-noSLN": (str(path), SLN, overrides),
        "static": (static, (), None),
        "static-noSLN": (static, SLN, None),
        "static+override": (static, (), overrides),
    }
    variants = {name: [_session(src, threads, dis, ov) for _ in range(replicas)] for name, (src, dis, ov) in recipes.items()}
    return variants, feeds


def _sln_kernel_variants(threads: int, batch: int, sequence: int, hidden: int, replicas: int) -> tuple[dict, dict]:
    from onnx import TensorProto, helper, numpy_helper

    shape = [batch, sequence, hidden]
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "skip"], ["sum"]),
         helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12)],
        "add_layernorm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("skip", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
         numpy_helper.from_array(np.zeros(hidden, np.float32), "beta")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "skip")}
    variants = {"fused (SkipLayerNormalization)": [_session(model, threads) for _ in range(replicas)],
                "unfused (Add + LayerNormalization)": [_session(model, threads, SLN) for _ in range(replicas)]}
    return variants, feeds


def _precision_variants(model_name: str, threads: int, batch: int, replicas: int) -> tuple[dict, dict]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = build_bert(hidden=256, layers=4, heads=4, intermediate=1024) if model_name == "bert" else build_resnet()
    folder = Path(tempfile.mkdtemp(prefix="ort-precision-"))
    path = folder / "fp32.onnx"
    onnx.save(model, str(path))
    sources = {"fp32": str(path)}
    for label, weight, ops in (("int8", QuantType.QInt8, ["MatMul", "Gemm"]), ("int8-all", QuantType.QInt8, None),
                               ("int8-uint8", QuantType.QUInt8, ["MatMul", "Gemm"])):
        out = folder / f"{label}.onnx"
        quantize_dynamic(str(path), str(out), weight_type=weight, op_types_to_quantize=ops)
        sources[label] = str(out)
    sources["fp16"] = convert_float_to_float16(model, keep_io_types=True).SerializeToString()
    variants = {name: [_session(src, threads) for _ in range(replicas)] for name, src in sources.items()}
    rng = np.random.default_rng(0)
    if model_name == "bert":
        feeds = {i.name: rng.integers(0, 100, (batch, 32)).astype(np.int64) for i in model.graph.input}
    else:
        feeds = {model.graph.input[0].name: rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    return variants, feeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", choices=["static", "sln-kernel", "precision"], default="static")
    parser.add_argument("--model", choices=["bert", "resnet"], default="bert", help="for --what precision")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256, help="for --what sln-kernel")
    parser.add_argument("--replicas", type=int, default=2,
                        help="sessions per variant: two sessions of one graph can differ by ~10%% (memory layout)")
    parser.add_argument("--variants", help="comma-separated: only these variants (e.g. static,static-noSLN)")
    parser.add_argument("--clock", choices=["wall", "cpu", "both"], default="both")
    parser.add_argument("--json", type=Path, help="also write the tables as JSON here")
    args = parser.parse_args(argv)
    results = {}
    clocks = [c for c in (("wall", args.threads, time.perf_counter), ("cpu", 1, time.thread_time))
              if args.clock in (c[0], "both")]
    for label, threads, clock in clocks:
        if args.what == "static":
            variants, feeds = _static_variants(threads, args.batch, args.sequence, args.replicas)
            base = "dynamic"
        elif args.what == "sln-kernel":
            variants, feeds = _sln_kernel_variants(threads, args.batch, args.sequence, args.hidden, args.replicas)
            base = "fused (SkipLayerNormalization)"
        else:
            variants, feeds = _precision_variants(args.model, threads, args.batch, args.replicas)
            base = "fp32"
        if args.variants:
            wanted = [v.strip() for v in args.variants.split(",")]
            variants = {k: v for k, v in variants.items() if k in wanted}
            base = base if base in variants else next(iter(variants))
        subject = {"precision": args.model, "static": "bert", "sln-kernel": f"[{args.batch},{args.sequence},{args.hidden}]"}
        title = (f"{args.what} {subject[args.what]} batch {args.batch}: "
                 f"{label} time, {threads} intra-op thread(s), median of {args.runs} interleaved runs "
                 f"x {args.replicas} session(s) per variant")
        results[label] = _table(title, _time(variants, feeds, args.runs, clock), base)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
