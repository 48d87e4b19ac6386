"""Profiling output: reading a capture folder and rendering it for people.

`report` owns the capture-folder contract (``instances/<name>/{*.json, sessions.json, requests.json}``) and
its parsing (`load_capture`, `op_rows`, the trace events); `render` writes the text/CSV/trace outputs; `plot` owns the PNG
charts and is imported on demand, because matplotlib is an optional dependency.
"""

from .render import render
from .report import Capture, OpRow, Request, Run, Session, load_capture, op_rows

__all__ = ["Capture", "OpRow", "Request", "Run", "Session", "load_capture", "op_rows", "render"]
