"""How much faster than fp32 each lower-precision rung runs on this CPU: its kernels and whole models, measured.

The peer (Triton's onnxruntime backend) runs a model's fp32 graph on ONNX Runtime's kernels. A rung beats it by
running the same products (matrix products, convolutions) on faster kernels: int8 (ONNX Runtime's dynamic or static
quantization, OpenVINO through NNCF), or bf16/fp16 where OpenVINO's CPU plugin reports them. How much faster those
kernels are than fp32 is a property of the CPU: with VNNI an int8 dot product does 4 multiply-adds in one
instruction where fp32 does one; on AVX2 without it the u8*s8 instruction adds pairs into a saturating int16 and
needs two more instructions to finish the sum.

Measured here, one thread (one core: what each pinned instance has), in rounds interleaved across the rungs:

1. kernels: transformer products (197 tokens x 768 -> 768, as a ViT-B/16 layer's projections; 256 x 768 -> 3072, a
   feed-forward layer), a ResNet 3x3 convolution (256 channels, 28 px) and a 1x1 one (1024 -> 256, 14 px), in
   operations a second (2 per multiply-add), fp32 on ONNX Runtime (the peer's kernels) and every rung `gebackend
   tune` would try on this machine (tune/space.py's table: bf16/fp16 only where OpenVINO reports them).
   Each rung is made by the backend's own lowering (compile/precision.py, compile/quantize_static.py) from the fp32
   kernel model, as a served model's is.
2. models (`--models`, bench models in bench/models: `python -m gebackend.modelzoo.bench_models NAME`): each rung's time
   for one input, × ONNX Runtime fp32, its operations a second (gebackend.bench.flops) and how that compares with
   its kernels' (the products at the kernel rates over the measured time: near or above 100 %, the model runs as
   fast as its kernels do alone and only faster kernels make it faster).

Served, a rung's × the peer is about its × ONNX Runtime fp32 here, times how far the peer's serving falls short of
its engine's in-process speed (the server's per-request work is paid by both; batching and pinning help both): so
where no kernel of any rung runs N times ONNX Runtime's fp32, a target of N × the peer is out of reach on that CPU.

Writes precision_gain.json, precision_gain.md and precision_gain.png into --out, names the CPU, prints the tables.
Never asserted anywhere.

    .venv/bin/python bench/precision_gain.py [--models resnet50,cnclip_text_l4,cnclip_image_l4] [--rounds 5]
                                            [--seconds 1.0] [--out bench/results/precision_gain]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gebackend.bench import flops
from gebackend.bench.inprocess import median_seconds
from gebackend.modelzoo.bench_models import DEFAULT_CACHE, models as bench_models
from gebackend.bench.runner import machine
from gebackend.compile.calibration import random_samples
from gebackend.compile.precision import lower_precision
from gebackend import cpu
from gebackend.engines import registry
from gebackend.tune import space
from gebackend.tune.space import PrecisionRung
from gebackend.tune.tuner import capabilities, installed_engines

REFERENCE = "onnxruntime origin"  # the key of the peer's kernels (`_key`)
OPENVINO_HINTS = {"bf16": "bf16", "fp16": "f16"}  # precision_mode -> OpenVINO's inference precision (else f32)
KERNELS = {  # name: (class, input dims, weight dims, conv pads or None)
    "matmul 197x768x768": ("matmul", (197, 768), (768, 768), None),
    "matmul 256x768x3072": ("matmul", (256, 768), (768, 3072), None),
    "conv3x3 256ch 28px": ("conv", (1, 256, 28, 28), (256, 256, 3, 3), (1, 1, 1, 1)),
    "conv1x1 1024->256 14px": ("conv", (1, 1024, 14, 14), (256, 1024, 1, 1), (0, 0, 0, 0)),
}
CALIBRATION_SAMPLES = 32


def kernel_model(name: str) -> onnx.ModelProto:
    kind, x_dims, w_dims, pads = KERNELS[name]
    weight = numpy_helper.from_array(
        (np.random.default_rng(0).standard_normal(w_dims) / np.sqrt(np.prod(w_dims[1:]) or 1)).astype(np.float32), "w")
    node = (helper.make_node("MatMul", ["x", "w"], ["y"]) if kind == "matmul"
            else helper.make_node("Conv", ["x", "w"], ["y"], pads=list(pads)))
    graph = helper.make_graph([node], "kernel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def available_rungs() -> list[tuple[str, PrecisionRung]]:
    """The (engine, rung) pairs `gebackend tune` would try on this machine (tune/space.py's table and rules: OpenVINO's
    only where it is installed, bf16/fp16 where its CPU plugin reports them)."""
    engines = installed_engines()
    return space.numerics(engines, capabilities(engines))


def lowered(path: Path, rung: tuple[str, PrecisionRung], folder: Path) -> Path:
    """The model file the rung runs, made as the backend makes it (only int8 rewrites the file)."""
    engine, precision = rung
    if precision.precision_mode != "int8":
        return path
    quantization = dict(precision.parameters).get("quantization", "dynamic")
    samples = random_samples(path, CALIBRATION_SAMPLES) if quantization == "static" else None
    return lower_precision(path, "int8", folder, quantization=quantization,
                           quantizer=registry.kind(engine).static_quantizer, samples=samples,
                           out_name=f"{path.stem}.{engine}.{precision.name}.onnx")


def runner(path: Path, rung: tuple[str, PrecisionRung]):
    """A callable running one feed on one thread with the rung's engine."""
    engine, precision = rung
    if engine == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    import openvino

    hint = OPENVINO_HINTS.get(precision.precision_mode, "f32")
    compiled = openvino.Core().compile_model(str(path), "CPU", {
        "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": hint})
    request = compiled.create_infer_request()
    return lambda feeds: request.infer(feeds)


def measure(runners: dict, feeds: dict, rounds: int, seconds: float) -> dict[str, dict]:
    """Per runner: the median seconds a run and the spread of the rounds' medians, rounds interleaved."""
    per_round: dict[str, list[float]] = {key: [] for key in runners}
    for run in runners.values():
        run(feeds)
    for _ in range(rounds):
        for key, run in runners.items():
            per_round[key].append(median_seconds(lambda: run(feeds), seconds))
    return {key: {"seconds": statistics.median(v), "spread": (max(v) - min(v)) / statistics.median(v),
                  "rounds": v} for key, v in per_round.items()}


def _key(rung: tuple[str, PrecisionRung]) -> str:
    engine, precision = rung
    return f"{engine} {precision.name}"


def _prepare(path: Path, rungs: list[tuple[str, PrecisionRung]], folder: Path, log) -> dict:
    made = {}
    for rung in rungs:
        try:
            made[_key(rung)] = runner(lowered(path, rung, folder), rung)
        except Exception as exc:  # noqa: BLE001 - a rung that cannot be made here is reported, the rest go on
            log(f"  {_key(rung)}: not measured: {type(exc).__name__}: {str(exc)[:200]}")
    return made


def measure_kernels(rungs: list[tuple[str, PrecisionRung]], folder: Path, rounds: int, seconds: float,
                    log) -> dict[str, dict]:
    """Per kernel: its class, operations and, per rung, operations a second (with the spread of its rounds)."""
    result = {}
    for name, (kind, x_dims, _, _) in KERNELS.items():
        model = kernel_model(name)
        path = folder / f"{name.split()[0]}{len(result)}.onnx"
        onnx.save(model, str(path))
        ops = flops.count(model).total
        log(f"kernel {name}: {ops / 1e9:.2f} G operations")
        feeds = {"x": np.random.default_rng(1).standard_normal(x_dims).astype(np.float32)}
        timed = measure(_prepare(path, rungs, folder, log), feeds, rounds, seconds)
        result[name] = {"class": kind, "operations": ops,
                        "rates": {k: {"ops_per_s": ops / v["seconds"], "spread": v["spread"]} for k, v in timed.items()}}
    return result


def class_rates(kernels: dict) -> dict[str, dict[str, float]]:
    """Per rung, per class: the best rate of that class's kernels (an upper bound for the model's products)."""
    rates: dict[str, dict[str, float]] = {}
    for kernel in kernels.values():
        for key, rate in kernel["rates"].items():
            best = rates.setdefault(key, {})
            best[kernel["class"]] = max(best.get(kernel["class"], 0.0), rate["ops_per_s"])
    return rates


def measure_models(names: list[str], rungs: list[tuple[str, PrecisionRung]], rates: dict, folder: Path, rounds: int,
                   seconds: float, cache: Path, log) -> list[dict]:
    known, rows = bench_models(cache), []
    for name in names:
        model = known[name]
        path = model.path(cache)
        if not path.is_file():
            log(f"model {name}: not exported ({path} missing: python -m gebackend.modelzoo.bench_models {name}); left out")
            continue
        feeds = model.sample_inputs(1)
        ops = flops.at_shapes(onnx.load(str(path)), {k: list(v.shape) for k, v in feeds.items()})
        log(f"model {name}: {ops.total / 1e9:.2f} G operations " + str({k: round(v / 1e9, 2) for k, v in ops.by_class.items()})
            + (f"; {len(ops.unknown)} products of unknown shape not counted" if ops.unknown else ""))
        timed = measure(_prepare(path, rungs, folder / name, log), feeds, rounds, seconds)
        if REFERENCE not in timed:
            continue
        fp32 = timed[REFERENCE]["seconds"]
        for key, measured in timed.items():
            rows.append({"model": name, "rung": key, "operations": ops.by_class, "seconds": measured["seconds"],
                         "spread": measured["spread"], "ops_per_s": ops.total / measured["seconds"],
                         "x_fp32": fp32 / measured["seconds"],
                         "of_kernels": flops.kernel_time(ops.by_class, rates.get(key, {})) / measured["seconds"]})
    return rows


def report(kernels: dict, rows: list[dict], meta: dict) -> str:
    rungs = list(next(iter(kernels.values()))["rates"]) if kernels else []
    lines = [f"# How much faster than fp32 each rung runs here (1 thread), {meta['when']}", "",
             f"Machine: {meta['machine']}", "", "Kernels, operations a second (× ONNX Runtime fp32; ± half the spread of "
             "the rounds):", "", "| kernel | " + " | ".join(rungs) + " |", "| --- |" + " ---: |" * len(rungs)]
    for name, kernel in kernels.items():
        rates = kernel["rates"]
        base = rates.get(REFERENCE, {}).get("ops_per_s")
        cells = [f"{rates[r]['ops_per_s'] / 1e9:.0f} G/s" + (f" ({rates[r]['ops_per_s'] / base:.2f}×)" if base else "")
                 + f" ±{rates[r]['spread'] / 2:.0%}" if r in rates else "-" for r in rungs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Models, one input:", "", "| model | rung | ms a run | ± | G/s | × onnxruntime fp32 | of its kernels' speed |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['rung']} | {row['seconds'] * 1e3:.1f} | {row['spread'] / 2:.0%} | "
                     f"{row['ops_per_s'] / 1e9:.0f} | {row['x_fp32']:.2f} | {row['of_kernels']:.0%} |")
    return "\n".join(lines) + "\n"


def plot(kernels: dict, rows: list[dict], path: Path) -> None:
    """Left: each kernel's rungs × ONNX Runtime fp32; right: each model's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1, 2]})
    for name, kernel in kernels.items():
        base = kernel["rates"][REFERENCE]["ops_per_s"]
        keys = list(kernel["rates"])
        left.plot(range(len(keys)), [kernel["rates"][k]["ops_per_s"] / base for k in keys], "o-", label=name)
    if kernels:
        keys = list(next(iter(kernels.values()))["rates"])
        left.set_xticks(range(len(keys)), keys, rotation=60, fontsize=7)
    left.set_title("kernels", fontsize=9)
    left.legend(fontsize=7)
    x = np.arange(len(rows))
    right.bar(x, [r["x_fp32"] for r in rows], 0.6)
    right.set_xticks(x, [f"{r['model']}\n{r['rung']}" for r in rows], rotation=70, fontsize=7)
    right.set_title("models, one input", fontsize=9)
    for ax in (left, right):
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel("× ONNX Runtime fp32, 1 thread")
    fig.suptitle(f"{cpu.describe()[:90]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,cnclip_text_l4,cnclip_image_l4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0, help="timing window per rung and round")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=Path("bench/results/precision_gain"))
    args = p.parse_args(argv)
    rungs = available_rungs()
    meta = {"machine": machine(), "flags": sorted(cpu.flags() & set(cpu.ISA_FLAGS)),
            "when": datetime.now().isoformat(timespec="seconds"), "rounds": args.rounds, "seconds": args.seconds,
            "rungs": [_key(r) for r in rungs]}
    print(f"machine: {meta['machine']}\nrungs here: {', '.join(meta['rungs'])}")
    with tempfile.TemporaryDirectory(prefix="precision_gain.") as scratch:
        kernels = measure_kernels(rungs, Path(scratch), args.rounds, args.seconds, print)
        rows = measure_models([m for m in args.models.split(",") if m], rungs, class_rates(kernels), Path(scratch),
                              args.rounds, args.seconds, args.cache, print)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "precision_gain.json").write_text(json.dumps({"meta": meta, "kernels": kernels, "models": rows}, indent=1))
    text = report(kernels, rows, meta)
    (args.out / "precision_gain.md").write_text(text)
    if kernels:
        plot(kernels, rows, args.out / "precision_gain.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
