"""Runs a batch of requests in dynamic graph mode: validate each, batch the compatible ones, run, split.

A bad request fails alone: it is answered with its own error while the others in the same
batch still run. If a batched run fails, its requests are retried one by one, so one request
whose values the engine rejects cannot take its neighbours down with it.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.engines.base import Engine, EngineInputError, EngineRunError
from gebackend.errors import GeBackendError, InvalidRequest
from gebackend.runtime import batching
from gebackend.runtime.validation import validate_request

Tensors = Mapping[str, np.ndarray]
Result = Union[dict, GeBackendError]  # the outputs of one request, or why it failed


class InternalError(GeBackendError):
    """The server's fault, not the request's (HTTP 500)."""


class Executor:
    def __init__(self, spec: ModelSpec, engine: Engine):
        self.spec = spec
        self.engine = engine
        self._output_names = [t.name for t in spec.outputs]

    def execute(self, requests: Sequence[Tensors]) -> list[Result]:
        results: list[Result | None] = [None] * len(requests)
        runnable: list[int] = []
        for index, inputs in enumerate(requests):
            try:
                validate_request(self.spec, inputs)
                runnable.append(index)
            except InvalidRequest as exc:
                results[index] = exc
        if self.spec.batching:
            groups = batching.group_compatible([requests[i] for i in runnable])
            for group in groups:
                members = [runnable[i] for i in group]
                for index, result in zip(members, self._run_group([requests[i] for i in members])):
                    results[index] = result
        else:
            for index in runnable:
                results[index] = self._run_one(requests[index])
        return results  # type: ignore[return-value]

    def _run_group(self, group: Sequence[Tensors]) -> list[Result]:
        if len(group) == 1:
            return [self._run_batched(group)[0]]
        results = self._run_batched(group)
        if isinstance(results[0], GeBackendError):
            return [self._run_batched([one])[0] for one in group]  # isolate the request at fault
        return results

    def _run_batched(self, group: Sequence[Tensors]) -> list[Result]:
        feeds, sizes = batching.concat(group)
        try:
            outputs = self._run(feeds)
            return batching.split(outputs, sizes)
        except GeBackendError as exc:
            return [exc] * len(group)

    def _run_one(self, inputs: Tensors) -> Result:
        try:
            return self._run(inputs)
        except GeBackendError as exc:
            return exc

    def _run(self, feeds: Tensors) -> dict[str, np.ndarray]:
        try:
            arrays = self.engine.run(feeds, self._output_names)
        except EngineInputError as exc:
            raise InvalidRequest(f"model '{self.spec.name}' cannot run this request: {exc}") from None
        except EngineRunError as exc:
            raise InternalError(f"model '{self.spec.name}' failed while running: {exc}") from None
        return dict(zip(self._output_names, arrays))

    def close(self) -> None:
        self.engine.close()
