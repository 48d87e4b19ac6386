"""Reading a Triton config.pbtxt into the JSON-shaped dict Triton hands a Python backend, and saying where and why
one does not parse (tritonserver only logs "failed to read text proto")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from google.protobuf import descriptor, json_format, text_format

from gebackend.errors import ConfigError

_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def _scalar(field: descriptor.FieldDescriptor, value: Any) -> Any:
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    return value


def _ints(message: descriptor.Descriptor, data: dict[str, Any]) -> dict[str, Any]:
    """Turn the 64-bit integers MessageToDict writes as strings (dims, max_queue_delay_microseconds...) into ints."""
    for key, value in data.items():
        field = message.fields_by_name.get(key)
        if field is None:
            continue
        if field.type != descriptor.FieldDescriptor.TYPE_MESSAGE:
            data[key] = [_scalar(field, v) for v in value] if isinstance(value, list) else _scalar(field, value)
            continue
        sub = field.message_type
        if sub.GetOptions().map_entry:
            value_field = sub.fields_by_name["value"]
            for k, v in value.items():
                if value_field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
                    _ints(value_field.message_type, v)
                else:
                    value[k] = _scalar(value_field, v)
        elif isinstance(value, list):
            for item in value:
                _ints(sub, item)
        else:
            _ints(sub, value)
    return data


def _parse(path: Path):
    """The ModelConfig message in the file; ConfigError says why not ('<path>:<line>:<column>: <complaint>')."""
    from tritonclient.grpc import model_config_pb2

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigError(f"cannot parse {_located(path, exc)}") from None
    return message


def _located(path: Path, exc: text_format.ParseError) -> str:
    """'<path>:<line>:<column>: <complaint>' (protobuf puts '<line>:<column> : ' before its message)."""
    line, column = exc.GetLine(), exc.GetColumn()
    complaint = str(exc)
    if line is None:
        return f"{path}: {complaint}"
    prefix = f"{line}:{column} : "
    return f"{path}:{line}:{column}: {complaint[len(prefix):] if complaint.startswith(prefix) else complaint}"


def config_parse_error(model_dir: str | os.PathLike) -> str | None:
    """Why `<model_dir>/config.pbtxt` is not a Triton model config (file, line, column, the parser's complaint);
    None when it parses or when there is no such file (Triton then auto-completes the config)."""
    path = Path(model_dir) / "config.pbtxt"
    if not path.is_file():
        return None
    try:
        _parse(path)
    except ConfigError as exc:
        return str(exc)
    return None


def load_model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config.pbtxt at `path` as a dict in Triton's JSON shape; `name` defaults to the parent folder's name."""
    path = Path(path)
    message = _parse(path)
    config = _ints(message.DESCRIPTOR, json_format.MessageToDict(message, preserving_proto_field_name=True))
    if not config.get("name"):
        config["name"] = path.resolve().parent.name
    config["max_batch_size"] = int(config.get("max_batch_size", 0))
    return config
