"""The cn_clip wheel from PyPI: downloading it once into a cache folder, and taking files out of it.

Owns the one download of `cn_clip==1.6.0` (`pip download --no-deps`, nothing installed: its dependencies include
torchvision, which does not import beside our torch) and what is taken from it: the model code `gebackend bench`
builds CN_CLIP from (`cn_clip_source`) and the tokenizer vocabulary `vocab.txt` the text preprocessing model
reads (`extract_vocab`). The cache is `bench/models/` by default, the folder `gebackend bench` exports into.

    python -m gebackend.modelzoo.cnclip_wheel vocab TARGET [--cache DIR]   # writes cn_clip's vocab.txt to TARGET
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import sys
import zipfile
from pathlib import Path

CN_CLIP_VERSION = "1.6.0"
DEFAULT_CACHE = Path("bench/models")
VOCAB_MEMBER = "cn_clip/clip/vocab.txt"
# sha256 of cn_clip 1.6.0's cn_clip/clip/vocab.txt (21128 tokens, BERT-Chinese's vocabulary)
VOCAB_SHA256 = "45bbac6b341c319adc98a532532882e91a9cefc0329aa57bac9ae761c27b291c"


def cn_clip_wheel(cache: Path = DEFAULT_CACHE) -> Path:
    """The cn_clip wheel in `<cache>/wheels/`, downloaded now with `pip download --no-deps` unless already there."""
    wheels = Path(cache).resolve() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"cn_clip-{CN_CLIP_VERSION}-*.whl"))
    if not found:  # downloaded into a private folder first, so an interrupted download leaves no partial wheel
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       f"cn_clip=={CN_CLIP_VERSION}", "-d", tmp]
            done = subprocess.run(command, capture_output=True, text=True)
            downloaded = sorted(Path(tmp).glob(f"cn_clip-{CN_CLIP_VERSION}-*.whl"))
            if done.returncode != 0 or not downloaded:
                raise RuntimeError(
                    f"could not download cn_clip=={CN_CLIP_VERSION} from PyPI into {wheels} (`pip download "
                    f"--no-deps cn_clip=={CN_CLIP_VERSION}` exited {done.returncode}): "
                    f"{(done.stderr or done.stdout).strip()[-600:]}")
            found = [downloaded[0].replace(wheels / downloaded[0].name)]
    return found[0]


def cn_clip_source(cache: Path = DEFAULT_CACHE) -> Path:
    """cn_clip's model files, extracted from its wheel (downloaded once with `pip download --no-deps`)."""
    root = Path(cache).resolve() / f"cn_clip-{CN_CLIP_VERSION}"
    marker = root / "cn_clip" / "clip" / "model.py"
    if marker.is_file():
        return root
    with zipfile.ZipFile(cn_clip_wheel(cache)) as zf:
        for member in zf.namelist():
            if member.startswith("cn_clip/clip/") and (member.endswith(".py") or member.endswith(".json")):
                zf.extract(member, root)
    return root


def wheel_member(name: str, cache: Path = DEFAULT_CACHE) -> bytes:
    """One file of the wheel, e.g. `cn_clip/clip/bert_tokenizer.py`."""
    with zipfile.ZipFile(cn_clip_wheel(cache)) as zf:
        return zf.read(name)


def extract_vocab(target: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """Write cn_clip's `vocab.txt` to `target` (checked against its known sha256) and return `target`."""
    data = wheel_member(VOCAB_MEMBER, cache)
    digest = hashlib.sha256(data).hexdigest()
    if digest != VOCAB_SHA256:
        raise RuntimeError(f"{VOCAB_MEMBER} in the cn_clip {CN_CLIP_VERSION} wheel has sha256 {digest}, "
                           f"not the expected {VOCAB_SHA256}")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def copy_vocab(target: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """`extract_vocab` unless `target` already holds the right file."""
    target = Path(target)
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == VOCAB_SHA256:
        return target
    return extract_vocab(target, cache)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gebackend.modelzoo.cnclip_wheel",
                                     description=f"Take files out of the cn_clip=={CN_CLIP_VERSION} wheel (downloaded once).")
    sub = parser.add_subparsers(dest="command", required=True)
    vocab = sub.add_parser("vocab", help="write cn_clip's tokenizer vocabulary (vocab.txt) to TARGET")
    vocab.add_argument("target", type=Path)
    vocab.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    print(copy_vocab(args.target, args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
