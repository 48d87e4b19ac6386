"""The in-process ceiling: the same engine and config as a served scenario, called directly, no server.

The scenario's model is loaded as the backend loads it (`runtime.instance.ModelInstance`), one per instance.
`concurrency` client threads each send one request (batch 1), wait for its answer and send the next, as
perf_analyzer's concurrency mode does, taking the requests perf_analyzer sends (its --input-data entries) in turn:
with requests of several lengths (captions, cut by trim_padding) the ceiling runs the mix that is served.
Throughput is the answers received inside the measurement window divided by its length; latency
percentiles are over those answers. (perf_analyzer counts only requests both sent and answered inside a
window, which under-counts when the window is not much longer than a request: give slow models long
windows, `--interval-ms`; the bench notes a level whose window is shorter than 5 x its p50.) When the
config batches, a queue in front of the executors plays Triton's dynamic batcher: each instance's worker
takes every request waiting (up to max_batch_size) and runs them as one batch, with no queue delay. So the
ceiling has what the server has except the server: gRPC, Triton's scheduler, and the Python backend's
shared-memory hop to the stub process. With several instances, each instance runs in a process of its own,
pinned to the cores its served instance would get (the even split of `gebackend.runtime.pinning`, or
`cores_per_instance` each), with its share of the client threads (concurrency 4 over 2 instances: 2 each);
their answers are counted together. That is what the served instances are: separate pinned processes, each
with its own engine thread pools. (Threads of one process would share an engine's process-wide pool, created
on the first instance's cores: measured on the 4-layer CN_CLIP image encoder, served then reached 166-189 %
of such a ceiling, which is why it is no longer measured that way.) The dynamic batcher's shared queue is
the one thing this split does not reproduce: each process batches only its own clients' requests.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from gebackend.bench.perf_analyzer import PerfRow


@dataclass
class _Pending:
    inputs: Mapping[str, np.ndarray]
    done: threading.Event
    error: BaseException | None = None


class _Quiet:
    """An `InstanceLog` that keeps the load's lines to itself (the bench prints its own)."""

    def info(self, message: str) -> None:
        pass

    warn = info


def plan_cpus(instances: int, cores_per_instance: int = 0) -> list[frozenset[int] | None]:
    """The CPU set of each in-process instance: like pinned served instances when there are several
    (`cores_per_instance` each, else the cores divided evenly), unpinned (None) for one instance."""
    if instances <= 1:
        return [None]
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [None] * instances
    k = cores_per_instance or max(1, len(cores) // instances)
    return [frozenset(cores[(i * k + j) % len(cores)] for j in range(k)) for i in range(instances)]


def _pin(cpus) -> None:
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)  # Linux: 0 is the calling thread
        except (AttributeError, OSError):
            pass


def _on_thread(cpus, build):
    box: dict = {}

    def run() -> None:
        _pin(cpus)
        try:
            box["value"] = build()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def split_clients(concurrency: int, instances: int) -> list[int]:
    """Client threads per instance process: `concurrency` spread evenly, the first ones taking the remainder."""
    return [concurrency // instances + (1 if i < concurrency % instances else 0) for i in range(instances)]


class RoundRobin:
    """The requests in turn, from `start`, to any number of client threads (perf_analyzer's --input-data order)."""

    def __init__(self, requests: Sequence[Mapping[str, np.ndarray]], start: int = 0):
        if not requests:
            raise ValueError("no request to send")
        self.requests, self.next, self.lock = list(requests), start % len(requests), threading.Lock()

    def take(self) -> Mapping[str, np.ndarray]:
        with self.lock:
            request = self.requests[self.next]
            self.next = (self.next + 1) % len(self.requests)
        return request


def _instance_process(model_dir: str, cpus, clients: int, requests, start: int, seconds: float, warmup: float,
                      barrier, conn) -> None:
    """One served instance's counterpart: a process pinned to its cores, one executor, its share of the clients
    (taking the requests in turn from `start`)."""
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        ceiling = Ceiling(Path(model_dir), log=lambda m: None, instances=1)
        try:
            ceiling.instances_here[0].execute([requests[start % len(requests)]])  # warm before the others measure
            barrier.wait(timeout=600)
            ceiling.measure(requests, clients, seconds, warmup, start=start)
            conn.send(("ok", ceiling.last_latencies_us.tolist()))
        finally:
            ceiling.close()
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class Ceiling:
    """One scenario's model loaded in this process (several instances: measured in one process each)."""

    def __init__(self, model_dir: Path, log=print, instances: int | None = None):
        from gebackend.config.pbtxt import load_model_config
        from gebackend.runtime.instance import InstanceInfo, ModelInstance, parsed_options

        self.model_dir = Path(model_dir)
        self.config = load_model_config(self.model_dir / "config.pbtxt")
        count = sum(int(g.get("count", 1)) for g in self.config.get("instance_group") or [{"count": 1}])
        self.instances = max(1, count) if instances is None else instances
        self.last_latencies_us = np.zeros(0)
        self.instances_here = []  # the ModelInstance of each instance measured in this process
        name = self.config["name"]
        self.instance_cpus = plan_cpus(self.instances, parsed_options(name, self.config).options.instances.cores_per_instance)
        self.cpu_sets = self.instance_cpus[:1] if self.instances > 1 else self.instance_cpus  # loaded here
        for number, cpus in enumerate(self.cpu_sets):
            # Build each instance on a thread pinned like the served instance's process, so the engine's thread
            # pool (created now, inheriting the affinity) runs on the same cores as when served; the load itself
            # pins nothing.
            self.instances_here.append(_on_thread(cpus, lambda: ModelInstance.load(
                self.config, self.model_dir / "1", InstanceInfo(f"{name}_0_{number}"), _Quiet(), pin=False)))
        self.spec, self.how = self.instances_here[0].spec, self.instances_here[0].how
        self.batching = self.spec.batching and "dynamic_batching" in self.config
        self.max_batch = max(1, self.spec.max_batch_size) if self.batching else 1
        where = f"{self.instances} pinned processes" if self.instances > 1 else "this process"
        log(f"bench:   ceiling: {self.instances} instance(s) in {where}, {self.how}")

    def run_once(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.instances_here[0].execute([feeds])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def measure(self, requests: Sequence[Mapping[str, np.ndarray]], concurrency: int, seconds: float, warmup: float,
                start: int = 0) -> PerfRow:
        """`concurrency` clients sending `requests` (one request's feeds each, batch 1) in turn from `start`, as
        perf_analyzer sends its --input-data entries, for `seconds` after `warmup`."""
        if self.instances > 1:
            return self._measure_in_processes(requests, concurrency, seconds, warmup)
        turns = RoundRobin(requests, start)
        waiting: queue.Queue = queue.Queue()
        stop = threading.Event()
        latencies: list[float] = []
        window = {"start": float("inf"), "end": float("inf")}
        errors: list[BaseException] = []

        def worker(instance, cpus) -> None:
            _pin(cpus)
            while not stop.is_set():
                try:
                    first = waiting.get(timeout=0.05)
                except queue.Empty:
                    continue
                batch = [first]
                while len(batch) < self.max_batch:
                    try:
                        batch.append(waiting.get_nowait())
                    except queue.Empty:
                        break
                try:
                    results = instance.execute([p.inputs for p in batch])
                except BaseException as exc:  # noqa: BLE001 - reported below
                    results = [exc] * len(batch)
                for pending, result in zip(batch, results):
                    if isinstance(result, BaseException):
                        pending.error = result
                    pending.done.set()

        def client() -> None:
            while not stop.is_set():
                pending = _Pending(turns.take(), threading.Event())
                sent = time.perf_counter()
                waiting.put(pending)
                while not pending.done.wait(0.1):
                    if stop.is_set():
                        return
                answered = time.perf_counter()
                if pending.error is not None:
                    errors.append(pending.error)
                    stop.set()
                    return
                if window["start"] <= answered <= window["end"]:
                    latencies.append(answered - sent)  # every answer inside the window counts (unbiased rate)

        threads = [threading.Thread(target=worker, args=(i, c), daemon=True) for i, c in zip(self.instances_here, self.cpu_sets)]
        threads += [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
        for t in threads:
            t.start()
        time.sleep(warmup)
        window["start"] = time.perf_counter()
        window["end"] = window["start"] + seconds
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if errors:
            raise RuntimeError(f"in-process run failed: {errors[0]}")
        self.last_latencies_us = np.asarray(latencies) * 1e6
        return _row(concurrency, self.last_latencies_us, seconds)

    def _measure_in_processes(self, requests, concurrency: int, seconds: float, warmup: float) -> PerfRow:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        shares = [(cpus, n) for cpus, n in zip(self.instance_cpus, split_clients(concurrency, self.instances)) if n]
        barrier = context.Barrier(len(shares))
        children = []
        requests = [dict(r) for r in requests]
        for number, (cpus, clients) in enumerate(shares):
            receive, send = context.Pipe(duplex=False)
            start = number * len(requests) // len(shares)  # each process from its own place in the requests
            process = context.Process(target=_instance_process, daemon=True,
                                      args=(str(self.model_dir), cpus, clients, requests, start, seconds, warmup,
                                            barrier, send))
            process.start()
            send.close()
            children.append((process, receive))
        latencies, errors = [], []
        for process, receive in children:
            try:
                status, payload = receive.recv() if receive.poll(900 + seconds) else ("error", "no answer in time")
            except EOFError:
                status, payload = "error", f"instance process exited with code {process.exitcode}"
            (latencies.extend if status == "ok" else errors.append)(payload)
            process.join(30)
            if process.is_alive():
                process.kill()
        if errors:
            raise RuntimeError(f"in-process run failed: {errors[0]}")
        self.last_latencies_us = np.asarray(latencies)
        return _row(concurrency, self.last_latencies_us, seconds)

    def close(self) -> None:
        for instance in self.instances_here:
            instance.close()
        self.instances_here = []


def _row(concurrency: int, lat_us: np.ndarray, seconds: float) -> PerfRow:
    if lat_us.size == 0:
        raise RuntimeError("in-process run completed no request in the measurement window")
    pct = lambda q: float(np.percentile(lat_us, q))  # noqa: E731
    return PerfRow(concurrency=concurrency, throughput=lat_us.size / seconds, p50_us=pct(50), p90_us=pct(90),
                   p95_us=pct(95), p99_us=pct(99), avg_us=float(lat_us.mean()))


def median_seconds(run, seconds: float, least: int = 3) -> float:
    """The median seconds of `run()` called back to back for about `seconds` (at least `least` calls; no warm-up:
    the caller runs it once first)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < least:
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def accuracy(ceiling: Ceiling, model_path: Path, feeds: Mapping[str, np.ndarray]) -> dict:
    """Cosine similarity and max-abs-diff of the scenario's outputs to a plain fp32 onnxruntime session, on a batch
    of requests (`feeds`: one request per row where the model batches)."""
    if ceiling.spec.max_batch_size > 0:  # one request per row of the batch
        requests = [{k: v[i:i + 1] for k, v in feeds.items()} for i in range(next(iter(feeds.values())).shape[0])]
    else:  # a model without batching: the feeds are one request
        requests = [dict(feeds)]
    return accuracy_on(ceiling, model_path, requests)


def accuracy_on(ceiling: Ceiling, model_path: Path, requests: Sequence[Mapping[str, np.ndarray]]) -> dict:
    """`accuracy` over `requests` (each one request's feeds, of any shapes the model takes), run by the scenario's
    instance as one execute and by the fp32 session one by one."""
    from gebackend.compile import bfloat16
    from gebackend.compile.ort_session import open_session

    session = open_session(model_path, None)  # onnxruntime's defaults, errors only in the log
    names = [o.name for o in session.get_outputs()]
    # bfloat16 tensors: through OrtValues
    reference = [dict(zip(names, bfloat16.run(session, names, dict(request)))) for request in requests]
    got = ceiling.instances_here[0].execute([dict(request) for request in requests])
    worst_cos, worst_diff = 1.0, 0.0
    for name in names:
        if any(isinstance(r, BaseException) for r in got):
            raise next(r for r in got if isinstance(r, BaseException))
        ours = np.concatenate([np.asarray(r[name]).ravel() for r in got]).astype(np.float64)
        ref = np.concatenate([np.asarray(r[name]).ravel() for r in reference]).astype(np.float64)
        denom = np.linalg.norm(ours) * np.linalg.norm(ref)
        cos = float(ours @ ref / denom) if denom else float(np.array_equal(ours, ref))
        worst_cos = min(worst_cos, cos)
        worst_diff = max(worst_diff, float(np.max(np.abs(ours - ref))) if ours.size else 0.0)
    return {"cosine": worst_cos, "max_abs_diff": worst_diff}
