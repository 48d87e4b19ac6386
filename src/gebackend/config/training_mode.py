"""Nodes an ONNX file runs in training mode: what a module exported without `model.eval()` keeps.

torch's dynamo exporter (torch.onnx.export's default since torch 2.9) exports a module in the mode it is in: one left
in training mode writes each Dropout with its `training_mode` input a stored `True`, and BatchNormalization (opset
14+) with `training_mode=1`. Such a file answers by chance: ONNX Runtime's graph optimizations remove most of those
Dropouts, but not one whose output is a graph output, nor any with optimizations off, where it drops activations at
random on every request; OpenVINO cannot read it ("Training mode is not supported for Dropout op"). `training_nodes`
names them; the load warns and `gebackend analyze` says so, pointing to the export.
"""

from __future__ import annotations

import onnx

from gebackend.config.index_bounds import constant_node_tensors, stored_array


def training_nodes(model: onnx.ModelProto) -> tuple[str, ...]:
    """`"<op> '<name>'"` for each node of the main graph set to training mode by a value stored in the file."""
    graph = model.graph
    stored = {init.name: init for init in graph.initializer}
    stored.update(constant_node_tensors(graph))
    found = []
    for node in graph.node:
        label = f"{node.op_type} '{node.name or node.output[0]}'"
        if node.op_type == "Dropout" and len(node.input) > 2 and _true(stored.get(node.input[2])):
            found.append(label)
        elif node.op_type == "BatchNormalization" and any(a.name == "training_mode" and a.i for a in node.attribute):
            found.append(label)
    return tuple(found)


def describe(nodes: tuple[str, ...]) -> str:
    """The load's warning and the doctor's note for `nodes` (not empty)."""
    shown = ", ".join(nodes[:3]) + (f", … ({len(nodes)} in all)" if len(nodes) > 3 else "")
    return (f"the file runs {len(nodes)} node(s) in training mode ({shown}): it was exported from a module in "
            f"training mode; its answers depend on the engine (ONNX Runtime drops activations at random where its "
            f"optimizations leave such a Dropout, OpenVINO cannot read it): export again after model.eval()")


def _true(tensor: onnx.TensorProto | None) -> bool:
    value = None if tensor is None else stored_array(tensor)
    return value is not None and value.size == 1 and bool(value.reshape(-1)[0])
