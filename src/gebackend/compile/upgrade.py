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
- PRelu before opset 7 applies a slope of C values per channel (axis 1: Caffe2's PRelu, what PyTorch's early exporter
  wrote), opset 7 broadcasts it from the right, and onnx.version_converter keeps the node as it is: ONNX Runtime then
  refuses every run of an input [N, C, L] with a slope [C] (`Attempting to broadcast an axis by a dimension other
  than 1`). Before converting, such a slope gets an `Unsqueeze` to [C, 1, ..., 1] (`channel_slopes`), which means the
  same at both opsets (the onnx wheel's pytorch-converted PReLU cases: 3 of 6 failed every run without it).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from gebackend.compile.graph_pass import GraphPass, PassContext, reason
from gebackend.errors import ModelLoadError

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

    old = default_opset(model)
    converted = version_converter.convert_version(channel_slopes(model) if old is not None and old < 7 else model, target)
    return raise_ir_version(converted)


def channel_slopes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each PRelu's per-channel slope (C values, C > 1, an input of rank r > 2) unsqueezed to
    [C, 1, ..., 1] (r - 2 ones), which opset 7's broadcasting reads as the channel axis; `model` itself when no
    PRelu needs it or an input's rank is unknown. For a model below opset 7 only."""
    from onnx import helper

    from gebackend.config.light import infer_shapes

    if not any(node.op_type == "PRelu" for node in model.graph.node):
        return model
    try:
        inferred = infer_shapes(model, data_prop=False)
    except Exception:  # noqa: BLE001 - no ranks known: nothing is changed
        return model
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.graph.input, *inferred.graph.value_info] if v.type.tensor_type.HasField("shape")}
    dims.update({init.name: list(init.dims) for init in model.graph.initializer})
    changes = {}  # node index -> the rank of its input
    for index, node in enumerate(model.graph.node):
        if node.op_type != "PRelu" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        data, slope = dims.get(node.input[0]), dims.get(node.input[1])
        if data is not None and len(data) > 2 and slope is not None and len(slope) == 1 and (slope[0] or 0) > 1:
            changes[index] = len(data)
    if not changes:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes = []
    for index, node in enumerate(result.graph.node):
        if index in changes:
            channel = f"{node.input[1]}__per_channel{index}"
            nodes.append(helper.make_node("Unsqueeze", [node.input[1]], [channel], axes=list(range(1, changes[index] - 1))))
            node.input[1] = channel
        nodes.append(node)
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    return result


def upgraded_copy(path: Path, temp_parent: Path | None) -> tuple[Path, int] | None:
    """For the dynamic graph: the file at `path` converted to opset `MIN_FOLD_OPSET` as a model copy
    (config/model_copy.py), and the opset it had; None when its opset is not below it. Raises `ModelLoadError` when
    the conversion fails."""
    from gebackend.config.model_copy import served_copy

    model = onnx.load(str(path), load_external_data=False)
    if not needs_opset_upgrade(model):
        return None
    old = default_opset(model)
    try:
        converted = upgrade_opset(model)
    except Exception as exc:  # noqa: BLE001 - an adapter onnx.version_converter lacks
        raise ModelLoadError(reason(exc, f"converting its opset {old} to {MIN_FOLD_OPSET} with onnx.version_converter "
                                         f"failed: ")) from None
    return served_copy(converted, Path(path), temp_parent, f"ge-opset{MIN_FOLD_OPSET}-",
                       f"converted to opset {MIN_FOLD_OPSET}"), old


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
