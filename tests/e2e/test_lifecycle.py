"""The server's life: start-up failures say why, fast; a stop drains in-flight requests, exits 0 and leaves nothing behind."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import helper

from gebackend.modelzoo import build_add_mul, build_bert
from gebackend.server.ports import free_ports

from .conftest import ADD_MUL_CONFIG, BERT_BUCKETS, add_model, params
from .server import GEBACKEND, RunningServer, start_server, taken_port

pytestmark = pytest.mark.e2e

# Dynamic batching that holds a lone request ~3 s in the queue waiting for company: an in-flight request
# that costs no CPU.
QUEUED_CONFIG = """
backend: "ge"
max_batch_size: 16
dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 3000000 }
"""


def named(processes: list[psutil.Process], name: str) -> list[psutil.Process]:
    """The processes called `name`, skipping any that exited since they were listed (the CLI's short-lived helpers)."""
    found = []
    for process in processes:
        try:
            if process.name() == name:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@dataclass
class Footprint:
    """Everything one `gebackend serve` made: its processes, its temp folder and the prefix of its /dev/shm regions."""

    processes: list[psutil.Process]
    workdir: Path
    shm_prefix: str

    @classmethod
    def of(cls, server: RunningServer) -> "Footprint":
        children = psutil.Process(server.process.pid).children(recursive=True)
        triton = named(children, "tritonserver")[0]
        args = triton.cmdline()
        backends = next(a.split("=", 1)[1] for a in args if a.startswith("--backend-directory="))
        prefix = next(a.split("shm-region-prefix-name=", 1)[1] for a in args if "shm-region-prefix-name=" in a)
        return cls(children, Path(backends).parent, prefix)

    def shm(self) -> list[str]:
        return sorted(p.name for p in Path("/dev/shm").glob(f"{self.shm_prefix}*"))

    def leftovers(self) -> list[str]:
        alive = [f"{p.name()} (pid {p.pid})" for p in self.processes if _running(p)]
        folder = [str(self.workdir)] if self.workdir.exists() else []
        return alive + folder + self.shm()


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stub_of(server: RunningServer, instance: str) -> psutil.Process:
    return next(p for p in server.tritonserver().children() if instance in p.cmdline())


def add_mul_request(module, value: float):
    inputs = []
    for name in ("x", "y"):
        tensor = module.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        inputs.append(tensor)
    return inputs


def stop_with(server: RunningServer, sig: int, timeout: float = 90) -> tuple[int, float]:
    started = time.monotonic()
    server.process.send_signal(sig)
    code = server.process.wait(timeout=timeout)
    return code, time.monotonic() - started


def test_clean_shutdown_leaves_no_shm_or_temp_folders(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log")
    footprint = Footprint.of(server)
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("add_mul", add_mul_request(httpclient, 1.0))
    np.testing.assert_array_equal(result.as_numpy("sum"), np.full((1, 4), 2, np.float32))
    assert footprint.shm(), "the server should hold shm regions while running"
    client.close()
    assert server.stop() == 0, server.output()[-3000:]
    assert footprint.leftovers() == []
    assert "gebackend: stopped cleanly" in server.output()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_in_flight_requests_then_exits_0(tmp_path, sig):
    repo = tmp_path / "repo"
    add_model(repo, "queued", QUEUED_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log")
    footprint = Footprint.of(server)
    answers: dict[str, object] = {}

    def send(protocol: str, value: float) -> None:
        module = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
        try:
            answers[f"{protocol}{value}"] = client.infer("queued", add_mul_request(module, value)).as_numpy("sum")
        except Exception as exc:
            answers[f"{protocol}{value}"] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(p, v)) for p, v in (("http", 1.0), ("grpc", 2.0), ("http", 3.0))]
    for thread in threads:
        thread.start()
    time.sleep(0.8)  # all three wait in the batcher's queue (3 s)
    code, seconds = stop_with(server, sig)
    for thread in threads:
        thread.join(10)
    out = server.output()
    assert code == 0, out[-3000:]
    for key, value in answers.items():
        assert not isinstance(value, Exception), (key, value)
        np.testing.assert_array_equal(value, np.full((1, 4), 2 * float(key[4:]), np.float32))
    assert len(answers) == 3
    assert "gebackend: every in-flight request finished" in out and "gebackend: stopped cleanly" in out
    assert 1.5 < seconds < 20, seconds  # it waited for the queued requests, not for the 30 s exit timeout
    assert footprint.leftovers() == []


def test_idle_keep_alive_connections_do_not_hold_the_stop(tmp_path):
    """Fact (Triton 2.51): an idle keep-alive HTTP connection holds Triton's exit until --exit-timeout-secs, then it
    exits 1. Every request has finished by then, so the CLI ends it after a short grace and exits 0."""
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log", ["--exit-timeout", "30"])
    footprint = Footprint.of(server)
    idle_http = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    idle_http.request("GET", "/v2/health/ready")
    assert idle_http.getresponse().read() == b""
    idle_grpc = grpcclient.InferenceServerClient(server.grpc_url)
    idle_grpc.infer("add_mul", add_mul_request(grpcclient, 1.0))
    try:
        code, seconds = stop_with(server, signal.SIGTERM)
    finally:
        idle_http.close()
        idle_grpc.close()
    out = server.output()
    assert code == 0, out[-3000:]
    assert seconds < 20, seconds
    assert "with no request left to finish; ended it" in out and "HTTP service connections" in out, out[-2000:]
    assert footprint.leftovers() == []


@pytest.mark.parametrize("healing", [True, False], ids=["self-healing", "no-self-healing"])
def test_stop_right_after_a_stub_was_killed_is_clean(tmp_path, healing):
    """A request has met the dead stub (so Triton 2.51 can never unload that model) and the stop comes at once."""
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    add_model(repo, "other", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log", [] if healing else ["--no-self-healing"])
    footprint = Footprint.of(server)
    stub_of(server, "add_mul_0").kill()
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(Exception, match="not healthy"):
        client.infer("add_mul", add_mul_request(httpclient, 1.0))
    client.close()
    code, seconds = stop_with(server, signal.SIGTERM)
    out = server.output()
    assert code == 0, out[-3000:]
    assert seconds < 25, seconds
    assert "gebackend: stopped cleanly" in out
    assert footprint.leftovers() == [], out[-2000:]


def test_a_crashed_tritonserver_is_started_again(tmp_path):
    """Seen in a soak on an overloaded machine: tritonserver 2.51 itself died of SIGSEGV inside the Python backend.
    The CLI starts it again on the same ports (nothing of the dead one left behind) and keeps serving."""
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log")
    first = Footprint.of(server)
    triton = next(p for p in first.processes if p.name() == "tritonserver")
    triton.send_signal(signal.SIGSEGV)
    deadline = time.monotonic() + 120
    while "tritonserver restarted: 1 of 1 models ready" not in server.output():
        assert time.monotonic() < deadline and server.process.poll() is None, server.output()[-3000:]
        time.sleep(0.2)
    out = server.output()
    assert "gebackend: tritonserver exited unexpectedly with code -11; starting it again" in out
    assert first.leftovers() == [], "the crashed server's processes, shm regions and temp folder are gone"
    second = Footprint.of(server)
    for module in (httpclient, grpcclient):
        client = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
        result = client.infer("add_mul", add_mul_request(module, 2.0))
        np.testing.assert_array_equal(result.as_numpy("sum"), np.full((1, 4), 4, np.float32))
        client.close()
    code, _ = stop_with(server, signal.SIGTERM)
    assert code == 0, server.output()[-3000:]
    assert second.leftovers() == []


def test_without_self_healing_a_crashed_tritonserver_ends_the_cli(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log", ["--no-self-healing"])
    footprint = Footprint.of(server)
    next(p for p in footprint.processes if p.name() == "tritonserver").send_signal(signal.SIGSEGV)
    assert server.process.wait(timeout=60) != 0
    assert "tritonserver exited unexpectedly with code -11" in server.output()
    assert footprint.leftovers() == []


def test_the_exit_timeout_bounds_the_drain(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "queued", QUEUED_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log", ["--exit-timeout", "1"])
    footprint = Footprint.of(server)
    failed = []

    def send() -> None:
        client = httpclient.InferenceServerClient(server.http_url, connection_timeout=30, network_timeout=30)
        try:
            client.infer("queued", add_mul_request(httpclient, 1.0))
        except Exception as exc:
            failed.append(exc)
        finally:
            client.close()

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(0.5)
    code, seconds = stop_with(server, signal.SIGTERM)
    thread.join(30)
    out = server.output()
    assert code == 1, out[-3000:]
    assert seconds < 2.5, seconds  # the request alone would have needed 3 s
    assert "requests to queued were still running after --exit-timeout 1s; they were cut off" in out
    assert failed, "the cut-off request cannot have succeeded"
    assert footprint.leftovers() == []


def test_ctrl_c_while_models_load_stops_at_once(tmp_path):
    """Static compilation of a bucketed model takes seconds: a Ctrl-C then is obeyed, not held until ready."""
    repo = tmp_path / "repo"
    add_model(repo, "bert_buckets", 'backend: "ge"\nmax_batch_size: 4\n' + params(
        static_model="1", bucket_paddable_dims="sequence", **BERT_BUCKETS), build_bert())
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            GEBACKEND + ["serve", str(repo), *_port_flags(*free_ports(3))],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    deadline = time.monotonic() + 60
    stubs: list[psutil.Process] = []
    while time.monotonic() < deadline and not stubs:
        stubs = named(psutil.Process(process.pid).children(recursive=True), "triton_python_backend_stub")
        time.sleep(0.05)
    assert stubs, log.read_text()[-2000:]
    processes = psutil.Process(process.pid).children(recursive=True)
    workdirs = {Path(a.split("=", 1)[1]).parent for p in named(processes, "tritonserver")
                for a in p.cmdline() if a.startswith("--backend-directory=")}
    process.send_signal(signal.SIGINT)
    code = process.wait(timeout=30)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "gebackend: stopping before the server was ready" in text or "gebackend: stopped cleanly" in text
    assert [p.pid for p in processes if _running(p)] == []
    assert all(not folder.exists() for folder in workdirs)
    assert not list(Path("/dev/shm").glob(f"gebackend{process.pid}x*"))


def _port_flags(http: int, grpc: int, metrics: int) -> list[str]:
    return ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]


def test_port_in_use_fails_fast_with_reason(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    with taken_port() as port:
        started = time.monotonic()
        done = subprocess.run(
            GEBACKEND + ["serve", str(repo), *_port_flags(port, *free_ports(2))],
            capture_output=True, text=True, timeout=60,
        )
    assert done.returncode != 0
    assert f"HTTP port {port} is already in use" in done.stderr
    assert time.monotonic() - started < 30


def test_one_port_for_two_services_fails_fast_with_reason(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    port, metrics = free_ports(2)
    done = subprocess.run(
        GEBACKEND + ["serve", str(repo), *_port_flags(port, port, metrics)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert f"HTTP and gRPC are both given port {port}; each service needs its own" in done.stderr
    assert "Usage" not in done.stderr and "--trace" not in done.stderr  # not tritonserver's usage text


def test_missing_repository_fails_fast(tmp_path):
    done = subprocess.run(GEBACKEND + ["serve", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "is not a folder" in done.stderr


def add_mul_plus(offset: float) -> onnx.ModelProto:
    """add_mul's signature with sum = x + y + offset: a model whose files change, and whose answer shows which."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["xy"]), helper.make_node("Add", ["xy", "offset"], ["sum"]),
         helper.make_node("Mul", ["x", "y"], ["product"])],
        "add_mul_plus",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["batch", 4]) for n in ("x", "y")],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["batch", 4]) for n in ("sum", "product")],
        [helper.make_tensor("offset", onnx.TensorProto.FLOAT, [1], [offset])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def our_rss(server: RunningServer) -> tuple[int, int]:
    """(tritonserver RSS, sum of its stubs' RSS) in bytes."""
    triton = server.tritonserver()
    stubs = 0
    for child in triton.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                stubs += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return triton.memory_info().rss, stubs


def wait_for(server: RunningServer, text: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while server.output().count(text) < count:
        assert time.monotonic() < deadline, f"no {count}x {text!r}:\n{server.output()[-3000:]}"
        time.sleep(0.05)


RELOAD_CYCLES = int(os.environ.get("GE_RELOAD_CYCLES", "20"))


def test_sighup_reloads_changed_models_without_dropping_requests(tmp_path):
    """20 reloads of a model whose file changed: every request to it and to another model is answered, and the
    server's memory does not grow."""
    from .test_recovery import Traffic

    repo = tmp_path / "repo"
    onnx_file = add_model(repo, "changing", ADD_MUL_CONFIG.replace("200000", "1000"), add_mul_plus(0.0))
    add_model(repo, "steady", ADD_MUL_CONFIG.replace("200000", "1000"), build_add_mul())
    server = start_server(repo, tmp_path / "serve.log")
    footprint = Footprint.of(server)
    rss = []
    try:
        with Traffic(server, "steady", pause=0.03) as steady, \
                Traffic(server, "changing", pause=0.03, offsets=tuple(float(k) for k in range(RELOAD_CYCLES + 1))) \
                as changing:
            for cycle in range(1, RELOAD_CYCLES + 1):
                onnx.save(add_mul_plus(float(cycle)), str(onnx_file))
                server.process.send_signal(signal.SIGHUP)
                wait_for(server, "gebackend: reload: model 'changing' reloaded in ", cycle)
                client = httpclient.InferenceServerClient(server.http_url)
                got = client.infer("changing", add_mul_request(httpclient, 1.0)).as_numpy("sum")
                client.close()
                np.testing.assert_array_equal(got, np.full((1, 4), 2.0 + cycle, np.float32))
                rss.append(our_rss(server))
        out = server.output()
        mib = [(t >> 20, s >> 20) for t, s in rss]
        print(f"\nRSS after each of {RELOAD_CYCLES} reloads (tritonserver MiB, stubs MiB): {mib}; "
              f"requests: steady {len(steady.outcomes)}, changing {len(changing.outcomes)}")
        assert steady.failures() == [], steady.failures()[:5]
        assert changing.failures() == [], changing.failures()[:5]
        # No stall either (over HTTP, Triton 2.51 holds HTTP inference for the ~2 s a load takes; the CLI loads over gRPC).
        slowest = max(seconds for _, seconds, _ in steady.outcomes + changing.outcomes)
        print(f"slowest request during the reloads: {slowest * 1000:.0f} ms")
        assert slowest < 1.5, slowest
        assert len(changing.outcomes) > RELOAD_CYCLES and len(steady.outcomes) > RELOAD_CYCLES
        assert "reloading steady" not in out and "died" not in out
        settled = rss[min(4, len(rss) - 1)]
        assert rss[-1][0] < settled[0] * 1.15 + (8 << 20), mib  # tritonserver
        assert rss[-1][1] < settled[1] * 1.15 + (8 << 20), mib  # its stubs
    finally:
        assert server.stop() == 0, server.output()[-3000:]
    assert footprint.leftovers() == []


def test_sighup_with_a_broken_file_reports_it_and_keeps_the_others(tmp_path):
    repo = tmp_path / "repo"
    onnx_file = add_model(repo, "changing", ADD_MUL_CONFIG, add_mul_plus(0.0))
    add_model(repo, "steady", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "serve.log")
    try:
        onnx_file.write_bytes(b"not an onnx file any more")
        shutil.copytree(repo / "steady", repo / "newcomer")
        server.process.send_signal(signal.SIGHUP)
        wait_for(server, "gebackend: reload: model 'newcomer' loaded in ", 1)
        wait_for(server, "gebackend: reload: model 'changing' failed: ", 1)
        out = server.output()
        assert re.search(r"reload: model 'changing' failed: .*cannot read ONNX file", out), out[-3000:]
        client = httpclient.InferenceServerClient(server.http_url)
        for model in ("steady", "newcomer"):
            got = client.infer(model, add_mul_request(httpclient, 1.0)).as_numpy("sum")
            np.testing.assert_array_equal(got, np.full((1, 4), 2.0, np.float32))
        # Triton keeps the version it had: the model goes on answering from the old file.
        assert client.is_model_ready("changing")
        got = client.infer("changing", add_mul_request(httpclient, 1.0)).as_numpy("sum")
        np.testing.assert_array_equal(got, np.full((1, 4), 2.0, np.float32))
        client.close()
    finally:
        assert server.stop() == 0, server.output()[-3000:]


def test_kill_9_of_the_cli_takes_the_server_down_and_the_next_start_sweeps_the_rest(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    server = start_server(repo, tmp_path / "first.log")
    footprint = Footprint.of(server)
    server.process.kill()
    server.process.wait()
    deadline = time.monotonic() + 60  # tritonserver gets SIGTERM from its parent-death signal and stops by itself
    while any(_running(p) for p in footprint.processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_running(p) for p in footprint.processes)
    # Only the CLI could remove its temp folder (and regions, if tritonserver left any): the next start does.
    # (Any `gebackend serve` of this user sweeps, so on a shared machine another one may have done it first.)
    second = start_server(repo, tmp_path / "second.log")
    try:
        assert footprint.leftovers() == []
    finally:
        assert second.stop() == 0
