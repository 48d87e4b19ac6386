"""The instance side of profiling: switch the engines' profilers on and off while serving, and record requests.

With `profiling=true` an instance profiles from load until it is unloaded. With `profiling=dynamic`
it watches a control file, `$GE_CONTROL_DIR/profile-<model>.json`, written by `gebackend profile
start|stop`: a daemon thread polls its modification time (one `stat` every 0.25 s), so requests never
wait on the control path, and a profiled session is built beside the serving one before they are
swapped, so no request is lost or stalled while profiling switches on or off.

Each instance writes its part of a capture under `<capture>/instances/<instance>/`: the engine's own
profile files, `sessions.json` (how to read them), `requests.json` (request boundaries) and a `done`
marker, which `gebackend profile stop` waits for before it renders the report.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from gebackend.engines.base import Engine
from gebackend.control.env import control_dir as server_control_dir

POLL_SECONDS = 0.25


def control_file(control_dir: Path, model: str) -> Path:
    return control_dir / f"profile-{model}.json"


def new_capture_dir(profiling_dir: str | Path, model: str) -> Path:
    return Path(profiling_dir).resolve() / model / time.strftime("%Y%m%d-%H%M%S")


class ProfilingControl:
    def __init__(
        self,
        model: str,
        instance: str,
        engines: Sequence[Engine],
        mode: str,
        profiling_dir: str,
        log: Callable[[str], None] = lambda m: None,
        control_dir: Path | None = None,
    ):
        self.model, self.instance, self.engines, self.log = model, instance, list(engines), log
        self.capture: Path | None = None
        self._requests: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen_id: str | None = None
        self._thread: threading.Thread | None = None
        if mode == "true":
            self.start(new_capture_dir(profiling_dir, model))
        elif mode == "dynamic":
            directory = control_dir or server_control_dir()
            if directory is None:
                log("profiling=dynamic needs `gebackend serve` (no control folder): profiling stays off")
            else:
                self._file = control_file(directory, model)
                self._thread = threading.Thread(target=self._watch, name=f"profiling-{instance}", daemon=True)
                self._thread.start()

    @property
    def active(self) -> bool:
        return self.capture is not None

    # -- control -------------------------------------------------------------------------------
    def _watch(self) -> None:
        mtime = None
        while not self._stop.wait(POLL_SECONDS):
            try:
                current = self._file.stat().st_mtime_ns
                if current == mtime:
                    continue
                mtime = current
                command = json.loads(self._file.read_text())
            except (OSError, ValueError):
                continue
            if command.get("id") == self._seen_id:
                continue
            self._seen_id = command.get("id")
            try:
                if command.get("command") == "start" and not self.active:
                    self.start(Path(command["capture"]))
                elif command.get("command") == "stop" and self.active:
                    self.stop()
            except Exception as exc:  # the control path must never take the instance down
                self.log(f"profiling command {command!r} failed: {type(exc).__name__}: {exc}")

    def start(self, capture: Path) -> None:
        folder = capture / "instances" / self.instance
        folder.mkdir(parents=True, exist_ok=True)
        for number, engine in enumerate(self.engines):
            engine.start_profiling(folder / f"ort-engine{number}")
        with self._lock:
            self._requests = []
            self.capture = capture
        (folder / "started").write_text(str(time.time()))
        self.log(f"profiling on, capturing into {capture}")

    def stop(self) -> Path | None:
        with self._lock:
            capture, self.capture = self.capture, None
            requests, self._requests = self._requests, []
        if capture is None:
            return None
        folder = capture / "instances" / self.instance
        sessions = [s for engine in self.engines for s in engine.stop_profiling()]
        for session in sessions:
            if session.file.parent != folder and session.file.exists():
                session.file = Path(session.file.replace(folder / session.file.name))
        (folder / "sessions.json").write_text(json.dumps([s.to_dict() for s in sessions], indent=1))
        (folder / "requests.json").write_text(json.dumps(requests))
        (folder / "done").write_text(str(time.time()))
        self.log(f"profiling off; {len(sessions)} session profile(s) and {len(requests)} executions written to {folder}")
        return capture

    # -- recording -----------------------------------------------------------------------------
    def record(self, start_ns: int, end_ns: int, requests: int, rows: int, errors: int) -> None:
        with self._lock:
            if self.capture is not None:
                self._requests.append({"start_ns": start_ns, "end_ns": end_ns, "requests": requests, "rows": rows, "errors": errors})

    def close(self) -> Path | None:
        self._stop.set()
        return self.stop()
