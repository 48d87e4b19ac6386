"""Between Triton's Python-backend API and a preprocessing kind (models.py): auto-complete, load, batched execute.

Every request of a batch gets its own response: a request whose item is not what the model expects (not an
image, a truncated file, text that is not UTF-8, a tensor of the wrong shape) is answered INVALID_ARG (HTTP 400
/ gRPC INVALID_ARGUMENT) with a message naming the model, the input and what was expected; the others in the
same batch are served, and the instance keeps serving. `pb_utils` exists only inside the backend stub, so it is
passed in, as in triton/bridge.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gebackend.config.options import model_parameters
from gebackend.errors import ConfigError, InvalidRequest, named
from gebackend.preprocess.models import KINDS, PreprocessKind

DEFAULT_MAX_BATCH_SIZE = 8
_SCHEDULERS = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")


def _dims(entry: dict) -> list[int] | None:
    dims = entry.get("dims")
    return [int(d) for d in dims] if dims else None


def kind_for(config: dict) -> PreprocessKind:
    """The preprocessing a config's `backend` names (`models.KINDS`)."""
    backend = config.get("backend", "")
    try:
        return KINDS[backend]
    except KeyError:
        raise ValueError(f"model '{config.get('name', '')}': backend {backend!r} is no preprocessing backend: expected "
                         f"one of {', '.join(KINDS)}") from None


def tensor_names(kind: PreprocessKind, model: str, config: dict, params: dict) -> tuple[str, str]:
    """The input and output names (the config's, or the kind's defaults), checking what the config declares."""
    inputs, outputs = config.get("input") or [], config.get("output") or []
    if len(inputs) > 1 or len(outputs) > 1:
        raise ConfigError(f"model '{model}': backend {kind.backend} has one input and one output; config.pbtxt declares "
                          f"inputs {[e.get('name') for e in inputs]} and outputs {[e.get('name') for e in outputs]}")
    wanted = [("input", inputs, kind.input_name, "TYPE_STRING", [1]),
              ("output", outputs, kind.output_name, kind.output_type, kind.output_dims(params))]
    names = []
    for what, entries, default, data_type, dims in wanted:
        entry = entries[0] if entries else {"name": default}
        declared = entry.get("data_type")
        if declared and declared not in ("TYPE_INVALID", data_type):
            raise ConfigError(f"model '{model}': {what} '{entry['name']}' of backend {kind.backend} is {data_type}, "
                              f"not {declared}")
        if _dims(entry) is not None and _dims(entry) != dims:
            raise ConfigError(f"model '{model}': {what} '{entry['name']}' of backend {kind.backend} has dims {dims} "
                              f"(without the batch dim), not {_dims(entry)}")
        names.append(entry["name"])
    return names[0], names[1]


def auto_complete(kind: PreprocessKind, auto_complete_model_config: Any, pb_utils: Any) -> Any:
    """Fill the input, output, max_batch_size and dynamic batching, so a config can be one `backend:` line."""
    config = auto_complete_model_config.as_dict()
    name = config["name"]
    try:
        params, _ = kind.parse_parameters(name, model_parameters(config))
        input_name, output_name = tensor_names(kind, name, config, params)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    auto_complete_model_config.add_input({"name": input_name, "data_type": "TYPE_STRING", "dims": [1]})
    auto_complete_model_config.add_output({"name": output_name, "data_type": kind.output_type,
                                           "dims": kind.output_dims(params)})
    if int(config.get("max_batch_size") or 0) == 0:
        auto_complete_model_config.set_max_batch_size(DEFAULT_MAX_BATCH_SIZE)
    if not any(k in config for k in _SCHEDULERS):
        auto_complete_model_config.set_dynamic_batching()
    return auto_complete_model_config


class PreprocessModel:
    """One loaded instance of a preprocessing model."""

    def __init__(self, kind: PreprocessKind, name: str, input_name: str, output_name: str, preprocessor, pb_utils: Any):
        self.kind = kind
        self.name = name
        self.input_name = input_name
        self.output_name = output_name
        self.pre = preprocessor
        self.pb = pb_utils
        self._invalid = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        self._internal = getattr(pb_utils.TritonError, "INTERNAL", None)

    @classmethod
    def load(cls, kind: PreprocessKind, args: dict, pb_utils: Any) -> "PreprocessModel":
        log = pb_utils.Logger
        config = json.loads(args["model_config"])
        name = args["model_name"]
        started = time.perf_counter()
        try:
            params, unknown = kind.parse_parameters(name, model_parameters(config))
            input_name, output_name = tensor_names(kind, name, config, params)
            if int(config.get("max_batch_size") or 0) < 1:
                raise ConfigError(f"backend {kind.backend} batches: max_batch_size must be at least 1")
            model_dir = Path(args["model_repository"])
            preprocessor = kind.load(params, model_dir, model_dir / str(args["model_version"]))
        except ConfigError as exc:
            raise RuntimeError(named(name, str(exc))) from None
        if unknown:
            known = ", ".join(p.key for p in kind.parameters)
            log.log_warn(f"gebackend: model '{name}': unknown parameter(s) ignored: {', '.join(unknown)} "
                         f"(backend {kind.backend} reads {known})")
        log.log_info(f"gebackend: model '{name}' instance '{args.get('model_instance_name', name)}' loaded in "
                     f"{time.perf_counter() - started:.2f}s: {preprocessor.description}, "
                     f"max_batch_size={config.get('max_batch_size')}")
        return cls(kind, name, input_name, output_name, preprocessor, pb_utils)

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        prepared: list = []
        spans = []  # (request index, first item, item count)
        for index, request in enumerate(requests):
            try:
                values = self._values(request)
                items = [self._prepare(value, position, len(values)) for position, value in enumerate(values)]
            except InvalidRequest as exc:
                responses[index] = self._error(str(exc), self._invalid)
                continue
            except Exception as exc:  # a fault of ours, not the client's: 500 for this request alone
                responses[index] = self._error(named(self.name, f"preprocessing failed: {type(exc).__name__}: {exc}"),
                                               self._internal)
                continue
            spans.append((index, len(prepared), len(items)))
            prepared.extend(items)
        outputs = self._run_all(prepared, spans)
        for (index, _, _), output in zip(spans, outputs):
            if isinstance(output, BaseException):
                responses[index] = self._error(named(self.name, f"preprocessing failed: {type(output).__name__}: "
                                                                 f"{output}"), self._internal)
            else:
                tensor = self.pb.Tensor(self.output_name, np.ascontiguousarray(output, dtype=self.kind.output_dtype))
                responses[index] = self.pb.InferenceResponse(output_tensors=[tensor])
        return responses

    def _values(self, request) -> list:
        tensor = self.pb.get_input_tensor_by_name(request, self.input_name)
        if tensor is None:
            raise InvalidRequest(f"model '{self.name}': input '{self.input_name}' is missing: expected "
                                 f"{self.kind.expected} as TYPE_STRING [batch, 1]")
        array = tensor.as_numpy()
        if array.ndim != 2 or array.shape[1] != 1:
            raise InvalidRequest(f"model '{self.name}': input '{self.input_name}' has shape {list(array.shape)}: "
                                 f"expected [batch, 1], one element of {self.kind.expected} per batch row")
        return list(array[:, 0])

    def _prepare(self, value, position: int, count: int):
        try:
            return self.pre.prepare(value)
        except InvalidRequest as exc:
            item = f" item {position} of {count}" if count > 1 else ""
            raise InvalidRequest(f"model '{self.name}': input '{self.input_name}'{item}: {exc}") from None

    def _run_all(self, prepared: list, spans: list) -> list:
        """One run for the whole batch; if it fails, one run per request, so only a faulty one fails."""
        if not spans:
            return []
        try:
            out = self.pre.run(prepared)
            return [out[start:start + count] for _, start, count in spans]
        except Exception:
            if len(spans) == 1:
                return [self._run_one(prepared)]
            return [self._run_one(prepared[start:start + count]) for _, start, count in spans]

    def _run_one(self, items: list):
        try:
            return self.pre.run(items)
        except Exception as exc:
            return exc

    def _error(self, message: str, code):
        error = self.pb.TritonError(message, code) if code is not None else self.pb.TritonError(message)
        return self.pb.InferenceResponse(output_tensors=[], error=error)

    def close(self) -> None:
        pass
