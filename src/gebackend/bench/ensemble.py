"""The CN_CLIP ensembles as a bench scenario kind: their repository and their real inputs.

A scenario `NAME+ensemble` serves a CN_CLIP encoder model (one whose `BenchModel.ensemble` is "image" or "text")
as ge scenario NAME, inside the same ensemble examples/cnclip_repository serves:

    cnclip_image: image bytes -> cnclip_image_preprocess -> cnclip_image_encoder
    cnclip_text:  UTF-8 text  -> cnclip_text_preprocess  -> cnclip_text_encoder

`write_repository` writes those three models: the encoder's file gets its normalised features as a second output
(modelzoo/normalized_output.py, as `make cnclip` does) and its config.pbtxt is the scenario's
(scenarios.config_text, under the encoder's name, so its engine, buckets, batching and instances are the
scenario's); the other two are the example repository's configs (`configs`; a unit test keeps them equal). The
same server then answers both the ensemble and the bare encoder, so the two are measured against one set of
loaded instances.

`inputs` makes the data perf_analyzer sends: real encoded JPEGs (photo-like 640x480 pictures: smooth gradients,
shapes and sensor noise, quality 90, a few hundred KiB like a camera's) or real Chinese captions for the ensemble,
and for the bare encoder the very tensors the preprocessing makes of them (gebackend.preprocess: cn_clip's
image_transform and tokenizer), so both do the same work after the preprocessing.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gebackend.bench import scenarios
from gebackend.modelzoo.bench_models import BenchModel
from gebackend.config.onnx_signature import read_signature


@dataclass(frozen=True)
class Pipeline:
    kind: str  # "image" or "text"
    ensemble: str
    preprocess: str
    encoder: str
    input_name: str  # the ensemble's and the preprocessing model's input
    preprocess_output: str
    encoder_input: str
    encoder_output: str
    features: str  # the ensemble's normalised output, and the encoder's

    @property
    def steps(self) -> tuple[str, str]:
        return (self.preprocess, self.encoder)

    @property
    def models(self) -> tuple[str, ...]:
        return (self.ensemble, *self.steps)


PIPELINES = {
    "image": Pipeline("image", "cnclip_image", "cnclip_image_preprocess", "cnclip_image_encoder", "image",
                      "pixel_values", "image", "unnorm_image_features", "image_features"),
    "text": Pipeline("text", "cnclip_text", "cnclip_text_preprocess", "cnclip_text_encoder", "text",
                     "token_ids", "text", "unnorm_text_features", "text_features"),
}

# What examples/cnclip_repository's configs say (comments left out); tests/unit/test_bench_ensemble.py compares.
_PREPROCESS = """backend: "{backend}"
max_batch_size: 8
dynamic_batching {{ }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""
_ENSEMBLE = """platform: "ensemble"
max_batch_size: 8
input [ {{ name: "{p.input_name}", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [
  {{ name: "{p.features}", data_type: TYPE_FP32, dims: [ {embed} ] }},
  {{ name: "{p.encoder_output}", data_type: TYPE_FP32, dims: [ {embed} ] }}
]
ensemble_scheduling {{
  step [
    {{
      model_name: "{p.preprocess}"
      model_version: -1
      input_map {{ key: "{p.input_name}" value: "{p.input_name}" }}
      output_map {{ key: "{p.preprocess_output}" value: "{p.preprocess_output}" }}
    }},
    {{
      model_name: "{p.encoder}"
      model_version: -1
      input_map {{ key: "{p.encoder_input}" value: "{p.preprocess_output}" }}
      output_map {{ key: "{p.encoder_output}" value: "{p.encoder_output}" }}
      output_map {{ key: "{p.features}" value: "{p.features}" }}
    }}
  ]
}}
"""


def pipeline(model: BenchModel) -> Pipeline:
    """The ensemble `model` can be the encoder of (ValueError naming the models that can, if none)."""
    if model.ensemble not in PIPELINES:
        raise ValueError(f"model {model.name} is not a CN_CLIP encoder, so it has no ensemble (the cnclip_* models have)")
    return PIPELINES[model.ensemble]


def configs(p: Pipeline, embed: int = 512) -> dict[str, str]:
    """config.pbtxt of the ensemble and its preprocessing, by model name."""
    return {p.ensemble: _ENSEMBLE.format(p=p, embed=embed), p.preprocess: _PREPROCESS.format(backend=p.preprocess)}


def write_repository(root: Path, model: BenchModel, scenario: scenarios.Scenario, onnx_path: Path,
                     cache: Path) -> Path:
    """The ensemble repository with `model` as its encoder served as `scenario`; returns `root`."""
    from gebackend.modelzoo.cnclip_wheel import copy_vocab
    from gebackend.modelzoo.normalized_output import ensure_normalized_output

    p = pipeline(model)
    encoder, bare = replace(model, name=p.encoder), replace(scenario, ensemble=False)
    scenarios.write_repository(root, encoder, bare, onnx_path)
    served = root / p.encoder / "1" / "model.onnx"  # a link to the cache: replaced by a file of its own, not changed
    if ensure_normalized_output(served, p.encoder_output, p.features):  # the config then declares the new output
        (root / p.encoder / "config.pbtxt").write_text(scenarios.config_text(encoder, bare, read_signature(served)))
    embed = read_signature(onnx_path).outputs[0].shape[-1]
    for name, text in configs(p, int(embed) if isinstance(embed, int) else 512).items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(f"# generated by gebackend bench: {scenario.name}\n{text}")
    if p.kind == "text":
        copy_vocab(root / p.preprocess / "1" / "vocab.txt", cache)
    return root


# ------------------------------------------------------------------------------------------------- inputs
CAPTIONS = (
    "一只可爱的小猫在草地上玩耍",
    "夕阳下的海边，几个孩子在沙滩上堆城堡",
    "北京故宫的红墙和金色屋顶",
    "一碗热气腾腾的兰州牛肉拉面",
    "雨后的城市街道，霓虹灯倒映在积水中",
    "穿着汉服的女孩站在樱花树下微笑",
    "一辆红色的跑车停在山路旁边",
    "深夜的图书馆里只有一个学生在看书",
)
IMAGE_SIZE = (640, 480)


def photo_like_jpegs(count: int = 4, size: tuple[int, int] = IMAGE_SIZE, seed: int = 0, quality: int = 90) -> list[bytes]:
    """Encoded JPEGs that cost what photos cost to decode: smooth colour gradients, a few shapes, sensor noise."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for _ in range(count):
        a, b, c = rng.uniform(0.2, 1.0, 3)
        base = np.stack([255 * a * x / width, 255 * b * y / height, 255 * c * (x + y) / (width + height)], -1)
        image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
            box = (x0, y0, x0 + int(rng.integers(30, width // 2)), y0 + int(rng.integers(30, height // 2)))
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
        noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 12, (height, width, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
        out.append(buffer.getvalue())
    return out


@dataclass
class Inputs:
    ensemble: list[dict]  # one entry per request: {input name: bytes or str}
    bare: list[dict]  # the same requests after preprocessing: {encoder input: array without the batch dim}
    description: str


def inputs(p: Pipeline, cache: Path, vocab: Path | None = None, count: int = 4) -> Inputs:
    """`count` requests of one item each for the ensemble, and what the preprocessing makes of them for the encoder."""
    if p.kind == "image":
        from gebackend.preprocess.image import preprocess

        jpegs = photo_like_jpegs(count)
        sizes = ", ".join(f"{len(j) // 1024} KiB" for j in jpegs)
        return Inputs([{p.input_name: j} for j in jpegs], [{p.encoder_input: preprocess(j)} for j in jpegs],
                      f"{count} photo-like {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} JPEGs, quality 90 ({sizes})")
    from gebackend.modelzoo.cnclip_wheel import copy_vocab
    from gebackend.preprocess.text import CnClipTokenizer

    texts = [CAPTIONS[i % len(CAPTIONS)] for i in range(count)]
    if vocab is None:
        vocab = copy_vocab(Path(cache) / "cnclip_vocab.txt", cache)
    ids = CnClipTokenizer(vocab).encode(texts)
    return Inputs([{p.input_name: t} for t in texts], [{p.encoder_input: row} for row in ids],
                  f"{count} Chinese captions of {min(map(len, texts))}-{max(map(len, texts))} characters")
