"""config.pbtxt of a candidate, and the winner's: the original config's name, inputs, outputs and other settings
kept as they were, `backend: "ge"`, and the keys the tuner chose written after them, each with a `#` comment
above it saying what it does and why it was chosen (the measured ratio to the best alternative: `explain`).

The same writer makes every measured candidate's config, so the winner's file is the config that was measured
(plus comments). The original is parsed with Triton's ModelConfig protobuf (tritonclient's model_config_pb2, as
gebackend.config.pbtxt does) and written back with protobuf's text format; the tuner's own keys are removed from
it first (with their ge-backend aliases), so that nothing the tuner chose is said twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from google.protobuf import text_encoding, text_format

from gebackend.bench import scenarios as bench_scenarios
from gebackend.tune.space import PRECISIONS, Candidate
from gebackend.tune.tuned_model import TunedModel

_PRECISION_ALIASES = ("precision_mode", "ge.exec.precision_mode_v2", "ge.exec.precision_mode")
_CORE_ALIASES = ("cores_per_instance", "ge.aicoreNum")
TUNED_KEYS = frozenset(
    {"static_model", "graph.ge.inputShape", "graph.ge.dynamicDims", "bucket_fallback", "bucket_paddable_dims", "engine",
     "intra_op_thread_count", "pin_instances"}
    | {f"{prefix}{key}" for key in (*_PRECISION_ALIASES, *_CORE_ALIASES) for prefix in ("", "session.", "graph.")}
    | {key for rung in PRECISIONS for key, _ in rung.parameters})

PATH_KEYS = frozenset({"calibration_data"})  # kept parameters naming a file relative to the model folder
WHAT = {  # what each chosen key does, the first line of its comment
    "engine": "the graph engine that runs the model",
    "precision_mode": "the precision the model is lowered to at load",
    "static_model": "compile one graph per batch bucket at load (1: static shapes) or run one dynamic graph (0)",
    "graph.ge.inputShape": "the bucket template: every input's shape with -1 for the batch dim",
    "graph.ge.dynamicDims": "the batch buckets compiled (a request batch is padded up to the nearest; larger ones are split)",
    "bucket_paddable_dims": "the named dim a request is zero-padded along up to its bucket's length (checked at load: "
                            "not padded where the model's answer moves)",
    "bucket_fallback": "a batch no bucket holds (inputs of other dims than the buckets': the variable dims were compiled "
                       "as your requests sent them) runs on the dynamic graph instead of failing",
    "instance_group": "how many model instances (processes) serve requests in parallel",
    "cores_per_instance": "each instance pinned to its own cores, this many",
    "intra_op_thread_count": "engine threads inside one instance (one per pinned core)",
    "dynamic_batching": "Triton's dynamic batcher gathers waiting requests into one batch",
    "preferred_batch_size": "batch sizes the batcher sends at once (aligned with the buckets)",
    "max_queue_delay_microseconds": "how long the batcher holds a request waiting for company",
    "calibration_data": "static int8 calibrated on your requests (--input-data), not on seeded random samples",
    "trim_padding": "each batch cut to its longest request's tokens before the engine runs it (your requests are padded; "
                    "checked at load: served uncut if the outputs move)",
}
# the dimension (space.DIMENSIONS) whose measured reason each key's comment gives
DIMENSION_OF = {"engine": "numerics", "precision_mode": "numerics", "calibration_data": "numerics",
                "static_model": "graph", "graph.ge.inputShape": "graph", "graph.ge.dynamicDims": "graph", "bucket_fallback": "graph", "bucket_paddable_dims": "graph",
                "instance_group": "instances", "cores_per_instance": "instances",
                "intra_op_thread_count": "instances", "dynamic_batching": "delay", "preferred_batch_size": "delay",
                "max_queue_delay_microseconds": "delay"}


def _message(model: TunedModel):
    from tritonclient.grpc import model_config_pb2

    message = model_config_pb2.ModelConfig()
    text_format.Parse(model.config_text, message)
    if not message.name:
        message.name = model.name
    return message


def _parameter(key: str, value: str) -> str:
    key, value = (text_encoding.CEscape(v, as_utf8=True) for v in (key, value))
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'


def _comment(lines: list[str], text: str) -> None:
    for line in text.splitlines():
        lines.append(f"# {line}".rstrip())


def chosen_parameters(model: TunedModel, cand: Candidate) -> dict[str, str]:
    """The backend parameters a candidate sets (the bench's own mapping, plus its rung's extra parameters), with
    engine, precision_mode and static_model always spelled out."""
    params = {"engine": cand.scenario.engine, "precision_mode": cand.rung.precision_mode,
              "static_model": "1" if cand.scenario.static else "0"}
    params.update(bench_scenarios.parameters(model.bench_model(), cand.scenario))
    if cand.scenario.static and model.sent_dims:
        params.update(model.length_buckets(cand.scenario.buckets))  # requests of several lengths: each padded up
        params["bucket_fallback"] = "dynamic"  # buckets at the dims requests sent: others still served
    params.update(dict(cand.rung.parameters))
    if model.calibration and cand.rung.calibrated:
        params["calibration_data"] = model.calibration  # calibrated on the requests it was measured with
    return params


def config_text(model: TunedModel, cand: Candidate, reasons: Mapping[str, str] | None = None,
                header: Sequence[str] = ()) -> str:
    """The config.pbtxt that serves `cand` (`reasons`: dimension -> the measured reason, for the comments)."""
    if cand.kind == "baseline":
        return cand.config_text
    reasons = reasons or {}
    message = _message(model)
    peer = cand.kind == "peer"
    message.backend = cand.scenario.backend
    message.ClearField("platform")
    message.ClearField("instance_group")
    message.ClearField("dynamic_batching")
    for key in list(message.parameters):
        if peer or key in TUNED_KEYS:
            del message.parameters[key]
    if model.max_batch_size and not message.max_batch_size:
        message.max_batch_size = model.max_batch_size  # what the backend would fill in, said explicitly
    kept = {key: value.string_value for key, value in message.parameters.items()}
    message.ClearField("parameters")
    for key in PATH_KEYS & set(kept):  # relative to the model folder: the candidate's folder is elsewhere
        if kept[key] and not Path(kept[key]).is_absolute():
            kept[key] = str((model.dir / kept[key]).resolve())
    lines = [f"# {h}" for h in header]
    lines.append(text_format.MessageToString(message).rstrip())
    if kept:
        lines.append("# kept from your config")
        lines += [_parameter(key, value) for key, value in kept.items()]
    if peer:
        lines.append("instance_group [ { kind: KIND_CPU, count: 1 } ]")
        if cand.scenario.dynamic_batching:
            lines.append("dynamic_batching { }")
        return "\n".join(lines) + "\n"

    explained: set[str] = set()

    def why(key: str) -> str:
        """What the key does, and the measured reason of its dimension (said at its dimension's first key only)."""
        dim = DIMENSION_OF.get(key, key)
        reason = "" if dim in explained else reasons.get(dim, "")
        if reason:
            explained.add(dim)
        return WHAT.get(key, key) + (f"\n  chosen: {reason}" if reason else "")

    s = cand.scenario
    lines.append("")
    _comment(lines, f"instance_group count={s.instances}: " + why("instance_group"))
    lines.append(f"instance_group [ {{ kind: KIND_CPU, count: {s.instances} }} ]")
    if s.dynamic_batching:
        _comment(lines, "dynamic_batching: " + WHAT["dynamic_batching"])
        lines.append("dynamic_batching {")
        if s.preferred_batch_sizes:
            lines.append(f"  # preferred_batch_size: {WHAT['preferred_batch_size']}")
            lines.append(f"  preferred_batch_size: [ {', '.join(str(b) for b in s.preferred_batch_sizes)} ]")
        delay = why("max_queue_delay_microseconds")
        lines += [f"  # {line}".rstrip() for line in f"max_queue_delay_microseconds={s.max_queue_delay_us}: {delay}".splitlines()]
        lines.append(f"  max_queue_delay_microseconds: {s.max_queue_delay_us}")
        lines.append("}")
    for key, value in chosen_parameters(model, cand).items():
        text = why(key) if key in WHAT else f"set by the precision rung {cand.rung.name}"
        _comment(lines, f"{key}={value}: {text}")
        lines.append(_parameter(key, value))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ reasons
def _screened(outcome) -> float | None:
    return outcome.screen.throughput if outcome.screen is not None else None


def explain(winner, outcomes: Sequence, concurrency: int) -> dict[str, str]:
    """dimension -> why the winner's value: its throughput over the best measured candidate that differs from it
    in that dimension (one that differs in nothing else when there is one, else in the fewest other dimensions, and
    then the reason says which), both from their screening windows (the
    one measurement every candidate has, made the same way). `winner` and `outcomes` are outcome.Outcome objects
    (anything with .candidate, .screen, .status and .cosine)."""
    mine = winner.candidate.choices()
    out = {}
    measured = [o for o in outcomes if o.candidate.kind == "candidate" and _screened(o)]
    for dim in mine:
        others = [o for o in measured if o.candidate.choices()[dim] != mine[dim]]
        if not others:
            rejected = [o for o in outcomes if o.candidate.kind == "candidate" and o.status.startswith("rejected")
                        and o.candidate.choices()[dim] != mine[dim]]
            out[dim] = (f"{rejected[0].candidate.describe(dim)} {rejected[0].status}" if rejected
                        else "no alternative was measured (pruned or out of time)")
            continue
        def also(o) -> list[str]:  # the other dimensions in which `o` differs from the winner
            return [d for d in mine if d != dim and o.candidate.choices()[d] != mine[d]]

        # the twin (differing in nothing else) where there is one, else the nearest measured: fewest other differences
        fewest = min(len(also(o)) for o in others)
        best = max((o for o in others if len(also(o)) == fewest), key=_screened)
        ratio = _screened(winner) / _screened(best)
        what = best.candidate.describe(dim)
        where = "" if not fewest else (f"; no twin measured, nearest: {best.candidate.label}, which also differs in "
                                       f"{', '.join(also(best))}")
        out[dim] = f"{ratio:.2f}x {what} at concurrency {concurrency} on this CPU (screening{where})"
        if dim == "numerics" and winner.cosine is not None:
            out[dim] += f"; cosine to fp32 {winner.cosine:.6f}"
    return out
