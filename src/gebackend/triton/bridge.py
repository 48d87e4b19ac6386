"""Between Triton's Python backend API and gebackend: config auto-complete, tensors and status codes.

The instance itself (loading, pinning, heartbeat, profiling) is `runtime.instance.ModelInstance`; this module
only turns Triton's requests into numpy feeds and results into responses, errors into status codes, and
registers the backend's metrics. `pb_utils` (Triton's `triton_python_backend_utils`) exists only inside the
backend stub process, so it is passed in rather than imported; everything else here is plain Python.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gebackend.config.io_names import aliased_signature
from gebackend.config.model_file import (find_model_file, latest_version_dir, model_dir_in_repositories,
                                         version_dir_of_stub)
from gebackend.config.onnx_signature import read_signature
from gebackend.config.spec import reconcile
from gebackend.errors import GeBackendError, InvalidRequest, named
from gebackend.runtime.instance import InstanceInfo, ModelInstance, parsed_options
from gebackend.runtime.sequence_state import SequenceKey
from gebackend.compile.bfloat16 import BF16
from gebackend.triton.bf16_tensors import bf16_tensor, read_bf16
from gebackend.triton.metrics import BackendMetrics, SeriesOwners
from gebackend.runtime.strings import to_engine, to_triton


def auto_complete(auto_complete_model_config: Any, pb_utils: Any) -> Any:
    """Fill inputs, outputs, max_batch_size and dynamic batching from the ONNX file (Triton's auto-complete hook)."""
    config = auto_complete_model_config.as_dict()
    name = config["name"]
    try:
        version_dir = version_dir_of_stub(_stub_model_path()) or latest_version_dir(model_dir_in_repositories(name))
        path = find_model_file(version_dir, config.get("default_model_filename", ""))
        parsed = parsed_options(name, config)
        result = reconcile(name, config, aliased_signature(config, read_signature(path)), parsed.options.default_max_batch_size)
    except GeBackendError as exc:
        raise ValueError(named(name, str(exc))) from None
    declared = {e["name"]: e for e in (config.get("input") or []) + (config.get("output") or [])}
    for kind, tensor, add in [("input", t, auto_complete_model_config.add_input) for t in result.inputs] + [
        ("output", t, auto_complete_model_config.add_output) for t in result.outputs
    ]:
        if not result.completes(kind, tensor.name):
            continue
        entry = tensor.config_entry()
        if declared.get(tensor.name, {}).get("dims"):
            entry["dims"] = list(declared[tensor.name]["dims"])  # keep what the user wrote
            entry.pop("reshape", None)
        reshape = entry.pop("reshape", None)  # add_input/add_output take no reshape: set it on the entry after
        add(entry)
        if reshape is not None:
            completed = auto_complete_model_config.as_dict()  # the config object's own dict, not a copy
            target = next(e for e in completed[kind] if e["name"] == tensor.name)
            target.setdefault("reshape", reshape)
    if result.max_batch_size != int(config.get("max_batch_size") or 0):
        auto_complete_model_config.set_max_batch_size(result.max_batch_size)
    if result.enable_dynamic_batching:
        auto_complete_model_config.set_dynamic_batching()
    return auto_complete_model_config


class _TritonLog:
    """`runtime.instance.InstanceLog` on Triton's logger; after `release()`, on stderr (which tritonserver's output
    carries too): a line from a thread that outlives `finalize()` must not call into a stub tearing itself down."""

    def __init__(self, logger: Any):
        self.info, self.warn = logger.log_info, logger.log_warn

    def release(self) -> None:
        self.info = self.warn = _to_stderr


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ServedModel:
    """One loaded instance of a model (`runtime.instance.ModelInstance`), speaking pb_utils at the edges."""

    def __init__(self, instance: ModelInstance, pb_utils: Any, metrics: BackendMetrics | None = None,
                 log: _TritonLog | None = None):
        self.instance = instance
        self.spec = instance.spec
        self.pb = pb_utils
        self.metrics = metrics
        self.log = log  # the instance's log, on Triton's logger until `close()`
        self._scalar_inputs = {t.name: t.wire_dims for t in self.spec.inputs if t.wire_dims is not None}
        self._scalar_outputs = {t.name: t.wire_dims for t in self.spec.outputs if t.wire_dims is not None}

    @classmethod
    def load(cls, args: dict, pb_utils: Any) -> "ServedModel":
        config = json.loads(args["model_config"])
        name = args["model_name"]
        info = InstanceInfo(args.get("model_instance_name", f"{name}_0_0"), args.get("model_instance_kind", "CPU"),
                            int(args.get("model_instance_device_id", 0) or 0))
        log = _TritonLog(pb_utils.Logger)
        try:
            instance = ModelInstance.load(config, Path(args["model_repository"]) / str(args["model_version"]), info, log)
        except GeBackendError as exc:
            raise RuntimeError(named(name, str(exc))) from None
        metrics = None
        if hasattr(pb_utils, "MetricFamily"):
            metrics = BackendMetrics(pb_utils, name, instance.executor.runner, instance.load_seconds,
                                     instance.executor.trim, warn=lambda line: log.warn(line),
                                     owners=SeriesOwners.of(name), clock=instance.executor.clock).start()
        return cls(instance, pb_utils, metrics, log)

    def execute(self, requests: list) -> list:
        pb = self.pb
        clock = self.instance.executor.clock
        started = time.perf_counter_ns()
        batch, taken, refused = [], [], {}  # a request whose tensors cannot be read fails alone
        for index, request in enumerate(requests):
            try:
                batch.append(self._feeds(request))
                taken.append(request)
            except InvalidRequest as exc:
                refused[index] = exc
        keys = None
        if self.instance.sequences is not None:  # a stateful model: which sequence each request continues
            keys = [SequenceKey(request.correlation_id(), request.flags()) for request in taken]
        read, engine_before = time.perf_counter_ns(), clock.ns["engine"]
        ran = iter(self.instance.execute(batch, keys) if batch else ())
        called = time.perf_counter_ns()
        results = [refused[index] if index in refused else next(ran) for index in range(len(requests))]
        responses = []
        for request, result in zip(requests, results):
            if isinstance(result, BaseException):
                code = pb.TritonError.INVALID_ARG if isinstance(result, InvalidRequest) else pb.TritonError.INTERNAL
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(result), code)))
                continue
            # in name order, as Triton's onnxruntime backend answers (its outputs are a std::map): the same order on
            # every engine, graph mode and restart (Triton's requested names arrive in no fixed order)
            wanted = sorted(request.requested_output_names() or result)
            tensors = [self._tensor(name, self._to_wire(name, to_triton(result[name]))) for name in wanted
                       if name in result]
            responses.append(pb.InferenceResponse(output_tensors=tensors))
        clock.execution(read - started, called - read, clock.ns["engine"] - engine_before, time.perf_counter_ns() - called)
        return responses

    def _feeds(self, request) -> dict[str, np.ndarray]:
        model = self.spec.name
        return {(name := t.name()): self._to_model(name, to_engine(_as_numpy(t), model, name)) for t in request.inputs()}

    def _to_model(self, name: str, array: np.ndarray) -> np.ndarray:
        """A scalar input of a model without batching arrives as [1] (its config dims): the model takes it as []."""
        dims = self._scalar_inputs.get(name)
        return array.reshape(()) if dims is not None and array.shape == dims else array

    def _tensor(self, name: str, array: np.ndarray) -> Any:
        if array.dtype == BF16:  # pb_utils.Tensor refuses bfloat16 arrays
            return bf16_tensor(self.pb, name, array)
        return self.pb.Tensor(name, array)

    def _to_wire(self, name: str, array: np.ndarray) -> np.ndarray:
        dims = self._scalar_outputs.get(name)
        return array.reshape(dims) if dims is not None and array.ndim == 0 else array

    def close(self) -> bool:
        """Close the instance and let go of everything of pb_utils held here (`finalize()`: see triton/model.py).
        False when the metrics publisher could not be stopped: its objects are then kept (metrics.py says why)."""
        released = self.metrics is None or self.metrics.close()
        self.instance.close()
        if not released:
            return False
        self.metrics = None
        self.pb = None
        if self.log is not None:
            self.log.release()
        return True


def _stub_model_path() -> str | None:
    """The stub's first argument, `<model>/<version>/model.py` (Triton's Python backend starts every stub so), read
    from /proc rather than from the embedded interpreter's `sys.argv`; None where it cannot be read."""
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            args = cmdline.read().split(b"\0")
    except OSError:
        return None
    return os.fsdecode(args[1]) if len(args) > 1 and args[1] else None


def _as_numpy(tensor: Any) -> np.ndarray:
    try:
        return tensor.as_numpy()
    except Exception:  # BF16 ("cannot be converted to NumPy"): read through DLPack; anything else: as it was
        try:
            return read_bf16(tensor)
        except ValueError:
            pass
        raise
