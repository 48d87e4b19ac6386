"""IOBinding for one ONNX Runtime session of a static graph: inputs and outputs bound to buffers allocated once.

A run copies the feeds into the bound input buffers, runs, and copies the outputs out of theirs (the buffers are
reused by the next run). Outputs whose shape is known only at run time are re-bound before every run so ONNX
Runtime allocates them at this run's size; `unbind_mismatched` moves a bound output to that per-run allocation once
a correct answer shows another shape than compiled. A session with a tensor type IOBinding cannot take (strings,
bfloat16) runs without the bound buffers (`run_plain`). On CUDA the buffers live in device memory (where a captured
CUDA graph needs them).
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np
import onnxruntime as ort

from gebackend.compile import bfloat16
from gebackend.engines.providers import run_options_config
from gebackend.errors import ModelLoadError


class GraphShapes(Protocol):
    """What binding needs of a compiled graph: every input's shape, and each output's (None: known at run time)."""

    shapes: Mapping[str, tuple[int, ...]]
    output_shapes: Mapping[str, tuple[int, ...] | None]


class BoundSession:
    """One session with its inputs and outputs bound to buffers allocated once (runtime-shaped outputs: per run)."""

    def __init__(self, session: ort.InferenceSession, graph: "GraphShapes", device: str, device_id: int = 0,
                 run_config: Mapping[str, str] | None = None, captured: bool = False):
        self.session = session
        self.device, self.device_id, self.captured = device, device_id, captured
        self.run_config = dict(run_config or {})  # RunOptions entries every run carries (gpu_graph_id of a capture)
        self.run_options = run_options_config(self.run_config)
        self.output_order = [m.name for m in session.get_outputs()]
        self.inputs: dict[str, object] = {}
        self.outputs: dict[str, object | None] = {}
        # strings (and other types IOBinding cannot take) run through session.run, on this same session
        self.plain = not all(m.type in _ORT_TYPES for m in [*session.get_inputs(), *session.get_outputs()])
        self._values = bfloat16.needs_values(session)  # bfloat16 tensors: plain runs with OrtValues
        if self.plain:
            self.inputs = {m.name: np.zeros(graph.shapes[m.name], _PLAIN_TYPES[m.type]) if m.type in _PLAIN_TYPES
                           else np.full(graph.shapes[m.name], "", dtype=object) for m in session.get_inputs()}
            return  # (these arrays only give the warm-up its shapes and types)
        self.binding = session.io_binding()
        for meta in session.get_inputs():
            self.inputs[meta.name] = self._bind(meta.name, graph.shapes[meta.name], _numpy_type(meta.type), False)
        for meta in session.get_outputs():
            shape = graph.output_shapes.get(meta.name)
            if shape is None:
                self.binding.bind_output(meta.name, device, device_id)  # shape known only at run time
                self.outputs[meta.name] = None
            else:
                self.outputs[meta.name] = self._bind(meta.name, shape, _numpy_type(meta.type), True)
        self._runtime = self._runtime_outputs()

    def _bind(self, name: str, shape: tuple[int, ...], dtype, output: bool):
        """A buffer allocated once for one input or output, bound to it: an OrtValue in device memory on CUDA, a
        numpy array on the CPU."""
        if self.device == "cuda":
            value = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cuda", self.device_id)
            (self.binding.bind_ortvalue_output if output else self.binding.bind_ortvalue_input)(name, value)
        elif output:
            value = np.empty(shape, dtype=dtype)
            self.binding.bind_output(name, "cpu", 0, dtype, shape, value.ctypes.data)
        else:
            value = np.zeros(shape, dtype=dtype)
            self.binding.bind_cpu_input(name, value)
        return value

    def _runtime_outputs(self) -> list[tuple[str, int]]:
        """The outputs allocated per run (their shape known only then), with their position among the outputs."""
        return [(name, self.output_order.index(name)) for name, value in self.outputs.items() if value is None]

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str], options: ort.RunOptions | None = None) -> list[np.ndarray]:
        options = options if options is not None else self.run_options
        if self.plain:
            return self.run_plain({name: feeds[name] for name in self.inputs}, output_names, options)
        for name, value in self.inputs.items():
            if self.device == "cuda":
                value.update_inplace(np.ascontiguousarray(feeds[name]))
            else:
                np.copyto(value, feeds[name])
        for name, _ in self._runtime:  # unallocated again: the binding still holds the last run's value
            self.binding.bind_output(name, self.device, self.device_id)
        self.session.run_with_iobinding(self.binding, options)
        fetched = {}
        if self._runtime:
            values = self.binding.get_outputs()
            for name, position in self._runtime:
                fetched[name] = values[position].numpy()
        result = []
        for name in output_names:
            value = self.outputs[name]
            if value is None:
                result.append(fetched[name])
            elif self.device == "cuda":
                result.append(value.numpy())
            else:
                result.append(value.copy())  # the buffer is reused by the next run
        return result

    def run_plain(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str],
                  options: ort.RunOptions | None = None) -> list[np.ndarray]:
        """`session.run` without the bound buffers (bfloat16 tensors through OrtValues): raises what it raises."""
        options = options if options is not None else self.run_options
        if self._values:
            return bfloat16.run_with_values(self.session, output_names, feeds, options)
        return self.session.run(list(output_names), dict(feeds), options)

    def unbind_mismatched(self, output_names: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
        """Allocate per run, from now on, every bound output these (correct) arrays show to have another shape."""
        if self.device != "cpu" or self.plain:
            return  # a device graph may have been captured on these buffers: keep them
        for name, array in zip(output_names, arrays):
            value = self.outputs.get(name)
            if isinstance(value, np.ndarray) and value.shape != np.shape(array):
                self.outputs[name] = None
                self.binding.bind_output(name, self.device)
        self._runtime = self._runtime_outputs()


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint64)": np.uint64, "tensor(uint32)": np.uint32, "tensor(uint16)": np.uint16, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
# what a plain session (one IOBinding cannot take) gets as its warm-up arrays: bfloat16 runs through OrtValues
_PLAIN_TYPES = {**_ORT_TYPES, "tensor(bfloat16)": bfloat16.BF16}


def _numpy_type(ort_type: str):
    try:
        return _ORT_TYPES[ort_type]
    except KeyError:
        raise ModelLoadError(f"static graph mode cannot bind a {ort_type} tensor; use dynamic graph mode") from None
