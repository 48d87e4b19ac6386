"""The serving image as a cluster runs it: built with `make image` (tools/build_image.sh), run with podman with a
read-only root file system, a tmpfs /tmp, uid 1000, no capabilities, a small /dev/shm and its ports published on
127.0.0.1 only; answers checked over HTTP and gRPC against onnxruntime run here on the image's own ONNX files;
stopped with SIGTERM (`podman stop -t N`) within the grace period.

The image is reused when its label `org.gebackend.sources` matches the working tree (tools/image_sources.py), else
built (about 2-5 minutes here; the debootstrap rootfs and the wheels are cached). Every test skips, printing why,
when podman is missing or cannot run a container on this machine, or when the image must be built and debootstrap
is missing (`make deploy-tools` installs podman, buildah, debootstrap and kubectl).

`test_serve_fails_at_start_when_dev_shm_is_too_small` needs no podman: a private mount namespace (root) gives
`gebackend serve` a 2 MiB /dev/shm.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gebackend.server.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("GE_CONTAINER_IMAGE", "localhost/gebackend:latest")
BUILD_TIMEOUT = int(os.environ.get("GE_CONTAINER_BUILD_TIMEOUT", "1500"))
GRACE = 30  # podman stop -t: seconds between SIGTERM and SIGKILL
SHM_SIZE = "64m"  # docker's and podman's default; the examples need 3 MiB
CPUS = "1"  # a pod limited to one CPU: the engines must size their threads to it, not to the machine
STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWEV] \d+ [^\]]+\] ")

pytestmark = [pytest.mark.container, pytest.mark.e2e, pytest.mark.timeout(BUILD_TIMEOUT + 600)]


def _client_module():
    spec = importlib.util.spec_from_file_location("gebackend_example_client", ROOT / "examples" / "client.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _say(request, line: str) -> None:
    """Print past pytest's capture: skip reasons, build and stop times show in every run's output."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(f"test_container: {line}", file=sys.stderr)
        return
    with capture.global_and_fixture_disabled():
        sys.stderr.write(f"\ntest_container: {line}\n")
        sys.stderr.flush()


def _skip(request, reason: str):
    _say(request, f"skipped: {reason}")
    pytest.skip(reason)


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


@dataclass
class Podman:
    flags: list[str]  # run flags that work here (OCI runtime, ulimits)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run(["podman", *args], timeout)

    def start(self, *args: str, name: str | None = None) -> str:
        name = name or f"gebackend-test-{uuid.uuid4().hex[:8]}"
        result = self.run("run", "-d", "--name", name, *self.flags, *args)
        assert result.returncode == 0, f"podman run failed: {result.stderr}"
        return name

    def logs(self, name: str) -> str:
        result = self.run("logs", name, timeout=30)
        return result.stdout + result.stderr

    def state(self, name: str) -> dict:
        result = self.run("inspect", "--format", "{{json .State}}", name, timeout=30)
        return json.loads(result.stdout) if result.returncode == 0 else {}

    def remove(self, name: str) -> None:
        self.run("rm", "-f", "-t", "2", name, timeout=60)


def _sources_hash() -> str:
    return _run([sys.executable, str(ROOT / "tools" / "image_sources.py")], 30).stdout.strip()


def _image_label() -> str | None:
    result = _run(["podman", "image", "inspect", "--format", '{{index .Labels "org.gebackend.sources"}}', IMAGE], 30)
    return result.stdout.strip() if result.returncode == 0 else None


@pytest.fixture(scope="module")
def podman(request) -> Podman:
    """The image, current with the working tree (built if not), and the podman flags that run it here."""
    if shutil.which("podman") is None:
        _skip(request, "podman is not installed (make deploy-tools installs podman, buildah, debootstrap, kubectl)")
    try:
        info = _run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}"], 60)
    except subprocess.TimeoutExpired:
        _skip(request, "`podman info` did not answer within 60 s")
    if info.returncode != 0:
        _skip(request, f"podman does not work here: {info.stderr.strip()[-500:]}")
    if _image_label() != _sources_hash():
        if shutil.which("debootstrap") is None and _image_label() is None:
            _skip(request, f"{IMAGE} is not built and debootstrap is not installed (make deploy-tools)")
        if os.geteuid() != 0:
            _skip(request, f"{IMAGE} must be built, and debootstrap and the build need root here")
        log = ROOT / "build" / "container-test-build.log"
        log.parent.mkdir(exist_ok=True)
        started = time.monotonic()
        _say(request, f"building {IMAGE} (tools/build_image.sh, log in {log.relative_to(ROOT)})")
        with open(log, "w") as out:
            try:
                code = subprocess.run(["bash", str(ROOT / "tools" / "build_image.sh")], stdout=out, stderr=subprocess.STDOUT,
                                      timeout=BUILD_TIMEOUT, cwd=ROOT, env=dict(os.environ, IMAGE=IMAGE)).returncode
            except subprocess.TimeoutExpired:
                pytest.fail(f"building {IMAGE} took more than {BUILD_TIMEOUT}s; see {log}")
        tail = log.read_text(errors="replace")[-3000:]
        if code == 3:  # tools/podman_flags.sh / make_base_image.sh: this machine cannot do it
            _skip(request, f"cannot build or run containers here:\n{tail}")
        assert code == 0, f"tools/build_image.sh exited {code}:\n{tail}"
        _say(request, f"built {IMAGE} in {time.monotonic() - started:.0f}s")
    else:
        _say(request, f"reusing {IMAGE} (built from this tree)")
    probe = _run(["bash", str(ROOT / "tools" / "podman_flags.sh"), IMAGE], 300)
    if probe.returncode != 0:
        _skip(request, f"podman cannot run a container here: {probe.stderr.strip()[-800:]}")
    values = dict(re.findall(r"^(\w+)='(.*)'$", probe.stdout, re.M))
    flags = (values.get("PODMAN_RUNTIME", "") + " " + values.get("PODMAN_ULIMITS", "")).split()
    # `podman run --runtime` is a global flag in podman 4; as a run flag it is accepted too
    return Podman(flags)


def _locked_down(http: int, grpc: int, metrics: int, *extra: str) -> list[str]:
    """What a cluster gives the container: read-only root, tmpfs /tmp, uid 1000, no capabilities, a small /dev/shm,
    a CPU limit (a cgroup quota of one CPU, as `limits.cpu: "1"`), ports on 127.0.0.1 only."""
    return [
        "--read-only", "--tmpfs", "/tmp:rw,size=1g,mode=1777", "--user", "1000:1000", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--shm-size", SHM_SIZE, "--memory", "4g", "--cpus", CPUS,
        "-p", f"127.0.0.1:{http}:{extra_port(extra, '--http-port', 8000)}",
        "-p", f"127.0.0.1:{grpc}:{extra_port(extra, '--grpc-port', 8001)}",
        "-p", f"127.0.0.1:{metrics}:8002",
    ]


def extra_port(args, flag: str, default: int) -> int:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return int(args[i + 1])
        if arg.startswith(flag + "="):
            return int(arg.split("=", 1)[1])
    return default


def _wait_ready(podman: Podman, name: str, http: int, timeout: float = 180) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if not podman.state(name).get("Running", False):
            pytest.fail(f"the container exited before it was ready:\n{podman.logs(name)[-5000:]}")
        time.sleep(0.25)
    pytest.fail(f"not ready within {timeout}s:\n{podman.logs(name)[-5000:]}")


@pytest.fixture(scope="module")
def served(podman: Podman, request):
    ports = free_ports(3)
    name = podman.start(*_locked_down(*ports), IMAGE)
    try:
        ready = _wait_ready(podman, name, ports[0])
        _say(request, f"container ready {ready:.1f}s after podman run")
        yield name, ports
    finally:
        podman.remove(name)


def _check_models(podman: Podman, name: str, http_port: int, grpc_port: int, tmp: Path) -> list[str]:
    """Every model of the image's repository, over HTTP and gRPC, batch 1 and the largest batch, compared with
    onnxruntime on the image's own ONNX files. Returns what was checked."""
    client = _client_module()
    models = tmp / "models"
    copied = podman.run("cp", f"{name}:/models", str(models), timeout=60)
    assert copied.returncode == 0, copied.stderr
    http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    rng = np.random.default_rng(14)
    checked = []
    try:
        for model in sorted(p.parent.name for p in models.glob("*/config.pbtxt")):
            assert http.is_model_ready(model), f"{model} is not ready"
            metadata = http.get_model_metadata(model)
            config = http.get_model_config(model)
            session = ort.InferenceSession(str(next(iter(sorted((models / model).glob("*/*.onnx"))))),
                                           providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            for batch in (1, int(config.get("max_batch_size") or 1)):
                feeds = client.random_inputs(metadata, rng, batch=batch)
                expected = dict(zip(names, session.run(None, client.as_the_model_sees_them(config, feeds))))
                for protocol, module, connection in (("http", httpclient, http), ("grpc", grpcclient, grpc)):
                    result = client.infer(module, connection, model, feeds)
                    for output, want in expected.items():
                        got = result.as_numpy(output).reshape(want.shape)
                        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                                   err_msg=f"{model} [{protocol}] batch {batch} {output}")
                    checked.append(f"{model}/{protocol}/b{batch}")
    finally:
        http.close()
        grpc.close()
    return checked


def test_the_image_serves_the_examples_locked_down(podman: Podman, served, tmp_path: Path):
    name, (http, grpc, metrics) = served
    checked = _check_models(podman, name, http, grpc, tmp_path)
    assert {c.split("/")[0] for c in checked} == {"bert_ge", "resnet_ge", "resnet_npu_ge"}
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
        assert "nv_inference_request_success" in response.read().decode()
    # it runs as uid 1000 without capabilities on a read-only root
    whoami = podman.run("exec", name, "sh", "-c", "id -u; grep CapEff /proc/self/status; touch /x 2>&1; touch /tmp/x && echo tmp-ok")
    assert whoami.stdout.splitlines()[0] == "1000"
    assert "CapEff:\t0000000000000000" in whoami.stdout
    assert "Read-only file system" in whoami.stdout and "tmp-ok" in whoami.stdout
    inspect = podman.run("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.ShmSize}}", name)
    assert inspect.stdout.split() == ["true", str(64 * 1024 * 1024)]
    # the log: one event a line, stamped, ours like tritonserver's
    logs = podman.logs(name).splitlines()
    ours = [line for line in logs if " gebackend] " in line]
    assert ours and all(STAMPED.match(line) for line in ours)
    assert any('gebackend] "ready; Ctrl-C to stop"' in line for line in ours)
    assert any("/dev/shm has 64.0 MiB free" in line for line in ours)
    # the CPU limit reaches the engine: a thread per CPU of the quota, not one per core of the machine
    sized = [line for line in logs if "this process may use 1 CPU(s), as its cgroup's CPU quota is 1 CPU(s)" in line]
    if (os.cpu_count() or 1) > 1:
        loaded = [line for line in logs if "intra_op_threads=" in line]
        # resnet_npu_ge sets intra_op_thread_count=1 itself: its setting stands, and fits the quota (no warning)
        assert {re.search(r"model '(\w+)'", line).group(1) for line in sized} == {"bert_ge", "resnet_ge"}, loaded
        assert not [line for line in logs if "exceeds the 1 CPU(s)" in line]
    # every other line continues the event before it: Triton's tables, and NVML's own complaint on stderr
    assert STAMPED.match(logs[0])
    loose = [line for line in logs if not STAMPED.match(line) and line.strip() and line[0] not in "+|"
             and not line.startswith("Error: Failed to initialize NVML")]
    assert not loose, loose


def test_sigterm_stops_it_cleanly_within_the_grace_period(podman: Podman, tmp_path: Path, request):
    """KServe's way: the repository on a read-only volume at /mnt/models, HTTP on 8080 and gRPC on 9000."""
    repo = tmp_path / "repository"
    copy = podman.run("run", "--rm", *podman.flags, "--network", "none", "--entrypoint", "/bin/sh", "-v",
                      f"{tmp_path}:/out", "--user", "0", IMAGE, "-c", "cp -r /models /out/repository && chmod -R a+rX /out")
    assert copy.returncode == 0, copy.stderr
    ports = free_ports(3)
    kserve = ("--http-port", "8080", "--grpc-port", "9000")
    name = podman.start(*_locked_down(*ports, *kserve), "-v", f"{repo}:/mnt/models:ro", IMAGE, "/mnt/models", *kserve)
    try:
        _wait_ready(podman, name, ports[0])
        checked = _check_models(podman, name, ports[0], ports[1], tmp_path)
        assert len(checked) == 12
        # a client that keeps its connection open, as load balancers do
        keep_alive = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        assert keep_alive.is_server_live()
        started = time.monotonic()
        stop = podman.run("stop", "-t", str(GRACE), name, timeout=GRACE + 60)
        took = time.monotonic() - started
        keep_alive.close()
        state = podman.state(name)
        logs = podman.logs(name)
        _say(request, f"podman stop took {took:.1f}s, exit code {state.get('ExitCode')}")
        assert stop.returncode == 0, stop.stderr
        assert took < GRACE, f"the stop took {took:.1f}s, the grace period is {GRACE}s:\n{logs[-3000:]}"
        assert state.get("ExitCode") in (0, 143), logs[-3000:]
        assert "stopped cleanly" in logs
    finally:
        podman.remove(name)


def test_a_too_small_dev_shm_fails_at_start_in_the_container(podman: Podman):
    result = podman.run("run", "--rm", *podman.flags, "--network", "none", "--read-only", "--tmpfs", "/tmp",
                        "--user", "1000", "--cap-drop", "ALL", "--shm-size", "2m", IMAGE, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "/dev/shm has 2.0 MiB free of 2.0 MiB" in output and "needs at least 3.0 MiB" in output
    assert "--shm-size=" in output and "sizeLimit" in output
    assert "tritonserver" not in result.stdout and "serving " not in output  # refused before tritonserver started


def test_serve_fails_at_start_when_dev_shm_is_too_small(tmp_path: Path, request):
    """No podman needed: `unshare -m` (root) mounts a 2 MiB tmpfs over /dev/shm for `gebackend serve` alone."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        _skip(request, "needs root and unshare(1) for a private /dev/shm")
    from gebackend.modelzoo import build_resnet

    model = tmp_path / "repo" / "big"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "ge"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_CPU, count: 2 } ]\n')
    import onnx

    onnx.save(build_resnet(), str(model / "1" / "model.onnx"))
    http, grpc, metrics = free_ports(3)
    script = (f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -m gebackend.cli.main serve "
              f"{tmp_path / 'repo'} --http-port {http} --grpc-port {grpc} --metrics-port {metrics}")
    probe = _run(["unshare", "-m", "--propagation", "private", "true"], 30)
    if probe.returncode != 0:
        _skip(request, f"unshare -m does not work here: {probe.stderr.strip()}")
    result = _run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], 120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "/dev/shm has 1.0 MiB free of 1.0 MiB, but this model repository needs at least 2.0 MiB" in result.stderr
    assert "tritonserver" not in result.stdout and "serving " not in result.stdout  # nothing started
