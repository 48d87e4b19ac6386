"""What docs/deploy.md's sizing rests on, measured on this machine for the example models (loopback only, bounded).

1. Load: the example repository plus heavier variants of the same models (static shape buckets with int8 lowering,
   the bf16/OpenVINO path where OpenVINO is installed) are served by one `gebackend serve`; each model's load time
   (from the backend's "loaded ... in Xs" line) and the time from the CLI's start to HTTP ready.
2. Memory: the RSS of every process (the CLI, tritonserver, one stub per instance) after load and after traffic,
   and the /dev/shm regions of this server (allocated bytes) after a burst of largest-batch requests.
3. Throughput per core: `gebackend serve` of resnet_ge and bert_ge alone, pinned with taskset to 1 core and then
   to every core, a closed loop of tritonclient HTTP requests (batch 1, `--concurrency` clients) for `--seconds`.

    .venv/bin/python bench/deploy_facts.py [--seconds 8] [--concurrency 2] [--out bench/results/deploy-facts]

Writes facts.json into --out and prints markdown tables. Each server is stopped with SIGTERM when done.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient

from gebackend import cpu
from gebackend.server.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "model_repository"
LOADED = re.compile(r"model '([^']+)' instance '([^']+)' loaded (\S+) in ([0-9.]+)s")


def params(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())


VARIANTS = {
    # static buckets + int8 lowering (dynamic quantization) + the accuracy check at load
    "bert_ge_static_int8": ("bert_ge", 'backend: "ge"\nmax_batch_size: 4\n' + params(
        static_model="1", precision_mode="int8", bucket_paddable_dims="sequence",
        **{"graph.ge.inputShape": "input_ids:-1,-1;attention_mask:-1,-1",
           "graph.ge.dynamicDims": "1,16,1,16;4,16,4,16;4,32,4,32;4,128,4,128"})),
    "resnet_ge_static_int8": ("resnet_ge", 'backend: "ge"\nmax_batch_size: 8\n' + params(static_model="1", precision_mode="int8")),
    "resnet_ge_openvino_bf16": ("resnet_ge", 'backend: "ge"\nmax_batch_size: 8\n' + params(
        engine="openvino", static_model="1", precision_mode="bf16")),
}


def build_repository(folder: Path, names: list[str], variants: bool) -> Path:
    from gebackend.modelzoo import EXAMPLE_MODELS

    import onnx

    repo = folder / "repo"
    for name in names:
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / name / "config.pbtxt", repo / name / "config.pbtxt")
        onnx.save(EXAMPLE_MODELS[name](), str(repo / name / "1" / "model.onnx"))
    if variants:
        for name, (source, config) in VARIANTS.items():
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(config)
            onnx.save(EXAMPLE_MODELS[source](), str(repo / name / "1" / "model.onnx"))
    return repo


class Server:
    def __init__(self, repo: Path, log: Path, cpus: str | None = None):
        self.ports = free_ports(3)
        cmd = [sys.executable, "-m", "gebackend.cli.main", "serve", str(repo), "--http-port", str(self.ports[0]),
               "--grpc-port", str(self.ports[1]), "--metrics-port", str(self.ports[2]),
               "--", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        self.log = log
        self.started = time.monotonic()
        self.process = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.ready_s = None

    def wait_ready(self, timeout: float = 300) -> float:
        while time.monotonic() - self.started < timeout:
            if "gebackend: ready" in self.log.read_text(errors="replace"):
                self.ready_s = time.monotonic() - self.started
                return self.ready_s
            if self.process.poll() is not None:
                raise RuntimeError(f"gebackend serve exited:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError("not ready in time")

    def load_times(self) -> dict[str, float]:
        times: dict[str, float] = {}
        for model, _instance, _file, seconds in LOADED.findall(self.log.read_text(errors="replace")):
            times[model] = max(times.get(model, 0.0), float(seconds))
        return times

    def processes(self) -> dict[str, dict]:
        """RSS (MiB) of the CLI, tritonserver and each stub (named by its instance)."""
        found = {}
        try:
            cli = psutil.Process(self.process.pid)
        except psutil.NoSuchProcess:
            return found
        for proc in [cli, *cli.children(recursive=True)]:
            try:
                cmdline = proc.cmdline()
                rss = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
            if proc.pid == cli.pid:
                name = "gebackend serve (CLI)"
            elif cmdline and cmdline[0].endswith("tritonserver"):
                name = "tritonserver"
            elif cmdline and cmdline[0].endswith("triton_python_backend_stub") and len(cmdline) > 8:
                name = f"stub {cmdline[8]}"
            else:
                name = " ".join(cmdline[:1])
            found[name] = {"pid": proc.pid, "rss_mib": round(rss, 1)}
        return found

    def shm_regions(self) -> dict[str, int]:
        prefix = f"gebackend{self.process.pid}x"
        return {p.name: p.stat().st_blocks * 512 for p in Path("/dev/shm").glob(f"{prefix}*")}

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=90)


def feeds_for(client, model: str, batch: int, rng, seq: int = 16) -> list:
    metadata = client.get_model_metadata(model)
    inputs = []
    for tensor in metadata["inputs"]:
        shape = [batch if i == 0 else (seq if d == -1 else d) for i, d in enumerate(int(x) for x in tensor["shape"])]
        dtype = np.float32 if tensor["datatype"] == "FP32" else np.int64
        data = rng.standard_normal(shape).astype(dtype) if dtype == np.float32 else np.ones(shape, dtype)
        item = httpclient.InferInput(tensor["name"], shape, tensor["datatype"])
        item.set_data_from_numpy(data, binary_data=True)
        inputs.append(item)
    return inputs


def closed_loop(port: int, model: str, seconds: float, concurrency: int, batch: int = 1, seq: int = 16) -> dict:
    """`concurrency` clients, each sending the next request when the last is answered, for `seconds`."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(seed: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        inputs = feeds_for(client, model, batch, np.random.default_rng(seed), seq)
        mine = []
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                client.infer(model, inputs)
                mine.append(time.perf_counter() - start)
            except Exception:  # noqa: BLE001 - counted
                with lock:
                    errors[0] += 1
        client.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    ms = np.array(latencies) * 1000 if latencies else np.array([0.0])
    return {"model": model, "batch": batch, "concurrency": concurrency, "seconds": round(took, 2),
            "requests": len(latencies), "errors": errors[0], "infer_per_s": round(len(latencies) / took, 1),
            "samples_per_s": round(len(latencies) * batch / took, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def wait_quiet(limit: float, threshold: float = 0.8) -> float:
    """Wait (at most `limit` s) until the 1-minute load average is below `threshold`; returns the load then."""
    deadline = time.monotonic() + limit
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each throughput loop (bounded)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "deploy-facts")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                        help="first wait up to S seconds for the 1-minute load average to drop below 0.8 (a shared machine)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    quiet = wait_quiet(args.wait_quiet)
    cores = len(os.sched_getaffinity(0))
    facts: dict = {"cpu": cpu.describe(), "cores": cores, "load_average_start": os.getloadavg(), "load_when_started": quiet}
    work = Path(tempfile.mkdtemp(prefix="deploy-facts-"))
    try:
        # 1 + 2: load and memory, every example and its heavier variants on one server
        repo = build_repository(work / "all", sorted(p.parent.name for p in EXAMPLES.glob("*/config.pbtxt")), True)
        server = Server(repo, args.out / "serve-all.log")
        try:
            facts["ready_s"] = round(server.wait_ready(), 2)
            facts["load_s"] = server.load_times()
            facts["rss_after_load"] = server.processes()
            facts["shm_after_load"] = server.shm_regions()
            # largest batches on every model, twice each, then memory again
            client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports[0]}", network_timeout=60)
            rng = np.random.default_rng(0)
            for model in sorted(p.name for p in repo.iterdir()):
                config = client.get_model_config(model)
                batch = int(config.get("max_batch_size") or 1)
                seq = 128 if model.startswith("bert") else 16
                for _ in range(2):
                    client.infer(model, feeds_for(client, model, batch, rng, seq))
            client.close()
            facts["traffic_largest_batch"] = [closed_loop(server.ports[0], m, args.seconds / 2, args.concurrency,
                                                          batch=8, seq=128 if m.startswith("bert") else 16)
                                              for m in ("resnet_ge", "bert_ge")]
            facts["rss_after_traffic"] = server.processes()
            facts["shm_after_traffic"] = server.shm_regions()
        finally:
            facts["stop_code_all"] = server.stop()
        # 3: per-core throughput of resnet_ge and bert_ge, served alone
        facts["throughput"] = []
        for model in ("resnet_ge", "bert_ge"):
            repo = build_repository(work / model, [model], False)
            for cpus in ["0", f"0-{cores - 1}"] if cores > 1 else ["0"]:
                server = Server(repo, args.out / f"serve-{model}-{cpus}.log", cpus=cpus)
                try:
                    server.wait_ready()
                    closed_loop(server.ports[0], model, 1.0, args.concurrency)  # warm-up
                    result = closed_loop(server.ports[0], model, args.seconds, args.concurrency)
                    result["cores"] = len(range(int(cpus.split("-")[0]), int(cpus.split("-")[-1]) + 1))
                    result["rss_mib"] = {k: v["rss_mib"] for k, v in server.processes().items()}
                    facts["throughput"].append(result)
                finally:
                    server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts["load_average_end"] = os.getloadavg()
    (args.out / "facts.json").write_text(json.dumps(facts, indent=1))
    print(f"CPU: {facts['cpu']}, {cores} cores; load average {facts['load_average_start']} -> {facts['load_average_end']}")
    print(f"\nready {facts['ready_s']} s after the CLI started (all models)\n\n| model | load |\n| --- | ---: |")
    for model, seconds in sorted(facts["load_s"].items()):
        print(f"| {model} | {seconds:.2f} s |")
    print("\n| process | RSS after load | after traffic |\n| --- | ---: | ---: |")
    for name, value in facts["rss_after_load"].items():
        after = facts["rss_after_traffic"].get(name, {}).get("rss_mib", "-")
        print(f"| {name} | {value['rss_mib']} MiB | {after} MiB |")
    shm_load = sum(facts["shm_after_load"].values()) / 2**20
    shm_traffic = sum(facts["shm_after_traffic"].values()) / 2**20
    print(f"\n/dev/shm: {len(facts['shm_after_load'])} regions, {shm_load:.1f} MiB after load, {shm_traffic:.1f} MiB after traffic")
    print("\n| model | cores | infer/s (batch 1) | p50 | p99 | errors |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in facts["throughput"]:
        print(f"| {row['model']} | {row['cores']} | {row['infer_per_s']} | {row['p50_ms']} ms | {row['p99_ms']} ms | {row['errors']} |")
    for row in facts["traffic_largest_batch"]:
        print(f"largest batch {row['model']}: {row['samples_per_s']} samples/s at batch {row['batch']} (p99 {row['p99_ms']} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
