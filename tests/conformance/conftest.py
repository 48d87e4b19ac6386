"""The operator corpus starts with the test run and its tests run last: its worker processes, at the lowest CPU
priority, use the cores the other tests leave idle (a server starting, a client waiting), so by the time its tests
run most of the corpus is done."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import corpus

HERE = Path(__file__).parent


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they do
def pytest_collection_modifyitems(session, config, items):
    ours = [item for item in items if Path(item.path).parent == HERE and "results" in item.fixturenames]
    if not ours or config.option.collectonly:
        return
    items[:] = [item for item in items if item not in ours] + ours
    corpus.start_early()


def pytest_sessionfinish(session, exitstatus):
    corpus.cancel_early()  # a run stopped before the corpus's tests (-x, Ctrl-C) leaves no worker behind
