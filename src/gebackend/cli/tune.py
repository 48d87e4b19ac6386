"""`gebackend tune MODEL_DIR`: find the best config for one model on this machine (the work is in gebackend.tune)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
        return value
    return parse


def _cosine(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not -1 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a cosine is between -1 and 1")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="search engine, precision, graph mode, instances and batching for one model on this machine",
        description="Serve candidate configs of one model (a Triton model folder: config.pbtxt + 1/model.onnx) with "
        "`gebackend serve`, measure each with perf_analyzer at one concurrency, drop precisions below --min-cosine "
        "and candidates below half the best, re-measure the best in interleaved rounds, and write the winner's "
        "commented config.pbtxt, report.md, report.json and tune.png into --out.",
    )
    p.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="the model's folder in a Triton repository")
    p.add_argument("--concurrency", type=_positive(int), default=4, help="requests in flight to tune for (default 4)")
    p.add_argument("--latency-budget-ms", type=_positive(float), metavar="MS",
                   help="p99 above this: the candidate is reported 'over budget' and cannot win")
    p.add_argument("--min-cosine", type=_cosine, default=0.999,
                   help="precisions whose outputs' cosine to fp32 is below this are rejected (default 0.999)")
    p.add_argument("--time-budget-min", type=_positive(float), default=10.0,
                   help="stop with the best so far after this many minutes (default 10)")
    p.add_argument("--out", type=Path, help="where the results go (default ./tune-<model>-<timestamp>/)")
    p.add_argument("--apply", action="store_true",
                   help="write the winner into MODEL_DIR/config.pbtxt, the old one kept as config.pbtxt.orig")
    p.add_argument("--peer-backend-dir", type=Path, metavar="DIR",
                   help="a Triton backends folder with onnxruntime/libtriton_onnxruntime.so (release r24.10): the "
                        "model is also measured on Triton's onnxruntime backend ('x onnxruntime backend' column)")
    p.add_argument("--input-data", type=Path, metavar="FILE",
                   help="perf_analyzer --input-data JSON of your own requests, sent to every candidate and the peer "
                        "(default: one seeded random request); padded token ids make every candidate trim_padding; "
                        "the one shape they send to an input's variable dim is what static candidates compile")
    p.add_argument("--quick", action="store_true",
                   help="4-6 candidates around the fastest precision (each timed in process first), short windows")
    p.set_defaults(func=run)


def _interrupt(*_):
    raise KeyboardInterrupt


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from gebackend.bench import peer, perf_analyzer
    from gebackend.errors import ConfigError
    from gebackend.tune.tuner import TuneSettings, run as tune

    if not (args.model_dir / "config.pbtxt").is_file():
        print(f"gebackend tune: {args.model_dir} has no config.pbtxt (expected a model folder of a Triton repository)",
              file=sys.stderr)
        return 2
    if args.peer_backend_dir is not None:
        reason = peer.missing(args.peer_backend_dir)
        if reason:
            print(f"gebackend tune: {reason}", file=sys.stderr)
            return 2
    settings = TuneSettings(args.model_dir, args.concurrency, args.latency_budget_ms, args.min_cosine,
                            args.time_budget_min, args.out, args.apply, args.peer_backend_dir, args.quick,
                            args.input_data)
    signal.signal(signal.SIGTERM, _interrupt)  # stop the candidate's server and write what was measured
    try:
        out, data = tune(settings)
    except (perf_analyzer.PerfAnalyzerMissing, ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"gebackend tune: {exc}", file=sys.stderr)
        return 2
    print(out / "report.md")
    return 0 if data.get("winner") else 1
