"""`gebackend profile start|stop|report`: switch profiling on and off on a running server, and render captures.

The control path is a file per model in the server's control folder (found through the registry
of running servers by HTTP port); every instance of the model polls it. Files rather than requests:
an inference request reaches one instance only, and a file needs no extra port, no restart and
no change to the request path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from gebackend.errors import GeBackendError
from gebackend.profiling.control import control_file, new_capture_dir
from gebackend.control.registry import control_dir_for

WAIT_SECONDS = 60.0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="profile a running server (models with profiling=dynamic)")
    actions = p.add_subparsers(dest="action", required=True)
    for action, text in (("start", "switch profiling on"), ("stop", "switch profiling off and write the report")):
        a = actions.add_parser(action, help=text)
        a.add_argument("--model", action="append", help="model name (repeatable); default: every ready model")
        a.add_argument("--url", default="localhost:8000", help="the server's HTTP address (default localhost:8000)")
        a.set_defaults(func=run)
    actions.choices["start"].add_argument("--out", default="profiling", help="captures go to OUT/<model>/<timestamp>/")
    r = actions.add_parser("report", help="re-render the summary and plots of a capture folder")
    r.add_argument("capture", type=Path)
    r.set_defaults(func=run)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1]) if ":" in url else 8000


def _ready_models(url: str) -> list[str]:
    request = urllib.request.Request(f"http://{url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return [e["name"] for e in json.loads(response.read()) if e.get("state") == "READY"]


def _instances(capture: Path, marker: str) -> set[str]:
    return {p.parent.name for p in (capture / "instances").glob(f"*/{marker}")}


def _wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start(url: str, models: list[str], out: str) -> int:
    control = control_dir_for(_port(url))
    started_any = False
    for model in models:
        capture = new_capture_dir(out, model)
        control_file(control, model).write_text(json.dumps({"command": "start", "capture": str(capture), "id": uuid.uuid4().hex}))
        if _wait(lambda: bool(_instances(capture, "started")), 10.0 if len(models) == 1 else 3.0):
            print(f"profiling {model}: on, {len(_instances(capture, 'started'))} instance(s) capturing into {capture}")
            started_any = True
        elif len(models) == 1:
            print(f"gebackend: model '{model}' did not start profiling; does its config set profiling=dynamic?", file=sys.stderr)
    return 0 if started_any else 1


def stop(url: str, models: list[str]) -> int:
    from gebackend.profiling.plot import plot_top_ops
    from gebackend.profiling.render import render

    control = control_dir_for(_port(url))
    code = 0
    for model in models:
        path = control_file(control, model)
        try:
            command = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if command.get("command") != "start":
            continue
        capture = Path(command["capture"])
        path.write_text(json.dumps({"command": "stop", "capture": str(capture), "id": uuid.uuid4().hex}))
        if not _wait(lambda: _instances(capture, "started") <= _instances(capture, "done"), WAIT_SECONDS):
            print(f"gebackend: model '{model}': some instances did not finish writing within {WAIT_SECONDS:.0f}s", file=sys.stderr)
            code = 1
        written = render(capture)
        plot_top_ops(capture)
        print(f"profiling {model}: off; report in {capture}")
        for name, file in written.items():
            print(f"  {name}: {file}")
    return code


def run(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        if args.action == "report":
            from gebackend.profiling.plot import plot_timeline, plot_top_ops
            from gebackend.profiling.render import render

            written = render(args.capture)
            plot_top_ops(args.capture)
            plot_timeline(args.capture)
            print(Path(written["summary"]).read_text())
            return 0
        models = args.model or _ready_models(args.url)
        return start(args.url, models, args.out) if args.action == "start" else stop(args.url, models)
    except (GeBackendError, OSError) as exc:
        print(f"gebackend profile {args.action}: {exc}", file=sys.stderr)
        return 2
