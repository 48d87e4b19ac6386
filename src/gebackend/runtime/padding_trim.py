"""`trim_padding`: a batch's trailing padding cut off its sequence axis before the engine runs it.

Tokenizers pad every text to the model's context (CN_CLIP's `tokenize`: 52 tokens, `[PAD]` = 0) and clients send it
so. A model that masks its padding (attention masks built from the ids, pooling over the first token) gives the same
answer on the real tokens alone, and a transformer's work grows with the sequence: on the 4-layer CN_CLIP text
encoder, 1 thread, one text took 88 ms at 52 tokens and 29 ms at 16. With `trim_padding=INPUT` (or `INPUT=PAD`, the
pad id, 0 by default) each batch runs only as long as its longest row:

- `TrimPlan.of`: which inputs are cut: INPUT along its last axis, and every input whose last dim is the same ONNX dim
  (an attention mask, token type ids); a request still sends the config's full length;
- `loosened_model`: the engines' copy of a file that fixes that dim (`[batch, 52]`) with the dim left free;
- `TrimPlan.cut`: the feeds cut to the longest row's last non-pad position (in static graph mode: to the shortest
  compiled length holding it, the pad ids already there filling the rest);
- `check`: at load, seeded inputs run full and cut through the engine; a model whose outputs move (it does not mask
  its padding, or an output keeps the sequence axis) is served uncut, and the load says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from gebackend.config.spec import ModelSpec
from gebackend.config.trim_padding import trimmed_inputs
from gebackend.errors import GeBackendError
from gebackend.runtime.same_answer import exact_disagreement, fp32_disagreement

Tensors = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class TrimPlan:
    model: str
    key: str  # the input whose pad ids say where the padding starts
    pad: int
    inputs: tuple[str, ...]  # every input cut along its last axis (key first)
    lengths: tuple[int, ...] = ()  # static graph mode: the compiled sequence lengths; empty: any length runs
    # static graph mode: whether a batch of these shapes has buckets to run on (the router's plan); None: any runs
    fits: Callable[[dict], bool] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, spec: ModelSpec, fits: Callable[[dict], bool] | None = None) -> "TrimPlan":
        """The plan for the spec's `trim_padding` (config/trim_padding.py: `ConfigError` for what it refuses); in static
        graph mode it cuts to a length the spec compiles whose buckets take the batch (`fits`)."""
        option = spec.options.static.trim_padding
        inputs = trimmed_inputs(spec.name, option, spec.inputs, spec.batching)
        lengths = sorted({shapes[option[0]][-1] for shapes in spec.static_shapes})
        return cls(spec.name, option[0], option[1], inputs, tuple(lengths), fits)

    def needed(self, ids: np.ndarray) -> int:
        """How many positions of the last axis this batch needs: one past its last non-pad position, at least 1."""
        used = np.flatnonzero((ids != self.pad).reshape(-1, ids.shape[-1]).any(axis=0))
        return int(used[-1]) + 1 if used.size else 1

    def cut(self, feeds: Tensors) -> Tensors:
        """`feeds` with every planned input cut to the batch's length; unchanged when nothing would be cut."""
        ids = feeds.get(self.key)
        if ids is None or ids.ndim < 1:
            return feeds
        full = ids.shape[-1]
        if any(feeds[n].shape[-1] != full for n in self.inputs if n in feeds):
            return feeds
        needed = self.needed(ids)
        for keep in ([n for n in self.lengths if needed <= n < full] if self.lengths else [needed]):
            if keep >= full:
                break
            out = dict(feeds)
            for name in self.inputs:
                if name in out:
                    out[name] = np.ascontiguousarray(out[name][..., :keep])
            if self.fits is None or self.fits({n: a.shape for n, a in out.items()}):
                return out
        return feeds

    def describe(self) -> str:
        also = f" (with {', '.join(self.inputs[1:])})" if len(self.inputs) > 1 else ""
        lengths = f", to compiled lengths {list(self.lengths)}" if self.lengths else ""
        return f"trim_padding: '{self.key}'{also} cut after its last token other than {self.pad}{lengths}"


class Trimmer:
    """The executor's trim hook: the plan's cut, counting the positions of the key input sent and cut away (Triton's
    metrics endpoint shows them: gebackend_token_positions_total, gebackend_trimmed_positions_total)."""

    def __init__(self, plan: TrimPlan):
        self.plan = plan
        self.positions = 0  # rows x positions of the key input, as sent
        self.trimmed = 0  # of those, how many were cut off before the engine ran

    def __call__(self, feeds: Tensors) -> Tensors:
        out = self.plan.cut(feeds)
        ids = feeds.get(self.plan.key)
        if ids is not None:
            self.positions += ids.size
            self.trimmed += ids.size - out[self.plan.key].size
        return out


def loosened_model(path: Path, plan: TrimPlan, write_copy: Callable) -> Path:
    """`path`, or a copy whose cut inputs leave their last dim free where the file fixes it (`[batch, 52]`): the engines
    then take the cut lengths. `write_copy(model, path)` writes the copy (config/model_copy.write_model_copy)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    changed = False
    for value in model.graph.input:
        if value.name in plan.inputs:
            dim = value.type.tensor_type.shape.dim[-1]
            if dim.HasField("dim_value"):
                dim.dim_param = "ge_trimmed_sequence"  # setting the param clears the value (a oneof)
                changed = True
    return write_copy(model, path) if changed else path


def check(run: Callable[[Tensors], dict], plan: TrimPlan, full_shapes: Mapping[str, tuple[int, ...]],
          model_path: Path, reference: Path | None = None) -> str | None:
    """Run seeded inputs of `full_shapes` whole and cut; None when every output agrees, else why not (one line).

    A lowered model (int8, fp16: `reference` is the fp32 file it came from) is not exact at either length, and its
    dynamic int8 scales activations by their range, padding included: there, cut must be as close to the fp32 model's
    full-length answer as whole is (runtime/same_answer.py).

    Rows are real for a quarter or three eighths of the length, the rest pad ids (zeros in the other cut inputs); the
    real part, and the other inputs, are `compile/accuracy.random_feeds`' seeded values (ones in a mask).
    """
    from gebackend.compile.accuracy import random_feeds

    feeds = random_feeds(model_path, full_shapes)
    full = full_shapes[plan.key][-1]
    rows = full_shapes[plan.key][0]
    real = [max(1, full * (2 + r % 2) // 8) for r in range(rows)]  # a quarter of the length, then three eighths, ...
    for name in plan.inputs:
        array = feeds[name]
        for r, n in enumerate(real):
            if name == plan.key:
                tokens = array[r, ..., :n]
                tokens[tokens == plan.pad] = plan.pad + 1
                array[r, ..., n:] = plan.pad
            else:
                array[r, ..., n:] = 0
    cut_feeds = plan.cut(feeds)
    if cut_feeds is feeds:
        return "the check's inputs (real for a quarter to three eighths of the length) were not cut"
    try:
        whole = run(feeds)
        cut = run(cut_feeds)
    except GeBackendError as exc:
        return f"the model did not run its cut inputs: {exc}"
    for name, expected in whole.items():
        got = cut[name]
        if got.shape != expected.shape:
            return (f"output '{name}' has shape {list(got.shape)} cut and {list(expected.shape)} whole (it keeps the "
                    f"sequence axis)")
    if reference is not None:
        return fp32_disagreement(reference, feeds, whole, cut, "cut")
    return exact_disagreement(whole, cut, "when the padding is cut")


def full_shapes(spec: ModelSpec, plan: TrimPlan) -> dict[str, tuple[int, ...]]:
    """The shapes the load-time check runs whole: a compiled shape of the longest length (2 rows where compiled), or
    in dynamic graph mode the config's dims with 2 rows (a free dim: 32 positions for the cut ones, else 16)."""
    if spec.static:
        longest = max(shapes[plan.key][-1] for shapes in spec.static_shapes)
        chosen = [s for s in spec.static_shapes if s[plan.key][-1] == longest]
        return dict(min(chosen, key=lambda s: (abs(next(iter(s.values()))[0] - 2), next(iter(s.values()))[0])))
    out = {}
    for tensor in spec.inputs:
        last = len(tensor.dims) - 1
        dims = tuple(d if d > 0 else (32 if axis == last and tensor.name in plan.inputs else 16)
                     for axis, d in enumerate(tensor.dims))
        out[tensor.name] = ((2,) if spec.batching else ()) + dims
    return out


def build_trimmed(spec: ModelSpec, build: Callable[[ModelSpec], tuple], log: Callable[[str], None],
                  reference: Path | None = None) -> tuple:
    """`build(spec)` (runtime/loader.py's executor and load line) on the loosened file, the executor cutting each batch
    once the check passed; served at the full length, saying why, when it did not. `ConfigError` for an option that
    does not fit the model. `reference`: the fp32 file a lowered `spec.path` came from (see `check`)."""
    import dataclasses

    from gebackend.config.model_copy import write_model_copy
    from gebackend.control.env import server_temp_parent

    plan = TrimPlan.of(spec)
    path = loosened_model(spec.path, plan, lambda model, p: write_model_copy(model, p, server_temp_parent(), "ge-trim-"))
    executor, how = build(dataclasses.replace(spec, path=path))
    whole_shapes = full_shapes(spec, plan)
    full = max(whole_shapes[plan.key][-1], 1)
    if spec.static:
        router = executor.runner.router
        plan = dataclasses.replace(plan, fits=lambda shapes: router.plan(shapes) is not None)
    if spec.static and not any(n < full for n in plan.lengths):
        reason = (f"the static graph compiles no length of '{plan.key}' shorter than {full}; list shorter ones in "
                  f"graph.ge.dynamicDims")
    else:
        try:
            reason = check(executor.runner.run, plan, whole_shapes, path, reference)
        except Exception as exc:  # noqa: BLE001 - the check failing is a reason not to cut, never a load failure
            reason = f"the check could not run: {type(exc).__name__}: {exc}"
    if reason is not None:
        log(f"trim_padding: not used, every batch runs at the full length: {reason}")
        return executor, f"trim_padding off ({reason}), {how}"
    executor.trim = Trimmer(plan)
    checked = ("the outputs do not move when the padding is cut" if reference is None
               else "cut, the lowered model is as close to fp32 as at the full length")
    log(f"{plan.describe()}; checked at load: {checked}")
    return executor, f"{plan.describe()}, {how}"
