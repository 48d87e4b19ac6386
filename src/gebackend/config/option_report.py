"""What the load log says about a model's options: unknown keys, ge-backend keys without an effect, ge-backend's
device keys, and the execution accelerators config.pbtxt asks for. Each line is written once per instance load."""

from __future__ import annotations

from typing import Any, Mapping

from gebackend.config.ge_keys import describe_no_effect, device_notes
from gebackend.config.options import ParsedOptions


def load_report(parsed: ParsedOptions, model_config: Mapping[str, Any], instance_kind: str = "CPU") -> list[tuple[bool, str]]:
    """(is_warning, line) pairs, in the order they should be logged."""
    options = parsed.options
    lines: list[tuple[bool, str]] = []
    if model_config.get("backend") == "onnxruntime":  # as the config says, or as Triton maps platform onnxruntime_onnx
        lines.append((False, "config.pbtxt names Triton's onnxruntime backend, which this server does not have: "
                             "served by ge, the config as it is (its keys as that backend reads them: docs/configs.md)"))
    if parsed.unknown:
        lines.append((True, f"unknown option(s) ignored: {', '.join(parsed.unknown)}"))
    if parsed.no_effect:
        lines.append((True, describe_no_effect(parsed.no_effect)))
    lines.extend((False, note) for note in device_notes(options, model_config, instance_kind))
    accelerators = options.engines.accelerators
    if accelerators.cpu:
        if parsed.sources.get("engine") == "optimization.execution_accelerators":
            effect = "selects engine=openvino"
        else:
            effect = f"the config.pbtxt parameter engine={options.engines.engine} wins"
        lines.append((False, f"cpu_execution_accelerator {', '.join(accelerators.cpu)}: {effect}"))
    if accelerators.gpu:
        described = ", ".join(a.describe() for a in accelerators.gpu)
        if instance_kind.upper().endswith("GPU"):
            lines.append((False, f"gpu_execution_accelerator {described}: selects the "
                                 f"{accelerators.gpu[0].name} execution provider (engines/providers/)"))
        else:  # as Triton's onnxruntime backend, which reads the GPU list for GPU instances only
            lines.append((False, f"gpu_execution_accelerator {described}: for KIND_GPU instances; this "
                                 f"{instance_kind.upper().replace('KIND_', '')} instance runs without it"))
    return lines
