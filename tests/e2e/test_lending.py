"""lend_idle_cores end to end: two pinned instances of a model in a server of their own (no other pinned model, whose
cores the server's ledger would make shared), each with a second engine whose worker threads sit on the other
instance's cores, used while that instance is idle (read from /proc: which threads may run where and how long they
ran), answering as ONNX Runtime does; and where nothing can be lent (an instance that is not pinned), the log says why."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gebackend.modelzoo import build_bert
from gebackend.runtime.pinning import format_cpu_list, usable_cpus

from .conftest import add_model, params
from .server import start_server
from .test_pinning import _allowed, _children, _cmdline, _descendants
from .test_serving import infer

pytestmark = pytest.mark.e2e

USABLE = usable_cpus()
TWO = 'backend: "ge"\nmax_batch_size: 4\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n'


@pytest.fixture(scope="module")
def lending_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("lending") / "models"
    model = build_bert(hidden=128, intermediate=512)
    add_model(repo, "lending", TWO + params(lend_idle_cores="on"), model)
    # not pinned (one instance): no other pinned model here, whose cores the server's ledger would make shared
    add_model(repo, "lending_alone", 'backend: "ge"\nmax_batch_size: 4\n' + params(lend_idle_cores="on"), model)
    running = start_server(repo, repo.parent / "serve.log")
    yield running, repo
    running.stop()


def _stubs(server, model: str) -> dict[str, int]:
    """Instance name -> its stub's pid."""
    tritons = [p for p in _descendants(server.process.pid) if Path(_cmdline(p)[0]).name == "tritonserver"]
    found = {}
    for pid in _children(tritons[0]):
        names = [a for a in _cmdline(pid) if re.fullmatch(rf"{re.escape(model)}_\d+_\d+", a)]
        if names:
            found[names[0]] = pid
    return found


def _threads(pid: int) -> dict[int, tuple[tuple[int, ...], int]]:
    """Thread id -> (the CPUs it may run on, nanoseconds it has run)."""
    out = {}
    for task in (Path("/proc") / str(pid) / "task").iterdir():
        try:
            out[int(task.name)] = (_allowed(task), int((task / "schedstat").read_text().split()[0]))
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return out


def _feeds(seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, 1000, size=(4, 32), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


@pytest.mark.skipif(len(USABLE) < 2, reason="lending needs two instances on cores of their own: this process has "
                                             f"{len(USABLE)} usable CPU")
def test_each_instance_lends_its_core_and_borrows_the_others_while_idle(lending_server):
    server, repo = lending_server
    out = server.output()
    stubs = _stubs(server, "lending")
    assert sorted(stubs) == ["lending_0_0", "lending_0_1"], stubs
    before = {name: _threads(pid) for name, pid in stubs.items()}
    borrowed = {}
    for name, pid in stubs.items():
        own = _allowed(Path("/proc") / str(pid))
        others = tuple(c for c in USABLE if c not in own)
        line = re.search(rf"model 'lending' instance '{name}' loaded .*", out).group(0)
        assert (f"lend_idle_cores: a batch runs on CPU(s) {format_cpu_list(USABLE)} ({len(USABLE)} threads) while "
                f"the model's other instances are idle, else on CPU(s) {format_cpu_list(own)}") in line, line
        # the borrowing engine's workers: one thread on each of the other instance's cores, none elsewhere
        foreign = {tid: cpus for tid, (cpus, _) in before[name].items() if not set(cpus) <= set(own)}
        assert sorted(c for cpus in foreign.values() for c in cpus) == sorted(others), (name, foreign)
        borrowed[name] = list(foreign)
    session = ort.InferenceSession(str(repo / "lending" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for seed in range(120):  # one at a time: whichever instance answers finds the other idle
        feeds = _feeds(seed)
        got = infer(server, "grpc", "lending", feeds)
        for output, want in zip(names, session.run(names, feeds)):
            np.testing.assert_allclose(got.as_numpy(output), want, rtol=1e-4, atol=1e-5)
    after = {name: _threads(pid) for name, pid in stubs.items()}
    ran = {name: sum(after[name][tid][1] - before[name][tid][1] for tid in borrowed[name] if tid in after[name])
           for name in stubs}
    assert sum(ran.values()) > 0, ran  # the borrowing engine ran, on the other instance's core


def test_concurrent_requests_answer_as_onnxruntime(lending_server):
    server, repo = lending_server
    session = ort.InferenceSession(str(repo / "lending" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def one(seed):
        feeds = _feeds(1000 + seed)
        got = infer(server, "grpc", "lending", feeds)
        return [(got.as_numpy(n), w) for n, w in zip(names, session.run(names, feeds))]

    with ThreadPoolExecutor(6) as pool:
        for pairs in pool.map(one, range(48)):
            for got, want in pairs:
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_instance_that_is_not_pinned_lends_nothing_and_says_why(lending_server):
    server, _ = lending_server
    assert ("model 'lending_alone': lend_idle_cores=on: lends nothing: only pinned instances lend (this one is not: "
            "one instance without cores_per_instance, or pin_instances=off)") in server.output(), server.output()[-4000:]
    feeds = _feeds(7)
    got = infer(server, "http", "lending_alone", feeds)
    assert got.as_numpy("last_hidden_state").shape[:2] == (4, 32)
