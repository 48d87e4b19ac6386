"""Which input shapes a static model is compiled for: ge-backend's shape buckets, or the shapes config.pbtxt fixes.

`graph.ge.inputShape="image:-1,3,-1,-1"` names each input's full shape (batch dim included when the
model batches), with `-1` for every dim a bucket fills in; `graph.ge.dynamicDims="1,224,224;8,224,224"`
lists the buckets, one value per `-1` in the order they appear, buckets separated by `;`. Several
inputs are separated by `;` in inputShape. Without buckets, `static_model=1` compiles the shapes
config.pbtxt fixes, with batch sizes 1, 2, 4, ... up to max_batch_size when the model batches; where an input dim is
free and no bucket fixes it, there is nothing to compile and the model is served on the dynamic graph (`FreeDims`).
The file's dim names are hints (config/dim_names.py): a bucket giving one name two sizes is compiled as written, and
the engine decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from gebackend.config.options import BackendOptions
from gebackend.config.trim_padding import trimmed_inputs
from gebackend.errors import ConfigError

if TYPE_CHECKING:  # spec.py builds on this module: no import back at run time
    from gebackend.config.spec import TensorSpec

Shapes = dict[str, tuple[int, ...]]  # input name -> full shape (batch dim included when batching)


class FreeDims(ConfigError):
    """static_model=1 on a model with a free input dim that no bucket fixes: nothing to compile, so the model is
    served on the dynamic graph (`ModelSpec.static_note` keeps this message for the load line)."""


def _ints(model: str, key: str, text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"model '{model}': {key} has a non-integer value in {text!r}") from None


def parse_buckets(model: str, input_shape: str, dynamic_dims: str) -> list[Shapes]:
    """Parse graph.ge.inputShape / graph.ge.dynamicDims into one `Shapes` per bucket (unchecked against the model)."""
    if not input_shape or not dynamic_dims:
        missing = "graph.ge.dynamicDims" if input_shape else "graph.ge.inputShape"
        raise ConfigError(f"model '{model}': shape buckets need both graph.ge.inputShape and graph.ge.dynamicDims; {missing} is missing")
    templates: list[tuple[str, list[int]]] = []
    for part in filter(None, (p.strip() for p in input_shape.split(";"))):
        name, sep, dims = part.rpartition(":")
        if not sep or not name.strip():
            raise ConfigError(f"model '{model}': graph.ge.inputShape entry {part!r} is not NAME:d0,d1,...")
        templates.append((name.strip(), _ints(model, "graph.ge.inputShape", dims)))
    free = sum(d == -1 for _, dims in templates for d in dims)
    buckets = []
    for number, part in enumerate(filter(None, (p.strip() for p in dynamic_dims.split(";"))), start=1):
        values = _ints(model, "graph.ge.dynamicDims", part)
        if len(values) != free:
            raise ConfigError(
                f"model '{model}': graph.ge.dynamicDims bucket {number} ({part!r}) has {len(values)} values but "
                f"graph.ge.inputShape ({input_shape!r}) has {free} dims set to -1"
            )
        if any(v < 1 for v in values):
            raise ConfigError(f"model '{model}': graph.ge.dynamicDims bucket {number} ({part!r}) has a dim < 1")
        it = iter(values)
        buckets.append({name: tuple(next(it) if d == -1 else d for d in dims) for name, dims in templates})
    if not buckets:
        raise ConfigError(f"model '{model}': graph.ge.dynamicDims lists no bucket")
    return buckets


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _check_bucket(model: str, number: int, bucket: Shapes, inputs: Sequence[TensorSpec], max_batch_size: int,
                  shorter: Sequence[str] = ()) -> Shapes:
    """Complete a bucket with the inputs it leaves out and check it against the model's inputs; the inputs in
    `shorter` (those trim_padding cuts) may be compiled shorter than their fixed last dim."""
    batching = max_batch_size > 0
    names = {t.name for t in inputs}
    for name in bucket:
        if name not in names:
            raise ConfigError(f"model '{model}': graph.ge.inputShape names input '{name}', but the model's inputs are {sorted(names)}")
    batch = next(iter(bucket.values()))[0] if batching else None
    full: Shapes = {}
    for tensor in inputs:
        offset = 1 if batching else 0
        shape = bucket.get(tensor.name)
        if shape is None:
            if -1 in tensor.dims:
                raise ConfigError(
                    f"model '{model}': input '{tensor.name}' has unresolved dims {_fmt(tensor.dims)} and is not in "
                    f"graph.ge.inputShape; add it there"
                )
            shape = ((batch,) if batching else ()) + tensor.dims
        where = f"model '{model}': bucket {number} gives input '{tensor.name}' shape {_fmt(shape)}"
        if len(shape) != len(tensor.dims) + offset:
            raise ConfigError(f"{where}, but the model expects rank {len(tensor.dims) + offset}")
        if batching:
            if shape[0] > max_batch_size:
                raise ConfigError(f"{where}, whose batch {shape[0]} exceeds max_batch_size {max_batch_size}")
            if shape[0] != batch:
                raise ConfigError(f"{where}, whose batch {shape[0]} differs from the other inputs' ({batch})")
        last = len(shape) - 1
        for axis, (want, got) in enumerate(zip(tensor.dims, shape[offset:]), start=offset):
            if want != -1 and got != want and not (axis == last and tensor.name in shorter and got < want):
                raise ConfigError(f"{where}, but dim {axis} is fixed to {want}")
        for limit in tensor.limits:
            if shape[limit.axis] > limit.most:
                raise ConfigError(f"{where}, but dim {limit.axis} may be at most {limit.describe()}")
        full[tensor.name] = tuple(shape)
    return full


def _batch_sizes(max_batch_size: int) -> list[int]:
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch_size]


def compiled_shapes(model: str, max_batch_size: int, inputs: Sequence[TensorSpec], options: BackendOptions) -> list[Shapes]:
    """The shapes to compile, smallest first; [] when the model runs in dynamic graph mode."""
    static = options.static
    if static.input_shape or static.dynamic_dims:
        buckets = parse_buckets(model, static.input_shape, static.dynamic_dims)
        shorter = trimmed_inputs(model, static.trim_padding, inputs, max_batch_size > 0) if static.trim_padding else ()
        checked = [_check_bucket(model, n, b, inputs, max_batch_size, shorter) for n, b in enumerate(buckets, start=1)]
    elif static.static_model:
        for tensor in inputs:
            for axis, (dim, label) in enumerate(zip(tensor.dims, tensor.labels)):
                if dim == -1:
                    shown = f" ('{label}')" if label else ""
                    raise FreeDims(
                        f"static_model=1 needs every input shape fixed, but input '{tensor.name}' dim "
                        f"{axis + (1 if max_batch_size > 0 else 0)}{shown} is free and no bucket fixes it, so the "
                        f"model is served on the dynamic graph; fix it with dims in config.pbtxt, or compile shape "
                        f"buckets with graph.ge.inputShape and graph.ge.dynamicDims"
                    )
        if max_batch_size > 0:
            checked = [{t.name: (b,) + t.dims for t in inputs} for b in _batch_sizes(max_batch_size)]
        else:
            checked = [{t.name: t.dims for t in inputs}]
    else:
        return []
    unique = {tuple(sorted(s.items())): s for s in checked}
    return sorted(unique.values(), key=lambda s: tuple(s.values()))


def check_paddable(model: str, inputs: Sequence[TensorSpec], options: BackendOptions) -> None:
    labels = {label for t in inputs for label in t.labels if label}
    for name in options.static.bucket_paddable_dims:
        if name not in labels:
            raise ConfigError(
                f"model '{model}': bucket_paddable_dims names dim '{name}', but the model's named dims are {sorted(labels)}"
            )
