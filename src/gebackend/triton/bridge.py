"""Between Triton's Python backend API and gebackend: config auto-complete, loading, tensors and status codes.

`pb_utils` (Triton's `triton_python_backend_utils`) exists only inside the backend stub process,
so it is passed in rather than imported; everything else here is plain Python.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from gebackend.config.io_names import aliased_model, aliased_signature
from gebackend.config.model_file import find_model_file, latest_version_dir, model_dir_in_repositories
from gebackend.config.onnx_signature import read_signature
from gebackend.config.option_report import load_report
from gebackend.config.options import ParsedOptions, global_options_from_env, model_parameters, parse_options
from gebackend.config.spec import ModelSpec, build_model_spec, reconcile
from gebackend.engines import providers_for
from gebackend.errors import GeBackendError, InvalidRequest
from gebackend.runtime.core_ledger import CoreLedger
from gebackend.runtime.executor import Executor
from gebackend.runtime.loader import load_executor, server_temp_parent
from gebackend.profiling.control import ProfilingControl
from gebackend.profiling.dump_data import FirstRequestDump, first_request_dump
from gebackend.server.heartbeat import Heartbeat
from gebackend.server.registry import CONTROL_ENV_VAR
from gebackend.triton.metrics import BackendMetrics


def _options(name: str, config: dict) -> ParsedOptions:
    return parse_options(name, global_options_from_env(), model_parameters(config), config)


def auto_complete(auto_complete_model_config: Any, pb_utils: Any) -> Any:
    """Fill inputs, outputs, max_batch_size and dynamic batching from the ONNX file (Triton's auto-complete hook)."""
    config = auto_complete_model_config.as_dict()
    name = config["name"]
    try:
        version_dir = latest_version_dir(model_dir_in_repositories(name))
        path = find_model_file(version_dir, config.get("default_model_filename", ""))
        parsed = _options(name, config)
        result = reconcile(name, config, aliased_signature(config, read_signature(path)), parsed.options.default_max_batch_size)
    except GeBackendError as exc:
        raise ValueError(_named(name, str(exc))) from None
    declared = {e["name"]: e for e in (config.get("input") or []) + (config.get("output") or [])}
    for kind, tensor, add in [("input", t, auto_complete_model_config.add_input) for t in result.inputs] + [
        ("output", t, auto_complete_model_config.add_output) for t in result.outputs
    ]:
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


def _pin(name: str, args: dict, config: dict, options, log):
    """Pin this instance's process to its CPU set (runtime/pinning.py) and size the engine's threads to it.

    Runs before the engine exists, so the threads it creates inherit the affinity. Returns the options
    the instance runs with, and the server-wide core ledger holding its cores (released when it unloads).
    """
    from gebackend.runtime.pinning import pin_process, pinned_options, plan_for_instance

    instance = args.get("model_instance_name", f"{name}_0_0")
    ledger = None
    try:
        plan = plan_for_instance(name, instance, config, options.pin_instances, options.cores_per_instance,
                                 int(args.get("model_instance_device_id", 0) or 0))
        if plan is None:
            return options, None
        control = _control_dir()
        if control is not None:  # under `gebackend serve`: take the cores other models left free
            ledger = CoreLedger(control)
            claim = ledger.claim(name, instance, plan.cpus, plan.usable)
            plan = plan.claimed(claim.cpus, claim.neighbours)
        pin_process(plan.cpus)
    except (OSError, ValueError) as exc:
        log.log_warn(f"gebackend: model '{name}' instance '{instance}': not pinned: {exc}")
        if ledger is not None:
            ledger.release()
        return options, None
    pinned, notes = pinned_options(options, plan)
    message = (f"instance '{instance}': {plan.describe()}; intra_op_threads={pinned.intra_op_thread_count} "
               f"inter_op_threads={pinned.inter_op_thread_count} allow_spinning={pinned.allow_spinning}")
    (log.log_warn if plan.note or notes else log.log_info)(
        f"gebackend: model '{name}': {'; '.join([message, *notes])}")
    return pinned, ledger


def _named(model: str, message: str) -> str:
    return message if f"'{model}'" in message else f"model '{model}': {message}"


class ServedModel:
    """One loaded instance of a model: its spec and executor, speaking pb_utils at the edges."""

    def __init__(self, spec: ModelSpec, executor: Executor, pb_utils: Any, profiling: ProfilingControl | None = None,
                 metrics: BackendMetrics | None = None, heartbeat: Heartbeat | None = None,
                 ledger: CoreLedger | None = None, dump: FirstRequestDump | None = None):
        self.spec = spec
        self.executor = executor
        self.pb = pb_utils
        self.profiling = profiling
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.ledger = ledger
        self.dump = dump  # dump_data=1: writes the first request's every node input and output, then None
        self._scalar_inputs = {t.name: t.wire_dims for t in spec.inputs if t.wire_dims is not None}
        self._scalar_outputs = {t.name: t.wire_dims for t in spec.outputs if t.wire_dims is not None}

    @classmethod
    def load(cls, args: dict, pb_utils: Any) -> "ServedModel":
        log = pb_utils.Logger
        config = json.loads(args["model_config"])
        name = args["model_name"]
        started = time.perf_counter()
        try:
            version_dir = Path(args["model_repository"]) / str(args["model_version"])
            path = find_model_file(version_dir, config.get("default_model_filename", ""))
            parsed = _options(name, config)
            for warn, line in load_report(parsed, config, args.get("model_instance_kind", "CPU")):
                (log.log_warn if warn else log.log_info)(f"gebackend: model '{name}': {line}")
            say = lambda m: log.log_info(f"gebackend: model '{name}': {m}")  # noqa: E731
            path = aliased_model(config, path, say, server_temp_parent())  # npu_ge: names paired by position
            options, ledger = _pin(name, args, config, parsed.options, log)
            spec = build_model_spec(config, read_signature(path), path, options)
            providers = providers_for(args.get("model_instance_kind", "CPU"), int(args.get("model_instance_device_id", 0)))
            executor, how = load_executor(spec, providers, say)
        except GeBackendError as exc:
            raise RuntimeError(_named(name, str(exc))) from None
        seconds = time.perf_counter() - started
        log.log_info(
            f"gebackend: model '{name}' instance '{args['model_instance_name']}' loaded {path.name} in "
            f"{seconds:.2f}s: max_batch_size={spec.max_batch_size}, {how}"
        )
        profiling = None
        if spec.options.profiling != "off":
            engines = executor.runner.engines()
            profiling = ProfilingControl(name, args["model_instance_name"], engines, spec.options.profiling,
                                         spec.options.profiling_dir, say)
        metrics = BackendMetrics(pb_utils, name, executor.runner, seconds).start() if hasattr(pb_utils, "MetricFamily") else None
        dump = first_request_dump(spec, args["model_instance_name"], say)
        return cls(spec, executor, pb_utils, profiling, metrics, _heartbeat(spec), ledger, dump)

    def execute(self, requests: list) -> list:
        if self.heartbeat is None:
            return self._execute(requests)
        self.heartbeat.enter()
        try:
            return self._execute(requests)
        finally:
            self.heartbeat.leave()

    def _execute(self, requests: list) -> list:
        pb = self.pb
        started = time.monotonic_ns()
        batch = [{t.name(): self._to_model(t.name(), _to_engine(t.as_numpy())) for t in request.inputs()}
                 for request in requests]
        results = self.executor.execute(batch)
        if self.dump is not None:
            self.dump = self.dump.offer(batch, results)
        if self.profiling is not None and self.profiling.active:
            rows = sum(next(iter(b.values())).shape[0] if self.spec.batching and b else 1 for b in batch)
            errors = sum(isinstance(r, BaseException) for r in results)
            self.profiling.record(started, time.monotonic_ns(), len(requests), rows, errors)
        responses = []
        for request, result in zip(requests, results):
            if isinstance(result, BaseException):
                code = pb.TritonError.INVALID_ARG if isinstance(result, InvalidRequest) else pb.TritonError.INTERNAL
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(result), code)))
                continue
            wanted = request.requested_output_names() or list(result)
            tensors = [pb.Tensor(name, self._to_wire(name, _to_triton(result[name]))) for name in wanted if name in result]
            responses.append(pb.InferenceResponse(output_tensors=tensors))
        return responses

    def _to_model(self, name: str, array: np.ndarray) -> np.ndarray:
        """A scalar input of a model without batching arrives as [1] (its config dims): the model takes it as []."""
        dims = self._scalar_inputs.get(name)
        return array.reshape(()) if dims is not None and array.shape == dims else array

    def _to_wire(self, name: str, array: np.ndarray) -> np.ndarray:
        dims = self._scalar_outputs.get(name)
        return array.reshape(dims) if dims is not None and array.ndim == 0 else array

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.ledger is not None:
            self.ledger.release()
        if self.profiling is not None:
            capture = self.profiling.close()
            if capture is not None:
                _render_quietly(capture, self.pb.Logger)
        self.executor.close()


def _control_dir() -> Path | None:
    """The control folder of the `gebackend serve` running this instance (None under a plain tritonserver)."""
    control = os.environ.get(CONTROL_ENV_VAR)
    return Path(control) if control else None


def _heartbeat(spec: ModelSpec) -> Heartbeat | None:
    """Beat for the watchdog of `gebackend serve` (none without it, or with hang_timeout_s=0)."""
    control = _control_dir()
    if control is None or spec.options.hang_timeout_s <= 0:
        return None
    return Heartbeat(control, spec.options.hang_timeout_s)


def _render_quietly(capture: Path, log: Any) -> None:
    """profiling=true: render the report when the model unloads; a failure here must not fail the unload."""
    try:
        from gebackend.profiling.report import render

        render(capture)
        log.log_info(f"gebackend: profiling report written to {capture}")
    except Exception as exc:
        log.log_warn(f"gebackend: could not render the profiling report in {capture}: {exc}")


def _to_engine(array: np.ndarray) -> np.ndarray:
    """Triton hands BYTES tensors over as objects of `bytes`; ONNX Runtime wants `str`."""
    if array.dtype == np.object_:
        return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)
    return array


def _to_triton(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:
        return np.vectorize(lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object])(array)
    return np.ascontiguousarray(array)
