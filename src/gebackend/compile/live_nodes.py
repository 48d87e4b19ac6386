"""A rewritten graph's nodes put right: in an order that runs (each after the makers of what it reads), and only those
some graph output needs (compile/unused_rows.py writes its nodes beside the ones they replace)."""

from __future__ import annotations

import onnx

from gebackend.compile.row_rules import node_subgraph_reads, subgraph_reads
from gebackend.config import light


def in_order(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` sorted so that each comes after the makers of what it reads (its subgraphs' outer reads included),
    keeping the given order where it may."""
    maker = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    needs = []
    for node in nodes:
        reads = set(node.input) | node_subgraph_reads(node)
        needs.append(sorted({maker[name] for name in reads if name in maker}))
    done, order = [False] * len(nodes), []
    for root in range(len(nodes)):
        stack = [(root, 0)]
        while stack:
            index, next_need = stack.pop()
            if done[index]:
                continue
            if next_need < len(needs[index]):
                stack.append((index, next_need + 1))
                if not done[needs[index][next_need]]:
                    stack.append((needs[index][next_need], 0))
                continue
            done[index] = True
            order.append(nodes[index])
    return order


def live(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """A model of the `nodes` some graph output needs (a new model, the weights they read copied into it)."""
    needed = {value.name for value in model.graph.output} | subgraph_reads(model.graph)
    kept = []
    for node in reversed(nodes):
        if any(out in needed for out in node.output if out):
            kept.append(node)
            needed.update(name for name in node.input if name)
            needed |= node_subgraph_reads(node)
    kept.reverse()
    out = light.with_initializers(model, [init for init in model.graph.initializer if init.name in needed])
    del out.graph.node[:]
    out.graph.node.extend(kept)
    made = {name for node in kept for name in node.output}
    values = [value for value in out.graph.value_info if value.name in made]
    del out.graph.value_info[:]
    out.graph.value_info.extend(values)
    return out
