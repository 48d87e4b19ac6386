"""Where the sizes of an input we invent can come from, beside the file's own dims, in the order they are tried.

A load or a tune that runs a model without a request (the accuracy check, static int8's seeded calibration, the
tune's seeded requests) must give every free dim a size the model takes. The sources, most trusted first: the
`model_warmup` requests of config.pbtxt (its dims always win, compile/seed_shapes.py applies them to every
candidate), the first `calibration_data` sample, the input size exporters record in the file's metadata
(Ultralytics writes `imgsz` = "[640, 640]"; paddle2onnx writes none), then typical sizes: an image's free height and
width at 224, 320, 640 and other multiples of 32 (detectors concatenate feature maps that only such sizes align), then
the sizes of a line of text (48x320, 48x192, 32x320: OCR recognisers take a fixed height), any
other free dim at the default 16 (compile/free_dims.py's), then 32, 64 and 128. Each source is a `Candidate`: hints as
compile/free_dims.py takes them (a whole shape per input, -1 where it says nothing), the default size for what is left
free, and the phrase the load line prints for it. This module only reads; compile/seed_shapes.py runs them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx

from gebackend.compile.free_dims import conv_channels, graph_inputs

Hints = Mapping[str, Sequence[int]]
DEFAULT = 16  # compile/free_dims.py's size for a free dim nothing else sizes
IMAGE_SIZES = (224, 320, 640, 256, 384, 416, 448, 512, 576, 736, 960)
# (height, width) of a line of text, after the squares: OCR recognisers and direction classifiers take a fixed height
# (PaddleOCR's 48, older models' 32) at any width
LINE_SIZES = ((48, 320), (48, 192), (32, 320), (32, 128), (64, 256))
LENGTHS = (32, 64, 128)  # a free dim that is no image side, after DEFAULT
METADATA_KEYS = ("imgsz", "img_size", "image_size", "input_size")


@dataclass(frozen=True)
class Candidate:
    source: str  # the phrase the load line prints: "model_warmup", "the file's metadata imgsz=[320, 320]", ...
    hints: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    default: int = DEFAULT  # the size of a free dim the hints leave free


def free_axes(model: onnx.ModelProto, hints: Hints) -> dict[str, tuple[int, ...]]:
    """Per input, the axes after the first that neither the file, the hints (config.pbtxt's dims) nor a Conv's
    weight (its channels) size: those a source or a probe must choose. The first axis is the batch, sent as 1."""
    channels = conv_channels(model)
    found = {}
    for value in graph_inputs(model):
        hint = hints.get(value.name) or ()
        dims = value.type.tensor_type.shape.dim
        fixed = lambda axis, d: (d.HasField("dim_value") and d.dim_value > 0) or (  # noqa: E731
            len(hint) == len(dims) and hint[axis] > 0) or (value.name, axis) in channels
        axes = tuple(axis for axis, d in enumerate(dims) if axis > 0 and not fixed(axis, d))
        if axes:
            found[value.name] = axes
    return found


def image_axes(model: onnx.ModelProto, free: Mapping[str, tuple[int, ...]],
               hints: Hints | None = None) -> dict[str, tuple[int, ...]]:
    """Per image input, its free height and width: a rank-4 input of a few channels (1 to 4, by the file, the
    config or a Conv's weight) on axis 1 whose axes 2 and 3 are free (NCHW), or on axis 3 with axes 1 and 2 free
    (NHWC); or one free side beside a fixed one of 8 or more (a text line's [batch, 3, 48, width])."""
    channels = conv_channels(model)
    found = {}
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        axes = free.get(value.name, ())
        if len(dims) != 4 or not axes:
            continue
        hint = tuple((hints or {}).get(value.name) or ())
        size = [d.dim_value if d.HasField("dim_value") else hint[k] if len(hint) == 4 and hint[k] > 0 else 0
                for k, d in enumerate(dims)]
        few = lambda axis: 0 < (size[axis] or channels.get((value.name, axis), 0)) <= 4  # noqa: E731
        for channel, sides in ((1, (2, 3)), (3, (1, 2))):
            other = [size[a] for a in sides if a not in axes]
            if few(channel) and set(axes) <= set(sides) and all(s >= 8 for s in other):
                found[value.name] = axes
                break
    return found


def warmup(entries: Sequence[Mapping] | None, batching: bool) -> list[Candidate]:
    """The first `model_warmup` request of config.pbtxt that gives dims (as Triton sends it: batch dim 1 added)."""
    for entry in entries or ():
        inputs = entry.get("inputs") or {}
        hints = {name: ((1,) if batching else ()) + tuple(int(d) for d in spec.get("dims") or ())
                 for name, spec in inputs.items() if isinstance(spec, Mapping) and spec.get("dims")}
        if hints:
            return [Candidate("model_warmup", hints)]
    return []


def sample(feeds: Mapping[str, np.ndarray] | None) -> list[Candidate]:
    """The first `calibration_data` sample's shapes."""
    if not feeds:
        return []
    return [Candidate("calibration_data", {name: tuple(np.shape(value)) for name, value in feeds.items()})]


def metadata(model: onnx.ModelProto, images: Mapping[str, tuple[int, ...]]) -> list[Candidate]:
    """The input size the exporter recorded in the file's metadata_props, for the free height and width."""
    props = {p.key: p.value for p in model.metadata_props}
    for key in METADATA_KEYS:
        side = _sides(props.get(key, ""))
        if side and images:
            return [Candidate(f"the file's metadata {key}={props[key]}", _sized(model, images, side))]
    return []


def _sides(text: str) -> tuple[int, int] | None:
    """(height, width) from "640", "[320, 320]" or "[1, 3, 640, 640]"; None when it is not such a size."""
    try:
        value = ast.literal_eval(text.strip()) if text.strip() else None
    except (ValueError, SyntaxError):
        return None
    sizes = [value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else []
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        return None
    return (sizes[0], sizes[0]) if len(sizes) == 1 else (sizes[-2], sizes[-1])


def _sized(model: onnx.ModelProto, images: Mapping[str, tuple[int, ...]], side: tuple[int, int]) -> dict:
    """Hints giving each image input's free height and width the sizes of `side`."""
    hints = {}
    for value in graph_inputs(model):
        axes = images.get(value.name)
        if not axes:
            continue
        rank = len(value.type.tensor_type.shape.dim)
        spatial = (2, 3) if set(axes) <= {2, 3} else (1, 2)
        hints[value.name] = tuple(side[spatial.index(a)] if a in axes else -1 for a in range(rank))
    return hints


def probes(model: onnx.ModelProto, images: Mapping[str, tuple[int, ...]]) -> list[Candidate]:
    """Typical sizes: every image side at each of IMAGE_SIZES where the model has free image sides (`images`, from
    `image_axes`; its other free dims at DEFAULT), then the LINE_SIZES of a line of text where both sides are free;
    else DEFAULT and then each of LENGTHS for every free dim."""
    if images:
        two = any(len(a) == 2 for a in images.values())
        squares = [Candidate(f"probed {size}x{size}" if two else f"probed {size}", _sized(model, images, (size, size)))
                   for size in IMAGE_SIZES]
        lines = [Candidate(f"probed {h}x{w}", _sized(model, images, (h, w))) for h, w in LINE_SIZES] if two else []
        return squares + lines
    return [Candidate(f"the default size {DEFAULT}")] + [Candidate(f"probed {n}", default=n) for n in LENGTHS]
