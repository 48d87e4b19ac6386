"""The nodes and weights a graph rewrite adds, named so that no tensor or node of the graph has the name already, and
the rewritten model.

The rewrites (compile/unused_rows.py, compile/kept_query_attention.py, compile/patch_convolution.py) write their nodes
beside the ones they replace; each names them after what they replace with a suffix of its own and a number (a graph
a rewrite ran on before holds names of the same pattern).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gebackend.compile import live_nodes


class NodeWriter:
    """New node and tensor names `<base><suffix><n>` that no tensor or node of `model` has (nor one written before),
    the nodes written (`nodes`, in order) and the weights (`weights`)."""

    def __init__(self, model: onnx.ModelProto, suffix: str) -> None:
        graph = model.graph
        self.taken = {out for node in graph.node for out in node.output} | {v.name for v in graph.input} \
            | {init.name for init in graph.initializer} | {node.name for node in graph.node}
        self.suffix, self.nodes = suffix, []
        self.weights: list[onnx.TensorProto] = []

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

    def weight(self, values: np.ndarray, base: str) -> str:
        """A new stored tensor holding `values`, named after `base`."""
        name = self.name(base)
        self.weights.append(numpy_helper.from_array(values, name))
        return name

    def rewritten(self, model: onnx.ModelProto, replaced: set[int]) -> onnx.ModelProto:
        """`model` (a new one) without the nodes whose `id` is in `replaced`, with the nodes and weights written, put in
        order and kept where some output needs them (compile/live_nodes.py)."""
        nodes = [node for node in model.graph.node if id(node) not in replaced] + self.nodes
        out = live_nodes.live(model, live_nodes.in_order(nodes))
        out.graph.initializer.extend(self.weights)
        return out
