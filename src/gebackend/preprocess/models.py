"""What each preprocessing backend is: its one input and one output, its config parameters, and its work.

`IMAGE` (`backend: "cnclip_image_preprocess"`): TYPE_STRING `image` [1] of encoded JPEG/PNG/WebP bytes ->
TYPE_FP32 `pixel_values` [3, image_size, image_size]. `TEXT` (`backend: "cnclip_text_preprocess"`): TYPE_STRING
`text` [1] of UTF-8 text -> TYPE_INT64 `token_ids` [context_length]. A config may rename the two tensors (it
declares one input and one output of those types); auto-complete fills in what it leaves out.

The work is split in two so one request's bad item fails that request alone: `prepare` checks and converts one
item (raising `InvalidRequest`), `run` turns the prepared items of a whole batch into one stacked array.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gebackend.errors import ConfigError
from gebackend.preprocess import image, text
from gebackend.preprocess.vocab import find_vocab
from gebackend.runtime.strings import decode_utf8


@dataclass(frozen=True)
class Parameter:
    key: str
    default: str
    parse: Callable[[str], Any]  # raises ValueError saying what is accepted
    meaning: str


@dataclass(frozen=True)
class Preprocessor:
    """One loaded instance's work."""

    prepare: Callable[[Any], Any]  # one TYPE_STRING element -> a prepared item; InvalidRequest for a bad one
    run: Callable[[list], np.ndarray]  # prepared items -> [n, *output dims]
    description: str  # for the load log


@dataclass(frozen=True)
class PreprocessKind:
    backend: str
    input_name: str  # defaults; a config may name them differently
    output_name: str
    output_type: str
    output_dtype: type
    expected: str  # what an input element must be, for error messages
    parameters: tuple[Parameter, ...]
    output_dims: Callable[[dict], list[int]]  # parsed parameters -> dims without the batch dim
    load: Callable[[dict, Path, Path], Preprocessor]  # (parsed parameters, model dir, version dir)

    def parse_parameters(self, model: str, values: dict[str, str]) -> tuple[dict, list[str]]:
        """The parsed parameters (defaults filled in) and the unknown keys; a bad value is a ConfigError."""
        parsed = {}
        for p in self.parameters:
            raw = values.get(p.key, p.default)
            try:
                parsed[p.key] = p.parse(raw)
            except ValueError as exc:
                raise ConfigError(f"model '{model}': parameter {p.key}={raw!r} is invalid: {exc}") from None
        known = {p.key for p in self.parameters}
        return parsed, sorted(k for k in values if k not in known)


def _positive_int(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError(f"expected an integer >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return value
    return parse


def _formats(raw: str) -> tuple[str, ...]:
    from PIL import Image

    Image.init()
    names = tuple(f.strip().upper() for f in str(raw).split(",") if f.strip())
    unknown = [n for n in names if n not in Image.OPEN]
    if not names or unknown:
        raise ValueError(f"expected a comma list of Pillow image formats (e.g. JPEG,PNG,WEBP); "
                         f"{', '.join(unknown) or 'none given'} not among {', '.join(sorted(Image.OPEN))}")
    return names


def _load_image(params: dict, model_dir: Path, version_dir: Path) -> Preprocessor:
    size, formats = params["image_size"], params["formats"]
    return Preprocessor(
        prepare=lambda value: image.preprocess(value, size, formats),
        run=lambda items: np.stack(items) if items else np.zeros((0, 3, size, size), np.float32),
        description=f"cn_clip image_transform({size}): {'/'.join(formats)} bytes -> float32 [3, {size}, {size}]",
    )


def _load_text(params: dict, model_dir: Path, version_dir: Path) -> Preprocessor:
    path = find_vocab(model_dir, version_dir, params["vocab_file"])
    tokenizer = text.CnClipTokenizer(path, params["context_length"])
    return Preprocessor(
        prepare=decode_utf8,
        run=tokenizer.encode,
        description=(f"cn_clip tokenize(context_length={tokenizer.context_length}) with {path} "
                     f"({len(tokenizer.vocab)} tokens): UTF-8 text -> int64 [{tokenizer.context_length}]"),
    )


IMAGE = PreprocessKind(
    backend="cnclip_image_preprocess",
    input_name="image",
    output_name="pixel_values",
    output_type="TYPE_FP32",
    output_dtype=np.float32,
    expected="encoded image bytes",
    parameters=(
        Parameter("image_size", str(image.DEFAULT_SIZE), _positive_int(1), "the square side cn_clip resizes to"),
        Parameter("formats", ",".join(image.DEFAULT_FORMATS), _formats, "the image formats accepted"),
    ),
    output_dims=lambda p: [3, p["image_size"], p["image_size"]],
    load=_load_image,
)

TEXT = PreprocessKind(
    backend="cnclip_text_preprocess",
    input_name="text",
    output_name="token_ids",
    output_type="TYPE_INT64",
    output_dtype=np.int64,
    expected="UTF-8 text",
    parameters=(
        Parameter("context_length", str(text.CONTEXT_LENGTH), _positive_int(2), "token ids per text, [CLS] and [SEP] included"),
        Parameter("vocab_file", "", str, "the vocabulary (default: <version>/vocab.txt, then <model>/vocab.txt)"),
    ),
    output_dims=lambda p: [p["context_length"]],
    load=_load_text,
)

KINDS = {kind.backend: kind for kind in (IMAGE, TEXT)}
