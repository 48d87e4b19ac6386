"""The model-repository API of one tritonserver, as the CLI uses it: index, load, unload (the watchdog's
`ModelRepository`), behind the header that unlocks it; how this server's models are controlled (`ModelControl`,
decided from the settings and the user's own flags); and reading a repository and its index for people.

Kept for the CLI: unless `--allow-model-control`, Triton's repository API is restricted to a header whose
secret only this process knows (`CONTROL_HEADER`), over HTTP and gRPC alike.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gebackend.config.pbtxt import config_parse_error
from gebackend.errors import GeBackendError

if TYPE_CHECKING:
    from gebackend.server.launcher import ServerSettings

# The header that unlocks Triton's model-repository API (index, load, unload) when clients may not use it.
CONTROL_HEADER = "gebackend-control-key"


class LaunchError(GeBackendError):
    """The server could not be started or did not become ready."""


class RepositoryError(GeBackendError):
    """Triton refused a model-repository call; `status` is its HTTP or gRPC status."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


def flag_values(args: Sequence[str], name: str) -> list[str]:
    """The values of a tritonserver flag in `args`, written `--name=value` or `--name value`."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            values.append(arg[len(name) + 1:])
        elif arg == name and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def restriction_for(values: Sequence[str], api: str = "model-repository") -> tuple[str, str] | None:
    """The (header, value) a `--http-restricted-api` / `--grpc-restricted-protocol` list puts on `api`, if any.

    Each value reads `<api>[,<api>...]:<header>=<value>`.
    """
    for value in values:
        apis, sep, rule = value.partition(":")
        header, eq, secret = rule.partition("=")
        if sep and eq and api in [a.strip() for a in apis.split(",")]:
            return header.strip(), secret
    return None


@dataclass(frozen=True)
class ModelControl:
    """How this server's models are managed, decided from the settings and the user's extra flags."""

    mode: str  # tritonserver --model-control-mode: "explicit" unless the user chose another
    flags: tuple[str, ...]  # what the launcher adds to the command line for it
    header: tuple[str, str] | None  # (name, value) the CLI sends to reach the repository API; None when open
    grpc_header: tuple[str, str] | None = None  # the same over gRPC (differs if the user restricted it himself)

    @property
    def can_reload(self) -> bool:
        return self.mode == "explicit"

    @classmethod
    def decide(cls, settings: "ServerSettings", secret: str) -> "ModelControl":
        extra = settings.extra_args
        flags: list[str] = []
        modes = flag_values(extra, "--model-control-mode")
        mode = modes[-1] if modes else "explicit"
        if not modes:
            flags.append("--model-control-mode=explicit")
            if not flag_values(extra, "--load-model"):
                flags.append("--load-model=*")
        # A restriction the user set himself is kept, and used by the CLI too.
        header = user_http = restriction_for(flag_values(extra, "--http-restricted-api"))
        grpc_header = user_grpc = restriction_for(flag_values(extra, "--grpc-restricted-protocol"))
        if not settings.allow_model_control:
            header = user_http or (CONTROL_HEADER, secret)
            grpc_header = user_grpc or (CONTROL_HEADER, secret)
            if user_http is None:
                flags.append(f"--http-restricted-api=model-repository:{CONTROL_HEADER}={secret}")
            if user_grpc is None:
                flags.append(f"--grpc-restricted-protocol=model-repository:{CONTROL_HEADER}={secret}")
        return cls(mode, tuple(flags), header, grpc_header)


class RepositoryClient:
    """Triton's model-repository API of one server, for this CLI only (the watchdog's `ModelRepository`)."""

    def __init__(self, settings: "ServerSettings", control: ModelControl):
        self.settings = settings
        self.control = control
        self._grpc_channel = None
        self._grpc_stub = None

    def url(self, path: str) -> str:
        addresses = flag_values(self.settings.extra_args, "--http-address")
        host = addresses[-1] if addresses and addresses[-1] not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.settings.http_port}{path}"

    # Over gRPC: in tritonserver 2.51 an HTTP load or unload blocks an HTTP front-end thread for as long as
    # the load takes (measured: HTTP inference to other models stalls ~2 s per reload), a gRPC one does not.
    def _use_grpc(self) -> bool:
        allowed = flag_values(self.settings.extra_args, "--allow-grpc")
        return not allowed or allowed[-1].lower() not in ("false", "0", "no", "off")

    def _grpc(self):
        if self._grpc_stub is None:
            import grpc
            from tritonclient.grpc import service_pb2_grpc

            addresses = flag_values(self.settings.extra_args, "--grpc-address")
            host = addresses[-1] if addresses and addresses[-1] not in ("", "0.0.0.0", "::") else "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
            self._grpc_channel = grpc.insecure_channel(f"{host}:{self.settings.grpc_port}")
            self._grpc_stub = service_pb2_grpc.GRPCInferenceServiceStub(self._grpc_channel)
        return self._grpc_stub

    def _grpc_call(self, method: str, request, timeout: float):
        import grpc

        # Triton reads a restricted gRPC protocol's header with this prefix.
        header = self.control.grpc_header
        metadata = [(f"triton-grpc-protocol-{header[0]}".lower(), header[1])] if header else []
        try:
            return getattr(self._grpc(), method)(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise RepositoryError(exc.details() or str(exc.code()), str(exc.code())) from None

    def _http_call(self, path: str, timeout: float) -> bytes:
        """POST to Triton's model-repository API with the header that unlocks it for us."""
        headers = {"Content-Type": "application/json"}
        if self.control.header is not None:
            headers[self.control.header[0]] = self.control.header[1]
        request = urllib.request.Request(self.url(path), data=b"{}", method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise RepositoryError(_body(exc), str(exc.code)) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            raise RepositoryError(str(exc), "") from None

    def repository_index(self) -> list[dict]:
        """Every model in the repository with its state (and the reason when it is not READY)."""
        if not self._use_grpc():
            return json.loads(self._http_call("/v2/repository/index", timeout=10) or b"[]")
        from tritonclient.grpc import service_pb2

        response = self._grpc_call("RepositoryIndex", service_pb2.RepositoryIndexRequest(), timeout=10)
        return [{key: value for key, value in (("name", m.name), ("version", m.version), ("state", m.state),
                                              ("reason", m.reason)) if value} for m in response.models]

    def load_model(self, name: str, timeout: float = 600) -> None:
        """Load (or reload, if loaded and changed) one model; raises `LaunchError` with Triton's reason if it fails."""
        self._model_call(name, "load", timeout)

    def unload_model(self, name: str, timeout: float = 600) -> None:
        self._model_call(name, "unload", timeout)

    def _model_call(self, name: str, action: str, timeout: float) -> None:
        try:
            if self._use_grpc():
                from tritonclient.grpc import service_pb2

                if action == "load":
                    self._grpc_call("RepositoryModelLoad", service_pb2.RepositoryModelLoadRequest(model_name=name), timeout)
                else:
                    self._grpc_call("RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(model_name=name),
                                    timeout)
            else:
                self._http_call(f"/v2/repository/models/{urllib.parse.quote(name, safe='')}/{action}", timeout)
        except RepositoryError as exc:
            raise LaunchError(f"{action} of model '{name}' failed: {exc}") from None

    def close(self) -> None:
        if self._grpc_channel is not None:
            self._grpc_channel.close()
            self._grpc_channel = self._grpc_stub = None


def written_by_the_server(relative: Path) -> bool:
    """Whether a path inside a model folder is one the server writes itself, not part of the model: hidden folders
    and files (the caches gebackend keeps beside a model, `.gebackend-cache/`) and Python's byte code (the
    `__pycache__/` a stub writes when it first imports a `backend: "python"` model's `model.py`)."""
    parts = relative.parts
    return any(part.startswith(".") or part == "__pycache__" for part in parts) or relative.suffix in (".pyc", ".pyo")


def repository_fingerprints(repository: Path) -> dict[str, tuple]:
    """Per model folder, the (path, size, mtime) of every file in it: what a reload compares. What the server
    writes there itself (`written_by_the_server`) is left out: writing it reloads nothing."""
    found = {}
    for folder in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        entries = []
        for path in sorted(folder.rglob("*")):
            if written_by_the_server(path.relative_to(folder)):
                continue
            try:
                stat = path.stat()
            except OSError:
                continue
            if path.is_file():
                entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
        found[folder.name] = tuple(entries)
    return found


def _body(error: urllib.error.HTTPError) -> str:
    try:
        text = error.read().decode(errors="replace")
        return json.loads(text).get("error", text)
    except (ValueError, AttributeError, OSError):
        return str(error)


def load_failure_reason(entry: dict) -> str:
    """Triton's reason for a model that did not load, without the Python stack it appends."""
    return (entry.get("reason") or entry.get("state") or "").split("\n\nAt:")[0].strip()


def format_model_table(index: Sequence[dict]) -> list[str]:
    lines = []
    for entry in sorted(index, key=lambda e: e.get("name", "")):
        version = f" v{entry['version']}" if entry.get("version") else ""
        state = entry.get("state") or "UNKNOWN"
        reason = f" - {load_failure_reason(entry)}" if entry.get("reason") and state != "READY" else ""
        lines.append(f"  {entry.get('name')}{version}: {state}{reason}")
    return lines


def failure_reason(repository: Path, entry: dict) -> str:
    """Why a model did not load: Triton's reason, except for a config.pbtxt it could not read, where Triton says
    nothing (or only "failed to read text proto"): then the file, line, column and the parser's complaint."""
    reason = load_failure_reason({"reason": entry.get("reason")})
    if entry.get("name") and (not reason or "text proto" in reason or "failed to poll" in reason):
        parsed = config_parse_error(Path(repository) / str(entry["name"]))
        if parsed:
            return parsed
    return reason or f"tritonserver gave no reason (state {entry.get('state') or 'UNKNOWN'}; see its log above)"
