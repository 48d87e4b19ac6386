"""The models `gebackend bench` serves, and their export into a cache folder (`bench/models/` by default).

Small models (built in code by `gebackend.modelzoo`, no extra packages, seconds to build):
  tiny          elementwise add/mul on [batch, 4]: measures the server's own overhead (batching-delay trap)
  resnet_small  the example ResNet-style CNN (64 px)
  resnet_small_inputs   the same with every weight also a graph input, as old exporters wrote them
  bert_small    the example BERT-style encoder, sequence 16

Full-size models (need the `cnclip` extra: torch CPU; random weights, exported at opset 14 with a dynamic
batch axis by torch's TorchScript exporter, as ge-backend's CN_CLIP guide does):
  resnet50      a ResNet-50 (torchvision's architecture, written out here: torchvision does not import
                beside this torch)
  resnet50_inputs       the same exported with keep_initializers_as_inputs=True (every weight a graph input)
  cnclip_image  CN_CLIP ViT-B/16 image encoder (224 px, width 768, 12 layers, embed 512)
  cnclip_text   CN_CLIP RoBERTa-wwm-ext-base Chinese text encoder (vocab 21128, 12 layers, context 52)
  cnclip_image_l4, cnclip_text_l4   the same two encoders cut to 4 of their 12 layers (a third of the work)

Stand-ins (no torch; gebackend.modelzoo.cnclip_standin): cnclip_image_standin, cnclip_text_standin, CN_CLIP's
interface with small random-weight graphs, for trying the ensemble scenarios (`SCENARIO+ensemble`) anywhere.
Every CN_CLIP model names its `ensemble` pipeline ("image" or "text", gebackend.bench.ensemble).

The CN_CLIP encoders are built by cn_clip's own model code (`cn_clip/clip/model.py`, whose image encoder uses
`nn.MultiheadAttention`), taken from the `cn_clip` wheel on PyPI: the wheel is downloaded once with
`pip download --no-deps` into the cache and only its model files are loaded (the package's `__init__` imports
torchvision, which this torch cannot import). No weights are downloaded: parameters are randomly initialised.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from gebackend.modelzoo.cnclip_wheel import cn_clip_source

OPSET = 14
DEFAULT_CACHE = Path("bench/models")


@dataclass(frozen=True)
class BenchInput:
    name: str
    dtype: str  # numpy dtype name
    dims: tuple[int, ...]  # without the batch dim
    low: float = 0.0  # values are drawn uniformly in [low, high) (integers: token ids)
    high: float = 1.0

    def sample(self, batch: int, rng: np.random.Generator) -> np.ndarray:
        shape = (batch, *self.dims)
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            return rng.integers(int(self.low), int(self.high), size=shape, dtype=self.dtype)
        return rng.uniform(self.low, self.high, size=shape).astype(self.dtype)


@dataclass(frozen=True)
class BenchModel:
    name: str
    description: str
    inputs: tuple[BenchInput, ...]
    export: Callable[[Path], None] = field(repr=False, compare=False)  # writes the ONNX file at the given path
    full_size: bool = False
    needs: str = ""  # python packages the export needs, for the "not available" message
    max_batch_size: int = 8
    ensemble: str = ""  # the CN_CLIP pipeline this model can be the encoder of: "image", "text" or "" (none)

    def path(self, cache: Path) -> Path:
        return Path(cache) / self.name / "model.onnx"

    def ensure(self, cache: Path, log: Callable[[str], None] = print) -> Path:
        """The exported ONNX file, exported now unless already in the cache."""
        target = self.path(cache)
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        log(f"bench: exporting {self.name} ({self.description}) to {target}")
        tmp = target.with_name("model.tmp.onnx")
        self.export(tmp)
        _finish(tmp, target)
        return target

    @property
    def token_input(self) -> str | None:
        """The first integer input (token ids), which trim_padding scenarios cut; None for a model without one."""
        return next((i.name for i in self.inputs if np.issubdtype(np.dtype(i.dtype), np.integer)), None)

    def sample_inputs(self, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {i.name: i.sample(batch, rng) for i in self.inputs}


def _finish(tmp: Path, target: Path) -> None:
    """Rename an exported file (and its external data, if torch wrote any) into place."""
    model = onnx.load(str(tmp))
    for f in tmp.parent.glob("model.tmp.onnx*"):
        f.unlink()
    external = model.ByteSize() >= onnx.checker.MAXIMUM_PROTOBUF
    onnx.save_model(model, str(target), save_as_external_data=external, location="model.onnx.data")


def _save(builder: Callable[[], onnx.ModelProto]) -> Callable[[Path], None]:
    return lambda path: onnx.save(builder(), str(path))


# --------------------------------------------------------------------------------------------- small models
def _tiny() -> onnx.ModelProto:
    from gebackend.modelzoo import build_add_mul

    return build_add_mul()


def _resnet_small() -> onnx.ModelProto:
    from gebackend.modelzoo import build_resnet

    return build_resnet()


def _resnet_small_inputs() -> onnx.ModelProto:
    from gebackend.modelzoo import initializers_as_inputs

    return initializers_as_inputs(_resnet_small())


def _bert_small() -> onnx.ModelProto:
    from gebackend.modelzoo import build_bert

    return build_bert()


# ----------------------------------------------------------------------------------------------- torch models
def _torch():
    try:
        import torch
    except ImportError:
        raise RuntimeError("torch is not installed: `pip install -e '.[cnclip]'` (torch==2.13.0, CPU)") from None
    return torch


def _resnet50_module():
    """torchvision's resnet50 architecture (Bottleneck, [3, 4, 6, 3]), random He-initialised weights."""
    torch = _torch()
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(nn.Module):
        def __init__(self, num_classes: int = 1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(blocks):
                    layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * 4
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))

    torch.manual_seed(0)
    return ResNet50().eval()


def _export(module, args: tuple, path: Path, input_names: list[str], output_names: list[str],
            keep_initializers_as_inputs: bool = False) -> None:
    torch = _torch()
    axes = {n: {0: "batch"} for n in input_names + output_names}
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=input_names, output_names=output_names,
                          dynamic_axes=axes, opset_version=OPSET, do_constant_folding=True, dynamo=False,
                          keep_initializers_as_inputs=keep_initializers_as_inputs)


def _export_resnet50(path: Path, keep_initializers_as_inputs: bool = False) -> None:
    torch = _torch()
    _export(_resnet50_module(), (torch.randn(1, 3, 224, 224),), path, ["image"], ["logits"],
            keep_initializers_as_inputs)


def load_cn_clip(cache: Path, layers: int | None = None):
    """cn_clip's `CLIP` (ViT-B/16 + RoBERTa-wwm-ext-base-chinese), random weights, from cn_clip's own code.

    `layers` (default: the real 12) cuts both encoders to that many transformer layers, nothing else changed.
    """
    torch = _torch()
    root = cn_clip_source(cache)
    clip_dir = root / "cn_clip" / "clip"
    # Import cn_clip.clip.model without cn_clip.clip's __init__ (it imports torchvision and loads the tokenizer):
    # the model only needs `_tokenizer.vocab['[PAD]']`, which is 0 in cn_clip's vocab.txt.
    for name, path in (("cn_clip", root / "cn_clip"), ("cn_clip.clip", clip_dir)):
        if name not in sys.modules or getattr(sys.modules[name], "__gebackend_shim__", False) is False:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            module.__gebackend_shim__ = True
            sys.modules[name] = module
    sys.modules["cn_clip.clip"]._tokenizer = types.SimpleNamespace(vocab={"[PAD]": 0})
    import importlib

    model_module = importlib.import_module("cn_clip.clip.model")
    config = json.loads((clip_dir / "model_configs" / "ViT-B-16.json").read_text())
    config.update(json.loads((clip_dir / "model_configs" / "RoBERTa-wwm-ext-base-chinese.json").read_text()))
    if layers is not None:
        config.update(vision_layers=layers, text_num_hidden_layers=layers)
    torch.manual_seed(0)
    model = model_module.CLIP(**config).eval()
    return model, config


def _export_cnclip_image(path: Path, cache: Path, layers: int | None = None) -> None:
    torch = _torch()
    model, config = load_cn_clip(cache, layers)
    res = config["image_resolution"]

    class ImageEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, image):
            return self.model.encode_image(image)

    _export(ImageEncoder().eval(), (torch.randn(1, 3, res, res),), path, ["image"], ["unnorm_image_features"])


def _export_cnclip_text(path: Path, cache: Path, layers: int | None = None, context: int = 52) -> None:
    torch = _torch()
    model, config = load_cn_clip(cache, layers)

    class TextEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, text):
            return self.model.encode_text(text)

    text = torch.randint(1, config["vocab_size"], (1, context), dtype=torch.int64)
    _export(TextEncoder().eval(), (text,), path, ["text"], ["unnorm_text_features"])


def _image_standin() -> onnx.ModelProto:
    from gebackend.modelzoo.cnclip_standin import build_cnclip_image_standin

    return build_cnclip_image_standin()


def _text_standin() -> onnx.ModelProto:
    from gebackend.modelzoo.cnclip_standin import build_cnclip_text_standin

    return build_cnclip_text_standin()


SMALL_LAYERS = 4
IMAGE_224 = (BenchInput("image", "float32", (3, 224, 224), -1.0, 1.0),)


def models(cache: Path = DEFAULT_CACHE) -> dict[str, BenchModel]:
    cache = Path(cache)
    entries = [
        BenchModel("tiny", "elementwise add/mul on [batch, 4] (server overhead only)",
                   (BenchInput("x", "float32", (4,)), BenchInput("y", "float32", (4,))), _save(_tiny)),
        BenchModel("resnet_small", "gebackend.modelzoo ResNet-style CNN, 64 px",
                   (BenchInput("image", "float32", (3, 64, 64), -1.0, 1.0),), _save(_resnet_small)),
        # Old exporters' files (torch.onnx's keep_initializers_as_inputs=True): every weight also a graph input,
        # which ONNX Runtime may not fold or prepack, since a caller could replace it (config/optional_inputs.py)
        BenchModel("resnet_small_inputs", "resnet_small with its weights also listed as graph inputs (old exporters)",
                   (BenchInput("image", "float32", (3, 64, 64), -1.0, 1.0),), _save(_resnet_small_inputs)),
        BenchModel("bert_small", "gebackend.modelzoo BERT-style encoder, hidden 64, 2 layers, sequence 16",
                   (BenchInput("input_ids", "int64", (16,), 1, 1000), BenchInput("attention_mask", "int64", (16,), 1, 2)),
                   _save(_bert_small)),
        BenchModel("resnet50", "ResNet-50 (torchvision architecture), 224 px, random weights",
                   IMAGE_224, _export_resnet50, full_size=True, needs="torch"),
        BenchModel("resnet50_inputs", "resnet50 exported with keep_initializers_as_inputs=True (old exporters)",
                   IMAGE_224, lambda p: _export_resnet50(p, keep_initializers_as_inputs=True), full_size=True,
                   needs="torch"),
        BenchModel("cnclip_image", "CN_CLIP ViT-B/16 image encoder, 224 px, width 768, 12 layers, embed 512",
                   IMAGE_224, lambda p: _export_cnclip_image(p, cache), full_size=True, needs="torch, cn_clip wheel"),
        BenchModel("cnclip_text", "CN_CLIP RoBERTa-wwm-ext-base text encoder, vocab 21128, 12 layers, context 52",
                   (BenchInput("text", "int64", (52,), 1, 21128),), lambda p: _export_cnclip_text(p, cache),
                   full_size=True, needs="torch, cn_clip wheel"),
        # The same encoders cut to 4 of their 12 layers (everything else as above): a third of the work, for
        # measuring the whole ladder on a shared 2-core machine in reasonable time.
        BenchModel("cnclip_image_l4", "CN_CLIP ViT-B/16 image encoder cut to 4 layers (224 px, width 768, embed 512)",
                   IMAGE_224, lambda p: _export_cnclip_image(p, cache, SMALL_LAYERS), needs="torch, cn_clip wheel"),
        BenchModel("cnclip_text_l4", "CN_CLIP RoBERTa-wwm-ext-base text encoder cut to 4 layers (vocab 21128, context 52)",
                   (BenchInput("text", "int64", (52,), 1, 21128),), lambda p: _export_cnclip_text(p, cache, SMALL_LAYERS),
                   needs="torch, cn_clip wheel"),
        BenchModel("cnclip_image_standin", "STAND-IN for CN_CLIP's image encoder (small, random weights, CN_CLIP's interface)",
                   IMAGE_224, _save(_image_standin)),
        BenchModel("cnclip_text_standin", "STAND-IN for CN_CLIP's text encoder (small, random weights, CN_CLIP's interface)",
                   (BenchInput("text", "int64", (52,), 1, 21128),), _save(_text_standin)),
    ]
    entries = [replace(m, ensemble=m.name.split("_")[1]) if m.name.startswith("cnclip_") else m for m in entries]
    return {m.name: m for m in entries}


def main(argv: list[str] | None = None) -> int:
    """python -m gebackend.modelzoo.bench_models [NAME ...] [--cache DIR]: export models into the cache."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m gebackend.modelzoo.bench_models")
    p.add_argument("names", nargs="*")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = p.parse_args(argv)
    known = models(args.cache)
    for name in args.names or list(known):
        print(known[name].ensure(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
