"""Starts the early work (tests/early.py) of every module the run selected."""

from __future__ import annotations

import inspect

import early


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    modules = dict.fromkeys(item.module for item in session.items if getattr(item, "module", None) is not None)
    early.start(f for module in modules for f in vars(module).values()
                if inspect.isfunction(f) and getattr(f, "early_work", False))


def pytest_sessionfinish(session, exitstatus):
    early.stop()
