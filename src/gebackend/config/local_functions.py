"""ONNX local functions (a model's own `functions`: PyTorch's exports with `export_modules_as_functions`, its dynamo
exporter of 2023-2024, onnxscript) for OpenVINO: its ONNX reader has no conversion for them (`No conversion rule found
for operations: <domain>.<function>`), so a model served on OpenVINO that holds any is served from a copy with
every call inlined (`onnx.inliner.inline_local_functions`, the same graph) (config/model_copy.py); the load log says
how many. ONNX Runtime inlines them itself and gets the file as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from gebackend.errors import ModelLoadError


def served_inlined(path: Path, engine: str, log: Callable[[str], None] = lambda m: None,
                   temp_parent: Path | None = None) -> Path:
    """The file `engine` loads: `path` itself, or for OpenVINO a copy with the model's local functions inlined."""
    if engine != "openvino":
        return path
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    if not model.functions:
        return path
    names = sorted({f"{f.domain}.{f.name}" for f in model.functions})
    try:
        from onnx.inliner import inline_local_functions

        inlined = inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - the inliner's message, not its traceback
        raise ModelLoadError(f"OpenVINO reads no ONNX local functions and inlining {names} failed: "
                             f"{type(exc).__name__}: {exc}; serve it with engine=onnxruntime") from None
    log(f"{len(names)} ONNX local function(s) {names} inlined for OpenVINO, which reads none")
    from gebackend.config.model_copy import served_copy

    return served_copy(inlined, Path(path), temp_parent, "ge-inlined-", "with its local functions inlined")
