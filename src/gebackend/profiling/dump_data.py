"""`dump_data=1` (Ascend ge-backend's switch; also `ge.exec.enableDump`): one request's every node input and output.

ge-backend sets GE's dump options (ge.exec.enableDump=1, dumpMode=all, dumpPath=./dump_data) so the NPU writes
each operator's inputs and outputs. Here the first request an instance answers after load (a model_warmup request
counts) is run once more, on ONNX Runtime's CPU provider without graph optimizations, through a copy of the
model's ONNX graph with every node output exposed as a graph output, and written to
`<profiling_dir>/<model>/dump/<time>_<instance>/`:

    0000_<tensor>.npy ...   each graph input and node output (a tensor several nodes read is written once)
    index.json              the nodes in graph order, each with its op type and its inputs and outputs (tensor
                            name, file, shape, dtype; weights are named, with shape and dtype, and stay in the model)

The values are the ONNX graph's (what the model computes), not the serving engine's fused kernels; nodes inside
subgraphs (If, Loop) are not expanded. index.json is written last, so its presence means the dump is complete.
A failure is logged and never fails the request.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def dump_folder(profiling_dir: str | Path, model: str, instance: str) -> Path:
    return Path(profiling_dir).resolve() / model / "dump" / f"{time.strftime('%Y%m%d-%H%M%S')}_{instance}"


def exposed_model(model):
    """A copy of `model` whose graph outputs are its outputs followed by every other node output, in graph order."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for node in copy.graph.node:
        for name in node.output:
            if name and name not in present:
                copy.graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)
    return copy


def run_everything(model_path: str | Path, feeds: Mapping[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
    """The model and the value of every graph input and node output for `feeds`."""
    import onnx

    from gebackend.compile import bfloat16
    from gebackend.compile.ort_session import internal_options, open_session

    model = onnx.load(str(model_path))
    session = open_session(exposed_model(model), internal_options(optimize=False))
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, bfloat16.run(session, names, feeds)))
    values.update({k: np.asarray(v) for k, v in feeds.items()})
    return model, values


def write_dump(folder: Path, model, values: Mapping[str, np.ndarray], about: Mapping[str, Any]) -> Path:
    """The .npy files and index.json of one dump; returns the index."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = {t.name: t for t in model.graph.initializer}
    files: dict[str, str] = {}

    def entry(name: str) -> dict[str, Any]:
        if not name:
            return {"name": "", "kind": "absent (optional input not given)"}
        if name in values:
            array = values[name]
            if name not in files:
                files[name] = f"{len(files):04d}_{_UNSAFE.sub('_', name)[:100]}.npy"
                np.save(folder / files[name], array, allow_pickle=array.dtype == np.object_)
            return {"name": name, "file": files[name], "shape": list(array.shape), "dtype": str(array.dtype)}
        if name in weights:
            import onnx

            tensor = weights[name]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
            return {"name": name, "kind": "initializer (in the model file)", "shape": list(tensor.dims),
                    "dtype": str(np.dtype(dtype))}
        return {"name": name, "kind": "not computed (outer scope or subgraph)"}

    inputs = [entry(v.name) for v in model.graph.input if v.name not in weights]
    nodes = [{"index": i, "name": node.name, "op_type": node.op_type,
              "inputs": [entry(n) for n in node.input], "outputs": [entry(n) for n in node.output]}
             for i, node in enumerate(model.graph.node)]
    outputs = [entry(v.name) for v in model.graph.output]
    index = folder / "index.json"
    document = {**about, "inputs": inputs, "outputs": outputs, "nodes": nodes, "tensors_written": len(files)}
    partial = folder / "index.json.partial"
    partial.write_text(json.dumps(document, indent=1))
    partial.replace(index)
    return index


class FirstRequestDump:
    """Dumps the first request that ran without error, then is done (`offer` returns None)."""

    def __init__(self, model: str, instance: str, model_path: Path, profiling_dir: str,
                 log: Callable[[str], None] = lambda m: None):
        self.model, self.instance, self.model_path = model, instance, Path(model_path)
        self.profiling_dir, self.log = profiling_dir, log

    def offer(self, batch: Sequence[Mapping[str, np.ndarray]], results: Sequence[Any]) -> "FirstRequestDump | None":
        position = next((i for i, r in enumerate(results) if not isinstance(r, BaseException)), None)
        if position is None:
            return self  # every request failed: wait for one that runs
        started = time.perf_counter()
        folder = dump_folder(self.profiling_dir, self.model, self.instance)
        try:
            model, values = run_everything(self.model_path, batch[position])
            about = {"model": self.model, "instance": self.instance, "model_file": str(self.model_path),
                     "engine": "onnxruntime CPUExecutionProvider, graph optimizations off"}
            index = write_dump(folder, model, values, about)
        except Exception as exc:  # a dump must never fail the request, nor leak a dependency's traceback
            self.log(f"dump_data: could not dump the first request into {folder}: {type(exc).__name__}: {exc}")
            return None
        self.log(f"dump_data: wrote every node's inputs and outputs of the first request ({len(values)} tensors, "
                 f"{time.perf_counter() - started:.2f}s) to {folder}; index: {index.name}")
        return None


def first_request_dump(spec, instance: str, log: Callable[[str], None] = lambda m: None) -> FirstRequestDump | None:
    """The dump an instance of `spec` does, or None when dump_data is off."""
    if not spec.options.diagnostics.dump_data:
        return None
    return FirstRequestDump(spec.name, instance, spec.path, spec.options.diagnostics.profiling_dir, log)
