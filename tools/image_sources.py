"""The files `make image` copies into the image, and one hash of their contents.

    python3 tools/image_sources.py          # prints the hash (tools/build_image.sh labels the image with it)
    python3 tools/image_sources.py --list   # prints the files

The container test (tests/e2e/test_container.py) rebuilds the image only when the label differs: an image is
reused as long as it was built from exactly these contents. Keep in step with .containerignore.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ["Containerfile", ".containerignore", "pyproject.toml", "constraints.txt", "README.md"]


def image_sources(root: Path = ROOT) -> list[Path]:
    files = [root / name for name in TOP]
    files += sorted(p for p in (root / "src").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and not any(q.endswith(".egg-info") for q in p.parts))
    files += sorted((root / "examples" / "model_repository").glob("*/config.pbtxt"))
    return files


def sources_hash(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for path in image_sources(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()


if __name__ == "__main__":
    if "--list" in sys.argv[1:]:
        print("\n".join(str(p.relative_to(ROOT)) for p in image_sources()))
    else:
        print(sources_hash())
