"""Runs the static graph passes on one shape set, in order: specialise, upgrade, fold.

A pass that fails on a model is skipped for that model: the graph goes on without it and the caller's
`warn(pass, reason)` hears which pass and why, so the model still loads and serves: an unfolded graph
runs correctly, and ONNX Runtime and OpenVINO fold constants themselves when they build it. Only the
user's own errors stop a load: a shape that does not fit the model (`ConfigError` from `specialize`),
a `size_limit` below 1 byte (`ValueError` from `fold`).

- specialise (`specialize.py`): fix the input dims; a shape inference that gives up is left out;
- upgrade (`upgrade.py`): IR < 4 files get IR 4 semantics; opset < 7 is converted to opset 7, which
  onnxslim needs (with `onnx.version_converter`; if that fails the fold is skipped, saying so);
- fold (`fold.py`, onnxslim): constant folding under the size limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import onnx

from gebackend.compile import upgrade
from gebackend.compile.fold import fold_constants
from gebackend.compile.specialize import describe_error, specialize
from gebackend.errors import ConfigError

Warn = Callable[[str, str], None]  # (pass, reason)


def reason(exc: BaseException, where: str = "") -> str:
    """One line saying what failed: `where`, then the exception's type and first message line."""
    return f"{where}{describe_error(exc)}"


def compile_graph(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None,
    size_limit: int | None,
    warn: Warn,
) -> onnx.ModelProto:
    """`model` specialised to `shapes` (none: inputs keep their dims), upgraded when old, and folded.

    `model` is not changed. Raises `ConfigError` when `shapes` does not fit the model and `ValueError` for a
    `size_limit` below 1; a pass that fails otherwise is skipped and reported to `warn`.
    """
    if size_limit is not None and size_limit < 1:
        raise ValueError(f"size_limit must be at least 1 byte, or None for no limit; got {size_limit}")
    work = model
    if shapes:
        try:
            work = specialize(model, shapes, warn)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - never a dependency's traceback as a load failure
            warn("specialise", reason(exc) + "; the graph keeps the model's own input dims")
            work = model
    try:
        work = upgrade.raise_ir_version(work)
    except Exception as exc:  # noqa: BLE001
        warn("upgrade", reason(exc, "raising the IR version failed: "))
    old = upgrade.default_opset(work)
    if upgrade.needs_opset_upgrade(work):
        try:
            work = upgrade.upgrade_opset(work)
        except Exception as exc:  # noqa: BLE001 - an adapter onnx.version_converter lacks
            warn("upgrade", reason(exc, f"converting opset {old} to {upgrade.MIN_FOLD_OPSET} with onnx.version_converter "
                                        f"failed: ") + "; the graph keeps its opset")
    if upgrade.default_opset(work) is None:
        warn("fold", "the model imports no ai.onnx opset (only " + ", ".join(sorted({o.domain for o in work.opset_import}))
             + "), which onnxslim's shape inference needs; the graph is not folded")
        return work
    if upgrade.needs_opset_upgrade(work):
        warn("fold", f"onnxslim needs opset >= {upgrade.MIN_FOLD_OPSET} and the model has opset {old}; "
                     f"the graph is not folded")
        return work
    try:
        return fold_constants(work, size_limit)
    except Exception as exc:  # noqa: BLE001 - onnxslim raises what its dependencies raise
        warn("fold", reason(exc, "onnxslim failed: ") + "; the graph is not folded")
    return work
