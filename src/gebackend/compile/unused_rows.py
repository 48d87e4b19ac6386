"""Rows no output reads: a graph that keeps some rows of a sequence computes only those rows where it can.

A text or image encoder that answers with its first token (BERT's and CLIP's `[CLS]`: `x[:, 0]`, a `Gather` or
`Slice` on the sequence axis) computes its last layer for every token and then keeps one: on CN_CLIP's 4-layer text
encoder a fifth of its multiply-adds go to rows nobody reads. This pass moves such a selection up through the nodes
that work row by row on that axis (the rules: compile/row_rules.py) as far as every reader of a tensor wants the same
rows of it: in a transformer up to the last layer's input, whose keys and values every kept query row needs (they
are then read through their weights instead: compile/kept_query_attention.py). The nodes in that region then
compute the kept rows only; the answers are the same (the same operations on the same
values; only a batched kernel's rounding may differ).

A `Shape` of a tensor in the region is answered from the kept rows with the axis' full size written back, where
that size is known; elsewhere an unknown dim stops the region there, which is always correct. Works on fixed dims (a
static graph) and on a file's symbolic ones (`batch`). Used three times: on the file every instance serves, in either
graph mode (`served_kept_rows`, a copy: config/model_copy.py), as a static graph pass after folding (`PASS`: fixed dims
let it move further, through an attention's Reshapes), and on the file a lowering quantizes (compile/precision.py,
for a caller lowering a file of its own), so an int8 model computes the kept rows only too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gebackend.compile.kept_query_attention import kept_query_attention
from gebackend.compile.graph_pass import GraphPass, PassContext, reason
from gebackend.compile.node_writer import NodeWriter
from gebackend.compile.row_rules import GraphView, Rows, attribute, outputs_follow_rows, plan, recomputed_outputs
from gebackend.compile.upgrade import default_opset
from gebackend.config.row_selections import selections

METADATA_KEY = "gebackend.unused_rows"  # on a compiled graph: "<nodes moved> <nodes added>" (`pass_record`)
_END = np.iinfo(np.int64).max  # a Slice's end past any length
MIN_OPSET = 11  # Slice's bounds as inputs (10) and ScatterElements (11) for a Shape answered from the kept rows


def _seed(view: GraphView, node: onnx.NodeProto) -> Rows | None:
    """The rows a Gather of one index, or a Slice of one axis with step 1, keeps of a computed tensor; else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Gather", "Slice") or not node.input:
        return None
    dims = view.dims.get(node.input[0])
    maker = view.maker.get(node.input[0])
    if dims is None or maker is None or maker.op_type in ("Shape", "Constant"):
        return None
    if node.op_type == "Gather":
        index = view.constant(node.input[1]) if len(node.input) > 1 else None
        if index is None or index.size != 1:
            return None
        axis, start = attribute(node, "axis", 0) % len(dims), int(index.reshape(-1)[0])
        stop = start + 1  # -1: (-1, 0), the last
    else:
        starts, ends = view.ints(node, "starts", 1), view.ints(node, "ends", 2)
        axes, steps = view.ints(node, "axes", 3), view.ints(node, "steps", 4)
        if starts is None or ends is None or len(starts) != 1 or (steps is not None and steps != [1]):
            return None
        axis, start, stop = (axes[0] if axes else 0) % len(dims), starts[0], ends[0]
        if start < 0 and stop >= 2 ** 31:
            stop = 0  # to the end
        elif (start < 0) != (stop < 0) and not isinstance(dims[axis], int):
            return None  # from the start to a place counted from the end: its count depends on the length
    size = dims[axis]
    if isinstance(size, int):  # counted from the start
        start, stop = (max(0, min(v + size if v < 0 else v, size)) for v in (start, stop if stop or start >= 0 else size))
        if not (0 <= start < stop <= size and stop - start < size):
            return None
    elif not (0 <= start < stop < 2 ** 31 or start < stop <= 0):  # rows 1.. of any length: no count known
        return None
    return Rows(axis, start, stop)


def _answerable_shape(view: GraphView, reader: onnx.NodeProto, rows: Rows, name: str) -> bool:
    """Whether `reader` is a whole `Shape` of `name` that the kept rows can answer: the axis' size is known."""
    dims = view.dims.get(name)
    return (reader.op_type == "Shape" and reader.domain in ("", "ai.onnx") and not reader.attribute
            and dims is not None and isinstance(dims[rows.axis], int))


class _Region:
    """The tensors that can be computed for the wanted rows only, from a selection upwards."""

    def __init__(self, view: GraphView, seeds: list[onnx.NodeProto], rows: Rows) -> None:
        self.view, self.seeds = view, seeds  # selections of one tensor on one axis; `rows`: the span they keep
        seed = seeds[0]
        self.wanted: dict[str, Rows] = {}  # every tensor some node of the region wants rows of
        self.plans: dict[str, tuple] = {}  # tensor -> its maker's plan, where the maker works row by row
        conflicting: set[str] = set()
        stack = [(seed.input[0], rows)]
        while stack:
            name, part = stack.pop()
            if name in self.wanted:
                if self.wanted[name] != part:
                    conflicting.add(name)
                continue
            self.wanted[name] = part
            node = view.maker.get(name)
            if node is None or name in view.outputs or name in view.body_reads:
                continue
            others = [out for out in node.output[1:] if out and (out in view.readers or out in view.outputs)]
            statistics = recomputed_outputs(node)
            if name in statistics or any(out in view.outputs for out in others) or not all(
                    outputs_follow_rows(node) or out in statistics for out in others):
                continue  # another output is read, and it neither comes row for row with the first nor describes it
            if node.output[0] != name:
                stack.append((node.output[0], part))  # a second output moves with the first, for the same rows
                continue
            planned = plan(view, node, part)
            if planned is None:
                continue
            self.plans[name] = planned
            stack.extend((source, need) for source, need in zip(node.input, planned[0]) if need is not None and source)
        self.movable = set(self.plans) - conflicting
        while True:  # keep a tensor only where every reader is in the region, wanting the same rows
            reads = self._reads()
            dropped = {name for name in self.movable
                       if any(reads[out] != len(view.readers.get(out, ())) or self.wanted.get(out) != self.wanted[name]
                              for out in self.outputs(name))}
            if not dropped:
                break
            self.movable -= dropped

    def outputs(self, name: str) -> list[str]:
        """The outputs of the node making `name` (its first output) that are read and hold rows: they move together
        (a DynamicQuantizeLinear's scale and zero point move too, keeping their names: `_rewrite`)."""
        node = self.view.maker[name]
        statistics = recomputed_outputs(node)
        return [name] + [out for out in node.output[1:] if out in self.view.readers and out not in statistics]

    def moved(self, name: str) -> bool:
        """Whether tensor `name`, a node's first output or another, is computed for its wanted rows only."""
        node = self.view.maker.get(name)
        return node is not None and node.output[0] in self.movable and name in self.outputs(node.output[0])

    def _reads(self) -> Counter:
        reads: Counter = Counter()
        for name in self.movable:
            node, parts = self.view.maker[name], self.plans[name][0]
            reads.update(source for source, need in zip(node.input, parts)
                         if need is not None and need == self.wanted.get(source))
        data = self.seeds[0].input[0]
        reads[data] += sum(1 for seed in self.seeds for name in seed.input if name == data)
        for name in self.movable:
            reads[name] += sum(1 for reader in self.view.readers.get(name, ())
                               if _answerable_shape(self.view, reader, self.wanted[name], name))
        return reads

    def moves(self) -> bool:
        return self.moved(self.seeds[0].input[0])


class _Writer(NodeWriter):
    """The nodes a rewrite adds (names `<base>__rows<n>`), its constants and Slices."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model, "__rows")

    def stored_rows(self, values: np.ndarray, need: Rows, base: str) -> str:
        """The rows `need` of a stored tensor, stored (a Slice would copy them out of the weight on every run)."""
        cut = [slice(None)] * values.ndim
        cut[need.axis] = slice(need.start, None if need.start < 0 and need.stop == 0 else need.stop)
        return self.weight(np.ascontiguousarray(values[tuple(cut)]), base + "_rows")

    def constant(self, values, base: str, dtype=np.int64) -> str:
        name = self.name(base)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.asarray(values, dtype=dtype), name)))
        return name

    def slice(self, source: str, start: int, stop: int, axis: int, base: str, outputs=None) -> str:
        """`source[start:stop]` on `axis`, as a Slice of constant bounds (a stop of 0 after a negative start: the end)."""
        stop = _END if start < 0 and stop == 0 else stop
        return self.node("Slice", [source, self.constant([start], base + "_start"), self.constant([stop], base + "_stop"),
                                   self.constant([axis], base + "_axis")], base + "_rows", outputs=outputs)


def _rewrite(model: onnx.ModelProto, region: _Region, done: set[str]) -> onnx.ModelProto:
    """The nodes of `region` computing the wanted rows only, their Shape readers and the selection made to read them.
    What it writes goes into `done`: the Slices it cuts the region's inputs with are where this region stopped, and a
    moved Gather or Slice selects rows this region already keeps, no selection to move again (CN_CLIP's image encoder
    takes its queries from the stacked projection with a Gather: moved, it swapped places with the Slice it reads
    15 times over, one node a time, before the limit)."""
    view = region.view
    writer = _Writer(model)
    renamed: dict[str, str] = {}

    def take(source: str, need: Rows) -> str:
        if region.moved(source) and region.wanted[source] == need:
            return renamed[source]
        if source in view.values and (stored := view.constant(source)) is not None:
            return writer.stored_rows(stored, need, source)  # a weight's columns (one third of a stacked projection)
        return writer.slice(source, need.start, need.stop, need.axis, source)

    replaced: set[int] = set()  # the original nodes the rewrite answers for
    for node in model.graph.node:  # in graph order: a node's moved inputs are written before it
        name = node.output[0] if node.output else ""
        if name not in region.movable:
            continue
        parts, changes = region.plans[name]
        inputs = [take(source, need) if need is not None and source else source for source, need in zip(node.input, parts)]
        if "shape" in changes:
            inputs[1] = writer.constant(changes["shape"], name + "_shape")
        moved = onnx.NodeProto()
        moved.CopyFrom(node)
        del moved.input[:], moved.output[:]
        moved.input.extend(inputs)
        for out in region.outputs(name):
            renamed[out] = writer.name(out)
        statistics = recomputed_outputs(node)  # its readers, in the region or not, read them as the moved node's
        moved.output.extend(renamed.get(out, out if out in statistics else "") for out in node.output)
        if statistics:
            replaced.add(id(node))
        while moved.output and not moved.output[-1]:
            moved.output.pop()  # the outputs nobody reads, left off at the end
        moved.name = writer.name((node.name or name) + "_kept")
        writer.nodes.append(moved)
        for reader in view.readers.get(name, ()):
            if _answerable_shape(view, reader, region.wanted[name], name):
                rows = region.wanted[name]
                shape = writer.node("Shape", [renamed[name]], name + "_shape")
                writer.node("ScatterElements", [shape, writer.constant([rows.axis], name + "_axis"),
                                                writer.constant([view.dims[name][rows.axis]], name + "_size")],
                            name + "_size", outputs=list(reader.output), axis=0)
                replaced.add(id(reader))
    span = region.wanted[region.seeds[0].input[0]]
    for seed in region.seeds:  # each selection now reads the span's rows, counted from the span's start
        kept, rows = renamed[seed.input[0]], _seed(view, seed)
        if seed.op_type == "Gather":
            index = np.full_like(view.constant(seed.input[1]), rows.start - span.start)
            writer.node("Gather", [kept, writer.constant(index, seed.input[1], index.dtype)], seed.output[0],
                        outputs=list(seed.output), axis=attribute(seed, "axis", 0))
        elif rows == span:
            writer.node("Identity", [kept], seed.output[0], outputs=list(seed.output))
        else:
            writer.slice(kept, rows.start - span.start, rows.stop - span.start, rows.axis, seed.output[0],
                         outputs=list(seed.output))
        replaced.add(id(seed))
    done.update(out for node in writer.nodes for out in node.output)
    return writer.rewritten(model, replaced)


def _prune_once(model: onnx.ModelProto, done: set[str]) -> tuple[onnx.ModelProto, int, GraphView]:
    """`model` with the first selection not in `done` (by output name) that can move up moved (a new model; its name
    then added to `done`), how many nodes now compute the kept rows only, and the view of `model`; (`model`, 0, its
    view) when none can."""
    view = GraphView(model)
    for seeds, span in _selections_by_tensor(view, done):
        done.update(seed.output[0] for seed in seeds)  # moved once: what they read now has the kept rows only
        region = _Region(view, seeds, span)
        if region.moves():
            return _rewrite(model, region, done), len(region.movable), view
    return model, 0, view


def _selections_by_tensor(view: GraphView, done: set[str]) -> list[tuple[list[onnx.NodeProto], Rows]]:
    """The selections not in `done`, grouped by the tensor and axis they select from (a distilled ViT keeps two
    tokens, its class and distillation token), with the span of rows the group keeps; a group whose span is the
    whole axis is left out."""
    groups: dict[tuple[str, int], list] = {}
    for node in view.model.graph.node:
        rows = None if not node.output or node.output[0] in done else _seed(view, node)
        if rows is not None:
            groups.setdefault((node.input[0], rows.axis), []).append((node, rows))
    found = []
    for (name, axis), members in groups.items():
        if len({rows.start < 0 for _, rows in members}) > 1:
            continue  # some counted from the start, some from the end: no span is known
        span = Rows(axis, min(rows.start for _, rows in members), max(rows.stop for _, rows in members))
        size = view.dims[name][axis]
        if not isinstance(size, int) or span.stop - span.start < size:
            found.append(([node for node, _ in members], span))
    return found


def prune_unused_rows(model: onnx.ModelProto, limit: int = 16) -> tuple[onnx.ModelProto, int]:
    """`model` computing only the rows its selections keep (a new model; `model` is not changed) and how many nodes
    now do, an attention left with the kept query rows reading its keys and values through their weights
    (compile/kept_query_attention.py: those projections' nodes counted too); `model` itself and 0 when none can (no
    selection of a tensor computed row by row, or an opset below `MIN_OPSET`). At most `limit` selections are moved.
    A model without a selection (`selections`, config/row_selections.py) costs no shape inference (ResNet-50: 1 ms
    against 120 for the graph's view, per static bucket and per lowering)."""
    if (default_opset(model) or 0) < MIN_OPSET or not selections(model):
        return model, 0
    model, total, view = _prune(model, limit)
    model, rewritten = kept_query_attention(model, view)  # the keys and values of a kept query: kept_query_attention.py
    if rewritten:  # a projection of queries, keys and values in one weight now has the queries' kept rows as readers
        model, more, _ = _prune(model, limit)
        total += more
    return model, total + rewritten


def _prune(model: onnx.ModelProto, limit: int) -> tuple[onnx.ModelProto, int, GraphView | None]:
    """Up to `limit` selections moved: the model, how many nodes moved, and the view of the model where it is current."""
    total, done, view = 0, set(), None
    for _ in range(limit):
        model, moved, view = _prune_once(model, done)
        if not moved:
            break
        total += moved
        view = None  # of the model before this move
    return model, total, view


def kept_rows_only(model: onnx.ModelProto, log: Callable[[str], None], what: str) -> onnx.ModelProto:
    """`prune_unused_rows` for a lowering's input: the model to quantize (`model` where nothing moved), the load log
    told how many nodes now compute the kept rows only (`what`: the log line's start, "precision int8")."""
    try:
        pruned, moved = prune_unused_rows(model)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the model as it is still lowers
        log(f"{what}: the rows pass failed on the graph ({reason(exc)}); quantized as it is")
        return model
    if moved:
        log(f"{what}: {moved} node(s) compute only the rows of a sequence the outputs keep (the first token), "
            f"before quantizing")
    return pruned


def served_kept_rows(path: Path, signature, log: Callable[[str], None] = lambda message: None,
                     temp_parent: Path | None = None) -> Path:
    """The file the engines load, in either graph mode: `path` itself (its `signature` lists no selection: the file is
    not read again; none moves; or its weights are external data, which a copy would duplicate), or a copy computing
    only the kept rows (config/model_copy.py), said in the log."""
    if not signature.selections:
        return path
    model = onnx.load(str(path), load_external_data=False)
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer):
        return path  # a copy would copy its weights too (a tmpfs: memory); the static pass and int8 still prune
    try:
        pruned, moved = prune_unused_rows(model)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the file as it is still serves
        log(f"the rows pass failed on the file ({reason(exc)}); the file is served as it is")
        return path
    if not moved:
        return path
    log(f"{moved} node(s) compute only the rows of a sequence the outputs keep (the first token): served from a copy")
    from gebackend.config.model_copy import served_copy

    return served_copy(pruned, Path(path), temp_parent, "ge-rows-", "computing only the rows its outputs keep")


class UnusedRowsPass(GraphPass):
    """Compute only the rows of a sequence an output keeps (an encoder's first token)."""

    name = "rows"

    def run(self, model: onnx.ModelProto, context: PassContext) -> onnx.ModelProto:
        pruned, moved = prune_unused_rows(model)
        if not moved:
            return model
        from gebackend.compile.specialize import infer  # specialize.py declares a pass: imported late

        entry = pruned.metadata_props.add()  # what the doctor reports: it tells this pass's nodes from the fold's
        entry.key, entry.value = METADATA_KEY, f"{moved} {len(pruned.graph.node) - len(model.graph.node)}"
        return infer(pruned, context.warn)  # the moved nodes' shapes, which the static engines read


def pass_record(model: onnx.ModelProto) -> tuple[int, int]:
    """What the static pass did to a compiled graph: (nodes moved to compute the kept rows only, nodes it added: its
    Slices and constants, less the shape arithmetic it made unneeded); (0, 0) where it did nothing."""
    for entry in model.metadata_props:
        if entry.key == METADATA_KEY:
            moved, added = entry.value.split()
            return int(moved), int(added)
    return 0, 0


PASS = UnusedRowsPass()
