"""Small file operations more than one part of gebackend needs."""

from __future__ import annotations

import os
import shutil


def link_or_copy(source, target) -> str:
    """Hard-link `source` to `target`, or copy it (with its metadata) where a link cannot be made: another file
    system, or a file the kernel will not let us link (fs.protected_hardlinks). Returns `target`, so it serves as
    `shutil.copytree`'s copy_function."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return str(target)
