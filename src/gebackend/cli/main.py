"""Entry point of the `gebackend` command: parses the subcommand and hands over."""

from __future__ import annotations

import argparse
import sys

from gebackend import __version__
from gebackend.cli import analyze, bench, profile, serve, tune


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gebackend", description="Serve ONNX models fast on Triton Inference Server.")
    parser.add_argument("--version", action="version", version=f"gebackend {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(subparsers)
    analyze.add_parser(subparsers)
    profile.add_parser(subparsers)
    bench.add_parser(subparsers)
    tune.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    return args.func(args, extra)


if __name__ == "__main__":
    sys.exit(main())
