"""Where an instance's `execute()` time goes: nanoseconds per phase, summed since load.

- `read`: Triton's request tensors turned into numpy arrays (triton/bridge.py);
- `prepare`: gebackend's own work around the engine: checking each request, filling optional inputs, concatenating a
  batch, splitting the outputs per request (runtime/executor.py and what calls it);
- `engine`: the engine's runs, buckets and padding included (runtime/executor.py);
- `respond`: the outputs turned into Triton's response tensors.

Triton's statistics time the same call from outside (`compute_infer` of each execution: in the Python backend, from
tritonserver handing the batch to the stub to the responses coming back); what they count beyond these four phases is
the transport between tritonserver and the stub. Published as `gebackend_execute_seconds_total{model,phase}` and
`gebackend_executions_total{model}` (triton/metrics.py); `bench/serving_path.py` reads both.
"""

from __future__ import annotations

PHASES = ("read", "prepare", "engine", "respond")


class PhaseClock:
    """Counters only: one instance runs one `execute()` at a time, and a reader (the metrics thread) takes them as
    they are."""

    __slots__ = ("ns", "executions")

    def __init__(self) -> None:
        self.ns = dict.fromkeys(PHASES, 0)
        self.executions = 0

    def engine(self, ns: int) -> None:
        self.ns["engine"] += ns

    def execution(self, read_ns: int, call_ns: int, engine_ns: int, respond_ns: int) -> None:
        """One `execute()`: `call_ns` the instance's part, of which `engine_ns` the engine's (counted by `engine`)."""
        self.ns["read"] += read_ns
        self.ns["prepare"] += max(0, call_ns - engine_ns)
        self.ns["respond"] += respond_ns
        self.executions += 1

    def seconds(self) -> dict[str, float]:
        return {phase: ns / 1e9 for phase, ns in self.ns.items()}
