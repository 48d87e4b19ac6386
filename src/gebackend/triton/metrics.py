"""gebackend's own Prometheus metrics on Triton's metrics endpoint (:8002/metrics), through pb_utils.MetricFamily.

- `gebackend_bucket_runs_total{model,bucket}`: engine runs per compiled shape (static graph mode), and
  `bucket="dynamic"` for the batch sizes measured faster on the dynamic graph and run there;
- `gebackend_rows_total{model}` / `gebackend_padded_rows_total{model}`: rows run, and how many of them
  were padding; `gebackend_padding_waste_ratio{model}` is their ratio;
- `gebackend_fallback_runs_total{model}`: runs on the dynamic fallback (bucket_fallback=dynamic);
- `gebackend_bucket_run_seconds{model,bucket}`: the cost of one run of each bucket that the static graph's plans
  come from (pad or split, measured at load), where it measures them;
- `gebackend_compile_seconds{model}`: how long loading and compiling the model took.
- `gebackend_execute_seconds_total{model,phase}` and `gebackend_executions_total{model}`: where the instances'
  execute() time goes (phases `read`, `prepare`, `engine`, `respond`: runtime/phase_clock.py), and how many calls.
- `gebackend_token_positions_total{model}` / `gebackend_trimmed_positions_total{model}` (trim_padding): positions of
  the cut input sent (rows x length), and how many of them were cut off before the engine ran.

Published once a second by a daemon thread, never on the request path: each pb_utils metric call is a
round trip to tritonserver through shared memory, measured at 10-75 us, and a static model would make up
to four per execute() (Triton's Python backend serialises these calls with a mutex, so another thread
may make them).

`close()` (the model's `finalize()`) joins that thread and then drops every `Metric` and `MetricFamily`, so that
Triton deletes their series while the stub can still tell it to. Facts (tritonserver 2.51):
- a family still alive when `finalize()` returns is destroyed after the stub has torn itself down: its destructor
  asks for a new, empty stub and the process dies of SIGSEGV at exit (a kernel `segfault ... in
  triton_python_backend_stub` line per instance, at every unload, reload and stop), and its series stay on /metrics;
- every process asking for a series of the same name and labels gets the same one (the instances of a model, and
  the old and new versions of a reloaded model, which overlap), and the first of them to delete it deletes it for
  all: the others' handles then point at freed memory inside tritonserver. So the processes publishing a model's
  series are counted (`SeriesOwners`, in the server's control folder): the last one deletes them; one that leaves
  before it hands its families over instead, keeping them alive for good (a process about to exit, never
  destroying them: neither deleted nor crashing). A stub that died publishes no more and is not counted.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from gebackend.cache_dir import safe_name
from gebackend.control import env as control_env
from gebackend.control.procfs import is_running, own_start_time
from gebackend.runtime.buckets import DYNAMIC
from gebackend.runtime.phase_clock import PHASES, PhaseClock

PUBLISH_SECONDS = 1.0
JOIN_SECONDS = 5.0  # a publish is a few round trips of microseconds: a thread alive after this is stuck


class SeriesOwners:
    """The processes publishing one model's series: a file each, `<control dir>/metrics/<model>/<pid>-<start time>`.
    Joining (before any series is made) and leaving (and, for the last, deleting them) hold one lock per model."""

    def __init__(self, control_dir: Path, model: str, me: str | None = None):
        self.folder = Path(control_dir) / "metrics" / safe_name(model)
        self.me = me or f"{os.getpid()}-{own_start_time()}"

    @classmethod
    def of(cls, model: str) -> "SeriesOwners | None":
        """For an instance served by `gebackend serve`; None under a plain tritonserver (then each deletes its own)."""
        control = control_env.control_dir()
        return cls(control, model) if control is not None and control.is_dir() else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.parent.mkdir(exist_ok=True)  # never the control folder itself: that is the server's to make
        self.folder.mkdir(exist_ok=True)
        with open(self.folder.with_name(self.folder.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def join(self) -> None:
        try:
            with self._locked():
                (self.folder / self.me).touch()
        except OSError:  # the control folder is gone (the server is stopping): this one will count as the last
            pass

    @contextlib.contextmanager
    def leaving(self) -> Iterator[bool]:
        """Leave; yields whether this was the last live publisher (which then deletes the series before the lock
        is let go, so that a process joining meanwhile makes them afresh)."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._locked())
                last = self._leave()
            except OSError:  # the control folder is gone (the server is stopping): delete this one's own
                last = True
            yield last

    def _leave(self) -> bool:
        (self.folder / self.me).unlink(missing_ok=True)
        others = False
        for entry in self.folder.iterdir():
            pid, _, started = entry.name.partition("-")
            if pid.isdigit() and started.isdigit() and is_running(int(pid), started):
                others = True
            else:
                entry.unlink(missing_ok=True)  # a publisher that died
        return not others


def _keep_for_good(objects: list) -> None:
    """Never destroy these objects: one reference each that nothing gives back (the process is about to exit)."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class BackendMetrics:
    def __init__(self, pb_utils: Any, model: str, runner: Any, compile_seconds: float, trimmer: Any = None,
                 warn: Callable[[str], None] | None = None, owners: SeriesOwners | None = None,
                 clock: PhaseClock | None = None):
        family = pb_utils.MetricFamily
        self.model = model
        self._owners = owners
        if owners is not None:
            owners.join()  # before any series is made: a leaving publisher then sees this one
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
        self.clock = clock
        self._phases: list = []
        self._executions = None
        if clock is not None:
            self._families += [family("gebackend_execute_seconds_total", "Seconds of the instances' execute() calls, "
                                      "per phase (read, prepare, engine, respond)", family.COUNTER),
                               family("gebackend_executions_total", "execute() calls (batches)", family.COUNTER)]
            self._phases = [self._families[-2].Metric(labels={**labels, "phase": phase}) for phase in PHASES]
            self._executions = self._families[-1].Metric(labels=labels)
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

    def close(self, timeout: float = JOIN_SECONDS) -> bool:
        """Stop publishing, then release every pb_utils object held here (Triton then deletes the series).

        False, said in the log, when the publisher is still running after `timeout` seconds: then nothing is
        released, as the thread may be inside a call on those very objects."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                if self._warn is not None:
                    self._warn(f"{self.model}: gebackend's metrics publisher did not stop within {timeout:g}s; its "
                               "metrics are left registered (their series may stay on /metrics, and the backend "
                               "process may not exit cleanly)")
                return False
        self._thread = None
        with self._owners.leaving() if self._owners is not None else contextlib.nullcontext(True) as last:
            if not last:  # another live process publishes these series: hand them over, do not delete them
                _keep_for_good(self._families)
            # the metrics first, then their families: a family's destructor deletes the metrics it made, then itself
            self._bucket, self._rows, self._padded, self._waste, self._fallback = [], None, None, None, None
            self._positions = self._trimmed = self._executions = None
            self._phases = []
            self._families = []
        self._warn = None
        return True

    def _snapshot(self) -> tuple:
        r, t, c = self.runner, self.trimmer, self.clock
        trim = (t.positions, t.trimmed) if t is not None else (0, 0)
        phases = (tuple(c.ns[phase] for phase in PHASES), c.executions) if c is not None else ((), 0)
        if not hasattr(r, "runs_per_bucket"):
            return ((), 0, 0, 0, *trim, *phases)
        return (tuple(r.runs_per_bucket.get(i, 0) for i in self._bucket_keys), r.rows, r.padded_rows,
                r.fallback_runs, *trim, *phases)

    def update(self) -> None:
        """Publish what the runner, the trimmer and the phase clock counted since the last update."""
        now = self._snapshot()
        if now == self._seen:
            return
        runs, rows, padded, fallback, positions, trimmed, phase_ns, executions = now
        old_runs, old_rows, old_padded, old_fallback, old_positions, old_trimmed, old_phase_ns, old_executions = self._seen
        for metric, new, old in zip(self._phases, phase_ns, old_phase_ns or (0,) * len(phase_ns)):
            if new > old:
                metric.increment((new - old) / 1e9)
        if executions > old_executions:
            self._executions.increment(executions - old_executions)
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
