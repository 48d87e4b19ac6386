"""A sample of the ONNX operator test corpus (tests/conformance/corpus.py) served through the real server, in both
graph modes: each case's model in a repository with only its input dims in config.pbtxt (outputs auto-completed),
one request over HTTP with the case's inputs, the answer compared with the case's reference outputs at its
tolerance. The in-process conformance test covers the whole corpus; this proves the served path agrees.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from gebackend.config.onnx_signature import read_signature
from conformance import corpus  # tests/ is on sys.path (tests/e2e is a package)
import early

from .server import start_server

pytestmark = pytest.mark.e2e

SAMPLE = 14  # cases; each is served twice (dynamic and static_model=1)
WIRE = {np.dtype(t): w for t, w in [(np.float32, "FP32"), (np.float64, "FP64"), (np.float16, "FP16"), (np.int64, "INT64"),
                                     (np.int32, "INT32"), (np.int8, "INT8"), (np.uint8, "UINT8"), (np.bool_, "BOOL")]}


def _eligible(case: corpus.Case, path) -> bool:
    arrays = [*case.inputs, *case.outputs]
    if any(not isinstance(a, np.ndarray) or a.dtype not in WIRE for a in arrays):
        return False
    return corpus.not_servable(case, path) is None and corpus.run_plain("onnxruntime", case, path) is None


@early.work
def choose(folder: Path) -> None:
    """Every k-th eligible case by name (deterministic): `chosen.pkl`, the cases, each with its model file here."""
    cases = sorted(corpus.load_node_cases(), key=lambda c: c.name)
    eligible = []
    for case in cases:
        path = folder / "plain" / case.name / "model.onnx"
        path.parent.mkdir(parents=True)
        onnx.save(case.model, str(path))
        if _eligible(case, path):
            eligible.append(case)
    step = max(1, len(eligible) // SAMPLE)
    (folder / "chosen.pkl").write_bytes(pickle.dumps(eligible[::step][:SAMPLE]))


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """The chosen cases, served from one repository."""
    root = tmp_path_factory.mktemp("corpus")
    repo = root / "models"
    cases = early.folder(choose, root / "cases")
    chosen = [(case, cases / "plain" / case.name / "model.onnx")
              for case in pickle.loads((cases / "chosen.pkl").read_bytes())]
    for case, path in chosen:
        inputs = {t.name: t for t in read_signature(path).inputs}
        entries = ",\n".join(  # Triton's dims are >= 1 or -1: an empty input's 0 is -1
            f'  {{ name: "{name}", data_type: {inputs[name].dtype.triton}, '
            f'dims: [ {", ".join(str(d or -1) for d in np.shape(v)) or "1"} ] }}'
            for name, v in corpus.feeds(case).items())
        static = {"static_model": "1", **corpus.empty_buckets(case)}
        static_extra = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in static.items())
        for model, extra in ((case.name, ""), (f"{case.name}_static", static_extra)):
            (repo / model / "1").mkdir(parents=True)
            (repo / model / "1" / "model.onnx").write_bytes(path.read_bytes())
            (repo / model / "config.pbtxt").write_text(f'backend: "ge"\nmax_batch_size: 0\ninput [\n{entries}\n]\n{extra}')
    server = start_server(repo, root / "serve.log")
    yield server, chosen
    server.stop()


def test_a_sample_of_the_operator_corpus_answers_correctly_in_both_modes(sampled):
    server, chosen = sampled
    assert len(chosen) >= SAMPLE // 2, [c.name for c, _ in chosen]
    client = httpclient.InferenceServerClient(server.http_url)
    wrong = []
    for case, _ in chosen:
        for model in (case.name, f"{case.name}_static"):
            inputs = []
            for name, value in corpus.feeds(case).items():
                value = np.asarray(value)
                shape = list(value.shape) or [1]  # a scalar is sent as [1] (its config dims)
                tensor = httpclient.InferInput(name, shape, WIRE[value.dtype])
                tensor.set_data_from_numpy(value.reshape(shape))
                inputs.append(tensor)
            try:
                result = client.infer(model, inputs)
            except Exception as exc:  # noqa: BLE001 - collected: every case is reported at once
                wrong.append(f"{model}: {exc}")
                continue
            got = [result.as_numpy(o.name) for o in case.model.graph.output]
            got = [g.reshape(np.shape(w)) if g is not None and np.ndim(w) == 0 else g for g, w in zip(got, case.outputs)]
            why = corpus.compare(case.outputs, got, case.rtol, case.atol)
            if why:
                wrong.append(f"{model}: {why}")
    client.close()
    print(f"\nserved {2 * len(chosen)} models: {', '.join(c.name for c, _ in chosen)}")
    assert not wrong, "\n".join(wrong)
