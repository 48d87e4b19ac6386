"""`gebackend analyze`: run the graph doctor on an ONNX file and optionally write its constant-folded copy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnx

from gebackend.config.engine_names import DEFAULT as DEFAULT_ENGINE
from gebackend.config.engine_names import names as engine_names
from gebackend.cpu import describe as cpu_describe
from gebackend.engines.registry import kind, precision_run
from gebackend.errors import ConfigError, GeBackendError


def _size_limit(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes or 'none'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1 byte ('none' folds everything)")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="diagnose an ONNX model for the static graph mode",
        description="Report which nodes of MODEL have fully known output shapes, the first node where that "
        "breaks and why, and the constant subgraphs folding removes.",
    )
    p.add_argument("model", metavar="MODEL.onnx", type=Path)
    p.add_argument("--config", type=Path, metavar="config.pbtxt",
                   help="take the input shapes from the shapes this config compiles (the first set is analysed)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D0,D1,...",
                   help="fix an input's full shape (repeatable); overrides --config")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--fix", type=Path, metavar="OUT.onnx",
                   help="write MODEL with its constant subgraphs folded (input shapes unchanged)")
    p.add_argument("--size-limit", type=_size_limit, default=1 << 20, metavar="BYTES",
                   help="leave folded tensors larger than this unfolded; 'none' folds everything (default: 1 MiB)")
    p.add_argument("--precision", choices=["int8", "fp16", "bf16"],
                   help="lower MODEL to this precision and report how far its outputs move from fp32 on a seeded "
                        "random input (the same check the server logs at load)")
    p.add_argument("--engine", choices=list(engine_names()), default=DEFAULT_ENGINE,
                   help=f"the engine that runs the lowered model for --precision (default: {DEFAULT_ENGINE})")
    p.set_defaults(func=run)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`name:d0,d1,...` -> (name, dims); the name may itself contain ':'."""
    name, sep, dims = text.rpartition(":")
    try:
        values = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        values = ()
    if not sep or not name or not values:
        raise ConfigError(f"--shape {text!r} is not NAME:D0,D1,... (e.g. input_ids:1,128)")
    return name, values


def _load(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise ConfigError(f"cannot read ONNX file {path}: {type(exc).__name__}: {exc}") from None


def _config_shapes(path: Path, model: onnx.ModelProto) -> tuple[list[dict[str, tuple[int, ...]]], str]:
    """The shape sets the config compiles, and why static graph mode does not apply where nothing can be."""
    from gebackend.config.onnx_signature import signature_of
    from gebackend.config.pbtxt import load_model_config
    from gebackend.config.spec import shapes_from_config  # imported on use

    shape_sets, note = shapes_from_config(load_model_config(path), signature_of(model))
    return [dict(s) for s in shape_sets], note


def _graph_mode_at_load(model_path: Path, shape_sets, note: str, size_limit: int | None) -> str:
    """The graph mode a load of this config takes on ONNX Runtime, as the loader decides it (runtime/loader.py):
    static where every shape set compiles and ONNX Runtime builds each graph, else the dynamic graph, and why."""
    import onnxruntime as ort

    from gebackend.compile.pipeline import compile_static
    from gebackend.compile.specialize import describe_error
    from gebackend.runtime import static_fallback

    if note:
        return f"dynamic graph: {note}"
    if not shape_sets:
        return "dynamic graph (the config asks for no static graph)"
    try:
        graphs, _ = compile_static(model_path, shape_sets, size_limit)
    except Exception as exc:  # noqa: BLE001 - what the load would fall back on, said as the load says it
        why = str(exc) if isinstance(exc, GeBackendError) else describe_error(exc)
        return (f"dynamic graph: the static graph could not be built ({why}), so the model is served on the "
                f"dynamic graph")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    failed = []
    for graph in graphs:
        try:
            ort.InferenceSession(graph.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - as above
            failed.append((graph.shapes, exc))
    if not failed:
        return f"static graph, {len(shape_sets)} shape set(s), each built on ONNX Runtime"
    why = static_fallback.why(failed[0][1])
    if len(failed) == len(graphs):
        return (f"dynamic graph: the static graph could not be built ({why}), so the model is served on the "
                f"dynamic graph")
    return (f"static graph, {len(graphs) - len(failed)} of {len(graphs)} shape set(s); {static_fallback.describe(failed)} "
            f"could not be built ({why}), so the requests they would hold run on the dynamic graph beside the others")


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    external = model.ByteSize() >= onnx.checker.MAXIMUM_PROTOBUF
    onnx.save_model(model, str(path), save_as_external_data=external, location=f"{path.name}.data")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from gebackend.compile.doctor import analyze, fix

    try:
        model = _load(args.model)
        shapes: dict[str, tuple[int, ...]] = {}
        shape_sets = graph_mode = None
        if args.config is not None:
            sets, note = _config_shapes(args.config, model)
            shapes, shape_sets = (dict(sets[0]) if sets else {}), len(sets)
            graph_mode = _graph_mode_at_load(args.model, sets, note, args.size_limit)
        shapes.update(parse_shape(s) for s in args.shape)
        report = analyze(model, shapes or None, size_limit=args.size_limit)
        fixed = None
        if args.fix is not None:
            folded, removed = fix(model, size_limit=args.size_limit)
            _save(folded, args.fix)
            fixed = {"path": str(args.fix), "removed_nodes": removed}
        precision = ran = None
        if getattr(args, "precision", None):
            precision = _precision_report(args.model, args.precision, args.engine, shapes or None)
            ran = precision_run(args.precision, args.engine,
                                "static" if args.precision == "int8" and "dynamic" not in kind(args.engine).quantizations
                                else "dynamic" if args.precision == "int8" else "")
    except (GeBackendError, ValueError, OSError) as exc:
        print(f"gebackend analyze: {exc}", file=sys.stderr)
        return 2
    if args.json:
        result = report.to_dict()
        result["model"] = str(args.model)
        if shape_sets is not None:
            result["compiled_shape_sets"] = shape_sets
            result["graph_mode_at_load"] = graph_mode
        if fixed is not None:
            result["fix"] = fixed
        if precision is not None:
            result["precision"] = {"mode": args.precision, "engine": args.engine, "ran": ran.ran, "note": ran.note,
                                   **precision.to_dict()}
        print(json.dumps(result, indent=2))
        return 0
    print(f"model: {args.model}")
    if shape_sets is not None:
        print(f"config {args.config} compiles {shape_sets} shape set(s)" + ("; analysing the first" if shape_sets else ""))
        print(f"graph mode at load: {graph_mode}")
    print(report.format_text())
    if fixed is not None:
        print(f"wrote {args.fix}: folding removed {fixed['removed_nodes']} node(s)")
    if precision is not None:
        lines = precision.format_text().splitlines()
        print(f"precision {args.precision} ({args.engine}) vs fp32: {lines[0]}")
        for line in lines[1:]:
            print(line)
        print(f"precision {args.precision} on this CPU ({cpu_describe()}): {ran.describe()}")
    return 0


def _precision_report(path: Path, mode: str, engine: str, shapes):
    """The accuracy report of MODEL lowered to `mode`, as the server logs it at load (int8: quantization=auto, static
    int8 calibrated on seeded random samples); a file lowered for an engine that is not ONNX Runtime runs on it."""
    import shutil
    import tempfile

    from gebackend.compile.accuracy import accuracy_report, random_feeds
    from gebackend.config.options import BackendOptions

    feeds = random_feeds(path, shapes)
    engine_kind = kind(engine)
    options = BackendOptions.make(engine=engine, precision_mode=mode)
    if engine_kind.lowers(mode):
        lowered = engine_kind.dynamic(path, options, ("CPUExecutionProvider",))
        try:
            return accuracy_report(path, lowered, feeds)
        finally:
            lowered.close()
    from gebackend.compile.calibration import random_samples
    from gebackend.compile.precision import lower_precision, resolve_quantization

    quantization = resolve_quantization("auto", "", engine_kind) if mode == "int8" else "dynamic"
    samples = random_samples(path, options.engines.calibration_samples, shapes) if quantization == "static" else None
    folder = Path(tempfile.mkdtemp(prefix="gebackend-analyze-"))
    try:
        file = lower_precision(path, mode, folder, quantization=quantization, quantizer=engine_kind.static_quantizer,
                               samples=samples)
        if engine_kind.onnxruntime_providers:
            return accuracy_report(path, file, feeds)
        lowered = engine_kind.dynamic(file, options, ("CPUExecutionProvider",))
        try:
            return accuracy_report(path, lowered, feeds)
        finally:
            lowered.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
