"""Stateful models through Triton's sequence batcher, as Triton's onnxruntime backend serves them: `sequence_batching`
with every kind of `control_input` (START, END, READY, CORRID) and an implicit `state`, direct and oldest strategies,
one and two instances, the dynamic and the static graph. Many sequences run at once, interleaved; every answer must
equal the running sum the model computes, so a state carried to the wrong sequence, or not carried at all, fails."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gebackend.modelzoo import ACCUMULATOR_CONTROLS, accumulator_reference, build_accumulator

from .conftest import add_model, params
from .server import start_server

pytestmark = pytest.mark.e2e

STATE = """  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 4 ]
            initial_state { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true name: "zeros" } } ]"""


def config(strategy: str, count: int, outputs: str = "OUTPUT", extra: str = "", controls: str = ACCUMULATOR_CONTROLS) -> str:
    declared = ", ".join(f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ {4 if name != "ECHO" else 2} ] }}'
                         for name in outputs.split(","))
    return (f'backend: "ge"\nmax_batch_size: 4\n'
            f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]\noutput [ {declared} ]\n'
            f'sequence_batching {{\n  max_sequence_idle_microseconds: 30000000\n  {strategy}\n{controls}\n{STATE}\n}}\n'
            f'instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n{extra}')


OLDEST = "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000 }"
DIRECT = "direct { max_queue_delay_microseconds: 20000 }"
MODELS = {
    "acc_direct": config(DIRECT, 1, "OUTPUT,ECHO"),
    "acc_oldest_2": config(OLDEST, 2, "OUTPUT,ECHO"),
    "acc_static": config(OLDEST, 1, "OUTPUT,ECHO", params(static_model="1")),
    "acc_state_out": config(DIRECT, 1, "OUTPUT,OUTPUT_STATE"),
    # no `state`: the client carries the state itself, sending INPUT_STATE; Triton still fills the controls
    "acc_client_state": config(DIRECT, 1).replace(STATE + "\n", ""),
}


@pytest.fixture(scope="module")
def sequences(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequences")
    for name, text in MODELS.items():
        add_model(repo, name, text, build_accumulator())
    add_model(repo, "acc_bad_control", config(DIRECT, 1, controls=ACCUMULATOR_CONTROLS.replace('"START"', '"BEGIN"')),
              build_accumulator())
    add_model(repo, "acc_bad_state_type", config(DIRECT, 1).replace("data_type: TYPE_FP32 dims: [ 4 ]\n",
                                                                     "data_type: TYPE_INT32 dims: [ 4 ]\n"),
              build_accumulator())
    server = start_server(repo, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server
    server.stop()


def run_sequence(client, model: str, correlation_id: int, steps: list[np.ndarray], outputs=("OUTPUT", "ECHO")) -> list[dict]:
    answers = []
    for i, rows in enumerate(steps):
        tensor = grpcclient.InferInput("INPUT", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        result = client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                              sequence_id=correlation_id, sequence_start=i == 0, sequence_end=i == len(steps) - 1)
        answers.append({name: result.as_numpy(name) for name in outputs})
    return answers


def interleaved(server, model: str, count: int, length: int, outputs=("OUTPUT", "ECHO")) -> dict[int, tuple[list, list]]:
    """`count` sequences of `length` requests at once, one client thread each: correlation ID -> (answers, steps)."""
    rng = np.random.default_rng(len(model))
    runs: dict[int, tuple[list, list]] = {}
    errors: list[BaseException] = []

    def one(corrid: int) -> None:
        steps = [rng.integers(-9, 10, size=(1, 4)).astype(np.float32) for _ in range(length)]
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                runs[corrid] = (run_sequence(client, model, corrid, steps, outputs), steps)
        except BaseException as exc:  # noqa: BLE001 - reported below, with the sequence
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(1000 + i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    return runs


@pytest.mark.parametrize("model, outputs", [("acc_direct", ("OUTPUT", "ECHO")), ("acc_oldest_2", ("OUTPUT", "ECHO")),
                                            ("acc_static", ("OUTPUT", "ECHO")),
                                            # the output state listed as an output too (where the peer fails batches)
                                            ("acc_state_out", ("OUTPUT", "OUTPUT_STATE"))])
def test_interleaved_sequences_each_carry_their_own_state(sequences, model, outputs):
    runs = interleaved(sequences, model, count=6, length=5, outputs=outputs)
    assert len(runs) == 6
    with grpcclient.InferenceServerClient(sequences.grpc_url) as client:
        stats = client.get_inference_statistics(model).model_stats[0]
    # the sequence batcher did put several sequences in one batch: their states were stacked and split again
    assert stats.inference_count == 30 and stats.execution_count < 30, stats
    for corrid, (answers, steps) in runs.items():
        for step, (got, want) in enumerate(zip(answers, accumulator_reference(steps, corrid))):
            for name in outputs:
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{model} {name} sequence {corrid} step {step}")


def test_a_listed_output_state_is_returned_and_an_unlisted_one_is_not(sequences):
    steps = [np.full((1, 4), v, np.float32) for v in (1, 2, 3)]
    with grpcclient.InferenceServerClient(sequences.grpc_url) as client:
        answers = run_sequence(client, "acc_state_out", 7, steps, outputs=("OUTPUT", "OUTPUT_STATE"))
        for got, want in zip(answers, accumulator_reference(steps, 7)):
            np.testing.assert_array_equal(got["OUTPUT_STATE"], want["OUTPUT_STATE"])
            np.testing.assert_array_equal(got["OUTPUT"], want["OUTPUT"])
        with pytest.raises(Exception, match="OUTPUT_STATE"):
            run_sequence(client, "acc_direct", 8, steps[:1], outputs=("OUTPUT_STATE",))
    # over HTTP, asking for nothing returns the listed outputs only (the state stays on the server)
    with httpclient.InferenceServerClient(sequences.http_url) as client:
        tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
        tensor.set_data_from_numpy(steps[0])
        result = client.infer("acc_direct", [tensor], sequence_id=9, sequence_start=True, sequence_end=True)
        names = {o["name"] for o in result.get_response()["outputs"]}
        assert names == {"OUTPUT", "ECHO"}
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), steps[0] + 1100.0)


def test_the_client_sends_no_control_or_state_and_the_config_lists_none(sequences):
    with grpcclient.InferenceServerClient(sequences.grpc_url) as client:
        config = client.get_model_config("acc_oldest_2", as_json=True)["config"]
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT", "ECHO"]


def test_without_state_the_client_sends_it_and_triton_still_fills_the_controls(sequences):
    with grpcclient.InferenceServerClient(sequences.grpc_url) as client:
        config = client.get_model_config("acc_client_state", as_json=True)["config"]
        assert [i["name"] for i in config["input"]] == ["INPUT", "INPUT_STATE"]
        state = np.zeros((1, 4), np.float32)
        steps = [np.full((1, 4), v, np.float32) for v in (2, 3, 4)]
        for i, (rows, want) in enumerate(zip(steps, accumulator_reference(steps, 31))):
            tensors = [grpcclient.InferInput("INPUT", [1, 4], "FP32"), grpcclient.InferInput("INPUT_STATE", [1, 4], "FP32")]
            tensors[0].set_data_from_numpy(rows)
            tensors[1].set_data_from_numpy(state)
            result = client.infer("acc_client_state", tensors, sequence_id=31, sequence_start=i == 0, sequence_end=i == 2)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT"), want["OUTPUT"])
            state = want["OUTPUT_STATE"]


def test_a_sequence_config_that_contradicts_the_file_fails_naming_what(sequences):
    log = sequences.output()
    assert re.search(r"model 'acc_bad_control' failed to load: .*sequence_batching names sequence control 'BEGIN' "
                     r"but the ONNX file's inputs are \[", log), log[-3000:]
    assert re.search(r"model 'acc_bad_state_type' failed to load: .*input state 'INPUT_STATE' is TYPE_INT32 in "
                     r"sequence_batching but TYPE_FP32 in the ONNX file", log), log[-3000:]
    with grpcclient.InferenceServerClient(sequences.grpc_url) as client:
        assert client.is_model_ready("acc_direct")
