"""Pinned instances and precision modes, end to end: each instance's stub process affinity, read from /proc.

A server of its own: a model with two CPU instances (pinned by default), the same with pinning off, one
with more instances than this machine has cores (they share, and the log says so), one whose first group says
`count: 0` (Triton makes 1 of it), an int8 static model, a bf16 model ONNX Runtime refuses, and a static model with
two pinned instances (one times its buckets, the other uses that timing).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from gebackend.modelzoo import build_add_mul, build_bert, build_resnet
from gebackend.runtime.pinning import format_cpu_list, parse_cpu_list, plan_cpus, usable_cpus

from .conftest import BERT_BUCKETS, add_model, params
from .server import start_server
from .test_serving import infer

pytestmark = pytest.mark.e2e

USABLE = usable_cpus()  # the server inherits the test's affinity
SHARED_COUNT = len(USABLE) + 1  # one instance more than cores: some must share

MODELS = {
    "pinned": 'backend: "ge"\nmax_batch_size: 4\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n',
    "unpinned": 'backend: "ge"\nmax_batch_size: 4\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n'
                + params(pin_instances="off"),
    "crowded": f'backend: "ge"\nmax_batch_size: 4\ninstance_group [ {{ count: {SHARED_COUNT}, kind: KIND_CPU }} ]\n',
    "zero_count": 'backend: "ge"\nmax_batch_size: 4\n'
                  'instance_group [ { count: 0, kind: KIND_CPU }, { count: 1, kind: KIND_CPU } ]\n',
    "int8_static": 'backend: "ge"\nmax_batch_size: 4\n' + params(
        static_model="1", bucket_paddable_dims="sequence", precision_mode="int8", **BERT_BUCKETS),
    "bf16": 'backend: "ge"\nmax_batch_size: 4\n' + params(**{"session.ge.exec.precision_mode_v2": "bf16"}),
    # allow_spinning set: left to auto, an instance that shares its core with another model's gets it off and the
    # other not, and instances whose settings differ time their own buckets
    "static_pinned": 'backend: "ge"\nmax_batch_size: 4\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n'
                     + params(static_model="1", allow_spinning="off"),
}


@pytest.fixture(scope="module")
def pinning_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pinning") / "models"
    model = build_bert()
    for name, config in MODELS.items():
        add_model(repo, name, config, {"zero_count": build_add_mul, "static_pinned": build_resnet}.get(name, lambda: model)())
    running = start_server(repo, repo.parent / "serve.log")
    yield running, repo
    running.stop()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def stub_affinities(server, model: str, every_thread: bool = True) -> dict[str, tuple[int, ...]]:
    """Instance name -> CPUs allowed, for each stub process of `model` under this server's tritonserver.

    With `every_thread`, every thread of the process (the engine's pool included) must have the same set.
    """
    tritons = [p for p in _descendants(server.process.pid) if Path(_cmdline(p)[0]).name == "tritonserver"]
    assert len(tritons) == 1, tritons
    found = {}
    for pid in _children(tritons[0]):
        args = _cmdline(pid)
        if not args or Path(args[0]).name != "triton_python_backend_stub":
            continue
        names = [a for a in args if re.fullmatch(rf"{re.escape(model)}_\d+(_\d+)?", a)]
        if names:
            found[names[0]] = _allowed(Path("/proc") / str(pid))
            for task in (Path("/proc") / str(pid) / "task").iterdir() if every_thread else ():
                try:
                    assert _allowed(task) == found[names[0]], (names[0], task.name)
                except FileNotFoundError:
                    pass  # a thread that ended meanwhile
    return found


def _allowed(proc: Path) -> tuple[int, ...]:
    status = (proc / "status").read_text()
    return parse_cpu_list(re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1))


def _feeds(batch: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, size=(batch, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _reference(repo: Path, feeds):
    session = ort.InferenceSession(str(repo / "pinned" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def test_two_instances_get_disjoint_cpu_sets_covering_the_cores(pinning_server):
    server, _ = pinning_server
    affinity = stub_affinities(server, "pinned")
    assert sorted(affinity) == ["pinned_0_0", "pinned_0_1"], affinity
    first, second = set(affinity["pinned_0_0"]), set(affinity["pinned_0_1"])
    if len(USABLE) >= 2:
        assert first and second and not first & second, affinity
        assert first | second == set(USABLE), affinity
        # each takes as many cores as its plan gives it (which ones: the server-wide ledger decides, since
        # the other models' pinned instances load at the same time)
        assert sorted(len(a) for a in affinity.values()) == sorted(len(plan_cpus(i, 2, USABLE).cpus) for i in range(2))
    out = server.output()
    for index, name in enumerate(("pinned_0_0", "pinned_0_1")):
        cpus = format_cpu_list(affinity[name])
        assert re.search(rf"model 'pinned': instance '{name}': instance {index + 1}/2 pinned to CPU\(s\) {cpus} "
                         rf"of {format_cpu_list(USABLE)}; .*intra_op_threads={len(affinity[name])} "
                         r"inter_op_threads=1", out), out[-4000:]


def test_pinning_can_be_switched_off(pinning_server):
    server, _ = pinning_server
    # ONNX Runtime's default pool (intra_op_thread_count=0) pins each of its threads to one core itself,
    # in every unpinned instance alike: only the main thread shows the process's own affinity
    affinity = stub_affinities(server, "unpinned", every_thread=False)
    assert len(affinity) == 2 and all(cpus == tuple(sorted(USABLE)) for cpus in affinity.values()), affinity
    assert "model 'unpinned': instance" not in server.output()


def test_more_instances_than_cores_share_round_robin_and_say_so(pinning_server):
    server, _ = pinning_server
    affinity = stub_affinities(server, "crowded")
    assert len(affinity) == SHARED_COUNT, affinity
    assert all(len(cpus) == 1 for cpus in affinity.values()), affinity
    assert {c for cpus in affinity.values() for c in cpus} == set(USABLE)
    out = server.output()
    assert re.search(rf"model 'crowded': .*{SHARED_COUNT} instances on {len(USABLE)} usable core\(s\): "
                     r"instances share cores round-robin; this instance shares its core\(s\) with \w+/\w+", out)
    assert re.search(r"model 'crowded': instance 'crowded_0_0': .*allow_spinning=off", out), out[-4000:]


def test_a_group_of_count_zero_is_one_instance_to_triton_the_sizing_and_the_pinning(pinning_server):
    """Triton normalises `count: 0` to 1; the /dev/shm sizing (read from config.pbtxt) and the pinning plan (from
    the config Triton hands the stub) count the same instances through config/instance_groups.py."""
    server, _ = pinning_server
    affinity = stub_affinities(server, "zero_count")
    assert sorted(affinity) == ["zero_count_0_0", "zero_count_1_0"], affinity
    out = server.output()
    assert re.search(r"\(\d+ instance\(s\): .*zero_count 2x", out), out[:2000]
    for index, name in enumerate(("zero_count_0_0", "zero_count_1_0")):
        assert re.search(rf"model 'zero_count': instance '{name}': instance {index + 1}/2 pinned", out), out[-4000:]
    x, y = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 3.0, np.float32)
    for _ in range(3):  # more than one instance answers
        got = infer(server, "grpc", "zero_count", {"x": x, "y": y})
        np.testing.assert_array_equal(got.as_numpy("sum"), x + y)
        np.testing.assert_array_equal(got.as_numpy("product"), x * y)


@pytest.mark.parametrize("model", ["pinned", "crowded"])
def test_pinned_instances_answer_correctly(pinning_server, model):
    server, repo = pinning_server
    for seed in range(4):  # several requests: more than one instance answers
        feeds = _feeds(2, 9, seed)
        got = infer(server, "grpc", model, feeds)
        for name, want in _reference(repo, feeds).items():
            np.testing.assert_allclose(got.as_numpy(name), want, rtol=1e-4, atol=1e-5)


def test_int8_static_model_serves_close_to_fp32_and_logs_its_accuracy(pinning_server):
    server, repo = pinning_server
    out = server.output()
    assert re.search(r"model 'int8_static': precision int8 vs fp32: max_abs_diff=\S+ cosine=0\.99\d+ "
                     r"\(seeded random input input_ids:1,16 attention_mask:1,16, seed 0\)", out), out[-4000:]
    assert re.search(r"model 'int8_static' instance .* precision int8 \(cosine 0\.99\d+ to fp32 on input_ids:\[1, 16\] "
                     r"attention_mask:\[1, 16\], the first bucket's shape; ONNX Runtime dynamic, (\d+) of \1 MatMul/Gemm "
                     r"quantized\), static graph", out), out[-4000:]
    feeds = _feeds(3, 20, 7)
    got = infer(server, "http", "int8_static", feeds).as_numpy("last_hidden_state")
    want = _reference(repo, feeds)["last_hidden_state"]
    cosine = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine >= 0.99, cosine


def test_the_instances_of_a_static_model_time_their_buckets_once(pinning_server):
    """The first instance to time writes its costs to the server's control folder and the second uses them
    (control/shared_costs.py): one timing, the same routing on both, answers as the dynamic graph's."""
    server, repo = pinning_server
    out = server.output()
    costs = re.findall(r"model 'static_pinned': bucket run costs measured at load: ([^\n\x22]+)", out)
    shared = re.findall(r"model 'static_pinned': bucket costs: timed \d+s ago by another instance of this model "
                        r"\(on cores ([\d,]+)\), used as they are", out)
    if re.search(r"model 'static_pinned': bucket costs: timed while other instances still load", out):
        assert not shared  # a timing beside others' loads is not shared: each instance timed its own
    else:
        assert len(shared) == 1, out[-6000:]
        assert len(costs) == 2 and costs[0] == costs[1], costs
        cores = stub_affinities(server, "static_pinned", every_thread=False)
        assert len(cores) == 2 and parse_cpu_list(shared[0]) in cores.values(), (shared, cores)
    session = ort.InferenceSession(str(repo / "static_pinned" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    for seed in range(4):  # several requests: both instances answer
        feeds = {"image": np.random.default_rng(seed).standard_normal((3, 3, 64, 64)).astype(np.float32)}
        got = infer(server, "grpc", "static_pinned", feeds).as_numpy("logits")
        np.testing.assert_allclose(got, session.run(["logits"], feeds)[0], rtol=1e-4, atol=1e-5)


def test_bf16_on_onnxruntime_fails_to_load_pointing_to_openvino(pinning_server):
    server, _ = pinning_server
    failed = re.search(r"model 'bf16' failed to load: (.*)", server.output())
    assert failed, server.output()[-4000:]
    assert "bf16" in failed.group(1) and "engine=openvino" in failed.group(1)


@pytest.mark.skipif(len(USABLE) < 2, reason="needs 2 usable cores")
def test_pinned_instances_of_two_models_take_different_cores(tmp_path):
    """Each model's plan alone would put both instance 0s on the first core; the server-wide ledger does not."""
    repo = tmp_path / "models"
    config = 'backend: "ge"\nmax_batch_size: 4\n' + params(cores_per_instance="1")
    model = build_bert()
    for name in ("solo_a", "solo_b"):
        add_model(repo, name, config, model)
    server = start_server(repo, tmp_path / "serve.log")
    try:
        (a,) = stub_affinities(server, "solo_a").values()
        (b,) = stub_affinities(server, "solo_b").values()
        assert len(a) == len(b) == 1 and a != b, (a, b)
        out = server.output()
        assert re.search(r"model 'solo_\w': instance 'solo_\w_0': instance 1/1 pinned to CPU\(s\) \d+ ", out)
        assert "shares its core" not in out
        feeds = _feeds(2, 9, 0)
        for name in ("solo_a", "solo_b"):
            got = infer(server, "grpc", name, feeds)
            session = ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
            for output, value in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
                np.testing.assert_allclose(got.as_numpy(output), value, rtol=1e-4, atol=1e-5)
    finally:
        assert server.stop() == 0


@pytest.mark.skipif(len(USABLE) < 2, reason="this process has one CPU: there is nothing to confine the server to")
def test_a_server_confined_to_one_cpu_sizes_its_engine_threads_to_it(tmp_path):
    """`taskset -c N gebackend serve` (or a pod's cpuset): ONNX Runtime's default would start a thread per machine
    core, all on the one CPU; an instance that is not pinned gets one engine thread, and says why."""
    repo = tmp_path / "models"
    add_model(repo, "confined", 'backend: "ge"\nmax_batch_size: 4\n', build_bert())
    add_model(repo, "confined_set", 'backend: "ge"\nmax_batch_size: 4\n' + params(intra_op_thread_count="2"), build_bert())
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {USABLE[-1]})  # this thread's mask: the server started from it inherits it
    try:
        server = start_server(repo, tmp_path / "serve.log")
    finally:
        os.sched_setaffinity(0, mine)
    try:
        out = server.output()
        assert re.search(r"model 'confined': intra_op_threads=1: this process may use 1 CPU\(s\), as its CPU "
                         rf"affinity is 1 of the machine's {os.cpu_count()} CPUs", out), out[-3000:]
        assert re.search(r"model 'confined' instance 'confined_0' loaded .* intra_op_threads=1 ", out)
        assert re.search(r"model 'confined_set' instance 'confined_set_0' loaded .* intra_op_threads=2 ", out)
        assert "model 'confined_set': intra_op_threads=1" not in out  # the user's setting stands, with a warning
        assert "model 'confined_set': intra_op_thread_count=2 (set by the user) exceeds the 1 CPU(s)" in out
        assert set(stub_affinities(server, "confined").values()) == {(USABLE[-1],)}
        feeds = _feeds(3, 11, 5)
        session = ort.InferenceSession(str(repo / "confined" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        got = infer(server, "grpc", "confined", feeds)
        for output, value in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
            np.testing.assert_allclose(got.as_numpy(output), value, rtol=1e-4, atol=1e-5)
    finally:
        assert server.stop() == 0
