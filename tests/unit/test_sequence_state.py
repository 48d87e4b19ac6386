"""Unit tests for stateful models: gebackend.config.sequence (a config's sequence_batching, reconciled with the ONNX
file) and gebackend.runtime.sequence_state (the states an instance carries between a sequence's requests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions
from gebackend.config.pbtxt import load_model_config
from gebackend.config.sequence import sequence_spec
from gebackend.config.spec import build_model_spec, reconcile
from gebackend.errors import ConfigError, InvalidRequest
from gebackend.modelzoo import ACCUMULATOR_CONTROLS, accumulator_reference, build_accumulator
from gebackend.runtime.sequence_state import END, START, SequenceKey, SequenceStates

SEQUENCE = """
sequence_batching {
  max_sequence_idle_microseconds: 5000000
""" + ACCUMULATOR_CONTROLS + """
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 4 ] } ]
}
"""


@pytest.fixture(scope="module")
def signature():
    return signature_of(build_accumulator())


def config(tmp_path: Path, body: str = SEQUENCE, head: str = 'name: "acc"\nbackend: "ge"\nmax_batch_size: 4\n') -> dict:
    path = tmp_path / "config.pbtxt"
    path.write_text(head + body)
    return load_model_config(path)


def test_the_section_reads_into_controls_states_and_the_idle_time(tmp_path):
    spec = sequence_spec("acc", config(tmp_path))
    assert [(c.name, c.kind, c.dtype.triton) for c in spec.controls] == [
        ("START", "CONTROL_SEQUENCE_START", "TYPE_INT32"), ("END", "CONTROL_SEQUENCE_END", "TYPE_INT32"),
        ("READY", "CONTROL_SEQUENCE_READY", "TYPE_FP32"), ("CORRID", "CONTROL_SEQUENCE_CORRID", "TYPE_UINT64")]
    assert [(s.input_name, s.output_name, s.dtype.triton, s.dims, s.returned) for s in spec.states] == [
        ("INPUT_STATE", "OUTPUT_STATE", "TYPE_FP32", (4,), False)]
    assert spec.idle_seconds == 5.0
    assert spec.provided_inputs == {"START", "END", "READY", "CORRID", "INPUT_STATE"}
    assert spec.hidden_outputs == {"OUTPUT_STATE"}
    assert sequence_spec("acc", config(tmp_path, "sequence_batching { }\n")).idle_seconds == 1.0  # Triton's default
    assert sequence_spec("acc", config(tmp_path, "dynamic_batching { }\n")) is None


def test_auto_complete_leaves_out_what_triton_fills_and_the_unlisted_state(tmp_path, signature):
    result = reconcile("acc", config(tmp_path), signature, 8)
    written = [t.name for t in result.inputs if result.completes("input", t.name)]
    assert written == ["INPUT"]
    assert [t.name for t in result.outputs if result.completes("output", t.name)] == ["OUTPUT", "ECHO"]
    assert not result.enable_dynamic_batching  # the sequence batcher schedules this model


def test_a_listed_output_state_is_completed_and_returned(tmp_path, signature):
    listed = config(tmp_path, SEQUENCE + 'output [ { name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    result = reconcile("acc", listed, signature, 8)
    assert result.completes("output", "OUTPUT_STATE")
    assert result.sequence.hidden_outputs == frozenset()


def test_the_completed_config_builds_a_spec_with_every_onnx_input(tmp_path, signature):
    completed = config(tmp_path, SEQUENCE + 'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                                            'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    spec = build_model_spec(completed, signature, tmp_path / "model.onnx", BackendOptions())
    assert [t.name for t in spec.inputs] == ["INPUT", "INPUT_STATE", "START", "END", "READY", "CORRID"]
    assert [t.name for t in spec.outputs] == ["OUTPUT", "OUTPUT_STATE"]  # the state is computed, ECHO was not asked for
    without = config(tmp_path, 'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    with pytest.raises(ConfigError, match=r"omits input\(s\) \['INPUT_STATE', 'START', 'END', 'READY', 'CORRID'\]"):
        build_model_spec(without, signature, tmp_path / "model.onnx", BackendOptions())


@pytest.mark.parametrize("change, message", [
    (('"START"', '"BEGIN"'), r"model 'acc': sequence_batching names sequence control 'BEGIN' but the ONNX file's inputs are \["),
    (('output_name: "OUTPUT_STATE"', 'output_name: "NEXT"'), r"names output state 'NEXT' but the ONNX file's outputs are"),
    (("CORRID data_type: TYPE_UINT64", "CORRID data_type: TYPE_INT64"),
     r"sequence control 'CORRID' is TYPE_INT64 in sequence_batching but TYPE_UINT64 in the ONNX file"),
    (("fp32_false_true", "bool_false_true"), r"sequence control 'READY' is TYPE_BOOL in sequence_batching but TYPE_FP32"),
    (("int32_false_true: [ 0, 1 ] } ] },\n    { name: \"END\"", "} ] },\n    { name: \"END\""),
     r"sequence control 'START' \(CONTROL_SEQUENCE_START\) gives none of \['int32_false_true'"),
    (("data_type: TYPE_FP32 dims: [ 4 ] }", "dims: [ 4 ] }"), r"state 'INPUT_STATE': data type 'TYPE_INVALID' is not supported"),
    (("dims: [ 4 ] }", "dims: [ 8 ] }"),
     r"input state 'INPUT_STATE' has dims \[8\] in sequence_batching but \[4\] \(after the batch dim\) in the ONNX file"),
    (("dims: [ 4 ] }", "dims: [ 1, 4 ] }"), r"input state 'INPUT_STATE' has dims \[1, 4\] in sequence_batching but \[4\]"),
])
def test_a_section_that_contradicts_the_file_is_refused_naming_what(tmp_path, signature, change, message):
    with pytest.raises(ConfigError, match=message):
        reconcile("acc", config(tmp_path, SEQUENCE.replace(*change)), signature, 8)


# -- runtime/sequence_state.py --------------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def states(tmp_path):
    clock = Clock()
    return SequenceStates("acc", sequence_spec("acc", config(tmp_path)), clock), clock


@pytest.fixture(scope="module")
def session():
    return ort.InferenceSession(build_accumulator().SerializeToString(), providers=["CPUExecutionProvider"])


def request(rows: np.ndarray, flags: int, corrid: int) -> dict[str, np.ndarray]:
    """What Triton hands the backend: the client's INPUT, the controls, and the state Triton keeps (always the
    initial zeros here: the Python backend cannot hand an output state back)."""
    n = rows.shape[0]
    return {"INPUT": rows, "INPUT_STATE": np.zeros((n, 4), np.float32),
            "START": np.full((n, 1), bool(flags & START), np.int32), "END": np.full((n, 1), bool(flags & END), np.int32),
            "READY": np.ones((n, 1), np.float32), "CORRID": np.full((n, 1), corrid, np.uint64)}


def run(session, fed: list) -> list:
    names = [o.name for o in session.get_outputs()]
    return [f if isinstance(f, BaseException) else dict(zip(names, session.run(None, dict(f)))) for f in fed]


def test_two_sequences_interleaved_in_one_batch_each_get_their_running_sum(states, session):
    store, _ = states
    steps = {11: [np.full((1, 4), v, np.float32) for v in (1, 2, 3)], 12: [np.full((2, 4), v, np.float32) for v in (5, -1, 4)]}
    answers = {corrid: [] for corrid in steps}
    for i in range(3):
        flags = (START if i == 0 else 0) | (END if i == 2 else 0)
        keys = [SequenceKey(c, flags) for c in steps]
        results = store.keep(run(session, store.feed([request(steps[c][i], flags, c) for c in steps], keys)), keys)
        for corrid, result in zip(steps, results):
            assert "OUTPUT_STATE" not in result  # not listed in output: kept here, never answered
            answers[corrid].append(result)
    for corrid, got in answers.items():
        for g, want in zip(got, accumulator_reference(steps[corrid], corrid)):
            np.testing.assert_array_equal(g["OUTPUT"], want["OUTPUT"])
            np.testing.assert_array_equal(g["ECHO"], want["ECHO"])
    assert len(store) == 0  # both ended


def test_the_state_is_a_copy_so_a_reused_output_buffer_cannot_change_it(states):
    store, _ = states
    buffer = np.ones((1, 4), np.float32)
    store.keep([{"OUTPUT": buffer, "OUTPUT_STATE": buffer}], [SequenceKey(5, START)])
    buffer[:] = 99.0  # a static graph writes its next run into the same buffer
    fed = store.feed([request(np.zeros((1, 4), np.float32), 0, 5)], [SequenceKey(5)])
    np.testing.assert_array_equal(fed[0]["INPUT_STATE"], np.ones((1, 4), np.float32))


def test_null_requests_run_on_what_triton_gave_them_and_leave_nothing(states):
    store, _ = states
    sent = request(np.ones((1, 4), np.float32), 0, 0)
    assert store.feed([sent], [SequenceKey(0)])[0] is sent
    store.keep([{"OUTPUT": np.ones((1, 4)), "OUTPUT_STATE": np.ones((1, 4))}], [SequenceKey(0)])
    assert len(store) == 0


def test_a_sequence_without_state_here_fails_alone_and_says_to_start_again(states):
    store, _ = states
    store.keep([{"OUTPUT": np.ones((1, 4)), "OUTPUT_STATE": np.ones((1, 4))}], [SequenceKey(1, START)])
    fed = store.feed([request(np.ones((1, 4), np.float32), 0, 1), request(np.ones((1, 4), np.float32), 0, 2)],
                     [SequenceKey(1), SequenceKey(2)])
    assert isinstance(fed[0], dict)
    assert isinstance(fed[1], InvalidRequest)
    assert "model 'acc': sequence 2 has no state on this instance" in str(fed[1])
    assert "start it again with the START flag" in str(fed[1])


def test_a_failed_request_keeps_the_state_it_had(states):
    store, _ = states
    store.keep([{"OUTPUT": np.ones((1, 4)), "OUTPUT_STATE": np.full((1, 4), 3.0)}], [SequenceKey(4, START)])
    failure = InvalidRequest("bad values")
    assert store.keep([failure], [SequenceKey(4)]) == [failure]
    np.testing.assert_array_equal(store.feed([request(np.ones((1, 4), np.float32), 0, 4)], [SequenceKey(4)])[0]["INPUT_STATE"],
                                  np.full((1, 4), 3.0))


def test_sequences_idle_past_twice_triton_s_timeout_are_forgotten(states):
    store, clock = states
    store.keep([{"OUTPUT": np.ones((1, 4)), "OUTPUT_STATE": np.ones((1, 4))}], [SequenceKey("old", START)])
    clock.now = 6.0
    store.keep([{"OUTPUT": np.ones((1, 4)), "OUTPUT_STATE": np.ones((1, 4))}], [SequenceKey("recent", START)])
    clock.now = 10.5  # "old" idle 10.5 s > 2 x 5 s; "recent" 4.5 s
    store.feed([], [])
    assert len(store) == 1
    assert isinstance(store.feed([request(np.ones((1, 4), np.float32), 0, 0)], [SequenceKey("old")])[0], InvalidRequest)


def test_tune_refuses_a_stateful_model_saying_why(tmp_path, capsys):
    import onnx

    from gebackend.cli.main import main
    from gebackend.tune.tuned_model import TunedModel

    folder = tmp_path / "acc"
    (folder / "1").mkdir(parents=True)
    onnx.save(build_accumulator(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text('name: "acc"\nbackend: "ge"\nmax_batch_size: 4\n' + SEQUENCE)
    with pytest.raises(ConfigError, match=r"model 'acc' uses sequence_batching \(a stateful model\); tune searches "
                                          r"stateless configs only"):
        TunedModel.load(folder)
    assert main(["tune", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "gebackend tune: model 'acc' uses sequence_batching" in capsys.readouterr().err
