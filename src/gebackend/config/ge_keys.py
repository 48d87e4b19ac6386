"""Ascend ge-backend's option keys: which `ge.*` / `session.ge.*` / `graph.ge.*` keys mean something here, and
what its device keys (`device_ids`, `device_exec_blocks`, `instance_exec_blocks`) amount to on these engines.

What the peer does (hicann/triton-inference-server-ge-backend, src/model_state.cpp):
- `--backend-config npu_ge,KEY=VALUE` keys starting with `ge.` become GE initialisation options
  (ParseCmdlineConfig -> GEInitialize); any key containing `session.` or `graph.` (global or per model,
  SetOptions) has that prefix cut off and becomes a GE session option or a graph option (AddGraph):
  `session.ge.exec.precision_mode_v2` -> session option `ge.exec.precision_mode_v2`.
- `device_ids` ("4,5": the NPUs a model's execution blocks spread over; unset: every NPU),
  `device_exec_blocks` (blocks per device; unset: ceil(instances * instance_exec_blocks / devices)) and
  `instance_exec_blocks` (default 1) size its own scheduler: one GE session, stream and worker per block
  (ModelState::ProcessDeviceIdsConfig, ModelInstanceState::CalculateDeviceExecBlock).

The family keys with an equivalent are aliases in config/options.py (`ALIASES` here says which); every other
family key is accepted and reported once at load as having no effect on these engines, with a hint where one helps.
"""

from __future__ import annotations

from typing import Any, Mapping

from gebackend.config.instance_groups import instance_total

FAMILY_PREFIXES = ("ge.", "session.ge.", "graph.ge.")


def is_ge_family(key: str) -> bool:
    return key.startswith(FAMILY_PREFIXES)


def _levels(key: str) -> tuple[str, ...]:
    """A GE option under the three names ge-backend accepts: global (`ge.X`), session and graph."""
    return (key, f"session.{key}", f"graph.{key}")


# family key -> the option key it is an alias of (config/options.py parses it like that key).
ALIASES: dict[str, str] = {
    **{k: "ge.aicoreNum" for k in _levels("ge.aicoreNum")},  # "12|10": the first number counts
    **{k: "precision_mode" for k in _levels("ge.exec.precision_mode_v2")},
    **{k: "precision_mode_v1" for k in _levels("ge.exec.precision_mode")},
    **{k: "dump_data" for k in _levels("ge.exec.enableDump")},
    "graph.ge.inputShape": "graph.ge.inputShape",
    "graph.ge.dynamicDims": "graph.ge.dynamicDims",
    "graph.ge.dynamicNodeType": "graph.ge.dynamicNodeType",
}

# GE's precision_mode (v1) values, as the nearest precision_mode here.
PRECISION_V1 = {
    "force_fp32": "origin", "must_keep_origin_dtype": "origin",
    "force_fp16": "fp16", "allow_fp32_to_fp16": "fp16", "allow_mix_precision": "fp16",
    "allow_mix_precision_fp16": "fp16", "cube_fp16in_fp32out": "fp16", "force_lowerprecision": "fp16",
    "allow_mix_precision_bf16": "bf16",
}

# Hints for family keys without an effect, by the GE option name (the part after `session.` / `graph.`).
_HINTS = {
    "ge.exec.deviceId": "set the device with instance_group { kind, gpus }",
    "ge.session_device_id": "set the device with instance_group { kind, gpus }",
    "ge.graphRunMode": "these engines always run inference",
    "ge.exec.dumpPath": "dump_data writes under <profiling_dir>/<model>/dump/",
    "ge.exec.dumpMode": "dump_data writes every node's inputs and outputs",
    "ge.exec.dumpStep": "dump_data dumps the first request after load",
    "ge.exec.profilingMode": "use profiling=true or profiling=dynamic",
    "ge.exec.profilingOptions": "use profiling=true or profiling=dynamic",
    "ge.dynamicBatchSize": "use graph.ge.inputShape with graph.ge.dynamicDims",
    "ge.dynamicImageSize": "use graph.ge.inputShape with graph.ge.dynamicDims",
    "ge.exec.op_precision_mode": "use precision_mode",
    "ge.exec.modify_mixlist": "use precision_mode",
    "ge.opSelectImplmode": "use precision_mode",
}


def hint(key: str) -> str:
    """What to use instead of a family key without an effect ('' when nothing here is close)."""
    name = key.split(".", 1)[1] if key.startswith(("session.", "graph.")) else key
    return _HINTS.get(name, "")


def describe_no_effect(keys: tuple[str, ...]) -> str:
    shown = [f"{k} ({hint(k)})" if hint(k) else k for k in keys]
    return "ge-backend option(s) accepted, no effect on this engine: " + ", ".join(shown)


def instance_count(model_config: Mapping[str, Any]) -> int:
    """How many instances Triton runs (`instance_groups.instance_total`)."""
    return instance_total(model_config.get("instance_group"))


def exec_blocks(instances: int, devices: int, instance_exec_blocks: int = 1, device_exec_blocks: int = -1) -> int:
    """ge-backend's execution blocks per device (CalculateDeviceExecBlock)."""
    if device_exec_blocks != -1:
        return device_exec_blocks
    return (instances * instance_exec_blocks + devices - 1) // max(devices, 1)


def device_notes(options: Any, model_config: Mapping[str, Any], instance_kind: str = "CPU") -> list[str]:
    """The load-log lines for ge-backend's device keys: what ge-backend would do, and what happens here."""
    notes = []
    on_cpu = not instance_kind.upper().endswith("GPU")
    instances = options.instances
    if instances.device_ids:
        ids = ",".join(map(str, instances.device_ids))
        if options.engines.execution_provider == "cann":
            where = "execution_provider=cann: instance i runs on NPU device_ids[i % count]"
        elif on_cpu:
            where = "this instance runs on the CPU, so they select nothing (execution_provider=cann runs on them)"
        else:
            where = "Triton places GPU instances (instance_group { gpus: [...] }), so they select nothing"
        notes.append(f"device_ids {ids} (ge-backend: the NPUs the model spreads over): {where}")
    if instances.device_exec_blocks != -1 or instances.instance_exec_blocks != 1:
        count = instance_count(model_config)
        devices = len(instances.device_ids) or 1
        blocks = exec_blocks(count, devices, instances.instance_exec_blocks, instances.device_exec_blocks)
        set_keys = ", ".join(
            [f"device_exec_blocks={instances.device_exec_blocks}"] * (instances.device_exec_blocks != -1)
            + [f"instance_exec_blocks={instances.instance_exec_blocks}"] * (instances.instance_exec_blocks != 1))
        notes.append(
            f"{set_keys}: ge-backend would run {blocks} execution block(s) on each of {devices} device(s); here each "
            f"Triton instance runs one engine, so instance_group count ({count}) sets how many run at once")
    return notes
