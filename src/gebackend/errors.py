"""The error types every layer raises, so the Triton adapter can map them to status codes.

`InvalidRequest` is the client's fault (HTTP 400 / gRPC INVALID_ARGUMENT); `ModelLoadError`
stops one model from loading; anything else escaping the runtime is an internal error (500).
"""


class GeBackendError(Exception):
    """Base class of every error gebackend raises on purpose."""


class ConfigError(GeBackendError):
    """config.pbtxt, a backend option or the ONNX file is unusable; the model does not load."""


class ModelLoadError(GeBackendError):
    """A model could not be prepared for serving."""


class InvalidRequest(GeBackendError):
    """A request the model cannot run: wrong input names, dtypes or shapes."""


def named(model: str, message: str) -> str:
    """`message` naming the model it is about: as it is when it already names it, else prefixed."""
    return message if f"'{model}'" in message else f"model '{model}': {message}"
