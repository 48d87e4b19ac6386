"""Where a graph may keep some rows of a computed tensor (an encoder's first token: a Gather of one constant index, a
Slice of constant bounds on one axis), found without shape inference: the signature lists them (config/onnx_signature.py
`Signature.selections`), and the rows pass (compile/unused_rows.py) has nothing to do on a file without any.
"""

from __future__ import annotations

import onnx


def selections(model: onnx.ModelProto) -> tuple[str, ...]:
    """The outputs of the nodes that may keep some rows of a computed tensor (a Gather of one constant index, a Slice
    of constant bounds on one axis), found without shape inference: where there are none, the pass has nothing to do."""
    constants = {init.name for init in model.graph.initializer} | {
        node.output[0] for node in model.graph.node if node.op_type == "Constant" and node.output}
    computed = {out: node.op_type for node in model.graph.node for out in node.output}
    found = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Gather", "Slice") or len(node.input) < 2:
            continue
        if computed.get(node.input[0]) in (None, "Shape", "Constant"):
            continue
        if all(name in constants for name in node.input[1:] if name):
            found.append(node.output[0])
    return tuple(found)
