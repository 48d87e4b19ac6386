"""Bad input fuzz: seeded malformed (and valid) requests over HTTP and gRPC against one real server.

Every request is built by hand (HTTP bodies byte by byte, gRPC messages field by field), so nothing a
client library would refuse keeps it from reaching the server. Each answer must be:
- a 4xx (gRPC: a client-error status) for a bad request;
- 200 with outputs equal to onnxruntime's for a valid one (NaN in, NaN out is a valid answer);
- for an HTTP body that is not valid JSON, or JSON whose values do not parse, tritonserver 2.51's
  own HTTP front end answers 500 "failed to parse the request JSON" / "Unable to parse": that is
  accepted as the only 500 (it is Triton's code, before any model sees the request) and counted.
After every 20 cases a correct request must succeed on both protocols, and after every 100 cases
(and at the end) tritonserver and every backend stub process must be the very processes of the start.

GE_FUZZ_SEED and GE_FUZZ_CASES change the seed (printed on failure) and the number of cases.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import struct
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gebackend.modelzoo import build_add_mul, build_bert, build_identity_fixed

from .conftest import BERT_BUCKETS, add_model, params
from .server import start_server

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GE_FUZZ_SEED", "6061"))
CASES = int(os.environ.get("GE_FUZZ_CASES", "2000"))
VOCAB, MAX_POSITIONS = 1000, 128

NUMPY = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
         "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8, "UINT32": np.uint32, "BOOL": np.bool_}
GRPC_CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE,
                      grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}


@dataclass(frozen=True)
class Model:
    inputs: dict[str, tuple[str, tuple]]  # name -> (datatype, dims without the batch dim; "seq" is the sequence)
    max_batch: int  # 0: no batch dim
    max_seq: int = 0
    reference: str = ""  # the ONNX file onnxruntime checks the answers against


MODELS = {
    "add_mul": Model({"x": ("FP32", (4,)), "y": ("FP32", (4,))}, 8, reference="add_mul"),
    "bert": Model({"input_ids": ("INT64", ("seq",)), "attention_mask": ("INT64", ("seq",))}, 4, MAX_POSITIONS,
                  reference="bert"),
    "bert_buckets": Model({"input_ids": ("INT64", ("seq",)), "attention_mask": ("INT64", ("seq",))}, 4, 32,
                          reference="bert"),  # compiled for 1x16, 4x16, 4x32; shorter sequences are padded
    "identity": Model({"x": ("FP32", (2, 3))}, 0, reference="identity"),
}


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes


@dataclass
class Case:
    index: int
    kind: str
    protocol: str  # "http" or "grpc"
    model: str
    tensors: list[Tensor] = field(default_factory=list)
    expect: str = "4xx"  # "ok", "4xx", "parse" (400, or Triton's 500 for an unparsable JSON body), "any" (no answer wanted)
    feeds: dict[str, np.ndarray] | None = None  # valid cases: what onnxruntime runs
    version: str = ""
    body: bytes | None = None  # raw HTTP cases: the body as sent ...
    headers: dict[str, str] | None = None  # ... and its headers
    abandon: bool = False  # send part of the body, then hang up

    def describe(self) -> str:
        shapes = ", ".join(f"{t.name}:{t.datatype}{t.shape}({len(t.data)}B)" for t in self.tensors)
        return f"#{self.index} {self.kind} [{self.protocol}] {self.model} {shapes}"


# -- the generator -------------------------------------------------------------------------------------------------
def serialize_bytes(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def tensor(name: str, array: np.ndarray, datatype: str) -> Tensor:
    if datatype == "BYTES":
        return Tensor(name, datatype, list(array.shape), serialize_bytes([bytes(v) for v in array.reshape(-1)]))
    return Tensor(name, datatype, list(array.shape), np.ascontiguousarray(array).tobytes())


def random_values(rng: np.random.Generator, datatype: str, shape: list[int], special: bool = False) -> np.ndarray:
    dtype = NUMPY[datatype]
    n = int(np.prod(shape)) if shape else 1
    if np.issubdtype(dtype, np.floating):
        values = rng.standard_normal(n).astype(dtype)
        if special and n:
            picks = rng.integers(0, n, size=max(1, n // 3))
            values[picks] = rng.choice(np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45, 0.0], dtype))
    elif dtype == np.bool_:
        values = rng.integers(0, 2, n).astype(dtype)
    else:
        info = np.iinfo(dtype)
        values = rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dtype)
    return values.reshape(shape)


class Generator:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.index = 0

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def shapes(self, model: Model, batch: int, seq: int) -> dict[str, list[int]]:
        lead = [batch] if model.max_batch else []
        return {name: lead + [seq if d == "seq" else d for d in dims] for name, (_, dims) in model.inputs.items()}

    def valid(self, name: str, protocol: str) -> Case:
        model = MODELS[name]
        rng = self.rng
        batch = int(rng.integers(1, model.max_batch + 1)) if model.max_batch else 0
        seq = int(rng.integers(1, model.max_seq + 1)) if model.max_seq else 0
        feeds = {}
        for tensor_name, shape in self.shapes(model, batch, seq).items():
            datatype = model.inputs[tensor_name][0]
            if tensor_name == "input_ids":
                feeds[tensor_name] = rng.integers(0, VOCAB, size=shape, dtype=np.int64)
            elif tensor_name == "attention_mask":
                mask = (rng.random(shape) < 0.8).astype(np.int64)
                mask[:, 0] = 1  # a real tokenizer always keeps the first token
                feeds[tensor_name] = mask
            else:
                feeds[tensor_name] = random_values(rng, datatype, shape, special=rng.random() < 0.4)
        tensors = [tensor(n, a, model.inputs[n][0]) for n, a in feeds.items()]
        kind = "valid-nan-inf" if any(np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all()
                                      for a in feeds.values()) else "valid"
        return Case(self.index, kind, protocol, name, tensors, "ok", feeds)

    def bad(self, kind: str, name: str, protocol: str) -> Case:
        """A request of `kind` that must be refused with a 4xx."""
        rng, model = self.rng, MODELS[name]
        case = self.valid(name, protocol)
        case.kind, case.expect, case.feeds = kind, "4xx", None
        tensors = case.tensors
        victim = tensors[int(rng.integers(len(tensors)))]
        if kind == "dtype":
            victim.datatype = self.pick([d for d in NUMPY if d != victim.datatype])
            victim.data = random_values(rng, victim.datatype, victim.shape).tobytes()
        elif kind == "bytes-for-numbers":
            count = int(np.prod(victim.shape))
            victim.datatype = "BYTES"
            victim.data = serialize_bytes([rng.bytes(int(rng.integers(0, 9))) for _ in range(count)])
        elif kind == "wrong-dim":
            if name.startswith("bert"):
                victim.shape[-1] = victim.shape[-1] + int(rng.integers(1, 5))  # ids and mask disagree on sequence
            else:
                axis = len(victim.shape) - 1 - int(rng.integers(0, len(victim.shape) - (1 if model.max_batch else 0)))
                victim.shape[axis] = self.pick([d for d in range(1, 12) if d != victim.shape[axis]])
            victim.data = random_values(rng, victim.datatype, victim.shape).tobytes()
        elif kind == "wrong-rank":
            if rng.random() < 0.5 and len(victim.shape) > 1:
                victim.shape = victim.shape[1:] if rng.random() < 0.5 else victim.shape[:-1]
            else:
                victim.shape = victim.shape + [1] if rng.random() < 0.5 else [1] + victim.shape
            victim.data = random_values(rng, victim.datatype, victim.shape).tobytes()
        elif kind == "empty":
            axis = int(rng.integers(len(victim.shape)))  # a zero dim on every input (they share their rank)
            for t in tensors:
                t.shape[axis] = 0
                t.data = b""
        elif kind == "oversized-batch":
            batch = model.max_batch + int(rng.integers(1, 40)) if model.max_batch else int(rng.integers(2, 9))
            for t in tensors:
                t.shape = [batch] + (t.shape[1:] if model.max_batch else t.shape)
                t.data = np.zeros(t.shape, NUMPY[t.datatype]).tobytes()
        elif kind == "oversized-tensor":
            if name == "bert_buckets":  # longer than every compiled bucket
                seq = int(rng.integers(33, 120))
                for t in tensors:
                    t.shape = [t.shape[0], seq]
                    t.data = np.ones(t.shape, np.int64).tobytes()
            elif rng.random() < 0.5:  # big and consistent (up to 4 MiB)
                victim.shape = [1] * (len(victim.shape) - 1) + [int(rng.integers(1 << 14, 1 << 20))]
                victim.data = np.zeros(victim.shape, NUMPY[victim.datatype]).tobytes()
            else:  # a shape claiming far more than the body holds
                victim.shape = [1] * (len(victim.shape) - 1) + [int(rng.integers(1 << 30, 1 << 62))]
        elif kind == "size-mismatch":
            cut = int(rng.integers(1, max(2, len(victim.data))))
            victim.data = victim.data[:-cut] if rng.random() < 0.5 and victim.data else victim.data + rng.bytes(cut)
        elif kind == "missing-input":
            if len(tensors) > 1:
                tensors.remove(victim)
            else:
                victim.name = "not_" + victim.name
        elif kind == "unknown-input":
            extra = Tensor("bogus_" + str(int(rng.integers(100))), victim.datatype, list(victim.shape), victim.data)
            if rng.random() < 0.5:
                tensors.append(extra)
            else:
                tensors[tensors.index(victim)] = extra
        elif kind == "duplicate-input":
            tensors.append(Tensor(victim.name, victim.datatype, list(victim.shape), victim.data))
        elif kind == "unknown-model":
            case.model = self.pick(["nope", "add_mul_", "ADD_MUL", "bert/../add_mul", "x" * 300, "模型", "a%2Fb"])
        elif kind == "unknown-version":
            case.version = self.pick(["2", "0", "99999999999", "latest"])  # "" and "-1" mean the latest; gRPC reads "1.0" as 1
        elif kind == "token-out-of-range":
            ids = next(t for t in tensors if t.name == "input_ids")
            values = np.frombuffer(ids.data, np.int64).copy()
            values[int(rng.integers(values.size))] = self.pick([VOCAB, VOCAB + 7, 10**12, -VOCAB - 1, -(2**63)])
            ids.data = values.tobytes()
        else:
            raise ValueError(kind)
        return case

    def raw_http(self, kind: str) -> Case:
        """HTTP bodies that lie about themselves: header length, binary sizes, JSON."""
        rng = self.rng
        case = self.valid("add_mul", "http")
        case.kind, case.expect, case.feeds = kind, "4xx", None
        header, binary = http_body(case)
        if kind == "header-length-lies":
            value = self.pick([len(header) + len(binary) + int(rng.integers(1, 500)), -int(rng.integers(1, 100)),
                               2**63, 2**64 + 3, "abc", "", "1e3", "0x10"])
            if isinstance(value, str):
                case.expect = "parse"  # read as a number prefix ("1e3" is 1): the JSON then is cut or absent
            case.body, case.headers = header + binary, {"Inference-Header-Content-Length": str(value)}
        elif kind == "header-length-short":  # the JSON is cut: Triton's front end cannot parse it
            case.expect = "parse"
            case.body = header + binary
            case.headers = {"Inference-Header-Content-Length": str(int(rng.integers(1, len(header))))}
        elif kind == "truncated-binary":
            cut = int(rng.integers(1, len(binary)))
            case.body, case.headers = header + binary[:-cut], {"Inference-Header-Content-Length": str(len(header))}
        elif kind == "trailing-bytes":
            case.body = header + binary + rng.bytes(int(rng.integers(1, 64)))
            case.headers = {"Inference-Header-Content-Length": str(len(header))}
        elif kind == "garbled-json":
            case.expect = "parse"
            doc = bytearray(header)
            for _ in range(int(rng.integers(1, 6))):
                doc[int(rng.integers(len(doc)))] = int(rng.integers(256))
            case.body = self.pick([bytes(doc), rng.bytes(int(rng.integers(0, 300))), b"", b"null", b"[]", b"{}",
                                   b'{"inputs": 5}', b'{"inputs": [{"name": 1}]}', b"{" * 2000])
            case.headers = {}
        elif kind == "json-data-lies":
            case.expect = "parse"
            x = [float(v) for v in rng.standard_normal(4)]
            data = self.pick([x[:3], x + [1.0], ["a", "b", "c", "d"], None, {"a": 1}, [x[:2], x[2:3]]])
            shape = self.pick([[1, 4], [1, -4], ["1", "4"], [1.5, 4]])
            doc = {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": data},
                              {"name": "y", "shape": [1, 4], "datatype": "FP32", "data": x}]}
            case.body, case.headers = json.dumps(doc).encode(), {}
        elif kind == "abandoned-body":
            case.expect, case.abandon = "any", True
            case.body = header + binary
            case.headers = {"Inference-Header-Content-Length": str(len(header))}
        else:
            raise ValueError(kind)
        case.tensors = []
        return case

    BAD = ["dtype", "bytes-for-numbers", "wrong-dim", "wrong-rank", "empty", "oversized-batch", "oversized-tensor",
           "size-mismatch", "missing-input", "unknown-input", "duplicate-input", "unknown-model", "unknown-version"]
    RAW = ["header-length-lies", "header-length-short", "truncated-binary", "trailing-bytes", "garbled-json",
           "json-data-lies", "abandoned-body"]

    def next(self) -> Case:
        self.index += 1
        roll = self.rng.random()
        protocol = "http" if self.rng.random() < 0.5 else "grpc"
        if roll < 0.3:
            case = self.valid(self.pick(list(MODELS)), protocol)
        elif roll < 0.35:
            case = self.bad("token-out-of-range", "bert", protocol)
        elif roll < 0.5:
            case = self.raw_http(self.pick(self.RAW))
        else:
            case = self.bad(self.pick(self.BAD), self.pick(list(MODELS)), protocol)
        case.index = self.index
        return case


# -- sending -------------------------------------------------------------------------------------------------------
def http_body(case: Case) -> tuple[bytes, bytes]:
    doc = {
        "inputs": [{"name": t.name, "shape": t.shape, "datatype": t.datatype,
                    "parameters": {"binary_data_size": len(t.data)}} for t in case.tensors],
        "parameters": {"binary_data_output": True},
    }
    return json.dumps(doc).encode(), b"".join(t.data for t in case.tensors)


@dataclass
class Answer:
    status: str  # "200", "400", ... or a gRPC status name
    message: str = ""
    outputs: dict[str, np.ndarray] | None = None
    seconds: float = 0.0


class HttpSender:
    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        return self.conn

    def send(self, case: Case) -> Answer:
        if case.abandon:
            return self._abandon(case)
        path = f"/v2/models/{urllib.parse.quote(case.model, safe='')}"
        path += f"/versions/{case.version}" if case.version else ""
        path += "/infer"
        if case.body is not None:
            body, headers = case.body, dict(case.headers or {})
        else:
            header, binary = http_body(case)
            body, headers = header + binary, {"Inference-Header-Content-Length": str(len(header))}
        headers["Content-Type"] = "application/octet-stream"
        for attempt in range(2):
            try:
                conn = self._connection()
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        status = str(response.status)
        if response.status != 200:
            return Answer(status, payload.decode(errors="replace"))
        length = response.getheader("Inference-Header-Content-Length")
        result = httpclient.InferResult.from_response_body(payload, header_length=int(length) if length else None)
        names = [o["name"] for o in result.get_response()["outputs"]]
        return Answer(status, "", {n: result.as_numpy(n) for n in names})

    def _abandon(self, case: Case) -> Answer:
        """Announce the whole body, send half of it and hang up."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            head = (f"POST /v2/models/{case.model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(case.body)}\r\n"
                    + "".join(f"{k}: {v}\r\n" for k, v in case.headers.items()) + "\r\n").encode()
            sock.sendall(head + case.body[: len(case.body) // 2])
        return Answer("abandoned")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class GrpcSender:
    def __init__(self, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def send(self, case: Case) -> Answer:
        request = service_pb2.ModelInferRequest(model_name=case.model, model_version=case.version)
        for t in case.tensors:
            request.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
            request.raw_input_contents.append(t.data)
        try:
            response = self.stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as error:
            return Answer(error.code().name, error.details() or "")
        outputs = {}
        for output, raw in zip(response.outputs, response.raw_output_contents):
            outputs[output.name] = np.frombuffer(raw, NUMPY[output.datatype]).reshape(list(output.shape))
        return Answer("200", "", outputs)

    def close(self) -> None:
        self.channel.close()


# -- judging -------------------------------------------------------------------------------------------------------
def is_client_error(status: str) -> bool:
    if status.isdigit():
        return 400 <= int(status) < 500
    return getattr(grpc.StatusCode, status, None) in GRPC_CLIENT_ERRORS


class References:
    def __init__(self, repo: Path):
        self.sessions = {
            name: ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
            for name in {m.reference for m in MODELS.values()}
        }

    def run(self, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self.sessions[MODELS[model].reference]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds)))


def judge(case: Case, answer: Answer, references: References) -> str | None:
    """None if the answer is right for the case, else what is wrong."""
    if case.expect == "any":
        return None
    if case.expect == "ok":
        if answer.status != "200":
            return f"valid request answered {answer.status}: {answer.message[:300]}"
        want = references.run(case.model, case.feeds)
        tolerance = {"rtol": 1e-4, "atol": 1e-4} if case.model.startswith("bert") else {"rtol": 1e-6, "atol": 0}
        for name, expected in want.items():
            got = (answer.outputs or {}).get(name)
            if got is None or got.shape != expected.shape:
                return f"output {name}: got {None if got is None else got.shape}, want {expected.shape}"
            if not np.allclose(got, expected, equal_nan=True, **tolerance):
                return f"output {name} differs from onnxruntime by {np.nanmax(np.abs(got - expected))}"
        return None
    if is_client_error(answer.status):
        return None
    if case.expect == "parse" and answer.status == "500" and "parse" in answer.message.lower():
        return None  # tritonserver 2.51's HTTP front end: 500 for a body it cannot parse
    return f"expected a 4xx, got {answer.status}: {answer.message[:300]}"


# -- the server ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("fuzz") / "models"
    add_model(repo, "add_mul", 'backend: "ge"\nmax_batch_size: 8\n', build_add_mul())
    add_model(repo, "bert", 'backend: "ge"\nmax_batch_size: 4\n', build_bert(vocab_size=VOCAB, max_positions=MAX_POSITIONS))
    add_model(repo, "bert_buckets", 'backend: "ge"\nmax_batch_size: 4\n' + params(
        static_model="1", bucket_paddable_dims="sequence", **BERT_BUCKETS), onnx.load(str(repo / "bert" / "1" / "model.onnx")))
    add_model(repo, "identity", 'backend: "ge"\n', build_identity_fixed())
    add_model(repo, "escapes", 'backend: "ge"\n', weights_at("../../../../etc/passwd"))
    server = start_server(repo, repo.parent / "serve.log")
    yield server, repo
    server.stop()


def weights_at(location: str) -> onnx.ModelProto:
    """y = x @ w, with w's data claimed to live at `location` (external data)."""
    w = onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [4, 4], [0.0] * 16)
    w.ClearField("float_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "escapes",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])], [w])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_external_data_outside_the_model_folder_is_refused_at_load(fuzz_server):
    server, _ = fuzz_server
    out = server.output()
    assert re.search(r"model 'escapes' failed to load: .*tensor 'w' keeps its data at external_data location "
                     r"'\.\./\.\./\.\./\.\./etc/passwd', which is outside the model folder", out), out[-3000:]
    assert re.search(r"^  identity v1: READY$", out, re.M)


def our_processes(cli_pid: int) -> dict[int, tuple[str, float]]:
    found = {}
    for p in psutil.Process(cli_pid).children(recursive=True):
        try:
            found[p.pid] = (p.name(), p.create_time())
        except psutil.NoSuchProcess:  # a short-lived helper that exited since it was listed
            pass
    return found


def dead_processes(before: dict[int, tuple[str, float]]) -> list[str]:
    dead = []
    for pid, (name, created) in before.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() != created or process.status() == psutil.STATUS_ZOMBIE:
                dead.append(f"{name} (pid {pid})")
        except psutil.NoSuchProcess:
            dead.append(f"{name} (pid {pid})")
    return dead


def good_request(server, protocol: str, value: float) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        inputs = []
        for name in ("x", "y"):
            t = module.InferInput(name, [1, 4], "FP32")
            t.set_data_from_numpy(np.full((1, 4), value, np.float32))
            inputs.append(t)
        result = client.infer("add_mul", inputs)
        np.testing.assert_array_equal(result.as_numpy("sum"), np.full((1, 4), 2 * value, np.float32))
    finally:
        client.close()


def test_fuzz_bad_requests_get_4xx_and_nothing_dies(fuzz_server):
    server, repo = fuzz_server
    processes = our_processes(server.process.pid)
    names = sorted(name for name, _ in processes.values())
    assert names.count("tritonserver") == 1 and names.count("triton_python_backend_stub") >= 4, names
    references = References(repo)
    senders = {"http": HttpSender(server.http_port), "grpc": GrpcSender(server.grpc_port)}
    generator = Generator(SEED)
    failures: list[str] = []
    tally: Counter = Counter()
    slowest = (0.0, "")
    started = time.monotonic()
    try:
        for i in range(1, CASES + 1):
            case = generator.next()
            t0 = time.monotonic()
            try:
                answer = senders[case.protocol].send(case)
            except Exception as exc:  # no answer at all is a failure too
                answer = Answer("no answer", f"{type(exc).__name__}: {exc}")
            answer.seconds = time.monotonic() - t0
            slowest = max(slowest, (answer.seconds, case.describe()))
            wrong = judge(case, answer, references)
            tally[(case.kind, case.protocol, answer.status)] += 1
            if wrong:
                failures.append(f"{case.describe()}: {wrong}")
            if i % 20 == 0:
                for protocol in ("http", "grpc"):
                    try:
                        good_request(server, protocol, float(i))
                    except Exception as exc:
                        failures.append(f"after #{i}: a correct {protocol} request failed: {exc}")
            if i % 100 == 0 or i == CASES:
                dead = dead_processes(processes)
                assert not dead, f"after case #{i} ({case.describe()}): processes died: {dead}; seed {SEED}"
    finally:
        for sender in senders.values():
            sender.close()
    elapsed = time.monotonic() - started
    summary = "\n".join(f"  {kind:22} {protocol:4} {status:18} {count}" for (kind, protocol, status), count in sorted(tally.items()))
    print(f"\nfuzz: {CASES} cases, seed {SEED}, {elapsed:.1f}s, slowest {slowest[0] * 1000:.0f} ms ({slowest[1]})\n{summary}")
    assert not failures, f"{len(failures)} of {CASES} cases wrong (seed {SEED}):\n" + "\n".join(failures[:25])
    assert sum(count for (kind, _, _), count in tally.items() if kind.startswith("valid")) >= CASES // 5
    assert server.process.poll() is None
    assert "died; reloading" not in server.output()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_64_mib_request_is_refused_and_nothing_dies(fuzz_server, protocol):
    """tritonserver 2.51 has no request size limit of its own: the body is read whole, then refused (see docs/operations.md)."""
    server, _ = fuzz_server
    processes = our_processes(server.process.pid)
    n = 16 << 20  # FP32 elements: 64 MiB
    case = Case(0, "huge", protocol, "add_mul", [Tensor("x", "FP32", [1, n], bytes(4 * n)),
                                                  Tensor("y", "FP32", [1, 4], bytes(16))])
    sender = HttpSender(server.http_port) if protocol == "http" else GrpcSender(server.grpc_port)
    try:
        answer = sender.send(case)
    finally:
        sender.close()
    assert is_client_error(answer.status), (answer.status, answer.message[:300])
    good_request(server, protocol, 1.0)
    assert not dead_processes(processes)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", [
    "bert",
    "bert_buckets",
])
def test_token_ids_out_of_range_are_a_4xx_on_every_engine(fuzz_server, model, protocol):
    server, _ = fuzz_server
    ids = np.array([[1, 2, VOCAB + 5, 3]], np.int64)
    case = Case(0, "token-out-of-range", protocol, model, [tensor("input_ids", ids, "INT64"),
                                                          tensor("attention_mask", np.ones_like(ids), "INT64")])
    sender = HttpSender(server.http_port) if protocol == "http" else GrpcSender(server.grpc_port)
    try:
        answer = sender.send(case)
    finally:
        sender.close()
    assert is_client_error(answer.status), (answer.status, answer.message[:300])
