"""Triton's per-model statistics (`GET /v2/models/<model>/stats`) around a measurement: where an ensemble's time goes.

Triton counts per model, cumulatively since it loaded: the requests that succeeded and their time in the model
(`success`), their time in its queue (`queue`) and in the three compute phases (`compute_input`, `compute_infer`,
`compute_output`), each summed over requests; the executions (`execution_count`: batches) and inferences
(`inference_count`: items); and per batch size (`batch_stats`) each execution's compute time once. A batch of n
requests adds its compute time n times to `inference_stats`, once to `batch_stats`. So, from the difference of two
snapshots (`delta`):

- per request (`breakdown`): each step's mean queue and compute time per request and the ensemble's own time per
  request (Triton's `success` of the ensemble: from its arrival to its last step's end); the **latency share** of
  a step is its queue + compute per request over the ensemble's time per request. (The steps' times do not add
  up to the ensemble's exactly: their counted times overlap the hand-offs between them, and measured here they
  summed to between 1 % less and 9 % more than the ensemble's own, so no "scheduler overhead" is derived);
- busy time: the sum of a step's execution times from `batch_stats`, what its instances spent computing; the
  **work share** of a step is its busy time over the composing models' together.

The snapshots are taken before and after each perf_analyzer run, so a difference covers that whole run (its
warm-up and every stabilisation window): right for means and shares, not for a rate.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Mapping, Sequence

PHASES = ("compute_input", "compute_infer", "compute_output")
COUNTERS = ("requests", "failed", "inferences", "executions", "success_ns", "queue_ns", "compute_input_ns",
            "compute_infer_ns", "compute_output_ns", "busy_ns")


class StatsError(RuntimeError):
    pass


def fetch(http_url: str, model: str, timeout: float = 10.0) -> dict:
    """The statistics JSON of every version of `model` from a server's HTTP endpoint (host:port)."""
    url = f"http://{http_url}/v2/models/{model}/stats"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise StatsError(f"GET {url} failed: {exc}") from None


def counters(stats: Mapping) -> dict[str, int]:
    """One model's cumulative counters (every version summed) out of its `/stats` JSON."""
    out = dict.fromkeys(COUNTERS, 0)
    for entry in stats.get("model_stats") or []:
        inference = entry.get("inference_stats") or {}

        def ns(key: str) -> int:
            return int((inference.get(key) or {}).get("ns", 0))

        out["requests"] += int((inference.get("success") or {}).get("count", 0))
        out["failed"] += int((inference.get("fail") or {}).get("count", 0))
        out["inferences"] += int(entry.get("inference_count", 0))
        out["executions"] += int(entry.get("execution_count", 0))
        out["success_ns"] += ns("success")
        out["queue_ns"] += ns("queue")
        for phase in PHASES:
            out[f"{phase}_ns"] += ns(phase)
        for batch in entry.get("batch_stats") or []:
            out["busy_ns"] += sum(int((batch.get(phase) or {}).get("ns", 0)) for phase in PHASES)
    return out


def snapshot(http_url: str, models: Sequence[str]) -> dict[str, dict[str, int]]:
    return {model: counters(fetch(http_url, model)) for model in models}


def delta(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """after - before, per model and counter (a model missing from `before` counts from zero)."""
    return {model: {k: int(v) - int((before.get(model) or {}).get(k, 0)) for k, v in values.items()}
            for model, values in after.items()}


def _per(total: float, count: float) -> float | None:
    return total / count if count else None


def step(values: Mapping[str, int]) -> dict:
    """One model's means over a difference: per request (microseconds) and per execution."""
    requests = values.get("requests", 0)
    compute_ns = sum(values.get(f"{phase}_ns", 0) for phase in PHASES)
    queue_us = _per(values.get("queue_ns", 0) / 1000, requests)
    compute_us = _per(compute_ns / 1000, requests)
    return {
        "requests": requests, "failed": values.get("failed", 0), "executions": values.get("executions", 0),
        "avg_batch": _per(values.get("inferences", 0), values.get("executions", 0)),
        "queue_us": queue_us, "compute_us": compute_us,
        "compute_infer_us": _per(values.get("compute_infer_ns", 0) / 1000, requests),
        "time_us": None if queue_us is None else queue_us + compute_us,  # queue + compute per request
        "success_us": _per(values.get("success_ns", 0) / 1000, requests),  # in the model, per request
        "busy_ms": values.get("busy_ns", 0) / 1e6,
    }


def breakdown(diff: Mapping[str, Mapping[str, int]], ensemble: str, steps: Sequence[str]) -> dict:
    """Where an ensemble's requests spent their time, step by step, with each step's latency and work share.

    `steps` are the composing models in order. Returns {"ensemble": {...}, "steps": {name: {...,
    "latency_share", "work_share"}}}; shares are fractions (None where nothing was counted).
    """
    top = step(diff.get(ensemble) or {})
    per_step = {name: step(diff.get(name) or {}) for name in steps}
    e2e = top["success_us"]
    busy_total = sum(s["busy_ms"] for s in per_step.values())
    for s in per_step.values():
        s["latency_share"] = None if e2e is None or s["time_us"] is None else s["time_us"] / e2e
        s["work_share"] = s["busy_ms"] / busy_total if busy_total else None
    return {"ensemble": top, "steps": per_step}
