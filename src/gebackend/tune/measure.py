"""The real measurements of `gebackend tune`, made with the bench's machinery (gebackend.bench):

- each candidate's repository is laid out by `scenarios.write_repository` (config.pbtxt + a link to the ONNX
  file) under OUT/repos/<key>/, its config.pbtxt then replaced by config_writer's (the file the winner gets);
- it is served by `Bench.serve` (`gebackend serve` on free ports, failed loads reported with the server's
  reason; the peer's backend laid out beside ours), its log in OUT/logs/<key>.serve.log;
- perf_analyzer is `perf_analyzer.run` at the one concurrency tuned for (gRPC, batch 1, its unstable-retry), sending
  the user's requests (--input-data) or one valid seeded input for every request, its CSV and logs under OUT/perf/<key>/;
- the accuracy guard is the bench's in-process check (`inprocess.Ceiling` + `inprocess.accuracy`: the
  candidate's engine and precision loaded as the backend loads them, cutting padding where every candidate does,
  cosine to a plain fp32 ONNX Runtime session on the user's requests, else on 4 random inputs; the static int8 rungs
  calibrated on the user's requests where given: config_writer; a rung on an engine that cannot read the model, or
  whose load serves the exact model, is pruned saying why: outcome.Pruned), and the same loaded instance then times a
  request (`request_ms`, about a second), which orders the rungs for screening (numerics_order.py); the fastest
  rung so far stays loaded and one within 1.25x of it is timed again beside it, in interleaved rounds
  (paired_timing.py), before it is released;
- those timings and the winner's ceiling send the requests perf_analyzer sends, in turn: the user's (the first
  `requests.IN_PROCESS_LIMIT` of --input-data) or the one seeded request. Timed on seeded full-length requests,
  a rung's order and ceiling were those of requests nobody serves where the user's are cut (trim_padding).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

from gebackend.bench import inprocess, perf_analyzer, scenarios
from gebackend.bench.runner import Bench, BenchSettings
from gebackend.tune import config_writer, paired_timing
from gebackend.tune.numerics_order import Check
from gebackend.tune.outcome import Measurement, MeasureFailed, Pruned
from gebackend.tune.space import Candidate, PrecisionRung, make_candidate
from gebackend.tune.tuned_model import TunedModel

# perf_analyzer's own stability loop (3 windows within s%) is loosened to 100 %: on a noisy machine it rarely
# settles at 20-30 % and retries for tens of seconds; the tuner's noise answer is its interleaved rounds instead.
SCREEN = perf_analyzer.PerfSettings(measurement_interval_ms=1500, stability_percentage=100, max_trials=3, timeout_s=180)
REFINE = perf_analyzer.PerfSettings(measurement_interval_ms=3000, stability_percentage=100, max_trials=3, timeout_s=240)
QUICK_SCREEN = perf_analyzer.PerfSettings(measurement_interval_ms=800, stability_percentage=100, max_trials=3, timeout_s=90)
QUICK_REFINE = perf_analyzer.PerfSettings(measurement_interval_ms=1500, stability_percentage=100, max_trials=3, timeout_s=90)
CEILING_S = 5.0  # the winner's in-process ceiling, after the search
TIMING_S = 1.0  # the accuracy guard's timing of one request in process, per (engine, precision rung)
ACCURACY_REQUESTS = 16  # the accuracy guard compares with fp32 on at most this many of the user's requests
ACCURACY_LEAST = 4  # and on at least this many: seeded random ones make up the user's where fewer


def random_feeds(model: TunedModel, batch: int = 1, seed: int = 0):
    """Valid random inputs (token ids within their embedding tables: compile.accuracy.random_feeds)."""
    from gebackend.compile.accuracy import random_feeds as feeds

    shapes = {}
    for t in model.inputs:
        dims = model.request_dims(t)
        shapes[t.name] = ((batch, *dims[1:]) if model.max_batch_size > 0 else dims)
    return feeds(model.onnx_path, shapes, seed=seed)


def guard_requests(model: TunedModel, mine: list) -> list:
    """What the accuracy guard compares with fp32 where the user's requests are given: the first `ACCURACY_REQUESTS`
    of them, and seeded random ones beside them up to `ACCURACY_LEAST` where there are fewer (a file of one or two
    requests is a thin check of a precision the tune may write into the winner's config)."""
    mine = list(mine[:ACCURACY_REQUESTS])
    return mine + [random_feeds(model, 1, seed=1 + i) for i in range(ACCURACY_LEAST - len(mine))]


def unreadable(engine: str, model: TunedModel) -> str:
    """Why `engine` cannot serve the model at all (OpenVINO cannot read it: engines/auto_choice.py), or ""."""
    from gebackend.engines.auto_choice import openvino_refusal

    refused = openvino_refusal(model.onnx_path) if engine == "openvino" else ""
    return f"{refused}; none of its candidates on {engine} can load" if refused else ""


def exact_instead(rung: PrecisionRung, ceiling: inprocess.Ceiling) -> str:
    """Why the instance loaded for a lowering rung serves the exact model instead (its load line's reason: nothing to
    quantize, no input size it runs, nothing quantized), or "" where it lowers: such a rung is the origin rung again."""
    served = ceiling.instances_here[0].executor.spec.options.engines.precision_mode
    if rung.precision_mode == "origin" or served != "origin":
        return ""
    said = re.search(r"precision origin \((.*?)\), (?:dynamic|static) graph", ceiling.how)
    return f"{rung.name} serves the exact model here: {said.group(1) if said else ceiling.how}"


def request_ms(run, seconds: float = TIMING_S, least: int = 3) -> float:
    """The median milliseconds of `run()` (one request to the loaded instance), after one unmeasured run, over about
    `seconds` (at least `least` runs)."""
    run()
    return 1000 * inprocess.median_seconds(run, seconds, least)


class Served:
    def __init__(self, cand: Candidate, server, work: Path):
        self.candidate, self.server, self.work, self.count = cand, server, work, 0


class BenchMeasurer:
    def __init__(self, model: TunedModel, out: Path, concurrency: int, quick: bool = False, peer=None,
                 log: Callable[[str], None] = lambda line: None, startup_timeout: float = 600,
                 input_data: Path | None = None, min_cosine: float = 0.0, requests=None, trim: bool = False):
        self.model, self.out, self.concurrency, self.peer, self.log = model, Path(out), concurrency, peer, log
        self.min_cosine = min_cosine  # a rung under it is timed once and released, never held for pairing
        self.phases = {"screen": QUICK_SCREEN if quick else SCREEN, "refine": QUICK_REFINE if quick else REFINE}
        self.bench = Bench(BenchSettings(out=self.out, startup_timeout=startup_timeout), log=log)
        self.bench.dir = self.out  # the bench's logs/ and layout, directly in the tune folder
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.binary = perf_analyzer.find_perf_analyzer()
        seeded = None if requests and input_data is not None else random_feeds(model)
        self.input_data = Path(input_data) if input_data is not None else \
            perf_analyzer.write_input_data(self.out / "inputs.json", seeded)
        # what the in-process timings and ceiling send in turn: the user's requests (tune/requests.in_process) or the
        # seeded one perf_analyzer is given; `trim`: the accuracy guard's instance cuts padding as every candidate does
        self.requests = list(requests) if requests else [seeded]
        # what the accuracy guard compares with fp32 on: the user's requests (guard_requests), else 4 seeded ones
        self.guarded = guard_requests(model, self.requests) if requests else None
        self.trim = trim
        self.configs: dict[str, str] = {}
        self.fastest = paired_timing.FastestHeld(
            lambda run, seconds: inprocess.median_seconds(run, seconds), log=lambda line: log(f"tune: {line}"))

    def repository(self, cand: Candidate) -> Path:
        root = self.out / "repos" / cand.key
        scenarios.write_repository(root, self.model.bench_model(), cand.scenario, self.model.onnx_path)
        text = config_writer.config_text(self.model, cand, header=[f"gebackend tune candidate {cand.key}: {cand.label}"])
        (root / self.model.name / "config.pbtxt").write_text(text)
        self.configs[cand.key] = text
        return root

    def accuracy(self, engine: str, rung: PrecisionRung) -> Check:
        cand = make_candidate(engine, rung, False, (1, 0), 0 if self.model.max_batch_size else None,
                              self.model.max_batch_size, 0, trim=self.trim)
        cand = replace(cand, key=f"accuracy-{cand.key}")
        refused = unreadable(engine, self.model)
        if refused:
            raise Pruned(refused)
        root = self.repository(cand)
        try:
            ceiling = inprocess.Ceiling(root / self.model.name, self.log)
        except Exception as exc:  # noqa: BLE001 - the reason is the rung's status
            raise MeasureFailed(f"{type(exc).__name__}: {exc}") from None
        exact = exact_instead(rung, ceiling)
        if exact:
            ceiling.close()
            raise Pruned(exact)
        try:
            cosine = float(self._accuracy(ceiling)["cosine"])
            turns = inprocess.RoundRobin(self.requests)
            run = lambda: ceiling.run_once(turns.take())  # noqa: E731
            first = request_ms(run)
        except Exception as exc:  # noqa: BLE001
            ceiling.close()
            raise MeasureFailed(f"{type(exc).__name__}: {exc}") from None
        if cosine < self.min_cosine:
            ceiling.close()
            return Check(cosine, first)
        timed = paired_timing.Timed((engine, rung.name), run, ceiling.close, first)
        return Check(cosine, self.fastest.offer(timed))  # the fastest stays loaded, a close one timed beside it

    def _accuracy(self, ceiling: inprocess.Ceiling) -> dict:
        """The guard's comparison with fp32: on the user's requests where given (`guard_requests`), which the static
        int8 rungs are calibrated on too (TunedModel.calibration), else on 4 seeded random ones."""
        if self.guarded is not None:
            return inprocess.accuracy_on(ceiling, self.model.onnx_path, self.guarded)
        return inprocess.accuracy(ceiling, self.model.onnx_path, random_feeds(self.model, 4, seed=1))

    def ceiling(self, cand: Candidate, seconds: float = CEILING_S, warmup: float = 1.0) -> float | None:
        """What `cand`'s instances compute in process at the tuned concurrency, pinned as served, with no server,
        gRPC or perf_analyzer beside them (the bench's in-process ceiling), in inferences a second; None (the reason
        logged) where it cannot be measured."""
        try:
            ceiling = inprocess.Ceiling(self.repository(cand) / self.model.name, self.log)
            try:
                return ceiling.measure(self.requests, self.concurrency, seconds, warmup).throughput
            finally:
                ceiling.close()
        except Exception as exc:  # noqa: BLE001 - a line of the report, not the tune's result
            self.log(f"tune: the winner's in-process ceiling could not be measured: {type(exc).__name__}: {exc}")
            return None

    def in_process_times(self) -> dict[tuple[str, str], float]:
        """Every checked rung's time of one request in process, the close ones from rounds beside the fastest;
        releases the rung still loaded."""
        self.fastest.close()
        return dict(self.fastest.times)

    def start(self, cand: Candidate, timeout_s: float = 600) -> Served:
        if cand.kind == "peer" and self.peer is None:
            raise MeasureFailed("no onnxruntime backend")
        repo = self.repository(cand)
        result: dict = {}
        on_peer = cand.kind == "peer" or (cand.kind == "baseline" and self.model.backend not in ("ge", "npu_ge"))
        extra = self.peer.extra_backends if on_peer and self.peer is not None else None
        self.bench.settings = replace(self.bench.settings, startup_timeout=timeout_s)
        srv = self.bench.serve(repo, cand.key, result, [self.model.name], extra_backends=extra)
        if srv is None:
            raise MeasureFailed(result.get("reason", "did not start"))
        work = self.out / "perf" / cand.key
        work.mkdir(parents=True, exist_ok=True)
        return Served(cand, srv, work)

    def measure(self, handle: Served, phase: str) -> Measurement:
        handle.count += 1
        work = handle.work / f"{phase}{handle.count}"
        work.mkdir(parents=True, exist_ok=True)
        perf = perf_analyzer.run(self.binary, self.model.name, handle.server.grpc_url, [self.concurrency], work,
                                 self.phases[phase], input_data=self.input_data, log=self.log)
        (work / "perf.csv").write_text(perf.csv_text)
        if not perf.rows:
            raise MeasureFailed("perf_analyzer measured nothing: " + "; ".join(perf.failures))
        row = perf.rows[0]
        notes = "unstable (measured with -s 1000, 2x windows)" if perf.unstable else ""
        return Measurement(row.throughput, row.p50_us / 1000, row.p99_us / 1000, notes)

    def stop(self, handle: Served) -> None:
        handle.server.stop()
