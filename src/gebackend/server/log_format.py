"""How `gebackend serve` writes its log for a collector: `--log-format`.

Logs. `--log-format iso8601` (the image sets `GE_LOG_FORMAT=iso8601`) makes every event one line starting
`YYYY-MM-DDThh:mm:ssZ L PID SOURCE] "message"`: tritonserver writes its own lines so (`--log-format=ISO8601`),
and gebackend's own lines are rewritten to match with SOURCE `gebackend`; a multi-line message of ours (the
start-up report) becomes one event with `\\n` inside the quoted message. Lines that do not start with a timestamp
(Triton's tables, a Python traceback) continue the event before them.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from typing import Callable, Mapping

from gebackend.server.repository_client import flag_values

LOG_FORMATS = ("default", "iso8601")
LOG_FORMAT_ENV_VAR = "GE_LOG_FORMAT"


# -- logs ----------------------------------------------------------------------------------------------------
_STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWEV] ")
_OURS = "gebackend: "
# gebackend's own messages on stdout that report something gone wrong (the watchdog, a crashed server, a reload)
_WARNING = re.compile(r"died|hung|unexpectedly|failed|could not|cannot|cut off|was killed|not restored|still waiting")


class EventLines(io.TextIOBase):
    """A text stream that writes gebackend's own lines as one-line events in tritonserver's ISO8601 format.

    `gebackend: message` lines (and the indented lines printed with them, in the same write) become
    `2026-01-02T03:04:05Z I 42 gebackend] "message\\n  more"`; lines already stamped (tritonserver's) and other
    lines pass unchanged. Writes are gathered per thread until a newline, so a `print()` is one unit.
    """

    def __init__(self, stream, level: str = "I", clock: Callable[[], float] = time.time, pid: int | None = None):
        super().__init__()
        self._stream, self._level, self._clock = stream, level, clock
        self._pid = os.getpid() if pid is None else pid
        self._pending: dict[int, str] = {}
        self._lock = threading.Lock()

    # what code that writes to sys.stdout may ask
    @property
    def encoding(self):  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        key = threading.get_ident()
        with self._lock:
            buffered = self._pending.pop(key, "") + text
            if not buffered.endswith("\n"):
                self._pending[key] = buffered
                return len(text)
            self._stream.write(self.format(buffered))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    def close_pending(self) -> None:
        """Write what is still waiting for its newline (at exit)."""
        with self._lock:
            for key in list(self._pending):
                self._stream.write(self.format(self._pending.pop(key) + "\n"))
            self._stream.flush()

    def format(self, text: str) -> str:
        out: list[str] = []
        event: list[str] | None = None

        def close() -> None:
            nonlocal event
            if event is not None:
                message = "\n".join(event)
                level = self._level
                if level == "I" and _WARNING.search(event[0]):
                    level = "W"
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock()))
                out.append(f"{stamp} {level} {self._pid} gebackend] {json.dumps(message, ensure_ascii=False)}\n")
                event = None

        for line in text.split("\n")[:-1]:
            if line.startswith(_OURS):
                close()
                event = [line[len(_OURS):]]
            elif event is not None and line[:1] in (" ", "\t"):
                event.append(line)
            else:
                close()
                out.append(line + "\n")
        close()
        return "".join(out)


def log_format_default(environ: Mapping[str, str] = os.environ) -> str:
    value = environ.get(LOG_FORMAT_ENV_VAR, "default").strip().lower() or "default"
    return value if value in LOG_FORMATS else "default"


def apply_log_format(log_format: str, extra_args: list[str], install: bool = True) -> list[str]:
    """For `iso8601`: stamp our own lines (sys.stdout / sys.stderr, unless not `install`) and ask tritonserver for
    the same format, unless its own `--log-format` is among `extra_args`. Returns the tritonserver arguments."""
    import sys

    if log_format != "iso8601":
        return extra_args
    if install and not isinstance(sys.stdout, EventLines):
        import atexit

        sys.stdout = EventLines(sys.stdout, "I")
        sys.stderr = EventLines(sys.stderr, "E")
        for stream in (sys.stdout, sys.stderr):
            atexit.register(stream.close_pending)
    if flag_values(extra_args, "--log-format"):
        return extra_args
    return [*extra_args, "--log-format=ISO8601"]


