"""Runs a bench: for each model and scenario, generate the repository, serve it, drive perf_analyzer, stop,
measure the in-process ceiling, and write everything under `<out>/<timestamp>/`.

Layout of a run folder:
  summary.json, summary.md, throughput_<model>.png, latency_<model>.png
  <model>_<scenario>.csv            perf_analyzer's CSV (one row per concurrency)
  repos/<model>/<scenario>/...      the generated model repository (config.pbtxt, 1/model.onnx link)
  logs/<model>_<scenario>.serve.log the server's output; perf/<model>_<scenario>/ perf_analyzer's own logs

Where Triton's onnxruntime backend is found (gebackend.bench.peer: --peer-backend-dir, $GE_PEER_BACKEND_DIR or
/opt/tritonserver/backends), its scenarios run after the others of each model, in the same run, and every
scenario's throughput is reported over the peer's at the same concurrency (summary.json: `x_onnxruntime_backend`).
With `interleave`, a model's scenarios share one server and are measured in interleaved rounds instead
(gebackend.bench.interleaved_runner; repos/<model>/interleaved/, logs/<model>_interleaved.serve.log).
"""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from gebackend.bench import ensemble_runner, inprocess, interleaved_runner, peer, perf_analyzer, report, scenarios, server
from gebackend.modelzoo.bench_models import DEFAULT_CACHE, BenchModel, models as known_models
from gebackend import cpu
from gebackend.engines.registry import precision_run

QUICK_MODELS = ("resnet_small",)
FULL_MODELS = ("cnclip_image", "cnclip_text", "resnet50")
QUICK_SCENARIOS = scenarios.LADDER
FULL_SCENARIOS = (*scenarios.LADDER, "ge_openvino")


@dataclass
class BenchSettings:
    models: Sequence[str] = FULL_MODELS
    scenarios: Sequence[str] = FULL_SCENARIOS
    concurrency: Sequence[int] = (1, 4, 8)
    headline: int = 4
    perf: perf_analyzer.PerfSettings = field(default_factory=perf_analyzer.PerfSettings)
    ceiling: bool = True
    ceiling_for: Sequence[str] | None = None  # scenarios whose ceiling is measured (None: every ge scenario)
    ceiling_seconds: float = 5.0
    ceiling_warmup: float = 1.0
    out: Path = Path("bench/results")
    cache: Path = DEFAULT_CACHE
    quick: bool = False
    startup_timeout: float = 600.0
    rounds: int = 3  # `NAME+ensemble` scenarios: interleaved rounds of bare encoder vs ensemble, medians reported
    peer_backend_dir: Path | None = None  # Triton's onnxruntime backend (None: $GE_PEER_BACKEND_DIR, NGC's folder)
    with_peer: bool | None = None  # add the peer scenarios: None where the peer is found, True always, False never
    interleave: bool = False  # every scenario of a model in one server, `rounds` interleaved rounds (interleaved_runner)
    # the CN_CLIP text encoders' requests: "random" ids filling the whole context, or "captions": Chinese captions through
    # CN_CLIP's tokenizer, padded to the context as a client sends them (what trim_padding has to cut)
    texts: str = "random"

    @classmethod
    def quick_preset(cls, **overrides) -> "BenchSettings":
        base = cls(models=QUICK_MODELS, scenarios=QUICK_SCENARIOS, concurrency=(1, 4), headline=4,
                   perf=perf_analyzer.PerfSettings(measurement_interval_ms=1000, stability_percentage=40, max_trials=4,
                                                   timeout_s=120),
                   ceiling_seconds=2.0, ceiling_warmup=0.5, quick=True)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def machine() -> str:
    """The machine a result was measured on: the CPU's model and its inference ISA flags, cores, OS, Python."""
    return (f"{cpu.describe()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class Bench:
    def __init__(self, settings: BenchSettings, log: Callable[[str], None] = print):
        self.settings = settings
        self.log = log
        self.started = datetime.now()
        self.dir = Path(settings.out) / self.started.strftime("%Y%m%d-%H%M%S")
        self.summary: dict = {"meta": {}, "models": []}
        self.binary: Path | None = None
        self.peer: peer.Peer | None = None
        self.peer_reason: str | None = None

    def chosen(self) -> list[scenarios.Scenario]:
        """The scenarios named, and the peer's (not named twice) where with_peer says so and the peer is found."""
        s = self.settings
        chosen = scenarios.select(s.scenarios)
        add = s.with_peer if s.with_peer is not None else self.peer is not None
        if add:
            chosen += [scenarios.PEERS[name] for name in scenarios.PEER_SCENARIOS if name not in {c.name for c in chosen}]
        return chosen

    def run(self) -> Path:
        s = self.settings
        self.binary = perf_analyzer.find_perf_analyzer()
        self.peer, self.peer_reason = peer.lookup(s.peer_backend_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        t0 = time.monotonic()
        self.summary["meta"] = {
            "started": self.started.isoformat(timespec="seconds"), "machine": machine(), "quick": s.quick,
            "concurrency": list(s.concurrency), "headline_concurrency": s.headline,
            "perf_settings": f"-i {s.perf.protocol} -p {s.perf.measurement_interval_ms} -s {s.perf.stability_percentage} -r {s.perf.max_trials}",
            "perf_analyzer": str(self.binary), "ceiling_seconds": s.ceiling_seconds if s.ceiling else None,
            "loadavg_start": _loadavg(), "cpu": cpu.describe(), "peer": peer.describe(self.peer, self.peer_reason),
        }
        if any(sc.ensemble for sc in scenarios.select(s.scenarios)):
            self.summary["meta"]["ensemble_rounds"] = s.rounds
        self.log(f"bench: writing to {self.dir}")
        catalogue = known_models(s.cache)
        chosen = self.chosen()
        for name in s.models:
            if name not in catalogue:
                raise ValueError(f"unknown model {name!r}; known: {', '.join(catalogue)}")
        try:
            for name in s.models:
                self._run_model(catalogue[name], chosen)
        except KeyboardInterrupt:
            self.summary["meta"]["interrupted"] = True
            self.log("bench: interrupted; writing what was measured")
        self.summary["meta"]["duration_s"] = time.monotonic() - t0
        self.summary["meta"]["loadavg_end"] = _loadavg()
        self._save()
        report.plot(self.summary, self.dir, s.headline)
        self.log(f"bench: done in {self.summary['meta']['duration_s']:.0f}s: {self.dir / 'summary.md'}")
        return self.dir

    def _save(self) -> None:
        for model in self.summary["models"]:
            model["x_onnxruntime_backend"] = report.peer_ratios(model)
        (self.dir / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))
        (self.dir / "summary.md").write_text(report.markdown(self.summary, self.settings.headline))

    def _run_model(self, model: BenchModel, chosen: Sequence[scenarios.Scenario]) -> None:
        s = self.settings
        entry = {"name": model.name, "description": model.description, "scenarios": []}
        self.summary["models"].append(entry)
        try:
            path = model.ensure(s.cache, self.log)
        except Exception as exc:  # noqa: BLE001 - reported as the model's rows
            reason = f"export failed: {type(exc).__name__}: {exc}"
            self.log(f"bench: {model.name}: {reason}")
            entry["scenarios"] = [{"name": sc.name, "title": sc.title, "status": "failed", "reason": reason,
                                   "rows": [], "ceiling": []} for sc in chosen]
            self._save()
            return
        entry["path"] = str(path)
        entry["size_mb"] = round(path.stat().st_size / 2**20, 1)
        requests, input_data = self._inputs(model)
        if s.interleave:
            try:
                interleaved_runner.run(self, model, path, chosen, input_data, entry["scenarios"])
            finally:
                self._save()
            return
        for scenario in chosen:
            result = self._run_scenario(model, path, scenario, input_data, requests)
            entry["scenarios"].append(result)
            self._save()

    def _inputs(self, model: BenchModel) -> tuple[list[dict], Path]:
        """The requests every scenario is sent, as feeds (the in-process ceiling sends them in turn) and as
        perf_analyzer's --input-data (which sends them round-robin)."""
        target = self.dir / f"inputs_{model.name}.json"
        if self.settings.texts == "captions" and model.ensemble == "text":
            from gebackend.bench import ensemble

            texts = ensemble.inputs(ensemble.pipeline(model), self.settings.cache, count=len(ensemble.CAPTIONS))
            self.summary["meta"].setdefault("inputs", {})[model.name] = texts.description + ", tokenized, padded"
            requests = [{name: np.asarray(value)[None] for name, value in text.items()} for text in texts.bare]
            return requests, perf_analyzer.write_input_entries(target, texts.bare)
        feeds = model.sample_inputs(1, seed=0)
        return [feeds], perf_analyzer.write_input_data(target, feeds)

    def serve(self, repo: Path, tag: str, result: dict, models: Sequence[str], extra_backends=None):
        """`gebackend serve` on `repo` for one scenario, its start-up time in `result`; None, with `result` marked
        failed and the server stopped, when it did not start or one of `models` did not load."""
        try:
            srv = server.start(repo, self.dir / "logs" / f"{tag}.serve.log", timeout=self.settings.startup_timeout,
                               extra_backends=extra_backends)
        except server.ServeError as exc:
            result.update(status="failed", reason=str(exc).splitlines()[0] + " (see logs)")
            self.log(f"bench: {tag}: {exc}")
            return None
        result["startup_s"] = round(time.monotonic() - srv.started, 1)
        failed = {m: why for m, why in srv.failures().items() if m in models}
        if not failed:
            return srv
        srv.stop()
        if len(models) == 1:
            reason = f"model failed to load: {failed[models[0]]}"
        else:
            reason = "; ".join(f"model {m} failed to load: {why}" for m, why in failed.items())
        result.update(status="failed", reason=reason)
        self.log(f"bench: {tag}: {reason}")
        return None

    def prepare(self, model: BenchModel, scenario: scenarios.Scenario) -> tuple[scenarios.Scenario, dict, str]:
        """The scenario as it can run here, its result entry (status "not available" when it cannot) and its tag."""
        s = self.settings
        scenario, missing = scenarios.availability(scenario, s.peer_backend_dir, model)
        if scenario.is_peer and self.peer is None:
            missing = f"not available: {self.peer_reason}"
        result = {"name": scenario.name, "title": scenario.title, "status": "ok", "reason": "", "notes": scenario.notes,
                  "scenario": asdict(scenario), "rows": [], "ceiling": [], "accuracy": None,
                  "loadavg": _loadavg(), "peer": scenario.is_peer}
        tag = f"{model.name}_{scenario.name}"
        if missing:
            result.update(status="not available", reason=missing.removeprefix("not available: "))
            self.log(f"bench: {tag}: {missing}")
            return scenario, result, tag
        if scenario.precision != "origin":
            ran = precision_run(scenario.precision, scenario.engine, scenario.quantization)
            result["precision_ran"] = ran.ran
            if ran.note:
                report.note(result, ran.note)
                self.log(f"bench: {tag}: {ran.note}")
        return scenario, result, tag

    def _run_scenario(self, model: BenchModel, path: Path, scenario: scenarios.Scenario, input_data: Path,
                      requests: list[dict]) -> dict:
        s = self.settings
        scenario, result, tag = self.prepare(model, scenario)
        if result["status"] != "ok":
            return result
        if scenario.ensemble:
            return ensemble_runner.run(self, model, path, scenario, result, tag)
        repo = scenarios.write_repository(self.dir / "repos" / model.name / scenario.name, model, scenario, path)
        result["config"] = (repo / model.name / "config.pbtxt").read_text()
        if scenario.is_peer and self.peer is not None:
            report.note(result, f"backend from {self.peer.folder}", *self.peer.warnings)
        self.log(f"bench: {tag}: serving ({scenario.title})")
        srv = self.serve(repo, tag, result, [model.name],
                         extra_backends=self.peer.extra_backends if scenario.is_peer and self.peer else None)
        if srv is None:
            return result
        try:
            work = self.dir / "perf" / tag
            work.mkdir(parents=True, exist_ok=True)
            perf = perf_analyzer.run(self.binary, model.name, srv.grpc_url, s.concurrency, work, s.perf,
                                     input_data=input_data, log=self.log)
        finally:
            srv.stop()
        (self.dir / f"{tag}.csv").write_text(perf.csv_text)
        result["rows"] = [r.to_dict() for r in perf.rows]
        if perf.unstable:
            result["unstable"] = perf.unstable
            report.note(result, "unstable (measured with -s 1000, 2x windows) at c=" + ",".join(map(str, perf.unstable)))
        if perf.failures:
            report.note(result, *perf.failures)
        if not perf.rows:
            result.update(status="failed", reason="perf_analyzer measured nothing: " + "; ".join(perf.failures))
        short = [r.concurrency for r in perf.rows if r.p50_us * 5 / 1000 > s.perf.measurement_interval_ms]
        if short:
            report.note(result, f"window < 5 x p50 at c={','.join(map(str, short))}: "
                                "throughput under-counted, use a longer --interval-ms")
        for row in perf.rows:
            self.log(f"bench: {tag}: c={row.concurrency} {row.throughput:.1f} infer/s p50 {row.p50_us / 1000:.2f} ms "
                     f"p99 {row.p99_us / 1000:.2f} ms")
        wanted = s.ceiling_for is None or scenario.name in s.ceiling_for
        if scenario.is_ge and s.ceiling and wanted and result["status"] == "ok":
            self._ceiling(result, repo / model.name, path, requests, model, tag)
        return result

    def _ceiling(self, result: dict, model_dir: Path, path: Path, requests: list[dict], model: BenchModel, tag: str
                 ) -> None:
        s = self.settings
        try:
            ceiling = inprocess.Ceiling(model_dir, self.log)
        except Exception as exc:  # noqa: BLE001
            report.note(result, f"ceiling not measured: {exc}")
            return
        if ceiling.instances > 1:
            report.note(result, f"ceiling: {ceiling.instances} instances in {ceiling.instances} pinned processes, the "
                                "clients split between them (each batches only its own clients' requests)")
        try:
            try:
                result["accuracy"] = inprocess.accuracy(ceiling, path, model.sample_inputs(4, seed=1))
            except Exception as exc:  # noqa: BLE001
                report.note(result, f"accuracy not checked: {exc}")
            for level in s.concurrency:
                row = ceiling.measure(requests, level, s.ceiling_seconds, s.ceiling_warmup)
                result["ceiling"].append(row.to_dict())
                self.log(f"bench: {tag}: in-process c={level} {row.throughput:.1f} infer/s p50 {row.p50_us / 1000:.2f} ms")
        except Exception as exc:  # noqa: BLE001
            self.log(traceback.format_exc())
            report.note(result, f"ceiling failed: {exc}")
        finally:
            ceiling.close()
