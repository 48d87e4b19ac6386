"""Runs a batch of requests: validate each, batch the compatible ones, run them through a runner, split.

A bad request fails alone: it is answered with its own error while the others in the same
batch still run. If a batched run fails, its requests are retried one by one, so one request
whose values the engine rejects cannot take its neighbours down with it. A request the engine fails that gives
two sizes to one dim name of the file is answered as the request's fault, naming both inputs.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Protocol, Sequence, Union

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.errors import GeBackendError, InvalidRequest
from gebackend.runtime import batching
from gebackend.runtime.phase_clock import PhaseClock
from gebackend.runtime.ragged import RaggedBatch
from gebackend.engines.base import Engine
from gebackend.runtime.runners import DynamicRunner, InternalError
from gebackend.runtime.validation import RequestValidator, broken_tie

Tensors = Mapping[str, np.ndarray]
Result = Union[dict, GeBackendError]  # the outputs of one request, or why it failed

__all__ = ["Executor", "InternalError", "Runner"]


class Runner(Protocol):
    def run(self, feeds: Tensors) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class Executor:
    def __init__(self, spec: ModelSpec, runner: Runner, trim: Callable[[Tensors], Tensors] | None = None):
        """`trim`: what a batch goes through before the runner (trim_padding's cut, runtime/padding_trim.py)."""
        self.spec = spec
        self.runner = runner
        self.trim = trim
        self.clock = PhaseClock()  # the engine's share here; the caller counts the rest of each execute()
        self._validator = RequestValidator(spec)
        ragged = spec.ragged
        self._ragged_inputs = ragged.ragged_inputs if ragged else frozenset()
        self._concat = RaggedBatch(ragged, spec.inputs[0].name).concat if ragged else batching.concat

    @classmethod
    def dynamic(cls, spec: ModelSpec, engine: Engine) -> "Executor":
        """An executor running `engine` in dynamic graph mode."""
        return cls(spec, DynamicRunner(spec.name, engine, [t.name for t in spec.outputs]))

    def execute(self, requests: Sequence[Tensors]) -> list[Result]:
        if len(requests) == 1:  # the common case at low load: no grouping (measured ~20 us per request in the stub)
            try:
                self._validator.check(requests[0])
            except InvalidRequest as exc:
                return [exc]
            return self._run_batched(requests)
        results: list[Result | None] = [None] * len(requests)
        runnable: list[int] = []
        for index, inputs in enumerate(requests):
            try:
                self._validator.check(inputs)
                runnable.append(index)
            except InvalidRequest as exc:
                results[index] = exc
        if self.spec.batching:
            for group in batching.group_compatible([requests[i] for i in runnable], self._ragged_inputs):
                members = [runnable[i] for i in group]
                for index, result in zip(members, self._run_group([requests[i] for i in members])):
                    results[index] = result
        else:
            for index in runnable:
                results[index] = self._run_batched([requests[index]])[0]
        return results  # type: ignore[return-value]

    def _run_group(self, group: Sequence[Tensors]) -> list[Result]:
        results = self._run_batched(group)
        if len(group) > 1 and isinstance(results[0], GeBackendError):
            return [self._run_batched([one])[0] for one in group]  # isolate the request at fault
        return results

    def _run_batched(self, group: Sequence[Tensors]) -> list[Result]:
        try:
            if not self.spec.batching:
                return [self._run(group[0])]
            feeds, sizes = self._concat(group)
            return batching.split(self._run(feeds), sizes)
        except GeBackendError as exc:
            if len(group) == 1 and isinstance(exc, InternalError):
                tie = broken_tie(self.spec, group[0])
                if tie is not None:  # the likely cause is the request's: say so, as a 400
                    return [InvalidRequest(f"{exc}; {tie}")]
            return [exc] * len(group)

    def _run(self, feeds: Tensors) -> dict[str, np.ndarray]:
        if self.trim is not None:
            feeds = self.trim(feeds)
        started = time.perf_counter_ns()
        try:
            return self.runner.run(feeds)
        finally:
            self.clock.engine(time.perf_counter_ns() - started)

    def close(self) -> None:
        self.runner.close()
