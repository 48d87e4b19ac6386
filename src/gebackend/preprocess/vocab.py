"""Where the text preprocessing model finds cn_clip's vocabulary, and the load error that says how to get it.

The vocabulary is never committed: `make cnclip` (or `python -m gebackend.modelzoo.cnclip_wheel vocab PATH`)
takes `vocab.txt` out of the cn_clip wheel. A model reads it from its config parameter `vocab_file` (absolute,
or relative to the model folder) or else from `<model>/<version>/vocab.txt`, then `<model>/vocab.txt`.
"""

from __future__ import annotations

from pathlib import Path

from gebackend.errors import ConfigError

VOCAB_NAME = "vocab.txt"


def vocab_candidates(model_dir: Path, version_dir: Path, parameter: str = "") -> list[Path]:
    if parameter:
        path = Path(parameter).expanduser()
        return [path if path.is_absolute() else Path(model_dir) / path]
    return [Path(version_dir) / VOCAB_NAME, Path(model_dir) / VOCAB_NAME]


def find_vocab(model_dir: Path, version_dir: Path, parameter: str = "") -> Path:
    """The vocabulary file, or a ConfigError naming every place looked at and the command that writes it."""
    candidates = vocab_candidates(model_dir, version_dir, parameter)
    for path in candidates:
        if path.is_file():
            return path
    where = " or ".join(str(p) for p in candidates)
    source = "config parameter vocab_file" if parameter else "no vocab_file parameter"
    raise ConfigError(
        f"no tokenizer vocabulary: looked for {where} ({source}); cn_clip's vocab.txt is not shipped: write it "
        f"there with `python -m gebackend.modelzoo.cnclip_wheel vocab {candidates[0]}` (downloads the cn_clip "
        f"1.6.0 wheel from PyPI once), or run `make cnclip` for examples/cnclip_repository")
