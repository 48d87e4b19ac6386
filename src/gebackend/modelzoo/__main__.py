"""CLI: ``python -m gebackend.modelzoo REPO_DIR [--force]`` writes the example models' ``1/model.onnx`` files."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import build_example_repository


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gebackend.modelzoo",
        description="Generate model.onnx files for the example model repository.",
    )
    parser.add_argument("repo_dir", help="model repository containing <name>/config.pbtxt dirs")
    parser.add_argument("--force", action="store_true", help="overwrite existing model.onnx files")
    args = parser.parse_args(argv)
    for path in build_example_repository(args.repo_dir, force=args.force):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
