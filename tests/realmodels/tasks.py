"""What the real models' answers mean, and how two answers are judged equal: exactly, or at the level of the task.

Owns the post-processing each package does after its model runs, reduced to what decides the task (CTC greedy
decoding against the package's own character list, top-1 of a classifier, PaddleOCR's DB text regions, YOLOv8's
and PicoDet's boxes after non-maximum suppression, silero-vad's speech frames), and three judgements on it:
`exact_mismatches` (every output within 1e-4 of ONNX Runtime's, relative to the element and to the output's
largest value), `Task.disagree` (a lowered model read as the reference reads: the same text, the same top-1, each
confident box matched by one of the same class with IoU >= 0.9, the same speech decisions, with a margin around
each threshold so that a score sitting on the threshold does not decide) and `Task.untrue` (the reference's reading
against what the input holds, so that no judgement above rests on an input the model cannot read).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import ndimage

Outputs = dict[str, np.ndarray]
EXACT_RTOL = 1e-4
BOX_IOU = 0.9


def exact_mismatches(reference: Sequence[Outputs], got: Sequence[Outputs], rtol: float = EXACT_RTOL) -> list[str]:
    """Each output of each request against ONNX Runtime's: integers equal, floats within `rtol` of the element
    (`assert_allclose`'s rtol) or within `rtol` of the output's largest magnitude (its atol). The second bound is for
    elements far below the output's scale, a softmax's 1e-9 beside its 0.99 or a sigmoid map's background, where
    a reordered sum moves the last bits of the large values by as much as the small value itself."""
    wrong = []
    for number, (want_all, have_all) in enumerate(zip(reference, got)):
        for name, want in want_all.items():
            have = have_all.get(name)
            where = f"request {number} output '{name}'"
            if have is None:
                wrong.append(f"{where}: missing")
            elif have.shape != want.shape:
                wrong.append(f"{where}: shape {list(have.shape)}, onnxruntime {list(want.shape)}")
            elif want.dtype.kind in "iub":
                if not np.array_equal(have, want):
                    wrong.append(f"{where}: {int(np.sum(have != want))} of {want.size} values differ")
            else:
                want64, have64 = want.astype(np.float64), have.astype(np.float64)
                scale = float(np.max(np.abs(want64))) if want.size else 0.0
                excess = np.abs(have64 - want64) - (rtol * scale + rtol * np.abs(want64))
                if want.size and (not np.all(np.isfinite(have64)) or excess.max() > 0):
                    worst = int(np.argmax(excess))
                    wrong.append(f"{where}: {int(np.sum(excess > 0))} of {want.size} values off by more than "
                                 f"{rtol:g} (worst {have64.flat[worst]:.6g} against {want64.flat[worst]:.6g}; "
                                 f"largest |value| {scale:.4g})")
    if len(got) != len(reference):
        wrong.append(f"{len(got)} answers for {len(reference)} requests")
    return wrong


@dataclass(frozen=True)
class Task:
    """How a model's answers are read; `labels` come from the model's package (tasks know no labels of their own)."""

    output: str
    labels: tuple = ()

    def bind(self, labels: Sequence[str]) -> "Task":
        return dataclasses.replace(self, labels=tuple(labels))

    def read(self, answers: Sequence[Outputs]) -> list:
        raise NotImplementedError

    def disagree(self, reference: list, got: list) -> list[str]:
        """Where `got` (a lowered model's reading) differs from the reference's at the level of the task."""
        return [f"item {i}: {g!r}, onnxruntime {r!r}" for i, (r, g) in enumerate(zip(reference, got)) if r != g] + (
            [f"{len(got)} items, onnxruntime {len(reference)}"] if len(got) != len(reference) else [])

    def untrue(self, reading: list, truth: Any) -> list[str]:
        """Where the reading differs from what the input holds."""
        return [] if reading == list(truth) else [f"read {reading!r}, the input holds {list(truth)!r}"]


@dataclass(frozen=True)
class CtcText(Task):
    """CTC greedy decoding: the best class at each step, repeats collapsed, the blank (index 0) dropped. `indices`:
    the output holds each step's best class already (ddddocr's graph ends with its ArgMax)."""

    indices: bool = False

    def read(self, answers):
        texts = []
        for answer in answers:
            steps = answer[self.output] if self.indices else answer[self.output].argmax(axis=-1)
            for row in np.asarray(steps).reshape(-1, np.asarray(steps).shape[-1]):
                keep = np.r_[True, row[1:] != row[:-1]] & (row != 0)
                texts.append("".join(self.labels[int(i)] for i in row[keep]))
        return texts


@dataclass(frozen=True)
class TopOne(Task):
    """A classifier's best class per row."""

    def read(self, answers):
        return [self.labels[int(i)] for a in answers for i in a[self.output].reshape(-1, a[self.output].shape[-1]).argmax(1)]


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    order, kept = list(np.argsort(-scores)), []
    while order:
        best = order.pop(0)
        kept.append(best)
        order = [i for i in order if iou(boxes[best], boxes[i]) <= threshold]
    return kept


@dataclass(frozen=True)
class Boxes(Task):
    """Detections as (label, score, [x0, y0, x1, y1]) after per-class non-maximum suppression. Two readings agree when
    every detection one of them is sure of (score >= `sure`) has one of the same class in the other with score >=
    `kept` and IoU >= 0.9; the truth is a set of classes the reference must be sure of."""

    sure: float = 0.5
    kept: float = 0.25
    nms_iou: float = 0.45

    def candidates(self, answer: Outputs) -> tuple[np.ndarray, np.ndarray]:
        """[N, 4] corner boxes and [N, classes] scores."""
        raise NotImplementedError

    def read(self, answers):
        found = []
        for answer in answers:
            boxes, scores = self.candidates(answer)
            best, label = scores.max(1), scores.argmax(1)
            for cls in np.unique(label[best >= self.kept]):
                chosen = np.where((label == cls) & (best >= self.kept))[0]
                for i in nms(boxes[chosen], best[chosen], self.nms_iou):
                    found.append((self.labels[int(cls)], round(float(best[chosen[i]]), 4),
                                  [round(float(v), 1) for v in boxes[chosen[i]]]))
        return sorted(found, key=lambda d: -d[1])

    def _unmatched(self, these, those, side):
        return [f"{side} {d[0]} {d[1]:.3f} at {d[2]}: no {d[0]} with IoU >= {BOX_IOU} among "
                f"{[(o[1], round(iou(d[2], o[2]), 3)) for o in those if o[0] == d[0]]}"
                for d in these if d[1] >= self.sure
                and not any(o[0] == d[0] and o[1] >= self.kept and iou(d[2], o[2]) >= BOX_IOU for o in those)]

    def disagree(self, reference, got):
        return self._unmatched(reference, got, "onnxruntime's") + self._unmatched(got, reference, "served")

    def untrue(self, reading, truth):
        sure = {d[0] for d in reading if d[1] >= self.sure}
        return [] if set(truth) <= sure else [f"sure of {sorted(sure)}, the input holds {sorted(truth)}"]


@dataclass(frozen=True)
class YoloBoxes(Boxes):
    """YOLOv8's head: [1, 4 + classes, anchors], boxes as centre and size in input pixels."""

    def candidates(self, answer):
        head = answer[self.output][0]
        cx, cy, w, h = head[:4]
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1), head[4:].T


@dataclass(frozen=True)
class PicoDetBoxes(Boxes):
    """PicoDet's heads (PaddleDetection, as rapid-layout decodes them): per stride, class scores [1, N, classes] and
    a distribution over 8 bins for each side's distance from the anchor centre [1, N, 32]."""

    score_outputs: tuple = ()
    box_outputs: tuple = ()
    strides: tuple = (8, 16, 32, 64)
    input_hw: tuple = (800, 608)

    def candidates(self, answer):
        boxes, scores = [], []
        for stride, score_name, box_name in zip(self.strides, self.score_outputs, self.box_outputs):
            rows, cols = np.meshgrid(np.arange(np.ceil(self.input_hw[0] / stride)),
                                     np.arange(np.ceil(self.input_hw[1] / stride)), indexing="ij")
            cx, cy = (cols.ravel() + 0.5) * stride, (rows.ravel() + 0.5) * stride
            bins = answer[box_name][0].reshape(-1, 4, 8).astype(np.float64)
            bins = np.exp(bins - bins.max(-1, keepdims=True))
            distance = (bins / bins.sum(-1, keepdims=True) * np.arange(8)).sum(-1) * stride
            boxes.append(np.stack([cx - distance[:, 0], cy - distance[:, 1], cx + distance[:, 2], cy + distance[:, 3]], 1))
            scores.append(answer[score_name][0])
        return np.concatenate(boxes), np.concatenate(scores)


@dataclass(frozen=True)
class TextRegions(Task):
    """PaddleOCR's DB post-processing, boxes only: the probability map above 0.3, each connected region's bounding
    box kept where its mean probability is >= 0.5 and both sides >= 3 pixels, grown on every side by area * 1.6 /
    perimeter (PaddleOCR's unclip ratio). Two readings agree when their boxes pair up one to one with IoU >= 0.9;
    the truth is the number of lines rendered."""

    threshold: float = 0.3
    box_threshold: float = 0.5
    unclip: float = 1.6

    def read(self, answers):
        boxes = []
        for answer in answers:
            for prob in answer[self.output].reshape(-1, *answer[self.output].shape[-2:]):
                regions, _ = ndimage.label(prob > self.threshold)
                for number, where in enumerate(ndimage.find_objects(regions), start=1):
                    ys, xs = where
                    w, h = xs.stop - xs.start, ys.stop - ys.start
                    inside = regions[where] == number
                    if min(w, h) < 3 or prob[where][inside].mean() < self.box_threshold:
                        continue
                    grow = inside.sum() * self.unclip / (2 * (w + h))
                    boxes.append([round(float(v), 1) for v in (xs.start - grow, ys.start - grow, xs.stop + grow, ys.stop + grow)])
        return sorted(boxes, key=lambda b: (b[1], b[0]))

    def disagree(self, reference, got):
        wrong = [f"onnxruntime's box {r}: best IoU {max((iou(r, g) for g in got), default=0):.3f}"
                 for r in reference if not any(iou(r, g) >= BOX_IOU for g in got)]
        wrong += [f"served box {g}: best IoU {max((iou(g, r) for r in reference), default=0):.3f}"
                  for g in got if not any(iou(g, r) >= BOX_IOU for r in reference)]
        return wrong + ([f"{len(got)} boxes, onnxruntime {len(reference)}"] if len(got) != len(reference) else [])

    def untrue(self, reading, truth):
        return [] if len(reading) == truth else [f"{len(reading)} text regions {reading}, the input has {truth} lines"]


@dataclass(frozen=True)
class SpeechFrames(Task):
    """silero-vad's speech probability per frame, decided as silero-vad decides (speech from 0.5, silence below 0.35).
    Two readings agree when no frame one of them calls speech (>= 0.5) the other calls silence (< 0.35). The truth:
    at least 80 % of the frames inside the speech are speech, and no frame inside a silence is."""

    speech: float = 0.5
    silence: float = 0.35

    def read(self, answers):
        return [round(float(p), 4) for a in answers for p in np.asarray(a[self.output]).ravel()]

    def disagree(self, reference, got):
        wrong = [f"frame {i}: {g:.3f}, onnxruntime {r:.3f}" for i, (r, g) in enumerate(zip(reference, got))
                 if (r >= self.speech and g < self.silence) or (r < self.silence and g >= self.speech)]
        return wrong + ([f"{len(got)} frames, onnxruntime {len(reference)}"] if len(got) != len(reference) else [])

    def untrue(self, reading, truth):
        first, last = truth["speech"]
        inside = reading[first:last]
        wrong = [] if sum(p >= self.speech for p in inside) >= 0.8 * len(inside) else [
            f"frames {first}-{last} hold speech, read {inside}"]
        for begin, end in truth["silence"]:
            wrong += [f"frame {i} is silence, read {reading[i]:.3f}" for i in range(begin, end) if reading[i] >= self.speech]
        return wrong
