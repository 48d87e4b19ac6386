"""One `gebackend tune` run, start to end: read the model folder, build the space for this machine (cores from
os.sched_getaffinity, the installed engines, OpenVINO's CPU capabilities, the bench's features), search it
(search.py with measure.py's measurements), and write config.pbtxt, report.md, report.json and tune.png into
the output folder; with `apply`, the winner replaces MODEL_DIR/config.pbtxt (the old one kept as
config.pbtxt.orig).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

from gebackend.tune import config_writer, report, search as search_mod, space
from gebackend.tune.tuned_model import TunedModel

GE_BACKENDS = ("ge", "npu_ge")


@dataclass
class TuneSettings:
    model_dir: Path
    concurrency: int = 4
    latency_budget_ms: float | None = None
    min_cosine: float = 0.999
    time_budget_min: float = 10.0
    out: Path | None = None
    apply: bool = False
    peer_backend_dir: Path | None = None
    quick: bool = False
    input_data: Path | None = None  # perf_analyzer --input-data JSON of the user's requests (None: seeded random ones)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def installed_engines() -> tuple[str, ...]:
    from gebackend.config import engine_names
    from gebackend.engines import registry

    return tuple(n for n in engine_names.names() if registry.installed(n))


@functools.cache
def capabilities(engines: tuple[str, ...]) -> tuple[str, ...]:
    """OpenVINO's CPU capabilities (OPTIMIZATION_CAPABILITIES) where it is installed, else none; read once per
    process (the space and the favoured order both ask)."""
    if "openvino" not in engines:
        return ()
    try:
        from gebackend.engines.openvino import openvino_capabilities

        return tuple(openvino_capabilities())
    except Exception:  # noqa: BLE001 - no capability: no bf16/fp16 rungs
        return ()


def machine_space(settings: TuneSettings, model: TunedModel, slow: space.Slow,
                  trim: bool = False, favoured: space.Favoured = lambda engine, rung: None,
                  quantized: int = 0) -> list[space.Candidate]:
    """The candidates for this machine: its cores, installed engines, OpenVINO's capabilities, the bench's features,
    the rungs expected to lose on this CPU (`slow_rungs`), measured last, and those it runs natively
    (`favoured_rungs`), measured first; `trim`: each cuts its batches' padding; `quantized`: the file's quantization
    nodes, where it is int8 already (its int8 rungs would serve the file as it is, the origin rung again)."""
    from gebackend.bench import scenarios

    def available(feature: str) -> bool:
        return scenarios.feature_missing(feature) is None and not (feature == "int8" and quantized)

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    engines = installed_engines()
    return space.space(cores, engines, capabilities(engines), model.max_batch_size, settings.concurrency,
                       static_ok=not model.static_problem,
                       available=available, slow=slow, trim=trim, favoured=favoured)


def slow_rungs(model: TunedModel, cpu_flags: Iterable[str] | None = None) -> space.Slow:
    """Which (engine, rung) pairs are expected to lose on this CPU for `model`, and why (auto_choice's rule)."""
    from gebackend import cpu
    from gebackend.engines import auto_choice

    flags = frozenset(cpu.flags() if cpu_flags is None else cpu_flags)
    int8_on_openvino = auto_choice.openvino_int8_slow(flags, model.onnx_path)

    def slow(engine: str, rung: space.PrecisionRung) -> str:
        return int8_on_openvino if engine == "openvino" and rung.precision_mode == "int8" else ""

    return slow


def favoured_rungs(model: TunedModel, cpu_flags: Iterable[str] | None = None,
                   openvino_caps: Iterable[str] | None = None) -> space.Favoured:
    """Which (engine, rung) pairs this CPU runs natively for `model`, in the order to measure them, and why: int8
    where it has VNNI (NNCF's static int8 on OpenVINO first; ONNX Runtime's dynamic int8, which quantizes only
    MatMul/Gemm, for a MatMul model), NNCF's static int8 for a convolution model where it has AVX2 without VNNI,
    then bf16 where OpenVINO reports BF16. Measured in process on an AMD EPYC with AVX512-VNNI and BF16 (batch 4, 2
    threads, x ONNX Runtime's fp32): NNCF's int8 3.3-3.75x on ResNet-50 and the 4-layer CN_CLIP encoders, ONNX
    Runtime's dynamic int8 2.6-2.7x on the encoders (0.96x on ResNet-50), OpenVINO's bf16 1.9-2.2x; on a Xeon with AMX
    the same order held through Triton. Without VNNI, on AVX2-only AMD EPYCs through Triton, NNCF's int8 of the
    convolution models served 1.5-1.9x the exact graph on a Zen 3 (ResNet-50, resnet_small) and 1.05x on a Zen 1,
    never less, while on MatMul models it ran at half its f32 (`slow_rungs`) (docs/tuning.md)."""
    from gebackend import cpu
    from gebackend.engines import auto_choice

    flags = frozenset(cpu.flags() if cpu_flags is None else cpu_flags)
    caps = frozenset(capabilities(installed_engines()) if openvino_caps is None else openvino_caps)
    vnni = "/".join(sorted(flags & cpu.VNNI_FLAGS))
    avx2 = "avx2" in flags
    convs, matmuls = auto_choice.weighted_op_counts(model.onnx_path) if vnni or avx2 else (0, 0)

    def favoured(engine: str, rung: space.PrecisionRung) -> tuple[int, str] | None:
        if vnni and engine == "openvino" and rung.name == "int8-static":
            return 0, f"int8 with {vnni}: NNCF's static int8 ran 3.3-3.75x fp32 on such CPUs"
        if avx2 and convs > matmuls and engine == "openvino" and rung.name == "int8-static":
            return 0, (f"int8 on a convolution model ({convs} Conv vs {matmuls} MatMul/Gemm) with AVX2, no VNNI: "
                       "NNCF's static int8 served 1.05-1.9x the exact graph on such CPUs")
        if vnni and engine == "onnxruntime" and rung.name == "int8" and matmuls >= convs:
            return 1, (f"int8 with {vnni} on a MatMul model ({matmuls} MatMul/Gemm vs {convs} Conv): ONNX Runtime's "
                       "dynamic int8 ran 2.6-2.7x fp32 on such CPUs")
        if "BF16" in caps and engine == "openvino" and rung.name == "bf16":
            return 2, "OpenVINO reports BF16: bf16 ran 1.9-2.2x fp32 on such CPUs"
        return None

    return favoured


def trims(model: TunedModel, input_data: Path | None) -> str:
    """Why every candidate cuts its batches' padding (trim_padding on the token-id input), or "" when they do not: the
    user's requests (--input-data) are padded token ids, and the config does not set trim_padding itself."""
    token = model.bench_model().token_input
    params = model.config.get("parameters") or {}
    if input_data is None or token is None or "trim_padding" in params:
        return ""
    from gebackend.tune import requests

    padded = requests.padding(input_data, token)
    if padded is None:
        return ""
    return (f"your requests' '{token}' ends in padding (the longest uses {padded[0]} of its {padded[1]} positions): "
            f"every candidate cuts each batch to its longest request (trim_padding={token}, checked at load); static "
            f"candidates, whose batch buckets keep the full length, are measured last")


def in_process_requests(model: TunedModel, input_data: Path | None) -> tuple[list | None, str]:
    """(the feeds the in-process timings and ceiling send in turn, None for the seeded one; what they are, in words):
    the user's requests where --input-data gives them and they read as the model's inputs."""
    if input_data is None:
        return None, "the seeded request perf_analyzer sends"
    from gebackend.tune import requests

    try:
        sent = requests.in_process(model.name, model.onnx_path, input_data, model.max_batch_size > 0)
    except ValueError as exc:
        return None, f"the seeded request, not yours: your requests could not be {exc}"
    from gebackend.tune.measure import ACCURACY_LEAST

    which = f"the first {len(sent)} of your requests" if len(sent) == requests.IN_PROCESS_LIMIT else \
        f"your {len(sent)} request{'s' if len(sent) > 1 else ''}"
    short = ACCURACY_LEAST - len(sent)
    beside = (f" (the accuracy guard compares on {short} seeded random one{'s' if short > 1 else ''} beside "
              f"{'them' if len(sent) > 1 else 'it'}: fewer than {ACCURACY_LEAST} are a thin check)") if short > 0 else ""
    return sent, f"{which}, in turn, as perf_analyzer sends them{beside}"


def calibrated_on_requests(model: TunedModel, sent: list | None, input_data: Path | None) -> TunedModel:
    """The model whose static int8 rungs calibrate on the user's requests (`calibration_data` = --input-data) where
    they read as its inputs (`sent`) and its config names no calibration_data of its own: the requests it is measured
    and its accuracy checked with, not seeded random samples."""
    if sent is None or input_data is None or "calibration_data" in (model.config.get("parameters") or {}):
        return model
    return replace(model, calibration=str(input_data))


def sent_dims(model: TunedModel, input_data: Path | None) -> str:
    """What static candidates compile where inputs have variable dims, and what happens to requests of other dims."""
    dims = "; ".join(f"{name} {list(d)}" for name, d in model.sent_dims.items())
    source = "your requests (--input-data)" if input_data is not None else \
        f"the seeded random requests, {model.seeded_from} (--input-data with your own requests compiles theirs)"
    if model.pad_lengths:
        return (f"static candidates compile '{model.pad_dim}' at the lengths {list(model.pad_lengths)} of your requests "
                f"(--input-data), each request padded up to the next (bucket_paddable_dims={model.pad_dim}, checked at "
                f"load: not padded where the model's answer moves); a request of other dims runs on the dynamic graph "
                f"beside them (bucket_fallback=dynamic)")
    return (f"static candidates compile the variable dims at the dims every request sends, {dims}: those of "
            f"{source}; a request of other dims runs on the dynamic graph beside them (bucket_fallback=dynamic)")


def references(model: TunedModel, peer_found, cores: int) -> list[space.Candidate]:
    base = space.baseline(model, cores)
    if model.backend not in GE_BACKENDS and peer_found is None:
        # a config for Triton's onnxruntime backend, and no such backend here: measure it on ge as `gebackend serve`
        # serves it unchanged, with the CPU instances Triton gives that backend's models where the config names none
        from gebackend.config.instance_groups import default_instance_count
        from gebackend.server.layout import backend_of
        from gebackend.tune.config_writer import _message
        from google.protobuf import text_format
        from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

        message = _message(model)
        count = default_instance_count(backend_of({"backend": message.backend, "platform": message.platform}))
        message.backend = "ge"
        message.ClearField("platform")
        if not message.instance_group:  # tune measures on the CPU: Triton's one group is a CPU group there
            message.instance_group.add(kind=ModelInstanceGroup.KIND_CPU)
        for group in message.instance_group:
            if group.count < 1 and group.kind == ModelInstanceGroup.KIND_CPU:  # KIND_AUTO: by the machine, as it is
                group.count = count
        base = replace(base, config_text="# your config as gebackend serve serves it unchanged: on ge (no onnxruntime "
                       f"backend here), {count} instance(s) per CPU group where it names no count, as Triton gives "
                       "that backend\n" + text_format.MessageToString(message))
    refs = [base]
    if peer_found is not None:
        refs.append(space.peer(model, cores))
    return refs


def run(settings: TuneSettings, progress: Callable[[str], None] = _stderr) -> tuple[Path, dict]:
    from gebackend.bench import peer as peer_mod
    from gebackend.bench.runner import machine
    from gebackend.tune.measure import CEILING_S, BenchMeasurer

    started = datetime.now()
    t0 = time.monotonic()
    model = TunedModel.load(settings.model_dir)
    out = Path(settings.out or f"tune-{model.name}-{started.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    found = peer_mod.find(settings.peer_backend_dir) if settings.peer_backend_dir is not None else None
    if settings.input_data is not None:  # read once here: a file perf_analyzer cannot use fails before any server
        from gebackend.tune import requests

        model = model.with_requests(requests.read(settings.input_data))
        settings = replace(settings, input_data=Path(settings.input_data).resolve())
    slow, favoured = slow_rungs(model), favoured_rungs(model)
    trim = trims(model, settings.input_data)
    sent, in_process = in_process_requests(model, settings.input_data)
    model = calibrated_on_requests(model, sent, settings.input_data)
    from gebackend.compile.precision import quantized_nodes

    quantized = quantized_nodes(model.onnx_path)
    candidates = machine_space(settings, model, slow, trim=bool(trim), favoured=favoured, quantized=quantized)
    cores = candidates[0].cores if candidates else 1
    log_file = open(out / "tune.log", "a", buffering=1)
    log = lambda line: log_file.write(line + "\n")  # noqa: E731 - the bench's own lines: commands, server output
    count = (f"at most {space.QUICK_SERVED} of {len(candidates)} candidates (quick: around the fastest precision "
             f"once every one is timed in process, one change of each dimension)" if settings.quick
             else f"{len(candidates)} candidates")
    progress(f"tune: {model.name}: {count} on {machine()}; writing to {out}")
    static_dims = sent_dims(model, settings.input_data) if model.sent_dims else ""
    if model.static_problem:
        progress(f"tune: no static candidates: {model.static_problem}")
    elif static_dims:
        progress(f"tune: {static_dims}")
    if trim:
        progress(f"tune: {trim}")
    if settings.input_data is not None:
        progress(f"tune: in process (the accuracy guard's cosine and timings, the winner's ceiling): {in_process}")
    if model.calibration and any(c.rung.calibrated for c in candidates):
        progress(f"tune: static int8 calibrated on your requests (calibration_data={model.calibration}), not on "
                 f"seeded random samples")
    if quantized:
        progress(f"tune: no int8 rungs: the file is quantized already ({quantized} quantization node(s)); `ge` serves "
                 f"it as its producer quantized it, which the origin rung measures")
    for engine, rung in sorted({(c.scenario.engine, c.rung) for c in candidates if slow(c.scenario.engine, c.rung)},
                               key=lambda pair: (pair[0], pair[1].name)):
        progress(f"tune: {rung.name} on {engine} ranked last until the accuracy guard times it: {slow(engine, rung)}")
    placed = {(c.scenario.engine, c.rung) for c in candidates}
    for (_, why), engine, rung in sorted(((place, e, r) for e, r in placed if (place := favoured(e, r)) and
                                          not slow(e, r)), key=lambda item: item[0][0]):
        progress(f"tune: {rung.name} on {engine} ranked first until the accuracy guard times it: {why}")
    settings_s = search_mod.SearchSettings(
        concurrency=settings.concurrency, min_cosine=settings.min_cosine, latency_budget_ms=settings.latency_budget_ms,
        time_budget_s=settings.time_budget_min * 60, finalists=2 if settings.quick else 3,
        rounds=2 if settings.quick else 3, quick=settings.quick)
    ceiling = None
    try:
        measurer = BenchMeasurer(model, out, settings.concurrency, quick=settings.quick, peer=found, log=log,
                                 input_data=settings.input_data, min_cosine=settings.min_cosine, requests=sent,
                                 trim=bool(trim))
        done = search_mod.Search(candidates, measurer, settings_s, references(model, found, cores), progress).run()
        if done.winner is not None and not done.interrupted:
            progress(f"tune: the winner's in-process ceiling ({CEILING_S:.0f} s, no server) ...")
            ceiling = measurer.ceiling(done.winner.candidate)
    finally:
        log_file.close()
    winner = done.winner
    reasons = config_writer.explain(winner, done.outcomes, settings.concurrency) if winner else {}
    text = None
    if winner is not None:
        base = done.reference("baseline")
        x_base = f", {winner.throughput / base.throughput:.2f}x your config" if base and base.throughput else ""
        header = [f"generated by gebackend tune on {started.isoformat(timespec='seconds')} on {machine()}",
                  f"winner {winner.candidate.key}: {winner.candidate.label}: {winner.throughput:.1f} infer/s, "
                  f"p99 {winner.p99_ms:.2f} ms at concurrency {settings.concurrency}{x_base}",
                  f"every candidate measured: {(out / 'report.md').resolve()}"]
        text = config_writer.config_text(model, winner.candidate, reasons, header)
        (out / "config.pbtxt").write_text(text)
    seeded = seeded_calibration(model, winner.candidate if winner else None)
    if seeded:
        progress(f"tune: WARNING {seeded}")
        done.notes.append(f"WARNING {seeded}")  # report.md lists the search's notes
    meta = {"started": started.isoformat(timespec="seconds"), "machine": machine(), "model": model.name,
            "model_dir": str(model.dir), "concurrency": settings.concurrency, "min_cosine": settings.min_cosine,
            "latency_budget_ms": settings.latency_budget_ms, "time_budget_s": settings.time_budget_min * 60,
            "quick": settings.quick, "duration_s": round(time.monotonic() - t0, 1),
            "screen": _window(measurer.phases["screen"]), "refine": _window(measurer.phases["refine"]),
            "peer": peer_mod.describe(found, None if found else "not asked (--peer-backend-dir)"),
            "static_problem": model.static_problem,
            "static_dims": static_dims,
            "input_data": str(settings.input_data) if settings.input_data else "seeded random requests",
            "trim_padding": trim, "in_process_requests": in_process, "calibration": model.calibration}
    data = report.summary(done, meta, reasons, text, ceiling)
    for verdict in ("peer_verdict", "engine_verdict", "ceiling_verdict"):
        if data[verdict]:
            progress(f"tune: {data[verdict]}")
    if settings.apply:
        data["meta"]["applied"] = apply(model.dir, text, done)
        progress(f"tune: --apply: {data['meta']['applied']}")
    report.write(out, data)
    progress(f"tune: done in {data['meta']['duration_s']:.0f} s: {out / 'report.md'}")
    return out, data


def seeded_calibration(model: TunedModel, winner) -> str:
    """Where the winner is a static int8 calibrated and checked on seeded random inputs of a model with float inputs
    (images, audio), what to do; "" otherwise. Token ids drawn at random are requests like real ones; random pixels
    are not: calibrated on them, a real YOLOv8n lost a face it found at fp32, which the cosine on seeded inputs hid."""
    if winner is None or not winner.rung.calibrated or model.calibration:
        return ""
    floats = [t.name for t in model.inputs if t.dtype.numpy.kind == "f"]
    if not floats:
        return ""
    return (f"the winner's static int8 was calibrated and checked on seeded random {', '.join(floats)}, which do not "
            f"stand for real images or audio: tune again with --input-data of your own requests (it calibrates and "
            f"checks on them), or check its answers on real inputs before serving it")


def _window(perf) -> str:
    return f"-p {perf.measurement_interval_ms} -s {perf.stability_percentage} -r {perf.max_trials}"


def apply(model_dir: Path, text: str | None, done: search_mod.Search) -> str:
    """Write the winner into MODEL_DIR/config.pbtxt, the old one kept as config.pbtxt.orig; what was done, in words."""
    if text is None:
        return "not applied: no winner"
    base, winner = done.reference("baseline"), done.winner
    if base is not None and base.throughput and winner.throughput < base.throughput:
        return "not applied: your config measured faster than the winner"
    target = Path(model_dir) / "config.pbtxt"
    orig = target.with_name("config.pbtxt.orig")
    kept = "kept the existing config.pbtxt.orig"
    if not orig.exists():
        shutil.copy2(target, orig)
        kept = f"the old one is {orig}"
    target.write_text(text)
    return f"wrote {target} ({kept})"
