"""The nodes a graph rewrite adds, named so that no tensor or node of the graph has the name already.

The rewrites (compile/unused_rows.py, compile/kept_query_attention.py) write their nodes beside the ones they replace;
each names them after what they replace with a suffix of its own and a number (a graph a rewrite ran on before holds
names of the same pattern).
"""

from __future__ import annotations

import onnx
from onnx import helper


class NodeWriter:
    """New node and tensor names `<base><suffix><n>` that no tensor or node of `model` has (nor one written before),
    and the nodes written (`nodes`, in order)."""

    def __init__(self, model: onnx.ModelProto, suffix: str) -> None:
        graph = model.graph
        self.taken = {out for node in graph.node for out in node.output} | {v.name for v in graph.input} \
            | {init.name for init in graph.initializer} | {node.name for node in graph.node}
        self.suffix, self.nodes = suffix, []

    def name(self, base: str) -> str:
        number = 1
        while f"{base}{self.suffix}{number}" in self.taken:
            number += 1
        self.taken.add(f"{base}{self.suffix}{number}")
        return f"{base}{self.suffix}{number}"

    def node(self, op_type: str, inputs, base: str, outputs=None, **attributes) -> str:
        """A node of `op_type` reading `inputs`, writing `outputs` (a new name after `base` where not given); its first
        output."""
        outputs = outputs or [self.name(base)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=self.name(base + "_node"), **attributes))
        return outputs[0]
