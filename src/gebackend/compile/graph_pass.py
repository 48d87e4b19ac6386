"""What one static graph pass is: a name, a step from one ONNX model to the next, and how its failure is said.

The passes themselves live one per module (`specialize.py`, `upgrade.py`, `fold.py`), each declaring one
`PASS`; `passes.py` lists them in the order they run. A pass returns the graph it made, or raises:
- `PassSkipped(reason)` when the model is one it cannot work on (the reason is the whole message);
- `ConfigError` for the user's own mistake (a shape that does not fit the model), which stops the load;
- anything else when it failed: `explain(exc)` says so, and the graph goes on without this pass.
A pass may also hear of a partial failure itself and say it through `context.warn`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx

Warn = Callable[[str, str], None]  # (pass, reason)


def reason(exc: BaseException, where: str = "") -> str:
    """One line saying what failed: `where`, then the exception's type and first message line."""
    from gebackend.compile.specialize import describe_error  # specialize.py declares a pass: imported late

    return f"{where}{describe_error(exc)}"


@dataclass(frozen=True)
class PassContext:
    """What every pass of one compile is given: the shapes to fix (None: keep the model's), the fold's size limit
    for a constant, and where a pass says it skipped something."""

    shapes: Mapping[str, Sequence[int]] | None
    size_limit: int | None
    warn: Warn


class PassSkipped(Exception):
    """This pass cannot work on this model; the message says why and what the graph is left with."""


class GraphPass:
    """One pass: subclasses set `name` and implement `run`; `explain` words a failure for the load log."""

    name = ""

    def run(self, model: onnx.ModelProto, context: PassContext) -> onnx.ModelProto:
        raise NotImplementedError

    def explain(self, exc: BaseException) -> str:
        return reason(exc)
