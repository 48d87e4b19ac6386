"""`gebackend bench --soak MINUTES`: hold saturating load on a static and a bucketed model, and watch for failed
requests and memory growth in every process of the server.

One `gebackend serve` serves two models side by side (`SOAK_MODELS`): a static graph (one bucket, every batch
padded to it) and a bucketed one (buckets 1/2/4/8 + dynamic batching). One perf_analyzer per model keeps
`concurrency` requests in flight for the whole soak, run after run (windows of `window_ms`). A sampler reads,
every `sample_s` seconds, the RSS of the CLI, of tritonserver and of each instance's stub process, and
Triton's own request counters (`nv_inference_request_success` / `_failure` on the metrics port), which count
every request, also those between two perf_analyzer runs.

Memory growth is measured from the end of a warm-up (the first `warmup_fraction` of the soak, at most
`warmup_max_s`: arenas and caches fill as batch sizes vary) to the end; the target is no failed request, no
stub restarted, and less than `max_growth` growth in every process.

Writes under `<out>/soak-<timestamp>/`: soak.json, soak.md, soak_rss.png, soak_throughput.png, the perf CSVs
and logs of each run under perf/, and the server's log.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, Sequence

from gebackend.bench import perf_analyzer, scenarios, server
from gebackend.bench.soak_report import markdown, plot
from gebackend.modelzoo.bench_models import DEFAULT_CACHE, models as known_models
from gebackend.server.stubs import stub_identity

# (model, how it is served): the static graph pads every batch to 4; the bucketed one batches to 1/2/4/8.
SOAK_MODELS: tuple[tuple[str, scenarios.Scenario], ...] = (
    ("resnet_small", replace(scenarios.SCENARIOS["ge_static"], name="soak_static", buckets=(4,),
                             title="static graph, one bucket (batch 4)")),
    ("bert_small", replace(scenarios.SCENARIOS["ge_batching"], name="soak_buckets",
                           title="static buckets 1/2/4/8 + dynamic batching")),
)


@dataclass
class SoakSettings:
    minutes: float
    concurrency: int = 2  # requests in flight per model (two models: 4 on the machine)
    window_ms: int = 10_000  # perf_analyzer --measurement-interval; each run is 3 windows
    sample_s: float = 5.0
    warmup_fraction: float = 0.2
    warmup_max_s: float = 60.0
    max_growth: float = 0.05
    protocol: str = "grpc"
    out: Path = Path("bench/results")
    cache: Path = DEFAULT_CACHE

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @property
    def warmup_s(self) -> float:
        return min(self.warmup_max_s, self.warmup_fraction * self.seconds)


# ------------------------------------------------------------------------------------------ pure logic
_SAMPLE = re.compile(r'^(nv_inference_request_(?:success|failure))\{([^}]*)\}\s+([0-9.eE+-]+)$', re.M)
_MODEL_LABEL = re.compile(r'model="([^"]*)"')


def request_counts(metrics_text: str) -> dict[str, dict[str, float]]:
    """Triton's Prometheus text -> {model: {"success": n, "failure": n}} (failure summed over its reasons)."""
    counts: dict[str, dict[str, float]] = {}
    for name, labels, value in _SAMPLE.findall(metrics_text):
        model = _MODEL_LABEL.search(labels)
        if model is None:
            continue
        entry = counts.setdefault(model.group(1), {"success": 0.0, "failure": 0.0})
        entry[name.rsplit("_", 1)[1]] += float(value)
    return counts


def increase(values: Sequence[float]) -> float:
    """How much a counter grew over successive samples, as Prometheus' increase() counts it: a drop means the
    counter started again from 0 (Triton's counters restart when a model is reloaded)."""
    total = 0.0
    for before, after in zip(values, values[1:]):
        total += after - before if after >= before else after
    return total


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def memory_growth(series: Sequence[tuple[float, float]], warmup_s: float, window: int = 3) -> dict:
    """RSS samples [(seconds since start, MiB)] -> start, after warm-up, end (each the mean of `window` samples),
    growth after warm-up as a fraction, and the least-squares slope after warm-up in MiB per minute."""
    if not series:
        return {}
    after = [(t, v) for t, v in series if t >= warmup_s] or list(series[-1:])
    baseline = _mean([v for _, v in after[:window]])
    end = _mean([v for _, v in after[-window:]])
    slope = 0.0
    if len(after) >= 2:
        mt, mv = _mean([t for t, _ in after]), _mean([v for _, v in after])
        var = sum((t - mt) ** 2 for t, _ in after)
        slope = sum((t - mt) * (v - mv) for t, v in after) / var * 60.0 if var else 0.0
    return {"start_mib": round(series[0][1], 1), "baseline_mib": round(baseline, 1), "end_mib": round(end, 1),
            "peak_mib": round(max(v for _, v in series), 1), "growth": round((end - baseline) / baseline, 4) if baseline else 0.0,
            "slope_mib_per_min": round(slope, 3), "samples_after_warmup": len(after)}


def problems(result: Mapping, max_growth: float) -> list[str]:
    """What kept the soak from its target: failed requests, failed perf_analyzer runs, restarts, memory growth."""
    found = []
    for model, entry in result.get("models", {}).items():
        if entry.get("failed", 0):
            found.append(f"{model}: {entry['failed']:.0f} failed request(s)")
        if not entry.get("succeeded", 0):
            found.append(f"{model}: no request succeeded")
        for error in entry.get("errors", []):
            found.append(f"{model}: perf_analyzer: {error}")
    for name, proc in result.get("processes", {}).items():
        growth = proc.get("memory", {}).get("growth", 0.0)
        if growth >= max_growth:
            found.append(f"{name}: RSS grew {growth:.1%} after warm-up (limit {max_growth:.0%})")
        if proc.get("restarts", 0):
            found.append(f"{name}: its process was replaced {proc['restarts']} time(s)")
    return found


# ------------------------------------------------------------------------------------------- sampling
def server_processes(cli_pid: int) -> dict[str, "object"]:
    """{"gebackend serve": CLI, "tritonserver": ..., "stub <instance>": ...} as psutil processes."""
    import psutil

    found = {}
    try:
        cli = psutil.Process(cli_pid)
        found["gebackend serve"] = cli
        for child in cli.children():
            if child.name() != "tritonserver":
                continue
            found["tritonserver"] = child
            for stub in child.children():
                try:
                    argv = stub.cmdline()
                except psutil.Error:
                    continue
                served = stub_identity(argv)
                if served is not None and served[0] != served[1]:  # not the short-lived auto-complete stub
                    found[f"stub {served[1]}"] = stub
    except psutil.Error:
        pass
    return found


class Sampler:
    """Every `interval` seconds: RSS (MiB) of each server process and Triton's request counters."""

    def __init__(self, cli_pid: int, metrics_url: str, interval: float, t0: float):
        self.cli_pid, self.metrics_url, self.interval, self.t0 = cli_pid, metrics_url, interval, t0
        self.rss: dict[str, list[tuple[float, float]]] = {}
        self.pids: dict[str, list[int]] = {}
        self.counts: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def sample(self) -> None:
        import psutil

        now = time.monotonic() - self.t0
        for name, process in server_processes(self.cli_pid).items():
            try:
                rss = process.memory_info().rss / 2**20
            except psutil.Error:
                continue
            self.rss.setdefault(name, []).append((round(now, 2), round(rss, 2)))
            pids = self.pids.setdefault(name, [])
            if not pids or pids[-1] != process.pid:
                pids.append(process.pid)
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
                self.counts.append((round(now, 2), request_counts(response.read().decode())))
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "Sampler":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sample()


@dataclass
class LoadRun:
    """One perf_analyzer run of the soak's load on one model."""

    started: float
    ended: float
    throughput: float
    p50_us: float
    p99_us: float
    returncode: int
    error: str = ""


@dataclass
class Load:
    """perf_analyzer run after run on one model until `deadline` (seconds since t0)."""

    binary: Path
    model: str
    url: str
    input_data: Path
    settings: SoakSettings
    workdir: Path
    t0: float
    deadline: float
    log: Callable[[str], None] = print
    runs: list[LoadRun] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            left = self.deadline - (time.monotonic() - self.t0)
            if left < 3.0:
                return
            window = int(min(self.settings.window_ms, max(1000.0, left * 1000 / 3.5)))
            perf = perf_analyzer.PerfSettings(measurement_interval_ms=window, stability_percentage=perf_analyzer.LOOSE,
                                              max_trials=3, protocol=self.settings.protocol,
                                              timeout_s=window * 8 / 1000 + 60)
            number += 1
            csv_path = self.workdir / f"run{number:03d}.csv"
            cmd = perf_analyzer.command(self.binary, self.model, self.url, self.settings.concurrency, csv_path, perf,
                                        input_data=self.input_data)
            started = time.monotonic() - self.t0
            done = perf_analyzer.run_once(cmd, self.binary, perf.timeout_s)
            ended = time.monotonic() - self.t0
            if done is None:
                self.runs.append(LoadRun(started, ended, 0.0, 0.0, 0.0, -1, f"ran over {perf.timeout_s:.0f}s"))
                continue
            output = done.stdout + done.stderr
            (self.workdir / f"run{number:03d}.log").write_text(" ".join(cmd) + "\n" + output)
            rows = perf_analyzer.parse_csv(csv_path.read_text()) if csv_path.is_file() else []
            error = ""
            if done.returncode != 0 and perf_analyzer.UNSTABLE not in output:
                error = " | ".join(output.strip().splitlines()[-3:])
            row = rows[0] if rows else None
            self.runs.append(LoadRun(started, ended, row.throughput if row else 0.0, row.p50_us if row else 0.0,
                                     row.p99_us if row else 0.0, done.returncode, error))
            self.log(f"soak: {self.model}: {ended:6.0f}s  {self.runs[-1].throughput:8.1f} infer/s  "
                     f"p99 {self.runs[-1].p99_us / 1000:.1f} ms{'  ERROR ' + error if error else ''}")


# ---------------------------------------------------------------------------------------------- the soak
class Soak:
    def __init__(self, settings: SoakSettings, log: Callable[[str], None] = print):
        self.settings = settings
        self.log = log
        self.dir = Path(settings.out) / f"soak-{datetime.now().strftime('%Y%m%d-%H%M%S')}"

    def run(self) -> tuple[Path, dict]:
        s = self.settings
        binary = perf_analyzer.find_perf_analyzer()
        self.dir.mkdir(parents=True, exist_ok=True)
        catalogue = known_models(s.cache)
        repo = self.dir / "repo"
        inputs = {}
        for name, scenario in SOAK_MODELS:
            model = catalogue[name]
            scenarios.write_repository(repo, model, scenario, model.ensure(s.cache, self.log))
            inputs[name] = perf_analyzer.write_input_data(self.dir / f"inputs_{name}.json", model.sample_inputs(1))
        self.log(f"soak: {s.minutes:g} min on {', '.join(f'{m} ({sc.title})' for m, sc in SOAK_MODELS)}, "
                 f"concurrency {s.concurrency} each; writing to {self.dir}")
        srv = server.start(repo, self.dir / "serve.log")
        result: dict = {}
        try:
            failed = srv.failures()
            if failed:
                raise server.ServeError(f"model(s) failed to load: {failed}")
            t0 = time.monotonic()
            sampler = Sampler(srv.process.pid, f"http://localhost:{srv.metrics_port}/metrics", s.sample_s, t0).start()
            loads = []
            for name, _ in SOAK_MODELS:
                work = self.dir / "perf" / name
                work.mkdir(parents=True, exist_ok=True)
                loads.append(Load(binary, name, srv.grpc_url if s.protocol == "grpc" else srv.http_url, inputs[name],
                                  s, work, t0, s.seconds, self.log))
            threads = [threading.Thread(target=load.run, name=f"soak-{load.model}", daemon=True) for load in loads]
            interrupted = False
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    while thread.is_alive():
                        thread.join(0.5)
            except KeyboardInterrupt:
                interrupted = True
                self.log("soak: interrupted; stopping the load and writing what was measured")
                for load in loads:
                    load.stop.set()
                for thread in threads:
                    thread.join(120)
            sampler.stop()
            result = self._result(sampler, loads, time.monotonic() - t0, interrupted, srv.output())
        finally:
            exit_code = srv.stop()
        result["server_exit_code"] = exit_code
        if exit_code != 0:
            result["problems"].append(f"gebackend serve exited {exit_code} on SIGTERM")
        result["passed"] = not result["problems"]
        (self.dir / "soak.json").write_text(json.dumps(result, indent=1))
        (self.dir / "soak.md").write_text(markdown(result))
        plot(result, self.dir)
        return self.dir, result

    def _result(self, sampler: Sampler, loads: Sequence[Load], elapsed: float, interrupted: bool, log_text: str) -> dict:
        s = self.settings
        models = {}
        for load in loads:
            runs = [r for r in load.runs if r.throughput > 0]
            series = [counts.get(load.model, {}) for _, counts in sampler.counts]
            models[load.model] = {
                "served_as": dict(SOAK_MODELS)[load.model].title,
                "succeeded": increase([c.get("success", 0.0) for c in series]),
                "failed": increase([c.get("failure", 0.0) for c in series]),
                "perf_runs": len(load.runs),
                "errors": [r.error for r in load.runs if r.error],
                "throughput_mean": round(_mean([r.throughput for r in runs]), 1),
                "throughput_min": round(min((r.throughput for r in runs), default=0.0), 1),
                "throughput_max": round(max((r.throughput for r in runs), default=0.0), 1),
                "p99_ms_max": round(max((r.p99_us for r in runs), default=0.0) / 1000, 2),
                "runs": [asdict(r) for r in load.runs],
            }
        processes = {name: {"pids": sampler.pids.get(name, []), "restarts": len(sampler.pids.get(name, [])) - 1,
                            "memory": memory_growth(series, s.warmup_s), "rss": series}
                     for name, series in sampler.rss.items()}
        result = {
            "meta": {"minutes": s.minutes, "elapsed_s": round(elapsed, 1), "interrupted": interrupted,
                     "concurrency_per_model": s.concurrency, "window_ms": s.window_ms, "sample_s": s.sample_s,
                     "warmup_s": s.warmup_s, "max_growth": s.max_growth, "protocol": s.protocol,
                     "restored_by_watchdog": log_text.count("reloading the model")},
            "models": models,
            "processes": processes,
            "counts": sampler.counts,
        }
        result["problems"] = problems(result, s.max_growth)
        if result["meta"]["restored_by_watchdog"]:
            result["problems"].append(f"the watchdog restored a model {result['meta']['restored_by_watchdog']} time(s)")
        return result
