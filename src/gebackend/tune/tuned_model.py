"""The model folder under tune: its config, ONNX file and complete IO (filled from the ONNX file), the shapes its
requests send (a variable dim: the seeded requests' VARIABLE_DIM, or the user's --input-data), and why static
candidates are left out where they are."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from gebackend.bench.models import BenchInput, BenchModel
from gebackend.config.spec import TensorSpec

DEFAULT_MAX_BATCH_SIZE = 8  # what the backend gives a batching model whose config does not say (default_max_batch_size)
VARIABLE_DIM = 16  # a variable non-batch dim is sent as this size (compile.accuracy.random_feeds' default)


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
        problem = ""
        for t in rec.inputs:
            if not t.dims or (-1 in t.dims and rec.max_batch_size <= 0):
                problem = (f"input {t.name} has no fixed dims (dims {list(t.dims)})" if not t.dims else
                           f"input {t.name} has a variable dim (dims {list(t.dims)}) and the model does not batch")
                break
        variable = {t.name: tuple(VARIABLE_DIM if d == -1 else d for d in t.dims) for t in rec.inputs if -1 in t.dims}
        return cls(model_dir, name, config, config_path.read_text(), onnx_path,
                   config.get("backend") or config.get("platform", ""), rec.max_batch_size, rec.inputs, rec.outputs,
                   problem, {} if problem else variable)

    def with_requests(self, entries: Sequence[Mapping]) -> "TunedModel":
        """The model measured with the user's requests (perf_analyzer --input-data entries): the static candidates'
        buckets compile the dims the requests send to each input with a variable dim, when every request sends the
        same; otherwise static candidates are left out, saying why."""
        sent = {}
        for name, dims in self.sent_dims.items():
            shapes = {_shape(entry.get(name)) for entry in entries}
            if None in shapes or any(len(shape) != len(dims) for shape in shapes):
                return replace(self, sent_dims={}, static_problem=(
                    f"the shape your requests send to input {name} (a variable dim) cannot be read from --input-data: "
                    f"give each request's {name} a \"shape\" of {len(dims)} dims"))
            if len(shapes) > 1:
                return replace(self, sent_dims={}, static_problem=(
                    f"your requests send input {name} (a variable dim) in {len(shapes)} shapes "
                    f"({', '.join(str(list(s)) for s in sorted(shapes)[:4])}{', ...' if len(shapes) > 4 else ''}): "
                    f"a static candidate compiles the one shape requests send; the dynamic graph takes them all"))
            sent[name] = shapes.pop()
        return replace(self, sent_dims=sent)

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


def _shape(tensor) -> tuple[int, ...] | None:
    """One request's tensor shape in perf_analyzer's --input-data (batch dim dropped): its "shape", else the length of a
    flat list of values; None when neither is there."""
    if isinstance(tensor, dict) and isinstance(tensor.get("shape"), list):
        dims = tensor["shape"]
        return tuple(dims) if all(isinstance(d, int) and not isinstance(d, bool) for d in dims) else None
    if isinstance(tensor, list) and not any(isinstance(v, (list, dict)) for v in tensor):
        return (len(tensor),)
    return None
