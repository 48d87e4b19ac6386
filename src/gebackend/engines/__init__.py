"""Graph engines behind one small interface (registered by name in `registry.py`), which one a model's options
name, and which execution providers an instance gets (registered by name in `providers/`)."""

from __future__ import annotations

from typing import Sequence

from gebackend.engines.base import Engine
from gebackend.engines.providers import Selection, select_providers
from gebackend.engines import registry
from gebackend.engines.registry import kind


def engine_name(choice) -> str:
    """The engine that runs a model's options (their `engines` group, config/option_groups.EngineChoice);
    `auto`: what `registry.auto` prefers for the precision on what is installed."""
    return registry.auto(choice.precision_mode) if choice.engine == "auto" else choice.engine


def create_engine(spec, providers: Sequence = ("CPUExecutionProvider",)) -> Engine:
    """The dynamic graph engine for a model."""
    return kind(engine_name(spec.options.engines)).dynamic(spec.path, spec.options, providers)


def create_static_engine(spec, graphs: Sequence, providers: Sequence = ("CPUExecutionProvider",), temp_parent=None) -> Engine:
    """The static graph engine for a model: one compiled graph per shape (bucket)."""
    return kind(engine_name(spec.options.engines)).static(graphs, spec.options, providers, spec.path, temp_parent)


__all__ = ["Engine", "Selection", "create_engine", "create_static_engine", "engine_name", "select_providers"]
