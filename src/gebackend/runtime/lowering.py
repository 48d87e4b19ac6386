"""Lowering a model's precision at load (runtime/loader.py calls `lower` before it builds the engines), and the
precision part of the load line, which says what ran: `precision int8 static (cosine 0.999312 to fp32 on
images:[1, 3, 320, 320], probed 320x320; ONNX Runtime QDQ, 3 of 3 Conv quantized, calibrated on 32 seeded input(s))`,
the cosine on which inputs and whence their sizes (compile/seed_shapes.py; a static graph's first bucket; the first
`calibration_data` sample where it is given), run on the engine that serves the lowered model (OpenVINO's int8
kernels answer NNCF's file otherwise than ONNX Runtime), then how it was made and the ops quantized of how many. The
original is served at fp32 instead, and the load line says why (`precision origin (int8: nothing to quantize:
...)`), where int8 would quantize nothing (compile/int8_route.py), where int8 would be static with `quantization=auto`
on a model with float inputs and no `calibration_data` (seeded random images or audio calibrate it badly: a detector
calibrated on them lost a face it found at fp32), where no input size the model runs was found,
where the lowered file quantized nothing, and, behind an accuracy guard (precision_mode=auto's, or
precision_min_cosine), where the lowering fails, its engine cannot load it, or its cosine to fp32 is too low or
cannot be checked."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import numpy as np

from gebackend.compile.seed_shapes import SeedShapes, shapes_text
from gebackend.config.spec import ModelSpec
from gebackend.errors import GeBackendError, ModelLoadError

Log = Callable[[str], None]


def lower(spec: ModelSpec, engine_kind, log: Log, defaults: Mapping[str, np.ndarray] | None,
          seeded: SeedShapes) -> tuple[ModelSpec, str]:
    """The spec pointing at the lowered model (compile/precision_cache.py), or at the original file at fp32 where it
    is not lowered (see the module docstring); and the precision part of the load line."""
    from gebackend.compile.int8_route import quantized_in
    from gebackend.compile.precision_cache import lowered_model

    mode = spec.options.engines.precision_mode
    guard = spec.options.engines.precision_min_cosine
    refusal, line = _refusal(spec, engine_kind, seeded)
    if refusal:
        return fp32(spec, log, refusal, line=f"{mode}: {line}")
    try:
        lowered = lowered_model(spec.name, spec.path, spec.options.engines, engine_kind, spec.batching, seeded.shapes,
                                log, home=spec.home, fixed=defaults, shapes_source=seeded.source)
    except ModelLoadError as exc:
        if not guard:
            raise
        # the guard asks for fp32 where the lowered model cannot be trusted: one the quantizer could not write too
        return fp32(spec, log, f"lowering failed ({exc})", refused_by="a failed lowering")
    made = quantized_in(lowered.path) if mode == "int8" else None
    if made is not None and not made.quantized:
        return fp32(spec, log, f"nothing was quantized ({made.describe()})", line=f"int8: {made.describe()}")
    _say_what_runs(mode, engine_kind, lowered.quantization, log)
    return _checked_and_served(spec, engine_kind, log, defaults, seeded, lowered, made)


def _checked_and_served(spec: ModelSpec, engine_kind, log: Log, defaults: Mapping[str, np.ndarray] | None,
                        seeded: SeedShapes, lowered, made) -> tuple[ModelSpec, str]:
    """The lowered model checked against fp32 on the engine that serves it, and served where the guard (if any) lets
    it, else the original at fp32."""
    mode = spec.options.engines.precision_mode
    guard = spec.options.engines.precision_min_cosine
    label = f"{mode} static" if lowered.quantization == "static" else mode  # dynamic: the line as before static int8
    how = _how(engine_kind, lowered, made)
    served = dataclasses.replace(spec, path=lowered.path)
    try:
        judge = _judge(served, engine_kind)
    except ModelLoadError as exc:  # OpenVINO cannot read some files NNCF writes (QDQ on a tensor of unknown rank)
        if not guard:
            raise
        return fp32(spec, log, f"its engine cannot load the lowered model ({exc})", refused_by="its engine")
    try:
        report, where = _checked(spec, lowered, seeded, defaults, judge)
    except GeBackendError as exc:
        log(f"precision {mode}: no accuracy check: {exc}")
        if guard:
            return fp32(spec, log, f"precision_min_cosine={guard} cannot be checked")
        return served, f"precision {label} (accuracy not checked{'; ' + how if how else ''}), "
    finally:
        if judge is not None:
            judge.close()
    return _guarded(spec, served, log, report, where, how, label)


def _guarded(spec: ModelSpec, served: ModelSpec, log: Log, report, where: str, how: str,
             label: str) -> tuple[ModelSpec, str]:
    """`served` (the lowered model) with its accuracy said, or the original at fp32 where its cosine is under the
    guard; `where`: on what the check ran; `how`: how the model was made."""
    mode = spec.options.engines.precision_mode
    guard = spec.options.engines.precision_min_cosine
    for number, line in enumerate(report.format_text().splitlines()):
        log(f"precision {mode} vs fp32: {line}" if number == 0 else line)
    if guard and not report.cosine >= guard:
        return fp32(spec, log, f"cosine similarity {report.cosine:.6f} to fp32 is below precision_min_cosine={guard}",
                    line=f"{mode} refused by the accuracy guard: cosine {report.cosine:.6f} to fp32 on {where}, "
                         f"below {guard}")
    if not report.cosine >= 0.99:
        log(f"precision {mode}: WARNING cosine similarity {report.cosine:.4f} to fp32 is below 0.99; "
            f"check the outputs or use precision_mode=origin")
    return served, f"precision {label} (cosine {report.cosine:.6f} to fp32 on {where}{'; ' + how if how else ''}), "


def fp32(spec: ModelSpec, log: Log, why: str, refused_by: str = "the accuracy guard",
         line: str = "") -> tuple[ModelSpec, str]:
    """The spec serving the original file at fp32, said in the log (`why`) and the load line (`line`, else that
    `refused_by` refused the precision)."""
    mode = spec.options.engines.precision_mode
    log(f"precision {mode}: not served: {why}; serving fp32 (precision_mode=origin) instead")
    return dataclasses.replace(spec, options=spec.options.replace(precision_mode="origin")), \
        f"precision origin ({line or f'{mode} refused by {refused_by}'}), "


def seeded_shapes(spec: ModelSpec, defaults: Mapping[str, np.ndarray] | None = None) -> SeedShapes:
    """The shapes of a dynamic graph's seeded inputs (the accuracy check, the calibration samples): the file's dims,
    config.pbtxt's where the file's are free, then its model_warmup, the first calibration_data sample, the file's
    metadata and probed sizes (compile/seed_shapes.py)."""
    from gebackend.compile.seed_shapes import seed_shapes

    return seed_shapes(spec.path, spec.inputs, spec.batching, warmup=_warmup(spec),
                       sample=first_sample(spec, defaults), fixed=defaults, home=spec.home, name=spec.name)


def _warmup(spec: ModelSpec) -> list:
    """config.pbtxt's model_warmup entries (read beside the model's file in its repository), or none."""
    from gebackend.compile.calibration import model_folder
    from gebackend.config.pbtxt import load_model_config

    config = model_folder(spec.home) / "config.pbtxt"
    try:
        return list(load_model_config(config).get("model_warmup") or []) if config.is_file() else []
    except Exception:  # noqa: BLE001 - a config Triton read is not ours to refuse here: no warm-up sizes
        return []


def first_sample(spec: ModelSpec, defaults: Mapping[str, np.ndarray] | None = None) -> dict | None:
    """The first `calibration_data` sample, or None (unset, or unreadable: the lowering says why)."""
    from gebackend.compile import calibration

    data = spec.options.engines.calibration_data
    if not data:
        return None
    try:
        return calibration.load_samples(spec.name, spec.path, calibration.resolve(data, spec.home), spec.batching, 1,
                                        defaults)[0]
    except ModelLoadError:
        return None


def _refusal(spec: ModelSpec, engine_kind, seeded: SeedShapes) -> tuple[str, str]:
    """Why the model is not lowered at all, for the log and for the load line, or ("", ""): no input size it runs was
    found, or int8 has nothing to quantize."""
    from gebackend.compile.int8_route import choose, nothing_to_quantize

    if seeded.runs is False:
        fix = "give the sizes as dims in config.pbtxt, or set calibration_data"
        return (f"no input size the model runs was found to check it on ({seeded.why}); {fix}",
                f"no input size the model runs was found, {seeded.tried} tried; {fix}")
    if spec.options.engines.precision_mode != "int8":
        return "", ""
    engines = spec.options.engines
    try:
        quantization, why = choose(engines.quantization, engines.calibration_data, engine_kind, spec.path)
    except ModelLoadError:
        return "", ""  # the lowering refuses it, saying why
    nothing = nothing_to_quantize(spec.path, quantization)
    if nothing:
        return (f"nothing to quantize: {nothing}",) * 2
    if quantization == "static" and engines.quantization == "auto" and not engines.calibration_data:
        floats = [t.name for t in spec.inputs if t.dtype.numpy.kind == "f"]
        if floats:
            needs = (f"static int8 ({why}) calibrates on inputs like the real ones, and seeded random values of "
                     f"{', '.join(floats)} do not stand for real images or audio; set calibration_data to real "
                     f"requests (a folder of .npy files or a perf_analyzer JSON file), or quantization=static to "
                     f"calibrate on seeded random inputs anyway")
            return needs, needs
    return "", ""


def _say_what_runs(mode: str, engine_kind, quantization: str, log: Log) -> None:
    from gebackend.engines.registry import precision_run

    ran = precision_run(mode, engine_kind.name, quantization)
    if ran.note:
        log(f"precision {mode}: {ran.note}")


def _how(engine_kind, lowered, made) -> str:
    """How an int8 model was made, for the load line: the quantizer, the ops quantized, the calibration."""
    if made is None:
        return ""
    if lowered.quantization != "static":
        return f"ONNX Runtime dynamic, {made.describe()}"
    tool = "NNCF QDQ" if engine_kind.static_quantizer == "nncf" else "ONNX Runtime QDQ"
    return f"{tool}, {made.describe()}" + (f", calibrated on {lowered.calibrated}" if lowered.calibrated else "")


def _judge(served: ModelSpec, engine_kind):
    """The lowered model on the engine that serves it, where that is not ONNX Runtime (OpenVINO runs NNCF's QDQ file
    with its own int8 kernels, whose answers ONNX Runtime's do not tell), for the accuracy check; else None (the check
    runs it on ONNX Runtime, as the engine does)."""
    if engine_kind.onnxruntime_providers:
        return None
    return engine_kind.dynamic(served.path, served.options, ("CPUExecutionProvider",))


def _checked(spec: ModelSpec, lowered, seeded: SeedShapes, defaults: Mapping[str, np.ndarray] | None, judge=None):
    """The accuracy report of the lowered model (run by `judge` where given, else on ONNX Runtime) against the
    original, and on what it ran, in words: the first calibration_data sample where it is given, else a seeded input
    at `seeded`'s shapes."""
    from gebackend.compile.accuracy import accuracy_report, random_feeds

    sample = lowered.check_feeds if lowered.check_feeds is not None else first_sample(spec, defaults)
    judged = judge if judge is not None else lowered.path
    if sample is not None:
        report = accuracy_report(spec.path, judged, dict(sample), input_label="the first calibration sample")
        shapes = shapes_text({name: np.shape(value) for name, value in sample.items()})
        return report, f"{shapes}, the first calibration_data sample"
    report = accuracy_report(spec.path, judged, random_feeds(spec.path, seeded.shapes, fixed=defaults))
    return report, seeded.phrase()
