"""Simulated scale-out: N `gebackend serve` replicas on loopback behind a round-robin proxy, bounded in time.

Each replica serves one example model (default resnet_ge) pinned with taskset to its own core (replica i gets
core i mod the cores here), as a pod with a 1-core limit and the static CPU manager would be. A round-robin proxy
(bench/round_robin_proxy.py: HAProxy, or an aiohttp one; loopback only) spreads requests over the replicas, as a
Kubernetes Service does per connection. For each N:

1. saturation: a closed loop of 4N clients for `--saturate` seconds: throughput (infer/s) and latency;
2. a rate step: an open loop at a fixed request rate, `--seconds` long, stepping from 50% to 150% of what ONE
   replica sustained in phase 1 half-way: one replica saturates and its queue grows, N=2 absorbs it (p99 per
   second and per phase).

Writes scale_out.json and scale_out.png into --out, and prints markdown tables.

    .venv/bin/python bench/scale_out.py [--replicas 1,2] [--model resnet_ge] [--seconds 20] [--saturate 8]

Every request goes to 127.0.0.1; every loop is bounded in time and in outstanding requests (--max-outstanding);
every server is stopped with SIGTERM at the end. The load generator and the proxy share the machine's cores with
the replicas: on 2 cores they cost the replicas part of their capacity (said in the output with the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from deploy_facts import wait_quiet  # this folder: run as `python bench/scale_out.py`
from round_robin_proxy import start_proxy

from gebackend import cpu
from gebackend.files import link_or_copy
from gebackend.server.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "model_repository"


# -- replicas -----------------------------------------------------------------------------------------------------
class Replica:
    def __init__(self, repo: Path, cpu: int, log: Path):
        self.port, grpc, metrics = free_ports(3)
        cmd = ["taskset", "-c", str(cpu), sys.executable, "-m", "gebackend.cli.main", "serve", str(repo),
               "--http-port", str(self.port), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
               "--", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
        self.log = log
        self.process = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "gebackend: ready" in self.log.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"replica exited:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"replica not ready within {timeout}s")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def request_body(model: str, repo: Path, batch: int = 1, seq: int = 16) -> tuple[bytes, dict[str, str]]:
    """One binary KServe v2 request of `batch` samples (free dims: `seq`) for `model`, with its headers."""
    import onnx
    import tritonclient.http as httpclient

    graph = onnx.load(str(repo / model / "1" / "model.onnx"), load_external_data=False).graph
    rng = np.random.default_rng(0)
    inputs = []
    for value in graph.input:
        dims = [d.dim_value if d.dim_value > 0 else (batch if i == 0 else seq)
                for i, d in enumerate(value.type.tensor_type.shape.dim)]
        if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            data, wire = rng.standard_normal(dims).astype(np.float32), "FP32"
        else:
            data, wire = np.ones(dims, np.int64), "INT64"
        item = httpclient.InferInput(value.name, dims, wire)
        item.set_data_from_numpy(data, binary_data=True)
        inputs.append(item)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs)
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    return body, headers


# -- load ---------------------------------------------------------------------------------------------------------
async def closed_loop(url: str, body: bytes, headers: dict, clients: int, seconds: float) -> dict:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    latencies, errors = [], 0
    deadline = time.monotonic() + seconds

    async def client(session) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        latencies.append(time.perf_counter() - start)
                    else:
                        errors += 1
            except Exception:  # noqa: BLE001 - counted
                errors += 1

    async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=30)) as session:
        started = time.monotonic()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        took = time.monotonic() - started
    return {"clients": clients, "seconds": round(took, 2), "ok": len(latencies), "errors": errors,
            "infer_per_s": round(len(latencies) / took, 1), **_percentiles(latencies)}


async def rate_trace(url: str, body: bytes, headers: dict, phases: list[tuple[float, float]],
                     max_outstanding: int) -> dict:
    """Open loop: `phases` of (requests/s, seconds) back to back; returns per-phase and per-second results."""
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    records: list[tuple[float, float | None]] = []  # (send time from start, latency or None for an error)
    dropped = 0
    outstanding = 0
    tasks = set()

    async def one(session, sent: float) -> None:
        nonlocal outstanding
        start = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                records.append((sent, time.perf_counter() - start if response.status == 200 else None))
        except Exception:  # noqa: BLE001 - counted as an error
            records.append((sent, None))
        finally:
            outstanding -= 1

    async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=15)) as session:
        t0 = time.perf_counter()
        next_at = 0.0
        boundaries = []
        for rate, seconds in phases:
            end = next_at + seconds
            boundaries.append((next_at, end, rate))
            while next_at < end:
                delay = t0 + next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if outstanding >= max_outstanding:
                    dropped += 1
                else:
                    outstanding += 1
                    task = asyncio.create_task(one(session, next_at))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                next_at += 1.0 / rate
        if tasks:
            await asyncio.wait(tasks, timeout=20)
    phases_out = []
    for start, end, rate in boundaries:
        mine = [lat for sent, lat in records if start <= sent < end]
        ok = [lat for lat in mine if lat is not None]
        phases_out.append({"rate": round(rate, 1), "seconds": round(end - start, 1), "sent": len(mine), "ok": len(ok),
                           "errors": len(mine) - len(ok), "answered_per_s": round(len(ok) / (end - start), 1),
                           **_percentiles(ok)})
    total = boundaries[-1][1]
    per_second = []
    for second in range(int(total)):
        ok = [lat for sent, lat in records if second <= sent < second + 1 and lat is not None]
        per_second.append({"t": second, "ok": len(ok), **_percentiles(ok)})
    return {"phases": phases_out, "dropped": dropped, "per_second": per_second}


def _percentiles(latencies: list[float]) -> dict:
    if not latencies:
        return {"p50_ms": None, "p99_ms": None}
    ms = np.array(latencies) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


# -- the run ------------------------------------------------------------------------------------------------------
def rounds_of(runs: list[dict]) -> list[list[dict]]:
    """`--replicas 1,2,1,2` measures two rounds: a round ends where the replica count stops growing."""
    rounds: list[list[dict]] = []
    for run in runs:
        if not rounds or run["replicas"] <= rounds[-1][-1]["replicas"]:
            rounds.append([])
        rounds[-1].append(run)
    return rounds


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    rounds = rounds_of(runs)
    for number, group in enumerate(rounds, 1):
        ns = [r["replicas"] for r in group]
        tput = [r["saturation"]["infer_per_s"] for r in group]
        line, = left.plot(ns, tput, "o-", label=f"round {number}" if len(rounds) > 1 else "measured")
        left.plot(ns, [tput[0] / ns[0] * n for n in ns], "--", color=line.get_color(), alpha=0.5,
                  label="linear from its first N" if number == 1 else None)
    left.set_xlabel("replicas (1 core each)")
    left.set_ylabel(f"requests/s (batch {result['batch']}, saturated)")
    left.set_xticks(sorted({r["replicas"] for r in runs}))
    left.set_title(f"{result['model']}: throughput vs replicas")
    left.legend()
    for number, group in enumerate(rounds, 1):
        for run in group:
            seconds = run["step"]["per_second"]
            right.plot([s["t"] for s in seconds], [s["p99_ms"] for s in seconds], "o-", markersize=3,
                       label=f"N={run['replicas']}" + (f", round {number}" if len(rounds) > 1 else ""))
    step_at = result["phases"][0][1]
    right.axvline(step_at, color="grey", linestyle=":")
    right.text(step_at, 0.03, f" offered {result['phases'][0][0]:.0f} -> {result['phases'][1][0]:.0f} req/s",
               color="grey", transform=right.get_xaxis_transform())
    right.set_yscale("log")
    right.set_xlabel("seconds")
    right.set_ylabel("p99 latency per second (ms, log)")
    right.set_title("p99 under a rate step")
    right.legend()
    fig.suptitle(f"{result['cpu']}, {result['cores']} cores, proxy {result['proxy']}, "
                 f"load average {result['load_average_start'][0]:.1f}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default=None, help="comma list (default: 1..cores)")
    parser.add_argument("--model", default="resnet_ge", choices=sorted(p.parent.name for p in EXAMPLES.glob("*/config.pbtxt")))
    parser.add_argument("--onnx", type=Path, metavar="FILE",
                        help="serve this ONNX file (named after its folder, resnet_ge's config: auto-complete fills "
                             "in the rest) instead of an example model; one whose requests take long next to the load "
                             "generator's and the proxy's cost, e.g. bench/models/resnet50/model.onnx, shows the "
                             "scale-out where the load generator shares the replicas' cores")
    parser.add_argument("--batch", type=int, default=8,
                        help="samples a request (8: a replica's work per request outweighs the load generator's)")
    parser.add_argument("--seq", type=int, default=16, help="sequence length of bert_ge requests")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the rate step trace")
    parser.add_argument("--saturate", type=float, default=8.0, help="length of each saturation loop")
    parser.add_argument("--max-outstanding", type=int, default=256)
    parser.add_argument("--proxy-kind", choices=("auto", "haproxy", "aiohttp"), default="auto",
                        help="auto: HAProxy where installed (apt-get install haproxy), else the aiohttp proxy")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale-out")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                        help="first wait up to S seconds for the 1-minute load average to drop below 0.8 (a shared machine)")
    args = parser.parse_args()
    from gebackend.modelzoo import EXAMPLE_MODELS

    import onnx

    quiet = wait_quiet(args.wait_quiet)
    cores = len(os.sched_getaffinity(0))
    counts = [int(n) for n in args.replicas.split(",")] if args.replicas else list(range(1, cores + 1))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scale-out-"))
    repo = work / "repo"
    if args.onnx:
        args.model = args.onnx.resolve().parent.name
    folder = repo / args.model
    (folder / "1").mkdir(parents=True)
    if args.onnx:
        config = (EXAMPLES / "resnet_ge" / "config.pbtxt").read_text().replace('"resnet_ge"', f'"{args.model}"')
        (folder / "config.pbtxt").write_text(config)
        link_or_copy(args.onnx, folder / "1" / "model.onnx")
    else:
        shutil.copy(EXAMPLES / args.model / "config.pbtxt", folder / "config.pbtxt")
        onnx.save(EXAMPLE_MODELS[args.model](), str(folder / "1" / "model.onnx"))
    body, headers = request_body(args.model, repo, args.batch, args.seq)
    kind = args.proxy_kind if args.proxy_kind != "auto" else ("haproxy" if shutil.which("haproxy") else "aiohttp")
    result = {"cpu": cpu.describe(), "cores": cores, "model": args.model, "onnx": str(args.onnx or ""), "batch": args.batch, "seq": args.seq, "proxy": kind,
              "load_average_start": os.getloadavg(), "load_when_started": quiet, "runs": []}
    path = f"/v2/models/{args.model}/infer"
    try:
        for n in counts:
            replicas = [Replica(repo, i % cores, args.out / f"replica-{n}-{i}.log") for i in range(n)]
            proxy_port, = free_ports(1)
            proxy = start_proxy(result["proxy"], proxy_port, [f"http://127.0.0.1:{r.port}" for r in replicas], work)
            try:
                for replica in replicas:
                    replica.wait_ready()
                url = f"http://127.0.0.1:{proxy_port}{path}"
                _wait_proxy(proxy_port)
                asyncio.run(closed_loop(url, body, headers, 2 * n, 1.0))  # warm-up
                saturation = asyncio.run(closed_loop(url, body, headers, 4 * n, args.saturate))
                if not result.get("phases"):  # the step is sized from ONE replica's capacity
                    one = saturation["infer_per_s"] / n
                    result["phases"] = [(0.5 * one, args.seconds / 2), (1.5 * one, args.seconds / 2)]
                step = asyncio.run(rate_trace(url, body, headers, [tuple(p) for p in result["phases"]], args.max_outstanding))
                result["runs"].append({"replicas": n, "saturation": saturation, "step": step})
                print(f"N={n}: saturated {saturation['infer_per_s']} infer/s (p99 {saturation['p99_ms']} ms); step "
                      + ", ".join(f"{p['rate']} req/s: p99 {p['p99_ms']} ms, {p['errors']} errors" for p in step["phases"]),
                      flush=True)
            finally:
                proxy.send_signal(signal.SIGTERM)
                proxy.wait(timeout=30)
                for replica in replicas:
                    replica.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()
    (args.out / "scale_out.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "scale_out.png")
    print(f"\nproxy: {kind}; {result['cpu']}, {cores} cores, load average {result['load_average_start'][0]:.2f} -> "
          f"{result['load_average_end'][0]:.2f}\n")
    print(f"| round | replicas | saturated requests/s (batch {args.batch}) | samples/s | p50 | p99 | x its round's first |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for number, group in enumerate(rounds_of(result["runs"]), 1):
        base = group[0]["saturation"]["infer_per_s"] or 1
        for run in group:
            s = run["saturation"]
            print(f"| {number} | {run['replicas']} | {s['infer_per_s']} | {s['infer_per_s'] * args.batch:.0f} | "
                  f"{s['p50_ms']} ms | {s['p99_ms']} ms | {s['infer_per_s'] / base:.2f} |")
    print("\n| replicas | offered req/s | answered/s | p50 | p99 | errors | dropped |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in result["runs"]:
        for phase in run["step"]["phases"]:
            print(f"| {run['replicas']} | {phase['rate']} | {phase['answered_per_s']} | {phase['p50_ms']} ms | "
                  f"{phase['p99_ms']} ms | {phase['errors']} | {run['step']['dropped']} |")
    print(f"\nwrote {args.out / 'scale_out.json'} and {args.out / 'scale_out.png'}")
    return 0


def _wait_proxy(port: int, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the proxy did not answer")


if __name__ == "__main__":
    sys.exit(main())
