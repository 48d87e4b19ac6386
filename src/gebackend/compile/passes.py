"""The static graph passes, in the order they run: specialise, upgrade, fold, rows. The load's pipeline and the doctor
both compile through `compile_graph`, so this list is the one place that says which passes there are.

Adding a pass is one module declaring a `PASS` (a `graph_pass.GraphPass`) and one line in `PASSES`.

A pass that fails on a model is skipped for that model: the graph goes on without it and the caller's
`warn(pass, reason)` hears which pass and why, so the model still loads and serves: an unfolded graph
runs correctly, and ONNX Runtime and OpenVINO fold constants themselves when they build it. Only the
user's own errors stop a load: a shape that does not fit the model (`ConfigError` from `specialize`),
a `size_limit` below 1 byte (`ValueError`, checked before any pass runs).

- specialise (`specialize.py`): fix the input dims; a shape inference that gives up is left out;
- upgrade (`upgrade.py`): IR < 4 files get IR 4 semantics; opset < 7 is converted to opset 7, which
  onnxslim needs (with `onnx.version_converter`; if that fails the fold is skipped, saying so);
- fold (`fold.py`, onnxslim): constant folding under the size limit;
- rows (`unused_rows.py`): the rows of a sequence no output keeps (an encoder's tokens after the first) not computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from gebackend.compile import fold, specialize, unused_rows, upgrade
from gebackend.compile.graph_pass import GraphPass, PassContext, PassSkipped, Warn, reason
from gebackend.errors import ConfigError

PASSES: tuple[GraphPass, ...] = (
    specialize.PASS,
    upgrade.PASS,
    fold.PASS,
    unused_rows.PASS,
)

__all__ = ["PASSES", "Warn", "compile_graph", "reason"]


def compile_graph(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None,
    size_limit: int | None,
    warn: Warn,
) -> onnx.ModelProto:
    """`model` through every pass of `PASSES`: specialised to `shapes` (none: inputs keep their dims), upgraded
    when old, folded, and computing only the rows its outputs keep.

    `model` is not changed. Raises `ConfigError` when `shapes` does not fit the model and `ValueError` for a
    `size_limit` below 1; a pass that fails otherwise is skipped and reported to `warn`.
    """
    if size_limit is not None and size_limit < 1:
        raise ValueError(f"size_limit must be at least 1 byte, or None for no limit; got {size_limit}")
    context = PassContext(shapes, size_limit, warn)
    work = model
    for graph_pass in PASSES:
        try:
            work = graph_pass.run(work, context)
        except ConfigError:
            raise
        except PassSkipped as skipped:
            warn(graph_pass.name, str(skipped))
        except Exception as exc:  # noqa: BLE001 - never a dependency's traceback as a load failure
            warn(graph_pass.name, graph_pass.explain(exc))
    return work
