"""Folding pass: constant folding, unused-node removal and shape inference through onnxslim, quietly.

onnxslim's graph fusion, dead-node elimination, common-subexpression elimination and weight tying are
skipped, so graph input/output names and the initializers the pass did not fold away keep their names and
their uses: callers share weights across several specialised copies by initializer name. Graph inputs
onnxslim drops as unused are put back.

Dead-node elimination is skipped because it costs the engine its fusions: it erases a `Mul` by a weight of
ones and an `Add` of a weight of zeros, which is exactly a LayerNorm's gamma/beta and a Linear's bias in a
freshly initialised export (the CN_CLIP text files in bench/models: one shared all-ones gamma, all-zeros
beta and biases). ONNX Runtime's LayerNormFusion needs the Mul and Add, BiasGelu/MatMul+Add fusion the
bias Add: on the 4-layer CN_CLIP text encoder the folded graph lost all 9 LayerNormalization and 4
BiasGelu fusions (9 LayerNorms ran as 7 separate ops each), which made static slower than dynamic. The rest of
what it removes (Identity, Dropout, no-op Cast/Reshape/Transpose/Slice) ONNX Runtime and OpenVINO remove
themselves when they build the graph.
"""

from __future__ import annotations

import contextlib
import io
import logging

import onnx

from gebackend.compile import upgrade
from gebackend.compile.graph_pass import GraphPass, PassContext, PassSkipped, reason
from gebackend.config import light

# Fusion invents (custom) op types; dead-node elimination erases the Mul-by-ones/Add-of-zeros the engines' own
# fusions match (see above); common-subexpression elimination merges nodes whose weights are equal by value
# (dropping one of two equal initializers); weight tying renames shared initializers.
_SKIP = ["graph_fusion", "dead_node_elimination", "subexpression_elimination", "weight_tying"]


@contextlib.contextmanager
def _quiet():
    """Swallow onnxslim's prints (its graphsurgeon logger prints to stdout) and its log records meanwhile.

    A NullHandler on the "onnxslim" logger stops onnxslim's `init_logging` from adding a stderr handler of
    its own; records from it and its child loggers stop there instead of reaching the root logger.
    """
    logger = logging.getLogger("onnxslim")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    saved = logger.level, logger.propagate
    logger.propagate = False
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(saved[0])  # onnxslim sets its own level on every call
        logger.propagate = saved[1]


def _restore_inputs(original: onnx.ModelProto, slimmed: onnx.ModelProto) -> None:
    """Put back graph inputs onnxslim dropped as unused, in the original order."""
    initializers = {init.name for init in original.graph.initializer}
    wanted = [v for v in original.graph.input if v.name not in initializers]
    have = {v.name: v for v in slimmed.graph.input}
    if [v.name for v in wanted] == list(have):
        return
    restored = [have.get(v.name, v) for v in wanted]
    del slimmed.graph.input[:]
    slimmed.graph.input.extend(restored)


def _dedupe_value_info(model: onnx.ModelProto) -> None:
    """onnxslim may emit a tensor's value_info more than once; keep the first."""
    seen: set[str] = set()
    unique = []
    for value in model.graph.value_info:
        if value.name not in seen:
            seen.add(value.name)
            unique.append(value)
    if len(unique) != len(model.graph.value_info):
        del model.graph.value_info[:]
        model.graph.value_info.extend(unique)


def fold_constants(model: onnx.ModelProto, size_limit: int | None = 1 << 20) -> onnx.ModelProto:
    """A copy of `model` with constant subgraphs folded into initializers, dead nodes removed and shapes inferred.

    A folded tensor larger than `size_limit` bytes is left to be computed at run time (e.g. a big weight made
    by `ConstantOfShape` is not materialised); `None` folds everything. `model` itself is not changed.
    """
    if size_limit is not None and size_limit < 1:
        # onnxslim reads a threshold of 0 as "no threshold".
        raise ValueError(f"size_limit must be at least 1 byte, or None for no limit; got {size_limit}")
    import onnxslim  # heavy import: only when a model is folded

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    output_names = [o.name for o in model.graph.output]
    with _quiet():
        slimmed = onnxslim.slim(copy, skip_optimizations=list(_SKIP), size_threshold=size_limit)
    if slimmed is None:  # pragma: no cover - only with model_check, which is off
        raise RuntimeError("onnxslim returned no model")
    _restore_inputs(model, slimmed)
    _dedupe_value_info(slimmed)
    got = [o.name for o in slimmed.graph.output]
    if got != output_names:  # pragma: no cover - onnxslim keeps output names; guard the contract anyway
        raise RuntimeError(f"constant folding changed the graph outputs from {output_names} to {got}")
    light.check_model(slimmed)  # on the model less its weights: no 2 GB limit, no serialising of the weights
    return slimmed


class FoldPass(GraphPass):
    """Constant folding under the size limit, on a graph onnxslim can read (an ai.onnx opset >= 7)."""

    name = "fold"

    def run(self, model: onnx.ModelProto, context: PassContext) -> onnx.ModelProto:
        opset = upgrade.default_opset(model)
        if opset is None:
            raise PassSkipped("the model imports no ai.onnx opset (only " + ", ".join(sorted({o.domain for o in model.opset_import}))
                              + "), which onnxslim's shape inference needs; the graph is not folded")
        if opset < upgrade.MIN_FOLD_OPSET:
            raise PassSkipped(f"onnxslim needs opset >= {upgrade.MIN_FOLD_OPSET} and the model has opset {opset}; "
                              f"the graph is not folded")
        return fold_constants(model, context.size_limit)

    def explain(self, exc: BaseException) -> str:
        return reason(exc, "onnxslim failed: ") + "; the graph is not folded"


PASS = FoldPass()
