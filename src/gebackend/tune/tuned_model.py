"""The model folder under tune: its config, ONNX file and complete IO (filled from the ONNX file), the shapes its
requests send (a variable dim: what compile/seed_shapes.py gives seeded requests, the first size the model runs of its
config, model_warmup, metadata and probed sizes, VARIABLE_DIM where none runs; or the user's --input-data), and why
static candidates are left out where they are."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.modelzoo.bench_models import BenchInput, BenchModel
from gebackend.config.spec import TensorSpec
from gebackend.errors import ConfigError

DEFAULT_MAX_BATCH_SIZE = 8  # what the backend gives a batching model whose config does not say (default_max_batch_size)
VARIABLE_DIM = 16  # a variable non-batch dim no size is found for is sent as this (random_feeds' default)
MAX_LENGTHS = 4  # requests of several lengths: at most this many compiled (x each batch bucket)


@dataclass(frozen=True)
class TunedModel:
    """The model folder under tune: its config, ONNX file and the complete IO (filled from the ONNX file)."""

    dir: Path
    name: str
    config: Mapping
    config_text: str
    onnx_path: Path
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    static_problem: str = ""  # why static candidates are left out ("" = they are not)
    # inputs with a variable dim -> the non-batch dims requests send them (VARIABLE_DIM unless --input-data says):
    # static candidates compile their buckets at these, and run other shapes on the dynamic graph (bucket_fallback)
    sent_dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # requests of several lengths along one named dim (a sequence): the lengths static candidates compile, each request
    # padded up to the next (bucket_paddable_dims, checked at load); sent_dims then holds the longest shapes
    pad_dim: str = ""
    pad_lengths: tuple[int, ...] = ()
    # the user's requests (--input-data, an absolute path) the static int8 rungs calibrate on ("" = seeded samples)
    calibration: str = ""
    seeded_from: str = ""  # where the seeded requests' variable dims came from (compile/seed_shapes.py)

    @classmethod
    def load(cls, model_dir: Path) -> "TunedModel":
        from gebackend.config.model_file import find_model_file
        from gebackend.config.onnx_signature import read_signature
        from gebackend.config.pbtxt import load_model_config
        from gebackend.config.spec import reconcile

        model_dir = Path(model_dir)
        config_path = model_dir / "config.pbtxt"
        config = load_model_config(config_path)
        versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        if not versions:
            raise FileNotFoundError(f"{model_dir} has no version folder (1/model.onnx)")
        onnx_path = find_model_file(versions[-1], config.get("default_model_filename", ""))
        name = config["name"]
        rec = reconcile(name, config, read_signature(onnx_path), DEFAULT_MAX_BATCH_SIZE, fill=True)
        if rec.sequence is not None:
            raise ConfigError(
                f"model '{name}' uses sequence_batching (a stateful model); tune searches stateless configs only: its "
                f"batching rungs are the dynamic batcher's, which Triton does not combine with the sequence batcher. "
                f"Measure it with perf_analyzer (it sends sequences to such a model by itself)")
        if rec.ragged is not None:
            raise ConfigError(
                f"model '{name}' uses ragged batching (allow_ragged_batch, batch_input); tune does not search it: "
                f"its static rungs cannot serve it and perf_analyzer would send every request the same length. "
                f"Measure it with perf_analyzer --input-data holding requests of the lengths you serve")
        problem = ""
        for t in rec.inputs:
            if not t.dims or (-1 in t.dims and rec.max_batch_size <= 0):
                problem = (f"input {t.name} has no fixed dims (dims {list(t.dims)})" if not t.dims else
                           f"input {t.name} has a variable dim (dims {list(t.dims)}) and the model does not batch")
                break
        variable, seeded_from = _seeded_dims(onnx_path, rec.inputs, rec.max_batch_size > 0, config.get("model_warmup"))
        return cls(model_dir, name, config, config_path.read_text(), onnx_path,
                   config.get("backend") or config.get("platform", ""), rec.max_batch_size, rec.inputs, rec.outputs,
                   problem, {} if problem else variable, seeded_from=seeded_from)

    def with_requests(self, entries: Sequence[Mapping]) -> "TunedModel":
        """The model measured with the user's requests (perf_analyzer --input-data entries): the static candidates'
        buckets compile the dims the requests send to each input with a variable dim, when every request sends the
        same; requests of several lengths along one named dim, at most `MAX_LENGTHS` of them (else that many at their
        quartiles), padded up to the next (`pad_lengths`); otherwise static candidates are left out, saying why."""
        shapes = {name: [_shape(entry.get(name)) for entry in entries] for name in self.sent_dims}
        for name, dims in self.sent_dims.items():
            if any(shape is None or len(shape) != len(dims) for shape in shapes[name]):
                return replace(self, sent_dims={}, static_problem=(
                    f"the shape your requests send to input {name} (a variable dim) cannot be read from --input-data: "
                    f"give each request's {name} a \"shape\" of {len(dims)} dims"))
        if all(len(set(sent)) == 1 for sent in shapes.values()):
            return replace(self, sent_dims={name: sent[0] for name, sent in shapes.items()})
        label, lengths = self._lengths(shapes)
        if not lengths:
            name, sent = next((name, set(sent)) for name, sent in shapes.items() if len(set(sent)) > 1)
            return replace(self, sent_dims={}, static_problem=(
                f"your requests send input {name} (a variable dim) in {len(sent)} shapes "
                f"({', '.join(str(list(s)) for s in sorted(sent)[:4])}{', ...' if len(sent) > 4 else ''}): "
                f"a static candidate compiles the one shape requests send, or the lengths of one named dim (such as "
                f"a sequence) padded up; the dynamic graph takes them all"))
        longest = {name: max(sent, key=sum) for name, sent in shapes.items()}  # they differ in the length only
        return replace(self, sent_dims=longest, pad_dim=label, pad_lengths=lengths)

    def _lengths(self, shapes: Mapping[str, list]) -> tuple[str, tuple[int, ...]]:
        """(the named dim, the lengths to compile) where every variable dim of every input is that one dim and each
        request sends one length along all of them; ("", ()) otherwise."""
        by_name = {t.name: t for t in self.inputs}
        labels = {label for name in shapes for d, label in zip(by_name[name].dims, by_name[name].labels) if d == -1}
        if len(labels) != 1 or None in labels:
            return "", ()
        sent = []
        for request in zip(*shapes.values()):
            values = {v for name, shape in zip(shapes, request) for d, v in zip(by_name[name].dims, shape) if d == -1}
            fixed_ok = all(v == d for name, shape in zip(shapes, request) for d, v in zip(by_name[name].dims, shape)
                           if d != -1)
            if len(values) != 1 or not fixed_ok:
                return "", ()
            sent.append(values.pop())
        distinct = sorted(set(sent))
        if len(distinct) > MAX_LENGTHS:  # the lengths at the quartiles of the requests: a quarter padded up to each
            ordered = sorted(sent)
            distinct = sorted({ordered[-(-len(ordered) * q // MAX_LENGTHS) - 1] for q in range(1, MAX_LENGTHS + 1)})
        return labels.pop(), tuple(distinct)

    def length_buckets(self, batches: Sequence[int]) -> dict[str, str]:
        """With `pad_lengths`: the static candidates' buckets, every batch size at every length, the named dim padded
        (graph.ge.inputShape, graph.ge.dynamicDims, bucket_paddable_dims); {} otherwise."""
        if not self.pad_lengths:
            return {}
        template = ";".join(f"{t.name}:-1," + ",".join(str(d) for d in t.dims) for t in self.inputs)
        per_input = [sum(d == -1 for d in t.dims) for t in self.inputs]
        buckets = ";".join(",".join(",".join([str(b)] + [str(n)] * count) for count in per_input)
                           for b in batches for n in self.pad_lengths)
        return {"graph.ge.inputShape": template, "graph.ge.dynamicDims": buckets, "bucket_paddable_dims": self.pad_dim}

    def request_dims(self, tensor: TensorSpec) -> tuple[int, ...]:
        """One request's shape of an input, batch dim included when the model batches (variable dims: the dims the
        requests send, `sent_dims`; VARIABLE_DIM where not known)."""
        return ((1,) if self.max_batch_size > 0 else ()) + self._dims(tensor)

    def _dims(self, tensor: TensorSpec) -> tuple[int, ...]:
        return self.sent_dims.get(tensor.name) or tuple(VARIABLE_DIM if d == -1 else d for d in tensor.dims)

    def bench_model(self) -> BenchModel:
        """The model as the bench's repository writer takes it (the ONNX file already exists: no export); an input's
        variable dims are the ones its requests send, which is what static candidates' buckets compile."""
        inputs = tuple(BenchInput(t.name, t.dtype.numpy.name, self._dims(t)) for t in self.inputs)
        return BenchModel(self.name, f"{self.dir}", inputs, export=lambda path: None,
                          max_batch_size=self.max_batch_size)


def _seeded_dims(onnx_path: Path, inputs: Sequence[TensorSpec], batching: bool,
                 warmup: Sequence[Mapping] | None = None) -> tuple[dict[str, tuple[int, ...]], str]:
    """The dims seeded requests send to each input with a variable dim, and where they came from: compile/seed_shapes.py's
    choice, the first that runs of the config's model_warmup, the file's metadata and probed sizes (224, 320, 640...
    for an image's sides; the channels a Conv reads, a dim named by a sum of others its value)."""
    from gebackend.compile.seed_shapes import seed_shapes

    chosen = seed_shapes(onnx_path, inputs, batching, warmup=warmup)
    seeded = chosen.shapes
    variable = {}
    for t in inputs:
        if -1 not in t.dims:
            continue
        shape = seeded.get(t.name, ())[1 if batching else 0:]
        fits = len(shape) == len(t.dims)
        variable[t.name] = tuple((shape[k] if fits else VARIABLE_DIM) if d == -1 else d for k, d in enumerate(t.dims))
    return variable, chosen.source + (f" ({chosen.why})" if chosen.runs is False else "")


def _shape(tensor) -> tuple[int, ...] | None:
    """One request's tensor shape in perf_analyzer's --input-data (batch dim dropped): its "shape", else the length of a
    flat list of values; None when neither is there."""
    if isinstance(tensor, dict) and isinstance(tensor.get("shape"), list):
        dims = tensor["shape"]
        return tuple(dims) if all(isinstance(d, int) and not isinstance(d, bool) for d in dims) else None
    if isinstance(tensor, list) and not any(isinstance(v, (list, dict)) for v in tensor):
        return (len(tensor),)
    return None
