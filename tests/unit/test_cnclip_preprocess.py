"""CN_CLIP preprocessing (gebackend.preprocess) against cn_clip's own code, without a server.

The tokenizer is compared with cn_clip 1.6.0's `FullTokenizer` itself (`cn_clip/clip/bert_tokenizer.py`, loaded from
the wheel as a module file) wrapped as `cn_clip.clip.tokenize` does; the image transform with a reference written
straight from cn_clip's `image_transform` and the torchvision steps it runs on a PIL image. The wheel comes from PyPI
once into the bench cache (bench/models/wheels, as `gebackend bench` and `make cnclip` use it): without PyPI these
tests fail, they do not skip. Also here: the serving layer's per-request errors with a fake pb_utils, the stand-in
encoders, the normalisation model and the repository builder.

The reference helpers below (`cn_clip_tokenize`, `cn_clip_image_transform`, ...) are also what
tests/e2e/test_cnclip_service.py checks the served ensembles against.
"""

from __future__ import annotations

import importlib.util
import io
import json
import random
import shutil
import sys
import types
import unicodedata
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from PIL import Image

from gebackend.errors import ConfigError, InvalidRequest
from gebackend.modelzoo.cnclip_wheel import CN_CLIP_VERSION, cn_clip_wheel, copy_vocab
from gebackend.preprocess import image as image_pre
from gebackend.preprocess.text import CnClipTokenizer

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench" / "models"  # the cache `gebackend bench` and `make cnclip` download the wheel into
EXAMPLE = ROOT / "examples" / "cnclip_repository"


# ------------------------------------------------------------------------------------------- references (cn_clip)
def load_cn_clip_reference(target: Path) -> tuple[types.ModuleType, Path]:
    """cn_clip's bert_tokenizer.py (as a module, from the wheel) and its vocab.txt, extracted under `target`."""
    with zipfile.ZipFile(cn_clip_wheel(CACHE)) as zf:
        for member in ("cn_clip/clip/bert_tokenizer.py", "cn_clip/clip/vocab.txt", "cn_clip/clip/utils.py"):
            zf.extract(member, target)
    if "six" not in sys.modules:  # bert_tokenizer imports six only for six.PY2 / six.PY3 (not installed here)
        try:
            import six  # noqa: F401
        except ImportError:
            sys.modules["six"] = types.SimpleNamespace(PY2=False, PY3=True)
    path = target / "cn_clip" / "clip" / "bert_tokenizer.py"
    spec = importlib.util.spec_from_file_location("cn_clip_bert_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, target / "cn_clip" / "clip" / "vocab.txt"


def cn_clip_tokenize(tokenizer, texts: list[str], context_length: int = 52) -> np.ndarray:
    """`cn_clip/clip/utils.py: tokenize` (cn_clip 1.6.0) with numpy in place of torch, line for line:

        all_tokens.append([_tokenizer.vocab['[CLS]']] + _tokenizer.convert_tokens_to_ids(_tokenizer.tokenize(text))[
                                                        :context_length - 2] + [_tokenizer.vocab['[SEP]']])
        result = torch.zeros(len(all_tokens), context_length, dtype=torch.long)
        for i, tokens in enumerate(all_tokens):
            assert len(tokens) <= context_length
            result[i, :len(tokens)] = torch.tensor(tokens)
    """
    all_tokens = []
    for text in texts:
        all_tokens.append([tokenizer.vocab["[CLS]"]] + tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))[
                                                        :context_length - 2] + [tokenizer.vocab["[SEP]"]])
    result = np.zeros((len(all_tokens), context_length), dtype=np.int64)
    for i, tokens in enumerate(all_tokens):
        assert len(tokens) <= context_length
        result[i, :len(tokens)] = np.array(tokens)
    return result


CN_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # cn_clip/clip/utils.py: image_transform's Normalize
CN_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def cn_clip_image_transform(image: Image.Image, image_size: int = 224) -> np.ndarray:
    """cn_clip's `image_transform(image_size)` = Compose([Resize((s, s), BICUBIC), _convert_to_rgb, ToTensor(),
    Normalize(mean, std)]), each step as torchvision runs it on a PIL image:
    - F.resize: returns the image itself when [h, w] already equals the output size, else F_pil.resize, which calls
      `img.resize(tuple(size[::-1]), interpolation)` with PIL's BICUBIC;
    - _convert_to_rgb: `image.convert('RGB')`;
    - F.to_tensor: `torch.from_numpy(np.array(pic, mode_to_nptype.get(pic.mode, np.uint8), copy=True))`,
      `.view(pic.size[1], pic.size[0], len(pic.getbands()))`, `.permute((2, 0, 1))`, `.to(float32).div(255)`;
    - F.normalize: `mean = torch.as_tensor(mean, dtype=tensor.dtype)` (same for std), `tensor.sub_(mean[:, None, None])
      .div_(std[:, None, None])`.
    """
    output_size = [image_size, image_size]
    if [image.size[1], image.size[0]] != output_size:
        image = image.resize(tuple(output_size[::-1]), Image.BICUBIC)
    image = image.convert("RGB")
    tensor = np.array(image, np.uint8, copy=True)
    tensor = tensor.reshape(image.size[1], image.size[0], len(image.getbands())).transpose((2, 0, 1))
    tensor = tensor.astype(np.float32) / np.float32(255)
    mean = np.asarray(CN_CLIP_MEAN, dtype=tensor.dtype)
    std = np.asarray(CN_CLIP_STD, dtype=tensor.dtype)
    tensor = tensor - mean[:, None, None]
    return tensor / std[:, None, None]


def cn_clip_image_bytes(data: bytes, image_size: int = 224) -> np.ndarray:
    """cn_clip's loading (`Image.open(BytesIO(...))`, no EXIF transpose: cn_clip/eval/data.py) then its transform."""
    return cn_clip_image_transform(Image.open(io.BytesIO(data)), image_size)


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def make_images(rng: np.random.Generator) -> dict[str, bytes]:
    """JPEG/PNG/WebP of several modes, sizes and aspect ratios, made with Pillow."""
    def noise(w, h, channels=3):
        base = np.linspace(0, 255, w * h * channels).reshape(h, w, channels)
        return np.clip(base + rng.normal(0, 40, (h, w, channels)), 0, 255).astype(np.uint8)

    rgb = {size: Image.fromarray(noise(*size)) for size in [(224, 224), (640, 480), (97, 300), (1000, 37), (1, 1), (225, 224)]}
    out = {}
    for (w, h), im in rgb.items():
        out[f"rgb_{w}x{h}.jpg"] = encode(im, "JPEG", quality=90)
        out[f"rgb_{w}x{h}.png"] = encode(im, "PNG")
    out["rgb_640x480.webp"] = encode(rgb[(640, 480)], "WEBP", quality=80)
    out["rgb_97x300_lossless.webp"] = encode(rgb[(97, 300)], "WEBP", lossless=True)
    out["grey_300x200.png"] = encode(rgb[(640, 480)].convert("L").resize((300, 200)), "PNG")
    out["grey_333x500.jpg"] = encode(rgb[(97, 300)].convert("L").resize((333, 500)), "JPEG")
    rgba = Image.fromarray(noise(320, 240, 4))
    out["rgba_320x240.png"] = encode(rgba, "PNG")
    out["rgba_320x240.webp"] = encode(rgba, "WEBP", lossless=True)
    out["la_150x90.png"] = encode(Image.fromarray(noise(150, 90, 2)[..., :2].copy(), "LA"), "PNG")
    out["palette_256x128.png"] = encode(rgb[(640, 480)].resize((256, 128)).convert("P", palette=Image.ADAPTIVE, colors=64), "PNG")
    palette_alpha = rgba.convert("P", palette=Image.ADAPTIVE, colors=32)
    out["palette_transparency_320x240.png"] = encode(palette_alpha, "PNG", transparency=3)
    out["bilevel_200x120.png"] = encode(rgb[(640, 480)].resize((200, 120)).convert("1"), "PNG")
    out["cmyk_240x180.jpg"] = encode(rgb[(640, 480)].resize((240, 180)).convert("CMYK"), "JPEG")
    return out


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """cn_clip's FullTokenizer and the vocab path (from the wheel, downloaded once: fails loudly without PyPI)."""
    module, vocab = load_cn_clip_reference(tmp_path_factory.mktemp("cn_clip"))
    return module.FullTokenizer(str(vocab)), vocab


@pytest.fixture(scope="session")
def tokenizer(reference):
    return CnClipTokenizer(reference[1])


def generated_texts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    common = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跑狗猫猪鸟花草树"
    english = ["a", "photo", "of", "the", "cat", "dog", "CLIP", "Chinese", "model", "is", "running", "ONNX", "Triton",
               "server", "unaffable", "preprocessing", "tokenizer", "WordPiece", "GPU", "iPhone", "COVID-19", "e-mail"]
    punct = list("，。！？、；：“”‘’（）《》【】…—·,.!?;:'\"()[]{}<>@#$%^&*-_=+/\\|~`")
    fullwidth = list("ＡＢＣｘｙｚ０１２３４５６７８９！＃％＆（）＋，－．／：；＜＝＞？＠［］＾＿｀｛｜｝～　")
    accents = ["café", "naïve", "Ångström", "résumé", "Æsop", "Œuvre", "São", "Dvořák", "İstanbul", "Straße", "ÉCOLE",
               "Crème brûlée", "ΟΔΥΣΣΕΥΣ", "Σίσυφος", "ΑΣ", "Ελληνικά", "Москва", "naı̈ve", "e\u0301", "a\u0300\u0316"]
    emoji = ["😀", "🐱", "👍🏽", "🥰", "🧑\u200d🚀", "❤️", "🇨🇳", "🤖", "🫠", "⭐"]
    control = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\x85", "\u200b", "\u200d", "\ufeff", "\ufffd", "\t", "\n", "\r",
               "\x0b", "\x0c", "\u2028", "\u2029", "\u00a0", "\u3000", "\u202f"]
    rare = ["\ue000", "\U000f0000", "\U0002b820", "\U0002b91f", "\U0002a700", "\U00020000", "\uf900", "\u0378", "ㄅ",
            "한국어", "カタカナ", "ひらがな", "ภาษาไทย", "עברית", "العربية", "\u0890", "\u061d", "\u166d"]
    texts = ["", " ", "   ", "\t\n \u3000 ", "\x00", "a", "中", "[CLS]", "[UNK] [SEP] [PAD]", "##ing", "##"]
    for _ in range(120):  # generated Chinese sentences
        texts.append("".join(rng.choice(common) for _ in range(rng.randint(2, 30))) + rng.choice(["", "。", "！", "？"]))
    for _ in range(120):  # mixed Chinese / English / digits / punctuation / full-width / accents / emoji / controls
        parts = []
        for _ in range(rng.randint(1, 14)):
            pool = rng.choice([english, accents, emoji, control, rare, punct, fullwidth, [str(rng.randint(0, 10 ** 6))],
                               ["".join(rng.choice(common) for _ in range(rng.randint(1, 6)))]])
            parts.append(rng.choice(pool))
        texts.append(rng.choice(["", " ", ""]).join(parts))
    for n in (49, 50, 51, 52, 53, 80, 300):  # around and over the 52-token context (CLS + 50 + SEP)
        texts.append("".join(rng.choice(common) for _ in range(n)))
        texts.append(" ".join(rng.choice(english) for _ in range(n)))
    texts.append("x" * 200)  # a word of 200 characters is WordPiece'd; 201 is [UNK]
    texts.append("x" * 201)
    texts.append("一" * 1000 + "end")
    for _ in range(40):  # random code points from every plane
        texts.append("".join(chr(rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0xFFFF),
                                             rng.randint(0x10000, 0x10FFFF)])) for _ in range(rng.randint(1, 12))))
    return [t for t in texts if not any(0xD800 <= ord(c) <= 0xDFFF for c in t)]


# ------------------------------------------------------------------------------------------------------ tokenizer
def test_tokenizer_ids_equal_cn_clips_own_tokenizer(reference, tokenizer):
    ref, _ = reference
    texts = generated_texts()
    assert len(texts) >= 300
    want = cn_clip_tokenize(ref, texts)
    got = tokenizer.encode(texts)
    assert got.dtype == np.int64 and got.shape == (len(texts), 52)
    mismatches = [(t, got[i].tolist(), want[i].tolist()) for i, t in enumerate(texts) if not np.array_equal(got[i], want[i])]
    assert not mismatches, mismatches[:3]
    # the set covers what it should: truncation, [UNK]s, emptiness
    assert (want[:, -1] == ref.vocab["[SEP]"]).sum() >= 5  # texts that filled the whole context
    assert (want == ref.vocab["[UNK]"]).any()
    assert [row.tolist()[:3] for row, t in zip(want, texts) if t == ""][0] == [101, 102, 0]


def test_tokenizer_one_text_at_a_time_equals_batched(reference, tokenizer):
    ref, _ = reference
    texts = generated_texts(seed=1)[:60]
    for text, row in zip(texts, tokenizer.encode(texts)):
        np.testing.assert_array_equal(tokenizer.encode([text])[0], row)
        np.testing.assert_array_equal(row, cn_clip_tokenize(ref, [text])[0])


def test_tokenizer_words_equal_basic_tokenizer_on_every_unicode_category(reference, tokenizer):
    """One character of every Unicode category, alone and inside a word, against cn_clip's BasicTokenizer
    (where `tokenizers`' own BertNormalizer, with its older Unicode tables, would differ: see text.py)."""
    ref, _ = reference
    by_category: dict[str, list[str]] = {}
    for cp in range(0, 0x110000, 7):
        if not 0xD800 <= cp <= 0xDFFF:
            by_category.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    sample = [c for chars in by_category.values() for c in chars[:: max(1, len(chars) // 40)]]
    for char in sample:
        for text in (char, f"Ab{char}cd", f"中{char}。"):
            assert tokenizer.words(text) == ref.basic_tokenizer.tokenize(text), (hex(ord(char)), text)
    np.testing.assert_array_equal(tokenizer.encode(sample), cn_clip_tokenize(ref, sample))


def test_tokenizer_other_context_lengths(reference):
    ref, vocab = reference
    texts = generated_texts(seed=2)[:50]
    for length in (2, 3, 16, 77):
        np.testing.assert_array_equal(CnClipTokenizer(vocab, length).encode(texts), cn_clip_tokenize(ref, texts, length))


def test_tokenizer_rejects_bad_vocabularies(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the vocabulary"):
        CnClipTokenizer(tmp_path / "missing.txt")
    (tmp_path / "v.txt").write_text("hello\nworld\n")
    with pytest.raises(ConfigError, match=r"lacks \['\[CLS\]'"):
        CnClipTokenizer(tmp_path / "v.txt")


def test_text_decoding_is_strict_utf8():
    from gebackend.runtime.strings import decode_utf8

    assert decode_utf8("中文".encode()) == "中文" and decode_utf8("already str") == "already str"
    for bad in (b"\xff\xfe", b"abc\xe4\xb8", b"\xed\xa0\x80"):  # not UTF-8, truncated sequence, a surrogate
        with pytest.raises(InvalidRequest, match="expected UTF-8 text, got .* not valid UTF-8"):
            decode_utf8(bad)


# ---------------------------------------------------------------------------------------------------------- image
@pytest.mark.parametrize("size", [224, 336])
def test_image_transform_equals_cn_clips_on_jpeg_png_webp_of_every_mode(size):
    images = make_images(np.random.default_rng(0))
    formats = {n.rsplit(".", 1)[1] for n in images}
    assert formats == {"jpg", "png", "webp"}
    for name, data in images.items():
        got = image_pre.preprocess(data, size)
        want = cn_clip_image_bytes(data, size)
        assert got.dtype == np.float32 and got.shape == (3, size, size), name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_the_normalisation_table_gives_the_arithmetic_bits_for_every_pixel_value():
    every = np.arange(256, dtype=np.uint8)
    pixels = np.stack([every, every[::-1], np.roll(every, 7)]).reshape(3, 16, 16)
    looked_up = image_pre.transform(Image.fromarray(pixels.transpose(1, 2, 0), "RGB"), size=16)
    np.testing.assert_array_equal(looked_up, image_pre.normalize_arithmetic(pixels))
    assert looked_up.view(np.uint32).tobytes() == image_pre.normalize_arithmetic(pixels).view(np.uint32).tobytes()


def test_image_modes_really_differ_before_conversion():
    """Palette and bilevel images are resized in their own mode (Pillow: NEAREST), RGBA premultiplied, before
    cn_clip converts to RGB: converting first would give other pixels, so the order is checked, not just the result."""
    images = make_images(np.random.default_rng(0))
    for name in ("palette_256x128.png", "rgba_320x240.png", "bilevel_200x120.png"):
        opened = Image.open(io.BytesIO(images[name]))
        convert_first = cn_clip_image_transform(opened.convert("RGB"))
        assert not np.array_equal(convert_first, image_pre.preprocess(images[name])), name


def test_exif_orientation_is_ignored_as_cn_clip_ignores_it():
    im = Image.fromarray(np.random.default_rng(1).integers(0, 255, (120, 200, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    data = encode(im, "JPEG", exif=exif.tobytes())
    np.testing.assert_array_equal(image_pre.preprocess(data), cn_clip_image_bytes(data))


def test_bad_image_payloads_are_invalid_requests():
    good = encode(Image.new("RGB", (64, 48), (10, 200, 30)), "JPEG")
    gif = encode(Image.new("P", (10, 10)), "GIF")
    cases = [
        (b"", "got 0 bytes"),
        (np.random.default_rng(0).bytes(1000), "does not recognise"),
        (good[: len(good) // 2], "could not decode"),  # a truncated JPEG
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "JPEG, PNG or WebP"),
        (gif, "does not recognise"),  # a real image, but not a format this model accepts
        ("a str, not bytes", "expected encoded image bytes"),
    ]
    for payload, fragment in cases:
        with pytest.raises(InvalidRequest) as info:
            image_pre.preprocess(payload)
        assert fragment in str(info.value) and "Traceback" not in str(info.value), str(info.value)
    assert image_pre.preprocess(gif, formats=("GIF",)).shape == (3, 224, 224)


# ----------------------------------------------------------------------------------------------- serving (fake pb)
class FakeTensor:
    def __init__(self, name, array):
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class FakeRequest:
    def __init__(self, **inputs):
        self.tensors = [FakeTensor(k, v) for k, v in inputs.items()]


class FakeError:
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class FakeResponse:
    def __init__(self, output_tensors, error=None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class FakeLogger:
    lines: list = []

    @classmethod
    def log_info(cls, m):
        cls.lines.append(("info", m))

    @classmethod
    def log_warn(cls, m):
        cls.lines.append(("warn", m))


fake_pb = types.SimpleNamespace(
    Tensor=FakeTensor, InferenceResponse=FakeResponse, TritonError=FakeError, Logger=FakeLogger,
    get_input_tensor_by_name=lambda request, name: next((t for t in request.tensors if t.name() == name), None),
)


class FakeAutoComplete:
    """The part of pb_utils.ModelConfig auto-complete uses (its add_input/add_output rules, simplified)."""

    def __init__(self, config):
        self.config = {"input": [], "output": [], "max_batch_size": 0, **config}

    def as_dict(self):
        return self.config

    def add_input(self, entry):
        self._add("input", entry)

    def add_output(self, entry):
        self._add("output", entry)

    def _add(self, kind, entry):
        for e in self.config[kind]:
            if e["name"] == entry["name"]:
                e.update(entry)
                return
        self.config[kind].append(entry)

    def set_max_batch_size(self, n):
        self.config["max_batch_size"] = n

    def set_dynamic_batching(self):
        self.config.setdefault("dynamic_batching", {})


def served(kind, model_dir: Path, config: dict):
    from gebackend.preprocess.serving import PreprocessModel, auto_complete

    completed = auto_complete(kind, FakeAutoComplete({"name": model_dir.name, **config}), fake_pb).as_dict()
    args = {"model_config": json.dumps(completed), "model_name": model_dir.name, "model_repository": str(model_dir),
            "model_version": "1", "model_instance_name": f"{model_dir.name}_0"}
    return PreprocessModel.load(kind, args, fake_pb), completed


def strings(*values) -> np.ndarray:
    return np.array([[v] for v in values], dtype=object)


def test_auto_complete_fills_a_one_line_config(tmp_path):
    from gebackend.preprocess.models import IMAGE, TEXT

    _, image_config = served(IMAGE, tmp_path / "img", {})
    assert image_config["input"] == [{"name": "image", "data_type": "TYPE_STRING", "dims": [1]}]
    assert image_config["output"] == [{"name": "pixel_values", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}]
    assert image_config["max_batch_size"] == 8 and "dynamic_batching" in image_config
    (tmp_path / "txt" / "1").mkdir(parents=True)
    copy_vocab(tmp_path / "txt" / "1" / "vocab.txt", CACHE)
    params = {"context_length": {"string_value": "16"}}
    _, text_config = served(TEXT, tmp_path / "txt", {"parameters": params, "max_batch_size": 4,
                                                     "input": [{"name": "caption", "data_type": "TYPE_STRING"}]})
    assert text_config["input"] == [{"name": "caption", "data_type": "TYPE_STRING", "dims": [1]}]
    assert text_config["output"] == [{"name": "token_ids", "data_type": "TYPE_INT64", "dims": [16]}]
    assert text_config["max_batch_size"] == 4


def test_config_mistakes_fail_the_load_naming_the_model(tmp_path):
    from gebackend.preprocess.models import IMAGE, TEXT

    with pytest.raises(ValueError, match=r"model 'img': parameter image_size='big' is invalid"):
        served(IMAGE, tmp_path / "img", {"parameters": {"image_size": {"string_value": "big"}}})
    with pytest.raises(ValueError, match=r"output 'pixel_values' .* is TYPE_FP32, not TYPE_FP16"):
        served(IMAGE, tmp_path / "img", {"output": [{"name": "pixel_values", "data_type": "TYPE_FP16"}]})
    with pytest.raises(ValueError, match=r"formats='JPEG,NOPE'"):
        served(IMAGE, tmp_path / "img", {"parameters": {"formats": {"string_value": "JPEG,NOPE"}}})
    # a missing vocabulary says where it looked and how to get it
    (tmp_path / "txt" / "1").mkdir(parents=True)
    with pytest.raises(RuntimeError) as info:
        served(TEXT, tmp_path / "txt", {})
    message = str(info.value)
    assert "model 'txt'" in message and str(tmp_path / "txt" / "1" / "vocab.txt") in message
    assert str(tmp_path / "txt" / "vocab.txt") in message and "python -m gebackend.modelzoo.cnclip_wheel vocab" in message
    with pytest.raises(RuntimeError, match=r"looked for .*elsewhere\.txt \(config parameter vocab_file\)"):
        served(TEXT, tmp_path / "txt", {"parameters": {"vocab_file": {"string_value": "elsewhere.txt"}}})


def test_a_bad_request_fails_alone_inside_a_batch(tmp_path, reference):
    from gebackend.preprocess.models import IMAGE, TEXT

    model, _ = served(IMAGE, tmp_path / "img", {"parameters": {"unknown_knob": {"string_value": "1"}}})
    assert any(level == "warn" and "unknown parameter(s) ignored: unknown_knob" in m for level, m in FakeLogger.lines)
    images = make_images(np.random.default_rng(3))
    a, b = images["rgb_640x480.jpg"], images["palette_256x128.png"]
    responses = model.execute([
        FakeRequest(image=strings(a)),
        FakeRequest(image=strings(b, b"not an image", a)),  # item 1 of 3 is bad: this request fails
        FakeRequest(image=strings(b, a)),
        FakeRequest(other=strings(a)),  # no 'image' input at all
    ])
    assert [r.error is None for r in responses] == [True, False, True, False]
    np.testing.assert_array_equal(responses[0].outputs["pixel_values"], cn_clip_image_bytes(a)[None])
    np.testing.assert_array_equal(responses[2].outputs["pixel_values"], np.stack([cn_clip_image_bytes(b), cn_clip_image_bytes(a)]))
    error = responses[1].error
    assert error.code == "INVALID_ARG"
    assert error.message.startswith("model 'img': input 'image' item 1 of 3: expected an encoded JPEG, PNG or WebP image")
    assert responses[3].error.code == "INVALID_ARG" and "input 'image' is missing" in responses[3].error.message

    (tmp_path / "txt" / "1").mkdir(parents=True)
    copy_vocab(tmp_path / "txt" / "1" / "vocab.txt", CACHE)
    text_model, _ = served(TEXT, tmp_path / "txt", {})
    responses = text_model.execute([FakeRequest(text=strings("你好".encode(), b"")), FakeRequest(text=strings(b"\xff")),
                                    FakeRequest(text=strings("cat 🐱".encode()))])
    assert [r.error is None for r in responses] == [True, False, True]
    np.testing.assert_array_equal(responses[0].outputs["token_ids"], cn_clip_tokenize(reference[0], ["你好", ""]))
    np.testing.assert_array_equal(responses[2].outputs["token_ids"], cn_clip_tokenize(reference[0], ["cat 🐱"]))
    assert responses[1].error.message == ("model 'txt': input 'text': expected UTF-8 text, got 1 bytes that are not "
                                          "valid UTF-8 (invalid start byte at byte 0)")


def test_a_failing_batch_run_is_retried_per_request(tmp_path):
    from gebackend.preprocess.models import IMAGE

    model, _ = served(IMAGE, tmp_path / "img", {})
    real_run = model.pre.run

    def run(items):  # a run fails whenever it holds a 1x1 image (stands for an unexpected engine failure)
        if any(item.shape != (3, 224, 224) for item in items):
            raise RuntimeError("boom")
        return real_run(items)

    def prepare(value):
        if value == b"crash":  # a bug of ours while preparing one item
            raise KeyError("oops")
        return np.zeros((3, 1, 1), np.float32) if value == b"odd" else image_pre.preprocess(value)

    model.pre = type(model.pre)(prepare=prepare, run=run, description="")
    good = encode(Image.new("RGB", (30, 30)), "PNG")
    responses = model.execute([FakeRequest(image=strings(good)), FakeRequest(image=strings(b"odd")),
                               FakeRequest(image=strings(good)), FakeRequest(image=strings(b"crash"))])
    assert [r.error is None for r in responses] == [True, False, True, False]
    assert responses[1].error.code == "INTERNAL" and "preprocessing failed: RuntimeError: boom" in responses[1].error.message
    assert responses[3].error.code == "INTERNAL" and "preprocessing failed: KeyError: 'oops'" in responses[3].error.message


# ------------------------------------------------------------------------------ stand-ins, builder
def test_standin_encoders_have_cn_clips_interface():
    from gebackend.modelzoo.cnclip_standin import build_cnclip_image_standin, build_cnclip_text_standin

    image = ort.InferenceSession(build_cnclip_image_standin().SerializeToString(), providers=["CPUExecutionProvider"])
    text = ort.InferenceSession(build_cnclip_text_standin().SerializeToString(), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in image.get_inputs()] == [("image", "tensor(float)", ["batch", 3, 224, 224])]
    assert [(o.name, o.shape) for o in image.get_outputs()] == [("unnorm_image_features", ["batch", 512])]
    assert [(i.name, i.type, i.shape) for i in text.get_inputs()] == [("text", "tensor(int64)", ["batch", 52])]
    assert [(o.name, o.shape) for o in text.get_outputs()] == [("unnorm_text_features", ["batch", 512])]
    rng = np.random.default_rng(0)
    features = image.run(None, {"image": rng.standard_normal((3, 3, 224, 224)).astype(np.float32)})[0]
    assert features.shape == (3, 512) and np.all(np.isfinite(features)) and np.std(features[0] - features[1]) > 1e-3
    ids = np.zeros((2, 52), np.int64)
    ids[:, :4] = [101, 2769, 4263, 102]
    ids[1, 4:10] = 3000  # more tokens: other features; padding (id 0) does not count
    out = text.run(None, {"text": ids})[0]
    assert out.shape == (2, 512) and not np.allclose(out[0], out[1])
    longer_padding = np.zeros((1, 52), np.int64)
    longer_padding[0, :4] = [101, 2769, 4263, 102]
    np.testing.assert_allclose(text.run(None, {"text": longer_padding})[0][0], out[0], rtol=1e-6)


def _outputs(path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def test_repository_builder_writes_standins_with_their_normalised_outputs_and_vocab(tmp_path):
    from gebackend.modelzoo.cnclip_repository import build_cnclip_repository
    from gebackend.modelzoo.cnclip_standin import is_standin

    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("[0-9]*"))
    (repo / "cnclip_normalize" / "1").mkdir(parents=True)  # what an earlier build left once git removed its config
    (repo / "cnclip_normalize" / "1" / "model.onnx").write_bytes(b"old")
    lines: list[str] = []
    built = build_cnclip_repository(repo, "standin", cache=CACHE, log=lines.append)
    assert set(built) == {"cnclip_image_encoder", "cnclip_text_encoder"}
    assert all("STAND-IN" in v for v in built.values()) and sum("STAND-IN" in line for line in lines) == 2
    for folder in ("cnclip_image", "cnclip_text", "cnclip_image_preprocess"):
        assert (repo / folder / "1").is_dir()
    assert is_standin(onnx.load(str(repo / "cnclip_image_encoder" / "1" / "model.onnx")))
    for kind in ("image", "text"):
        path = repo / f"cnclip_{kind}_encoder" / "1" / "model.onnx"
        assert _outputs(path) == [f"unnorm_{kind}_features", f"{kind}_features"]
        assert f"cnclip: cnclip_{kind}_encoder: added the output '{kind}_features' ('unnorm_{kind}_features' L2-normalised) to model.onnx" in lines
    session = ort.InferenceSession(str(repo / "cnclip_image_encoder" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    unnorm, features = session.run(None, {"image": np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)})
    np.testing.assert_allclose(features, unnorm / np.linalg.norm(unnorm, axis=-1, keepdims=True), rtol=1e-6, atol=1e-7)
    assert not (repo / "cnclip_normalize").exists() and any("removed" in line and "cnclip_normalize" in line for line in lines)
    assert (repo / "cnclip_text_preprocess" / "1" / "vocab.txt").read_text(encoding="utf-8").splitlines()[101] == "[CLS]"
    lines.clear()
    again = build_cnclip_repository(repo, "auto", cache=CACHE, log=lines.append)  # auto keeps what is there
    assert all(v.startswith("kept ") for v in again.values()) and not any("added the output" in line for line in lines)


def test_repository_builder_takes_a_cn_clip_export_with_a_fixed_batch(tmp_path):
    """cn_clip's pytorch_to_onnx.py exports without dynamic axes (batch 1): the builder makes the batch dim variable when
    the graph allows it, and otherwise says how to re-export."""
    from gebackend.modelzoo.cnclip_repository import build_cnclip_repository
    from gebackend.modelzoo.cnclip_standin import build_cnclip_image_standin, build_cnclip_text_standin

    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("[0-9]*"))
    fixed = build_cnclip_image_standin()
    for value in (*fixed.graph.input, *fixed.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(fixed, str(tmp_path / "vit-b-16.img.fp32.onnx"))
    onnx.save(build_cnclip_text_standin(), str(tmp_path / "vit-b-16.txt.fp32.onnx"))
    built = build_cnclip_repository(repo, "standin", image_onnx=tmp_path / "vit-b-16.img.fp32.onnx",
                                    text_onnx=tmp_path / "vit-b-16.txt.fp32.onnx", cache=CACHE, log=lambda m: None)
    assert "batch dim made variable" in built["cnclip_image_encoder"]
    assert "variable batch dim" in built["cnclip_text_encoder"]
    installed = onnx.load(str(repo / "cnclip_image_encoder" / "1" / "vit-b-16.img.fp32.onnx"))
    assert installed.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [o.name for o in installed.graph.output] == ["unnorm_image_features", "image_features"]
    assert _outputs(repo / "cnclip_text_encoder" / "1" / "vit-b-16.txt.fp32.onnx") == ["unnorm_text_features", "text_features"]
    assert _outputs(tmp_path / "vit-b-16.txt.fp32.onnx") == ["unnorm_text_features"]  # linked at first: the export is unchanged
    assert not (repo / "cnclip_image_encoder" / "1" / "model.onnx").exists()

    baked = onnx.helper  # a graph whose Reshape bakes batch 1 in, as a traced export with static shapes does
    graph = baked.make_graph(
        [baked.make_node("Reshape", ["image", "shape"], ["flat"]),
         baked.make_node("Slice", ["flat", "zero", "e512", "one"], ["unnorm_image_features"])],
        "baked", [baked.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [1, 3, 224, 224])],
        [baked.make_tensor_value_info("unnorm_image_features", onnx.TensorProto.FLOAT, [1, 512])],
        [onnx.numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
         onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
         onnx.numpy_helper.from_array(np.array([512], np.int64), "e512"),
         onnx.numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = baked.make_model(graph, opset_imports=[baked.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "baked.img.fp32.onnx"))
    with pytest.raises(RuntimeError, match=r"fixed batch dim of 1 .* Re-export it with a dynamic batch axis: add "
                                           r"`dynamic_axes=\{'image': \{0: 'batch'\}"):
        build_cnclip_repository(repo, "standin", image_onnx=tmp_path / "baked.img.fp32.onnx", cache=CACHE, log=lambda m: None)


def test_the_wheel_is_cn_clip_1_6_0_from_the_bench_cache():
    wheel = cn_clip_wheel(CACHE)
    assert wheel.parent == CACHE.resolve() / "wheels" and f"cn_clip-{CN_CLIP_VERSION}-" in wheel.name


def test_repository_builder_installs_the_real_encoders_from_the_bench_export(tmp_path, monkeypatch):
    """`--encoders cnclip` takes gebackend.modelzoo.bench_models' export (torch is not installed here: a stand-in file plays the
    exported encoder, so what is checked is where it goes and what the log says), and `auto` without torch builds
    stand-ins."""
    import gebackend.modelzoo.bench_models as bench_models
    from gebackend.modelzoo import cnclip_repository
    from gebackend.modelzoo.cnclip_standin import build_cnclip_image_standin, build_cnclip_text_standin

    def fake_models(cache):
        def export(builder):
            def write(path):
                model = builder()
                model.doc_string = "exported by torch"
                onnx.save(model, str(path))
            return write
        return {name: bench_models.BenchModel(name, "fake export", (), export(builder))
                for name, builder in (("cnclip_image", build_cnclip_image_standin), ("cnclip_text", build_cnclip_text_standin),
                                      ("cnclip_image_l4", build_cnclip_image_standin), ("cnclip_text_l4", build_cnclip_text_standin))}

    monkeypatch.setattr(bench_models, "models", fake_models)
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("[0-9]*"))
    copy_vocab(repo / "cnclip_text_preprocess" / "1" / "vocab.txt", CACHE)  # so the fake cache needs no wheel
    built = cnclip_repository.build_cnclip_repository(repo, "standin", cache=tmp_path / "cache", log=lambda m: None)
    built = cnclip_repository.build_cnclip_repository(repo, "cnclip_l4", cache=tmp_path / "cache", log=lambda m: None)
    assert built["cnclip_image_encoder"].startswith("the real CN_CLIP encoder `cnclip_image_l4`")
    assert onnx.load(str(repo / "cnclip_image_encoder" / "1" / "model.onnx")).doc_string == "exported by torch"
    assert (tmp_path / "cache" / "cnclip_text_l4" / "model.onnx").is_file()
    assert _outputs(repo / "cnclip_text_encoder" / "1" / "model.onnx") == ["unnorm_text_features", "text_features"]
    assert _outputs(tmp_path / "cache" / "cnclip_text_l4" / "model.onnx") == ["unnorm_text_features"]  # the cache's is not
    monkeypatch.setattr(cnclip_repository, "_torch_available", lambda: False)
    assert cnclip_repository.resolve_encoders("auto") == "standin"
    monkeypatch.setattr(cnclip_repository, "_torch_available", lambda: True)
    assert cnclip_repository.resolve_encoders("auto") == "cnclip"
    with pytest.raises(ValueError, match="--encoders must be one of"):
        cnclip_repository.resolve_encoders("huge")


def test_every_preprocessing_kind_is_laid_out_as_a_backend_of_its_name_and_found_by_it():
    from gebackend.preprocess.models import IMAGE, KINDS, TEXT
    from gebackend.preprocess.serving import kind_for
    from gebackend.server.layout import ADAPTERS

    assert {name: ADAPTERS[name].name for name in KINDS} == {name: "preprocess_model.py" for name in KINDS}
    assert ADAPTERS["cnclip_image_preprocess"].is_file()
    assert kind_for({"backend": "cnclip_image_preprocess"}) is IMAGE and kind_for({"backend": "cnclip_text_preprocess"}) is TEXT
    with pytest.raises(ValueError, match="model 'm': backend 'ge' is no preprocessing backend: expected one of "
                                         "cnclip_image_preprocess, cnclip_text_preprocess"):
        kind_for({"name": "m", "backend": "ge"})
