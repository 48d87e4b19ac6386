"""Which engine and precision serve one model: `engine=auto` / `precision_mode=auto` made concrete for its file on
this CPU (auto_choice.py says why), and the models only ONNX Runtime serves (custom operator libraries, STRING
tensors). A load step: options in, options out, with the note the load line carries."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from gebackend.config.onnx_signature import Signature
from gebackend.config.option_groups import BackendOptions
from gebackend.errors import ConfigError


def resolve_engine(options: BackendOptions, path: Path, signature: Signature,
                   say: Callable[[str], None]) -> tuple[BackendOptions, str]:
    """`engine=auto` / `precision_mode=auto` made concrete for this model on this CPU (engines/auto_choice.py); a model
    that only ONNX Runtime serves (`onnxruntime_only`) runs there, and naming another engine for it fails the load.
    Also the load line's note where engine=auto would have taken OpenVINO, which cannot read the model ("" else)."""
    only = onnxruntime_only(options, signature)
    if only is not None:
        if options.engines.engine == "auto":
            say(f"engine=auto -> onnxruntime ({only[0]})")
            options = options.replace(engine="onnxruntime")
        elif options.engines.engine != "onnxruntime":
            raise ConfigError(f"{only[1]}, which engine={options.engines.engine} cannot run; set engine=onnxruntime "
                              f"(or auto)")
    choice = options.engines
    if "auto" not in (choice.engine, choice.precision_mode):
        return options, ""
    from gebackend import cpu
    from gebackend.engines import auto_choice

    def openvino_capabilities():  # imported only where OpenVINO is installed and asked
        from gebackend.engines.openvino import openvino_capabilities

        return openvino_capabilities()

    chosen = auto_choice.resolve(choice.engine, choice.precision_mode, path, cpu.flags(), openvino_capabilities)
    say(chosen.why)
    changes = {"engine": chosen.engine, "precision_mode": chosen.precision_mode}
    if choice.precision_mode == "auto" and not choice.precision_min_cosine:
        changes["precision_min_cosine"] = auto_choice.AUTO_MIN_COSINE
    note = f"engine=auto -> {chosen.engine} ({chosen.refused})" if chosen.refused else ""
    return options.replace(**changes), note


def auto_took_openvino(written: BackendOptions, resolved: BackendOptions) -> bool:
    """Whether OpenVINO serves this model because `engine=auto` chose it (not because the user named it)."""
    return written.engines.engine == "auto" and resolved.engines.engine == "openvino"


def onnxruntime_only(options: BackendOptions, signature: Signature) -> tuple[str, str] | None:
    """Why only ONNX Runtime serves this model (the load log's reason, the refusal's subject), or None: custom operator
    libraries load into ONNX Runtime only; OpenVINO runs STRING tensors, but OpenVINO 2026.4's string tensors corrupt
    the process's heap (after one run, freeing the compiled model aborts with `free(): invalid pointer`: an unload or
    reload kills the instance), so here they run on ONNX Runtime alone."""
    if options.session.custom_op_libraries:
        return ("model_operations' custom operator libraries load into ONNX Runtime only",
                f"model_operations' op_library_filename {list(options.session.custom_op_libraries)} holds ONNX Runtime "
                f"custom operators")
    strings = [t.name for t in (*signature.inputs, *signature.outputs) if t.dtype.triton == "TYPE_STRING"]
    if strings:
        return (f"STRING tensors {strings}: served on ONNX Runtime only",
                f"the model's STRING tensors {strings} are served on ONNX Runtime only (OpenVINO's string tensors "
                f"corrupt the process's memory)")
    return None
