"""Profiling output: reading a capture folder and rendering it for people.

`report` owns the capture-folder contract (``instances/<name>/{*.json, sessions.json, requests.json}``),
its parsing (`load_capture`, `op_rows`) and the text/CSV/trace outputs (`render`); `plot` owns the PNG
charts and is imported on demand, because matplotlib is an optional dependency.
"""

from .report import Capture, OpRow, Request, Run, Session, load_capture, op_rows, render

__all__ = ["Capture", "OpRow", "Request", "Run", "Session", "load_capture", "op_rows", "render"]
