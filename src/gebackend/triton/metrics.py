"""gebackend's own Prometheus metrics on Triton's metrics endpoint (:8002/metrics), through pb_utils.MetricFamily.

- `gebackend_bucket_runs_total{model,bucket}`: engine runs per compiled shape (static graph mode), and
  `bucket="dynamic"` for the batch sizes measured faster on the dynamic graph and run there;
- `gebackend_rows_total{model}` / `gebackend_padded_rows_total{model}`: rows run, and how many of them
  were padding; `gebackend_padding_waste_ratio{model}` is their ratio;
- `gebackend_fallback_runs_total{model}`: runs on the dynamic fallback (bucket_fallback=dynamic);
- `gebackend_bucket_run_seconds{model,bucket}`: the cost of one run of each bucket that the static graph's plans
  come from (pad or split, measured at load), where it measures them;
- `gebackend_compile_seconds{model}`: how long loading and compiling the model took.
- `gebackend_token_positions_total{model}` / `gebackend_trimmed_positions_total{model}` (trim_padding): positions of
  the cut input sent (rows x length), and how many of them were cut off before the engine ran.

Published once a second by a daemon thread, never on the request path: each pb_utils metric call is a
round trip to tritonserver through shared memory, measured at 10-75 us, and a static model would make up
to four per execute() (Triton's Python backend serialises these calls with a mutex, so another thread
may make them).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from gebackend.runtime.buckets import DYNAMIC

PUBLISH_SECONDS = 1.0


class BackendMetrics:
    def __init__(self, pb_utils: Any, model: str, runner: Any, compile_seconds: float, trimmer: Any = None,
                 warn: Callable[[str], None] | None = None):
        family = pb_utils.MetricFamily
        self.model = model
        self._warn = warn  # where a publisher that stops says why (Triton's log)
        self.runner = runner
        self.trimmer = trimmer  # runtime/padding_trim.Trimmer, or None: its metrics are not registered
        labels = {"model": model}
        self._families = [
            family("gebackend_bucket_runs_total", "Engine runs per compiled shape (bucket)", family.COUNTER),
            family("gebackend_rows_total", "Rows run by the engine, padding included", family.COUNTER),
            family("gebackend_padded_rows_total", "Rows of padding added to fill buckets", family.COUNTER),
            family("gebackend_padding_waste_ratio", "Padded rows / rows run", family.GAUGE),
            family("gebackend_fallback_runs_total", "Runs on the dynamic fallback engine", family.COUNTER),
            family("gebackend_compile_seconds", "Seconds spent loading and compiling the model", family.GAUGE),
            family("gebackend_bucket_run_seconds", "Cost of one run of each bucket that plans are made from",
                   family.GAUGE),
        ]
        runs, rows, padded, waste, fallback, compile_time, run_seconds = self._families
        router = getattr(runner, "router", None)
        names = router.describe() if router is not None else []
        # runner.runs_per_bucket's keys and their labels; runs on the dynamic graph where it won a batch size
        counted = list(enumerate(names)) + ([(DYNAMIC, "dynamic")] if router is not None and router.dynamic_rows else [])
        self._bucket_keys = [key for key, _ in counted]
        self._bucket = [runs.Metric(labels={**labels, "bucket": name}) for _, name in counted]
        for name, cost in zip(names, (router.costs or []) if router is not None else []):  # fixed at load
            run_seconds.Metric(labels={**labels, "bucket": name}).set(cost)
        self._rows, self._padded = rows.Metric(labels=labels), padded.Metric(labels=labels)
        self._waste, self._fallback = waste.Metric(labels=labels), fallback.Metric(labels=labels)
        compile_time.Metric(labels=labels).set(compile_seconds)
        self._positions = self._trimmed = None
        if trimmer is not None:  # the families are kept in self._families: a family dropped is unregistered
            self._families += [family("gebackend_token_positions_total", "Positions of the trim_padding input sent "
                                      "(rows x length)", family.COUNTER),
                               family("gebackend_trimmed_positions_total", "Of those, positions cut off before the "
                                      "engine ran", family.COUNTER)]
            self._positions, self._trimmed = (f.Metric(labels=labels) for f in self._families[-2:])
        self._seen = self._snapshot()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval: float = PUBLISH_SECONDS) -> "BackendMetrics":
        self._thread = threading.Thread(target=self._run, args=(interval,), name="gebackend-metrics", daemon=True)
        self._thread.start()
        return self

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.update()
            except Exception as exc:  # noqa: BLE001 - e.g. tritonserver going away while the model unloads
                if not self._stop.is_set() and self._warn is not None:
                    self._warn(f"{self.model}: gebackend's metrics stopped: publishing them failed "
                               f"({type(exc).__name__}: {exc}); the model keeps serving, Triton's own metrics go on")
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _snapshot(self) -> tuple:
        r, t = self.runner, self.trimmer
        trim = (t.positions, t.trimmed) if t is not None else (0, 0)
        if not hasattr(r, "runs_per_bucket"):
            return ((), 0, 0, 0, *trim)
        return (tuple(r.runs_per_bucket.get(i, 0) for i in self._bucket_keys), r.rows, r.padded_rows,
                r.fallback_runs, *trim)

    def update(self) -> None:
        """Publish what the runner (and the trimmer) counted since the last update."""
        now = self._snapshot()
        if now == self._seen:
            return
        runs, rows, padded, fallback, positions, trimmed = now
        old_runs, old_rows, old_padded, old_fallback, old_positions, old_trimmed = self._seen
        if positions > old_positions:
            self._positions.increment(positions - old_positions)
        if trimmed > old_trimmed:
            self._trimmed.increment(trimmed - old_trimmed)
        for metric, new, old in zip(self._bucket, runs, old_runs or (0,) * len(runs)):
            if new > old:
                metric.increment(new - old)
        if rows > old_rows:
            self._rows.increment(rows - old_rows)
        if padded > old_padded:
            self._padded.increment(padded - old_padded)
        if fallback > old_fallback:
            self._fallback.increment(fallback - old_fallback)
        if rows:
            self._waste.set(padded / rows)
        self._seen = now
