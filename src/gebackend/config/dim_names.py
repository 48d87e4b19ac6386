"""Which of an ONNX file's dim names say something about the model, and which are an exporter's placeholders.

An exporter writes a `dim_param` for every axis it could not fix. Some names carry meaning: `batch`, `sequence`,
torch's `s0` for axes its tracer proved equal. Others are only "unknown": paddle2onnx writes `?` on every free axis
(the direction classifier's `x: [?, 3, ?, ?]` has height and width both `?`), tf2onnx writes `unk__123`, older
paddle2onnx and some converters `p2o.DynamicDimension.0` or `DynamicDimension.0`, others `-1` or `None`. Reading
two axes with the same placeholder as one tied dim would refuse requests the engine runs, so a placeholder names no
dim (`meaningful` answers None). A meaningful name is still a hint, never a contract: runtime/validation.py refuses
nothing on it, and only bucket planning and padding read it.
"""

from __future__ import annotations

import re

_PLACEHOLDERS = re.compile(
    r"""^(?:
        [?*_-]*                                   # '', '?', '*', '-', '_'
      | -?1                                       # '-1', '1' written as a name
      | none | null | unknown | dynamic | unk     # spelled-out unknowns
      | unk__\d+                                  # tf2onnx
      | (?:p2o\.)?dynamicdimension\.\d+           # paddle2onnx, some converters
      | dynamic_?dim(?:ension)?_?\d*              # generic converters
    )$""",
    re.IGNORECASE | re.VERBOSE,
)


def is_placeholder(name: str) -> bool:
    """Whether `name` is an exporter's word for "unknown" rather than the name of a dim."""
    return bool(_PLACEHOLDERS.match(name.strip()))


def meaningful(name: str | None) -> str | None:
    """`name` where it names a dim; None for no name or a placeholder."""
    if not name or is_placeholder(name):
        return None
    return name
