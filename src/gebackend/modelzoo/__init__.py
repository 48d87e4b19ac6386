"""In-code ONNX model zoo: builders for the example models (ResNet, BERT, tiny test graphs) and the example-repository writer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnx

from .bert import build_bert
from .defaults import SCALE_SHIFT_OPTIONAL, build_scale_shift, initializers_as_inputs, scale_shift_reference
from .misc import (
    build_add_mul,
    build_bf16_affine,
    build_bf16_mlp,
    build_constant_of_shape_weight,
    build_custom_negpos,
    build_identity_fixed,
    build_mod_constant,
    build_nonzero,
    build_row_scale,
    build_spin,
    build_weights_mlp,
)
from .ragged import RAGGED_SUM_CONFIG, build_ragged_sum
from .resnet import build_qdq_resnet, build_resnet
from .stateful import ACCUMULATOR_CONTROLS, accumulator_reference, build_accumulator, build_streaming_gru

__all__ = [
    "ACCUMULATOR_CONTROLS",
    "EXAMPLE_MODELS",
    "RAGGED_SUM_CONFIG",
    "SCALE_SHIFT_OPTIONAL",
    "accumulator_reference",
    "build_accumulator",
    "build_add_mul",
    "build_bert",
    "build_bf16_affine",
    "build_bf16_mlp",
    "build_constant_of_shape_weight",
    "build_custom_negpos",
    "build_example_repository",
    "build_identity_fixed",
    "build_mod_constant",
    "build_nonzero",
    "build_ragged_sum",
    "build_qdq_resnet",
    "build_resnet",
    "build_row_scale",
    "build_scale_shift",
    "build_spin",
    "build_streaming_gru",
    "build_weights_mlp",
    "initializers_as_inputs",
    "scale_shift_reference",
]

#: Example model directory name -> builder producing its ``1/model.onnx``.
EXAMPLE_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet_ge": build_resnet,
    "bert_ge": build_bert,
    "resnet_npu_ge": build_resnet,
}


def build_example_repository(repo_dir: str | os.PathLike, force: bool = False) -> list[Path]:
    """Write ``<repo_dir>/<name>/1/model.onnx`` for each known example dir that has a ``config.pbtxt``.

    Existing model files are kept unless ``force``. Returns the paths written.
    """
    written: list[Path] = []
    for model_dir in sorted(Path(repo_dir).iterdir()):
        builder = EXAMPLE_MODELS.get(model_dir.name)
        if builder is None or not (model_dir / "config.pbtxt").is_file():
            continue
        target = model_dir / "1" / "model.onnx"
        if target.exists() and not force:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(builder(), target)
        written.append(target)
    return written
