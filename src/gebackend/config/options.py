"""Backend options: the known keys and their parsers, and how the global and per-model sources merge.

The typed options and their defaults, grouped by the part that reads them, are `BackendOptions` in
config/option_groups.py (imported from here too).

Options reach a model from two places, merged in this order (later wins):
1. global: `gebackend serve --backend-config ge,KEY=VALUE` (also `npu_ge,`), carried to the backend
   process as JSON in the environment variable `GE_BACKEND_CONFIG` (Triton drops `--backend-config`
   for Python-based backends before it reaches `model.py`);
2. per model: `parameters { key: "KEY" value: { string_value: "VALUE" } }` in config.pbtxt.

config.pbtxt's own sections that Triton's onnxruntime backend reads sit between the two: `optimization
{ graph { level } }` (graph_optimization_level) and `optimization { execution_accelerators }`
(config/accelerators.py; `openvino` on the CPU selects engine=openvino) beat a global option and lose to a
per-model parameter.

Keys follow Triton's onnxruntime_backend where it has them; Ascend ge-backend's keys are accepted
under their own names (config/ge_keys.py: its `ge.*` / `session.ge.*` / `graph.ge.*` keys with an
equivalent are aliases, the others are returned as accepted without effect). Unknown keys are returned
so the caller reports them once at load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from gebackend.config.accelerators import parse_accelerators
from gebackend.config.ge_keys import ALIASES, PRECISION_V1, is_ge_family
from gebackend.config.option_groups import BackendOptions
from gebackend.control import env
from gebackend.config import arena_shrinkage, engine_names
from gebackend.errors import ConfigError

ENV_VAR = env.BACKEND_CONFIG  # the server-wide options the CLI passes (control/env.py)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")


def _one_or_zero(text: str) -> str:
    """A boolean ONNX Runtime session config entry: "1" or "0" (the peer hands the text as is, which ORT reads as on
    only when it is "1"; "true" here means on, as everywhere else in these options)."""
    return "1" if _bool(text) else "0"


def _non_negative_int(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def _cosine_bound(text: str) -> float:
    value = float(text.strip())
    if not 0 <= value <= 1:
        raise ValueError("expected a cosine similarity between 0 and 1")
    return value


def _non_negative_seconds(text: str) -> float:
    value = float(text.strip())
    if not value >= 0:  # also refuses nan
        raise ValueError("expected a number of seconds >= 0")
    return value


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _trim_padding(text: str) -> tuple[str, int] | None:
    """trim_padding: INPUT or INPUT=PAD (the pad id, 0 when not given); empty: off."""
    name, _, pad = text.strip().partition("=")
    if not name.strip():
        if pad.strip():
            raise ValueError("expected INPUT or INPUT=PAD_ID, e.g. text or input_ids=0")
        return None
    try:
        return name.strip(), int(pad.strip() or "0")
    except ValueError:
        raise ValueError(f"the pad id after '=' must be an integer, got '{pad.strip()}'") from None


def _optimizer_list(text: str) -> tuple[str, ...]:
    """disabled_optimizers: names, or "none" to switch off the defaults (nothing disabled)."""
    names = _name_list(text)
    return () if [n.lower() for n in names] in ([], ["none"]) else names


def _choice(mapping: Mapping[str, str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in mapping:
            raise ValueError(f"expected one of {sorted(mapping)}")
        return mapping[low]

    return parse


# a bool spelled any way _bool takes it, read as "on" / "off" (lend_idle_cores); with "auto" too (pin_instances, ...)
_ON_OFF = {**{k: "on" for k in _TRUE}, **{k: "off" for k in _FALSE}}
_on_off = _choice(_ON_OFF)
_auto_bool = _choice({"auto": "auto", **_ON_OFF})


# Our names, and Ascend ge-backend's precision_mode_v2 values that mean the same on these engines.
_PRECISIONS = {
    "origin": "origin", "fp32": "origin", "must_keep_origin_dtype": "origin",
    "fp16": "fp16", "mixed_float16": "fp16", "cube_fp16in_fp32out": "fp16",
    "bf16": "bf16", "mixed_bf16": "bf16",
    "int8": "int8",
    "auto": "auto",  # the fastest this CPU runs natively, guarded by accuracy (engines/auto_choice.py)
}


def _first_int(text: str) -> int:
    """ge-backend's ge.aicoreNum may list several numbers ("8|8", "8,8"): the first one counts."""
    for part in text.replace("|", ",").split(","):
        if part.strip():
            return _non_negative_int(part)
    raise ValueError("expected a number of cores")


def _device_ids(text: str) -> tuple[int, ...]:
    """ge-backend's device_ids: "4,5" (empty parts are skipped, as its Split does)."""
    return tuple(_non_negative_int(part) for part in text.split(",") if part.strip())


def _exec_blocks(text: str) -> int:
    """device_exec_blocks: -1 (ge-backend's default: computed from the instances) or an integer >= 1."""
    value = int(text.strip())
    if value != -1 and value < 1:
        raise ValueError("expected an integer >= 1 (or -1: computed)")
    return value


def _provider_name(text: str) -> str:
    """execution_provider: a name from engines/providers/ (checked there at load, which knows the installed ones)."""
    name = text.strip().lower()
    if not name.replace("_", "").isalnum():
        raise ValueError("expected auto or a provider name (cpu, cuda, tensorrt, cann)")
    return name


def _openvino_device(text: str) -> str:
    """device: an OpenVINO device string, spaces dropped ("AUTO: GPU, CPU" -> "AUTO:GPU,CPU"); checked at load."""
    device = "".join(text.split()).upper()
    if not device or not all(c.isalnum() or c in ".:,()_" for c in device):
        raise ValueError("expected an OpenVINO device: CPU, GPU, GPU.1, NPU, AUTO, AUTO:GPU,CPU, HETERO:GPU,CPU, ...")
    return device


def _thread_affinities(text: str) -> str:
    """ONNX Runtime's intra-op thread affinities: per worker thread a comma list of logical processors (from 1) or
    ranges, threads separated by ';' ("2;3", "2,3;4-5")."""
    text = text.strip()
    for entry in text.split(";") if text else []:
        for part in entry.split(","):
            low, dash, high = part.strip().partition("-")
            if not (low.isdigit() and int(low) >= 1 and (not dash or (high.isdigit() and int(high) >= int(low)))):
                raise ValueError("expected logical processors counted from 1 per worker thread, threads separated "
                                 "by ';', e.g. 2;3 or 2,3;4-5")
    return text


_EXECUTION_MODES = {"0": "sequential", "sequential": "sequential", "1": "parallel", "parallel": "parallel"}
_OPT_LEVELS = {
    "disable": "disable", "disabled": "disable", "none": "disable",
    "basic": "basic", "extended": "extended", "all": "all",
}


# key -> (field name, parser): the one table of keys. A field name is flat (`BackendOptions.make(**{name: value})`);
# its group follows from config/option_groups.py. Aliases map several keys onto one field.
_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "intra_op_thread_count": ("intra_op_thread_count", _non_negative_int),
    "inter_op_thread_count": ("inter_op_thread_count", _non_negative_int),
    "execution_mode": ("execution_mode", _choice(_EXECUTION_MODES)),
    "enable_mem_arena": ("enable_mem_arena", _bool),
    "enable_mem_pattern": ("enable_mem_pattern", _bool),
    "graph_optimization_level": ("graph_optimization_level", _choice(_OPT_LEVELS)),
    "default_max_batch_size": ("default_max_batch_size", _positive_int),
    "static_model": ("static_model", _bool),
    "graph.ge.inputShape": ("input_shape", str.strip),
    "graph.ge.dynamicDims": ("dynamic_dims", str.strip),
    "graph.ge.dynamicNodeType": ("dynamic_node_type", str.strip),
    "bucket_fallback": ("bucket_fallback", _choice({"error": "error", "dynamic": "dynamic"})),
    "bucket_paddable_dims": ("bucket_paddable_dims", _name_list),
    "trim_padding": ("trim_padding", _trim_padding),
    "bucket_plan": ("bucket_plan", _choice({"measured": "measured", "buckets": "buckets", "smallest": "smallest"})),
    "fold_size_limit": ("fold_size_limit", _non_negative_int),
    "enable_cuda_graph": ("enable_cuda_graph", _bool),
    "profiling": ("profiling", _choice({"off": "off", "false": "off", "0": "off", "true": "true", "1": "true",
                                        "on": "true", "dynamic": "dynamic"})),
    "profiling_dir": ("profiling_dir", str.strip),
    "dump_graph": ("dump_graph", _bool),
    "engine": ("engine", _choice(engine_names.spellings())),
    "precision_mode": ("precision_mode", _choice(_PRECISIONS)),
    "session.ge.exec.precision_mode_v2": ("precision_mode", _choice(_PRECISIONS)),
    "cores_per_instance": ("cores_per_instance", _non_negative_int),
    "ge.aicoreNum": ("cores_per_instance", _first_int),
    "disabled_optimizers": ("disabled_optimizers", _optimizer_list),
    "pin_instances": ("pin_instances", _auto_bool),
    "disable_prepacking": ("disable_prepacking", _bool),
    "share_weights": ("share_weights", _auto_bool),
    arena_shrinkage.RUN_CONFIG_KEY: ("arena_shrinkage", arena_shrinkage.parse),
    "session.use_device_allocator_for_initializers": ("device_allocator_for_initializers", _one_or_zero),
    "allow_spinning": ("allow_spinning", _auto_bool),
    "force_spinning_stop": ("force_spinning_stop", _auto_bool),
    "shared_thread_pool": ("shared_thread_pool", _auto_bool),
    "intra_op_thread_affinities": ("intra_op_thread_affinities", _thread_affinities),
    "lend_idle_cores": ("lend_idle_cores", _on_off),
    "hang_timeout_s": ("hang_timeout_s", _non_negative_seconds),
    "device_ids": ("device_ids", _device_ids),
    "device_exec_blocks": ("device_exec_blocks", _exec_blocks),
    "instance_exec_blocks": ("instance_exec_blocks", _positive_int),
    "dump_data": ("dump_data", _bool),
    "execution_provider": ("execution_provider", _provider_name),
    "device": ("device", _openvino_device),
    "device_fallback": ("device_fallback", _choice({"none": "none", **{k: "none" for k in _FALSE}, "cpu": "cpu"})),
    "quantization": ("quantization", _choice({"auto": "auto", "dynamic": "dynamic", "static": "static"})),
    "calibration_data": ("calibration_data", str.strip),
    "calibration_samples": ("calibration_samples", _positive_int),
    "precision_min_cosine": ("precision_min_cosine", _cosine_bound),
}
# ge-backend's family keys with an equivalent (config/ge_keys.py) parse like the key they stand for;
# precision_mode_v1 is GE's ge.exec.precision_mode, whose values differ from precision_mode_v2's.
_TARGETS = {**_KEYS, "precision_mode_v1": ("precision_mode", _choice(PRECISION_V1))}
_KEYS.update({key: _TARGETS[target] for key, target in ALIASES.items() if key != target})

KNOWN_KEYS = frozenset(_KEYS)
# Fields no key sets: config.pbtxt's sections alone give them (_config_sections).
SECTION_ONLY_FIELDS = frozenset({"accelerators", "custom_op_libraries"})


@dataclass(frozen=True)
class ParsedOptions:
    options: BackendOptions
    unknown: tuple[str, ...] = ()  # keys nobody understood, to be reported once at load
    sources: Mapping[str, str] = field(default_factory=dict)  # key -> "global" | "model" | the config section
    no_effect: tuple[str, ...] = ()  # ge-backend keys (ge.*, session.ge.*, graph.ge.*) accepted without an effect here


def global_options_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The `--backend-config ge,...` options the CLI put in the environment."""
    raw = environ.get(ENV_VAR, "")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{ENV_VAR} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{ENV_VAR} must be a JSON object of KEY: VALUE")
    return {str(k): str(v) for k, v in data.items()}


def model_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """config.pbtxt `parameters`, as Triton's JSON gives them ({key: {"string_value": v}})."""
    params = model_config.get("parameters") or {}
    out = {}
    for key, value in params.items():
        out[key] = value.get("string_value", "") if isinstance(value, Mapping) else str(value)
    return out


def graph_level_from_config(model_name: str, model_config: Mapping[str, Any]) -> str | None:
    """config.pbtxt `optimization { graph { level } }`, read as Triton's onnxruntime_backend reads it."""
    level = ((model_config.get("optimization") or {}).get("graph") or {}).get("level")
    if level in (None, 0, "0"):  # the peer: ORT_ENABLE_ALL, our default; 0 is also what an unset level reads as
        return None
    try:  # the peer (src/onnxruntime.cc, ModelState): -1 basic, 1 extended, 2 disable all, anything else all
        return {-1: "basic", 1: "extended", 2: "disable"}.get(int(level), "all")
    except ValueError:
        raise ConfigError(f"model '{model_name}': optimization.graph.level {level!r} is not an integer") from None


def parse_options(
    model_name: str,
    global_options: Mapping[str, str],
    model_options: Mapping[str, str],
    model_config: Mapping[str, Any] | None = None,
) -> ParsedOptions:
    """Merge global and per-model options into typed `BackendOptions`; per-model values win."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    unknown: list[str] = []
    no_effect: list[str] = []
    for source, options in (("global", global_options), ("model", model_options)):
        if source == "model" and model_config is not None:
            _config_sections(model_name, model_config, values, sources)  # they beat the global options
        for key, text in options.items():
            if key not in _KEYS:
                missing = no_effect if is_ge_family(key) else unknown
                if key not in missing:
                    missing.append(key)
                continue
            name, parse = _KEYS[key]
            try:
                values[name] = parse(str(text))
            except ValueError as exc:
                where = "--backend-config" if source == "global" else "config.pbtxt parameters"
                raise ConfigError(
                    f"model '{model_name}': option {key}={text!r} (from {where}) is invalid: {exc}"
                ) from None
            sources[key] = source
    return ParsedOptions(BackendOptions.make(**values), tuple(unknown), sources, tuple(no_effect))


def _config_sections(model_name: str, model_config: Mapping[str, Any], values: dict, sources: dict) -> None:
    """config.pbtxt's `optimization` settings and `model_operations`, as Triton's onnxruntime backend reads them."""
    if level := graph_level_from_config(model_name, model_config):
        values["graph_optimization_level"] = level
        sources["graph_optimization_level"] = "optimization.graph.level"
    accelerators = parse_accelerators(model_name, model_config)
    if accelerators:
        values["accelerators"] = accelerators
        sources["accelerators"] = "optimization.execution_accelerators"
    if accelerators.cpu:  # the peer's cpu_execution_accelerator: the engine that runs it
        values["engine"] = engine_names.CPU_ACCELERATORS[accelerators.cpu[0]]
        sources["engine"] = "optimization.execution_accelerators"
    libraries = (model_config.get("model_operations") or {}).get("op_library_filename") or []
    if libraries:  # the peer registers each with every session (RegisterCustomOpsLibrary)
        values["custom_op_libraries"] = tuple(str(path) for path in libraries)
        sources["custom_op_libraries"] = "model_operations.op_library_filename"


def parse_backend_config_args(args: list[str], backend_names: tuple[str, ...] = ("ge", "npu_ge")) -> tuple[dict[str, str], list[str]]:
    """Split `--backend-config NAME,KEY=VALUE` arguments into ours and Triton's own.

    Returns (our options, the arguments meant for other backends, passed to tritonserver unchanged). Triton's global
    `default-max-batch-size=N` (no backend named: every backend's default, the onnxruntime backend's included) is
    also ours, as `default_max_batch_size`, unless a `ge,default_max_batch_size=` says otherwise.
    """
    ours: dict[str, str] = {}
    others: list[str] = []
    for arg in args:
        name, sep, rest = arg.partition(",")
        key, eq, value = arg.partition("=")
        if not sep and eq and key.strip() == "default-max-batch-size":
            ours.setdefault("default_max_batch_size", value.strip())
            others.append(arg)
            continue
        if sep and name in backend_names:
            key, eq, value = rest.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ConfigError(f"--backend-config {arg!r}: expected {name},KEY=VALUE")
            ours[key] = value.strip()
        else:
            others.append(arg)
    return ours, others
