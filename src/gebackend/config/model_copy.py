"""A modified copy of a model's ONNX file for the engines to load, written outside the user's repository: the npu_ge
boundary renames (config/io_names.py) and trim_padding's freed sequence dim (runtime/padding_trim.py) write one."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


def write_model_copy(model, path: Path, temp_parent: Path | None, prefix: str) -> Path:
    """`model` (loaded from `path` without its external data) saved as a copy the engines load instead of `path`.

    The copy keeps the file name and sits in a private folder (under `temp_parent` when given, named with `prefix`)
    removed when this process ends; external data files are hard-linked into it (copied across file systems).
    """
    import onnx

    from gebackend.config.onnx_signature import all_tensors

    model_dir = path.resolve().parent
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=temp_parent))
    atexit.register(shutil.rmtree, str(root), True)
    # Keep <model>/<version>/<file>: external data may sit in the model folder ("../weights.bin").
    copy_dir = root / model_dir.parent.name / model_dir.name
    copy_dir.mkdir(parents=True)
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            link = Path(os.path.normpath(copy_dir / location))
            if not link.exists():  # ONNX Runtime refuses a symlink that leads out of the model's folder
                link.parent.mkdir(parents=True, exist_ok=True)
                source = os.path.normpath(model_dir / location)
                try:
                    os.link(source, link)
                except OSError:  # another file system
                    shutil.copyfile(source, link)
    copy = copy_dir / path.name
    onnx.save(model, str(copy))
    return copy
