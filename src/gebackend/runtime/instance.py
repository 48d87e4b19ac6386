"""One loaded instance of a model, from what Triton hands a backend: its config, version folder and instance name.

Owns the load, in order: the options (config parameters over `--backend-config`), the option report, the
served file (compile/served_file.py: npu_ge name pairing and the rewrites the engines need), pinning to the instance's cores (before any engine thread exists, so they inherit it),
the spec, the providers, the executor; and what runs beside every request: the heartbeat the watchdog of
`gebackend serve` reads, live profiling, the first-request dump (dump_data=1). Nothing here knows Triton's
`pb_utils`: `triton/bridge.py` turns requests into numpy feeds and results into responses and status codes,
and the bench's in-process ceiling (`bench/inprocess.py`) loads through this same class.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from gebackend.compile.served_file import served_file
from gebackend.config.local_functions import served_inlined
from gebackend.config.model_file import find_model_file
from gebackend.config.optional_inputs import Defaults
from gebackend.config.option_groups import BackendOptions
from gebackend.config.option_report import load_report
from gebackend.config.options import ParsedOptions, global_options_from_env, model_parameters, parse_options
from gebackend.config.spec import ModelSpec, build_model_spec
from gebackend.engines import select_providers
from gebackend.engines.engine_choice import auto_took_openvino, resolve_engine
from gebackend.profiling.control import ProfilingControl
from gebackend.profiling.dump_data import FirstRequestDump, first_request_dump
from gebackend.control.core_ledger import CoreLedger
from gebackend.runtime.executor import Executor
from gebackend.runtime.loader import load_executor
from gebackend.runtime.sequence_state import SequenceKey, SequenceStates
from gebackend.control.heartbeat import Heartbeat
from gebackend.control.timing_lock import loading
from gebackend.control.env import control_dir, server_temp_parent
from gebackend.errors import ModelLoadError


class InstanceLog(Protocol):
    """Where an instance says what it did: the server log under Triton."""

    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...


@dataclass(frozen=True)
class InstanceInfo:
    """What Triton says of the instance being loaded (`model_instance_*` in its initialize arguments)."""

    name: str  # e.g. "bert_ge_0_1"
    kind: str = "CPU"  # KIND_CPU / KIND_GPU / KIND_MODEL, as Triton names it ("CPU", "GPU", "MODEL")
    device_id: int = 0


def parsed_options(name: str, config: Mapping[str, Any]) -> ParsedOptions:
    """A model's options: its config's parameters over the server-wide `--backend-config ge,...` ones."""
    return parse_options(name, global_options_from_env(), model_parameters(config), config)


class ModelInstance:
    """One instance of a model, loaded: its spec and executor, and what runs beside each batch of requests."""

    def __init__(self, spec: ModelSpec, executor: Executor, how: str, load_seconds: float, instance: str,
                 profiling: ProfilingControl | None = None, heartbeat: Heartbeat | None = None,
                 ledger: CoreLedger | None = None, dump: FirstRequestDump | None = None,
                 log: InstanceLog | None = None, defaults: Defaults | None = None):
        self.spec = spec
        self.executor = executor
        self.how = how  # one line saying how it runs (graph mode, buckets, engine, precision)
        self.load_seconds = load_seconds
        self.instance = instance
        self.profiling = profiling
        self.heartbeat = heartbeat
        self.ledger = ledger
        self.dump = dump  # dump_data=1: writes the first request's every node input and output, then None
        self._log = log
        self.defaults = defaults or None  # the file's values of optional inputs, for requests that leave them out
        # a stateful model's sequences (sequence_batching with `state`): their states between requests
        self.sequences = SequenceStates(spec.name, spec.sequence) if spec.sequence and spec.sequence.states else None

    @classmethod
    def load(cls, config: Mapping[str, Any], version_dir: Path, instance: InstanceInfo, log: InstanceLog,
             pin: bool = True) -> "ModelInstance":
        """Load the model of `config` from `version_dir` as instance `instance`.

        Raises `GeBackendError` (its message names what failed and what to do) when it cannot. `pin=False` leaves
        this process's CPU affinity alone (a bench measuring in this process).
        """
        with loading():  # no other instance of the server times its buckets meanwhile (control/timing_lock.py)
            return cls._load(config, version_dir, instance, log, pin)

    @classmethod
    def _load(cls, config: Mapping[str, Any], version_dir: Path, instance: InstanceInfo, log: InstanceLog,
              pin: bool) -> "ModelInstance":
        name = config["name"]
        started = time.perf_counter()
        path = find_model_file(Path(version_dir), config.get("default_model_filename", ""))
        parsed = parsed_options(name, config)
        for warn, line in load_report(parsed, config, instance.kind):
            (log.warn if warn else log.info)(f"gebackend: model '{name}': {line}")
        say = lambda m: log.info(f"gebackend: model '{name}': {m}")  # noqa: E731
        in_repository = path  # caches (TensorRT's engines, int8 models) are kept beside this file, not beside a copy
        served = served_file(config, path, say, lambda m: log.warn(f"gebackend: model '{name}': {m}"),
                             server_temp_parent())
        path, signature, defaults = served.path, served.signature, served.defaults
        options, ledger, lending = _pin(name, instance, config, parsed.options, log) if pin else (parsed.options, None, None)
        pinned = options
        options, engine_note = resolve_engine(options, path, signature, say)

        def load(options: BackendOptions):
            served = served_inlined(path, options.engines.engine, say, server_temp_parent())  # OpenVINO: no functions
            spec = build_model_spec(config, signature, served, options, source=in_repository)
            providers = select_providers(spec, instance.kind, instance.device_id, model_path=in_repository,
                                         instance_index=_instance_index(name, instance, config))
            return spec, load_executor(spec, providers, say, lending, defaults.values)

        try:
            spec, (executor, how) = load(options)
        except ModelLoadError as exc:
            if not auto_took_openvino(pinned, options):
                raise
            # engine=auto took OpenVINO, which cannot serve this model (an operator it lacks: ai.onnx.ml, contrib ops):
            # ONNX Runtime runs every ONNX operator
            say(f"engine=auto: OpenVINO cannot serve this model ({exc}); onnxruntime instead")
            engine_note = f"engine=auto -> onnxruntime (OpenVINO cannot serve this model: {exc})"
            spec, (executor, how) = load(resolve_engine(pinned.replace(engine="onnxruntime"), path, signature, say)[0])
        how = f"{engine_note}, {how}" if engine_note else how  # the load line says why OpenVINO was not taken
        seconds = time.perf_counter() - started
        log.info(f"gebackend: model '{name}' instance '{instance.name}' loaded {path.name} in {seconds:.2f}s: "
                 f"max_batch_size={spec.max_batch_size}, {how}")
        profiling = None
        if spec.options.diagnostics.profiling != "off":
            profiling = ProfilingControl(name, instance.name, executor.runner.engines(), spec.options.diagnostics.profiling,
                                         spec.options.diagnostics.profiling_dir, say)
        dump = first_request_dump(spec, instance.name, say)
        return cls(spec, executor, how, seconds, instance.name, profiling, _heartbeat(spec), ledger, dump, log, defaults)

    def execute(self, batch: Sequence[Mapping[str, np.ndarray]], keys: Sequence[SequenceKey] | None = None) -> list:
        """One batch of requests (each its feeds by input name) -> per request its outputs by name, or the exception
        that request failed with (`InvalidRequest`: the request's fault). `keys`: each request's sequence, for a
        model with implicit state (`self.sequences`)."""
        if self.heartbeat is not None:
            self.heartbeat.enter()
        try:
            if self.sequences is None or keys is None:
                return self._execute(batch)
            return self._execute_in_sequences(batch, keys)
        finally:
            if self.heartbeat is not None:
                self.heartbeat.leave()

    def _execute_in_sequences(self, batch: Sequence[Mapping[str, np.ndarray]], keys: Sequence[SequenceKey]) -> list:
        fed = self.sequences.feed(batch, keys)
        runnable = [i for i, f in enumerate(fed) if not isinstance(f, BaseException)]
        results: list = list(fed)
        for index, result in zip(runnable, self._execute([fed[i] for i in runnable]) if runnable else []):
            results[index] = result
        return self.sequences.keep(results, keys)

    def _execute(self, batch: Sequence[Mapping[str, np.ndarray]]) -> list:
        started = time.monotonic_ns()
        if self.defaults is not None:
            batch = [self.defaults.fill(feeds) for feeds in batch]
        results = self.executor.execute(batch)
        if self.dump is not None:
            self.dump = self.dump.offer(batch, results)
        if self.profiling is not None and self.profiling.active:
            rows = sum(next(iter(b.values())).shape[0] if self.spec.batching and b else 1 for b in batch)
            errors = sum(isinstance(r, BaseException) for r in results)
            self.profiling.record(started, time.monotonic_ns(), len(batch), rows, errors)
        return results

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()
        if self.ledger is not None:
            self.ledger.release()
        if self.profiling is not None:
            capture = self.profiling.close()
            if capture is not None:
                self._render_quietly(capture)
        self.executor.close()

    def _render_quietly(self, capture: Path) -> None:
        """profiling=true: render the report when the model unloads; a failure here must not fail the unload."""
        log = self._log
        try:
            from gebackend.profiling.render import render

            render(capture)
            if log is not None:
                log.info(f"gebackend: profiling report written to {capture}")
        except Exception as exc:  # noqa: BLE001 - a report, never an unload failure
            if log is not None:
                log.warn(f"gebackend: could not render the profiling report in {capture}: {exc}")


def _pin(name: str, instance: InstanceInfo, config: Mapping[str, Any], options, log: InstanceLog):
    """Pin this instance's process to its CPU set (runtime/pinning.py) and size the engine's threads to it.

    Runs before the engine exists, so the threads it creates inherit the affinity. Returns the options
    the instance runs with, the server-wide core ledger holding its cores (released when it unloads), and what it
    may borrow of its model's other instances' cores (`lend_idle_cores`, runtime/lending.py), or None.
    """
    from gebackend.runtime.pinning import pin_process, pinned_options, plan_for_instance

    ledger = None
    try:
        plan = plan_for_instance(name, instance.name, config, options.instances.pin_instances,
                                 options.instances.cores_per_instance, instance.device_id)
        if plan is None:
            return _sized_to_allowance(name, options, log), None, _lending(name, None, options, log)
        control = control_dir()
        if control is not None:  # under `gebackend serve`: take the cores other models left free
            ledger = CoreLedger(control)
            claim = ledger.claim(name, instance.name, plan.cpus, plan.usable)
            plan = plan.claimed(claim.cpus, claim.neighbours)
        pin_process(plan.cpus)
    except (OSError, ValueError) as exc:
        log.warn(f"gebackend: model '{name}' instance '{instance.name}': not pinned: {exc}")
        if ledger is not None:
            ledger.release()
        return options, None, None
    pinned, notes = pinned_options(options, plan)
    message = (f"instance '{instance.name}': {plan.describe()}; intra_op_threads={pinned.session.intra_op_thread_count} "
               f"inter_op_threads={pinned.session.inter_op_thread_count} allow_spinning={pinned.session.allow_spinning}")
    (log.warn if plan.note or notes else log.info)(f"gebackend: model '{name}': {'; '.join([message, *notes])}")
    return pinned, ledger, _lending(name, plan, pinned, log)


def _lending(name: str, plan, options, log: InstanceLog):
    """What this instance (pinned by `plan`, or None) borrows while its siblings idle (runtime/lending.py), or None;
    `lend_idle_cores=on` that cannot be met says why."""
    if options.instances.lend_idle_cores != "on":
        return None
    from gebackend.runtime.lending import plan_lending, refused

    lending, why = plan_lending(plan, options.instances.cores_per_instance)
    if lending is None:
        log.warn(f"gebackend: model '{name}': {refused(why)}")
    return lending


def _sized_to_allowance(name: str, options, log: InstanceLog):
    """An instance that is not pinned, whose engine threads the user did not set: sized to the CPUs this process
    may use, where those are fewer than the machine's (runtime/cpu_allowance.py); else the engine's default."""
    from gebackend.runtime.cpu_allowance import cpu_allowance

    allowance = cpu_allowance()
    if allowance is None:
        return options
    mine = options.session.intra_op_thread_count
    if mine:
        if mine > allowance.cpus:
            log.warn(f"gebackend: model '{name}': intra_op_thread_count={mine} (set by the user) exceeds the "
                     f"{allowance.cpus} CPU(s) this process may use ({allowance.why}): threads share CPUs")
        return options
    log.info(f"gebackend: model '{name}': intra_op_threads={allowance.cpus}: this process may use "
             f"{allowance.cpus} CPU(s), as {allowance.why} (ONNX Runtime's default counts the machine's cores); "
             f"set intra_op_thread_count to choose")
    return options.replace(intra_op_thread_count=allowance.cpus)


def _instance_index(name: str, instance: InstanceInfo, config: Mapping[str, Any]) -> int:
    """This instance's index among its model's instances, which picks its entry of `device_ids`."""
    from gebackend.runtime.pinning import instance_position

    return instance_position(name, instance.name, config.get("instance_group") or [], instance.device_id).index


def _heartbeat(spec: ModelSpec) -> Heartbeat | None:
    """Beat for the watchdog of `gebackend serve` (none without it, or with hang_timeout_s=0)."""
    control = control_dir()
    if control is None or spec.options.instances.hang_timeout_s <= 0:
        return None
    return Heartbeat(control, spec.options.instances.hang_timeout_s)
