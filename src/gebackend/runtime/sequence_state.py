"""Implicit state for stateful models: what a sequence's last request left in its output state feeds its next one.

Triton keeps implicit state for a backend that hands the output state back through its state API, which the
Python backend `ge` runs in does not have: Triton would feed every request of a sequence the initial state. So
each instance keeps its sequences' states itself (Triton's sequence batcher sends all requests of a sequence to
the same instance), keyed by correlation ID:

- a request flagged START runs on the initial state Triton put in the request (zeros, or `initial_state`'s data);
- any other request runs on the output state its sequence's previous request left here;
- after the run, the output state is kept (a copy: batched outputs are views, static graphs reuse buffers); a
  request flagged END drops it, and so does a sequence idle longer than Triton's `max_sequence_idle_microseconds`
  (Triton has released it by then);
- Triton's null requests (correlation ID 0, filling an idle slot of the direct strategy's batch) run on the state
  Triton gave them and leave nothing behind;
- a request whose sequence has no state here (this instance restarted since the sequence began) fails alone,
  saying to start the sequence again, rather than run on a state that is not its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from gebackend.config.sequence import SequenceSpec
from gebackend.errors import InvalidRequest

START, END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END

Tensors = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class SequenceKey:
    """What Triton says of a request's place in its sequence: `request.correlation_id()` and `request.flags()`."""

    correlation_id: int | str
    flags: int = 0

    @property
    def null(self) -> bool:
        return self.correlation_id in (0, "")


class SequenceStates:
    """The states of one instance's live sequences (for a `spec` with at least one state)."""

    def __init__(self, model: str, spec: SequenceSpec, clock: Callable[[], float] = time.monotonic):
        self.model = model
        self.spec = spec
        self.clock = clock
        self._states: dict[int | str, tuple[float, dict[str, np.ndarray]]] = {}  # corrid -> (last used, input states)
        self._swept = clock()

    def __len__(self) -> int:
        return len(self._states)

    def feed(self, batch: Sequence[Tensors], keys: Sequence[SequenceKey]) -> list[Tensors | InvalidRequest]:
        """Each request's feeds with its sequence's state in place of the one Triton sent, or why it cannot run."""
        self._sweep()
        fed: list[Tensors | InvalidRequest] = []
        for inputs, key in zip(batch, keys):
            if key.null or key.flags & START:
                fed.append(inputs)
                continue
            kept = self._states.get(key.correlation_id)
            if kept is None:
                fed.append(InvalidRequest(
                    f"model '{self.model}': sequence {key.correlation_id!r} has no state on this instance (the "
                    f"instance restarted after the sequence began, or the sequence was idle longer than "
                    f"max_sequence_idle_microseconds, {self.spec.idle_seconds:g} s); start it again with the START flag"))
                continue
            fed.append({**inputs, **kept[1]})
        return fed

    def keep(self, results: Sequence[object], keys: Sequence[SequenceKey]) -> list[object]:
        """Keep each sequence's output states for its next request; the results without the output states no
        client may request (those not listed in config.pbtxt `output`)."""
        now = self.clock()
        hidden = self.spec.hidden_outputs
        answered: list[object] = []
        for result, key in zip(results, keys):
            if not isinstance(result, Mapping):
                answered.append(result)  # failed: the sequence keeps the state it had
                continue
            if not key.null:
                if key.flags & END:
                    self._states.pop(key.correlation_id, None)
                else:
                    states = {s.input_name: np.array(result[s.output_name]) for s in self.spec.states}
                    self._states[key.correlation_id] = (now, states)
            answered.append({k: v for k, v in result.items() if k not in hidden} if hidden else result)
        return answered

    def _sweep(self) -> None:
        """Forget sequences idle longer than Triton keeps them (checked at most once per idle period)."""
        now = self.clock()
        if now - self._swept < self.spec.idle_seconds:
            return
        self._swept = now
        stale = [corrid for corrid, (used, _) in self._states.items() if now - used > 2 * self.spec.idle_seconds]
        for corrid in stale:
            del self._states[corrid]
