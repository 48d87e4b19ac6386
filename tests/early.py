"""Preparation a test module's fixture needs that is pure computation writing files (exporting models, choosing test
cases): a module-level function `f(folder)` marked `@early.work` is started when the test run starts, in a worker
process at the lowest CPU priority (tests/conftest.py), so it uses the cores the other tests leave idle. The fixture
takes the folder it wrote with `early.folder(f, here)`: waiting for it where it is still running, re-raising what
it raised, or running it into `here` there and then where the run did not start it (--collect-only, say)."""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from conformance.corpus import lower_priority

Work = Callable[[Path], None]

_started: dict[str, tuple] = {}  # key -> (the pool's result, the folder it writes)
_pool = None
_folders: list[Path] = []


def work(func: Work) -> Work:
    func.early_work = True
    return func


def _key(func: Work) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def start(funcs: Iterable[Work]) -> None:
    global _pool
    for func in funcs:
        if _key(func) in _started:
            continue
        if _pool is None:
            _pool = multiprocessing.get_context("spawn").Pool(1, initializer=lower_priority, initargs=(19,))
        out = Path(tempfile.mkdtemp(prefix="gebackend-early-"))
        _folders.append(out)
        _started[_key(func)] = (_pool.apply_async(func, (out,)), out)


def folder(func: Work, here: Path) -> Path:
    """The folder `func` wrote: the early run's, once finished, or `here`, written now."""
    started = _started.pop(_key(func), None)
    if started is None:
        here.mkdir(parents=True, exist_ok=True)
        func(here)
        return here
    result, out = started
    result.get()
    return out


def stop() -> None:
    """At the end of the run: no worker left behind, no folder either."""
    global _pool
    if _pool is not None:
        _pool.terminate()
        _pool.join()
        _pool = None
    _started.clear()
    for out in _folders:
        shutil.rmtree(out, ignore_errors=True)
    _folders.clear()
