"""`gebackend bench`: measure the throughput ladder with the real perf_analyzer (the work is in gebackend.bench)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark scenarios (naive .. tuned ge) on a real server with perf_analyzer",
        description="Serve each scenario's generated Triton config with `gebackend serve`, drive it with "
        "perf_analyzer (installed by `make tools`), measure the in-process ceiling, and write CSVs, "
        "summary.json, summary.md and PNG plots under OUT/<timestamp>/.",
    )
    p.add_argument("--quick", action="store_true",
                   help="small model, ladder scenarios, concurrency 1,4, 1 s windows: a few minutes on 2 cores")
    p.add_argument("--models", type=_names, help="comma-separated (see --list); default: CN_CLIP image, text, ResNet-50")
    p.add_argument("--scenarios", type=_names,
                   help="comma-separated (see --list); default: the whole ladder. NAME+ensemble (e.g. ge_bf16+ensemble): "
                        "a cnclip_* model as ge scenario NAME inside its CN_CLIP ensemble, measured next to the bare "
                        "encoder in the same server with JPEG bytes / Chinese text")
    p.add_argument("--concurrency", type=_ints, help="comma-separated levels (default 1,4,8; quick 1,4)")
    p.add_argument("--headline", type=int, help="the concurrency the summary table reports (default 4)")
    p.add_argument("--interval-ms", type=int, help="perf_analyzer --measurement-interval (default 2000; quick 1000)")
    p.add_argument("--stability", type=int, help="perf_analyzer -s, percent (default 20; quick 40)")
    p.add_argument("--max-trials", type=int, help="perf_analyzer -r (default 6; quick 4)")
    p.add_argument("--protocol", choices=("grpc", "http"), help="perf_analyzer -i (default grpc)")
    p.add_argument("--rounds", type=int, help="NAME+ensemble scenarios and --interleave: interleaved rounds per "
                   "concurrency level, medians reported (default 3)")
    p.add_argument("--interleave", action="store_true",
                   help="serve all of a model's scenarios (the peer's too) in one server and measure them in "
                        "--rounds interleaved rounds, so a drifting load hits all alike; no in-process ceiling")
    p.add_argument("--texts", choices=("random", "captions"),
                   help="the CN_CLIP text encoders' requests: random ids filling the whole context (default), or "
                        "Chinese captions through CN_CLIP's tokenizer, padded to the context (what trim_padding cuts)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the in-process ceiling")
    p.add_argument("--ceiling-for", type=_names, metavar="SCENARIOS",
                   help="measure the in-process ceiling only for these scenarios (default: every ge scenario)")
    p.add_argument("--ceiling-seconds", type=float, help="in-process measurement per level (default 5; quick 2)")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="results go to OUT/<timestamp>/")
    p.add_argument("--cache", type=Path, default=Path("bench/models"), help="exported models are kept here")
    p.add_argument("--soak", type=float, metavar="MINUTES",
                   help="instead of the ladder: hold saturating load on a static and a bucketed model for MINUTES "
                        "and record failed requests and every process's RSS (exit 1 if the target is missed)")
    p.add_argument("--peer-backend-dir", type=Path, metavar="DIR",
                   help="a Triton backends folder holding onnxruntime/libtriton_onnxruntime.so (or that onnxruntime "
                        "folder), e.g. NGC's /opt/tritonserver/backends or a build of Triton's onnxruntime_backend, "
                        "release r24.10 to match tritonserver 2.51: the same model also runs on it (scenarios peer, "
                        "peer_batching) and every row gets a '× onnxruntime backend' column. Default: "
                        "$GE_PEER_BACKEND_DIR, then /opt/tritonserver/backends, used when found (nothing of it is shipped)")
    p.add_argument("--list", action="store_true", help="list models and scenarios (and what is not available) and exit")
    p.set_defaults(func=run)


def _interrupt(*_):
    raise KeyboardInterrupt


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from dataclasses import replace

    from gebackend.bench import peer, perf_analyzer, scenarios
    from gebackend.modelzoo.bench_models import models
    from gebackend.bench.runner import Bench, BenchSettings

    if args.peer_backend_dir is not None and not args.list:
        reason = peer.missing(args.peer_backend_dir)
        if reason:
            print(f"gebackend bench: {reason}", file=sys.stderr)
            return 2

    if args.list:
        for model in models(args.cache).values():
            print(f"model    {model.name:14s} {model.description}{' [full size]' if model.full_size else ''}")
        for scenario in [*scenarios.SCENARIOS.values(), *scenarios.PEERS.values()]:
            _, missing = scenarios.availability(scenario, args.peer_backend_dir)
            print(f"scenario {scenario.name:14s} {scenario.title}{'  -- ' + missing if missing else ''}")
        found, _ = peer.lookup(args.peer_backend_dir)
        for warning in found.warnings if found else ():
            print(f"peer     {warning}")
        print(f"scenario NAME{scenarios.ENSEMBLE_SUFFIX:10s} any ge scenario as the encoder of a cnclip_* model's CN_CLIP "
              "ensemble (preprocessing -> encoder with its L2-normalised output), measured next to the bare encoder")
        return 0
    if args.soak is not None:
        return _soak(args)
    base = BenchSettings.quick_preset() if args.quick else BenchSettings()
    perf = replace(
        base.perf,
        **{k: v for k, v in dict(measurement_interval_ms=args.interval_ms, stability_percentage=args.stability,
                                 max_trials=args.max_trials, protocol=args.protocol).items() if v is not None},
    )
    if args.rounds is not None and args.rounds < 1:
        print("gebackend bench: --rounds needs a number >= 1", file=sys.stderr)
        return 2
    # The peer's scenarios: always with --peer-backend-dir; without, where found, unless --scenarios names the set.
    with_peer = True if args.peer_backend_dir is not None else (False if args.scenarios else None)
    overrides = dict(models=args.models, scenarios=args.scenarios, concurrency=args.concurrency, headline=args.headline,
                     ceiling_seconds=args.ceiling_seconds, ceiling_for=args.ceiling_for, rounds=args.rounds,
                     peer_backend_dir=args.peer_backend_dir, with_peer=with_peer,
                     interleave=args.interleave or None, texts=args.texts)
    settings = replace(base, perf=perf, out=args.out, cache=args.cache, ceiling=not args.no_ceiling,
                       **{k: v for k, v in overrides.items() if v is not None})
    signal.signal(signal.SIGTERM, _interrupt)  # stop the scenario's server and write the partial summary
    try:
        out = Bench(settings).run()
    except (perf_analyzer.PerfAnalyzerMissing, ValueError) as exc:
        print(f"gebackend bench: {exc}", file=sys.stderr)
        return 2
    print((out / "summary.md").read_text())
    return 0


def _soak(args: argparse.Namespace) -> int:
    from gebackend.bench import perf_analyzer, server
    from gebackend.bench.soak import Soak, SoakSettings

    if args.soak <= 0:
        print("gebackend bench: --soak needs a number of minutes > 0", file=sys.stderr)
        return 2
    settings = SoakSettings(minutes=args.soak, out=args.out, cache=args.cache,
                            **{k: v for k, v in dict(concurrency=args.concurrency[0] if args.concurrency else None,
                                                     window_ms=args.interval_ms, protocol=args.protocol).items()
                               if v is not None})
    signal.signal(signal.SIGTERM, _interrupt)  # stop the load and the server, write what was measured
    try:
        out, result = Soak(settings).run()
    except (perf_analyzer.PerfAnalyzerMissing, server.ServeError, ValueError) as exc:
        print(f"gebackend bench: {exc}", file=sys.stderr)
        return 2
    print((out / "soak.md").read_text())
    return 0 if result["passed"] else 1
