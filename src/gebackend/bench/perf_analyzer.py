"""Triton's perf_analyzer: where it is (installed by `make tools`), its command line, and its CSV report.

perf_analyzer comes from the tritonclient 2.41.0 wheel, unpacked into `tools/bin/` by
`tools/install_perf_analyzer.sh`; it runs with `LD_LIBRARY_PATH=tools/lib` (a libcudart.so.12 link).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import shutil
import struct
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from gebackend.compile.bfloat16 import BF16

ENV_VAR = "GE_PERF_ANALYZER"  # an explicit path to the binary
UNSTABLE = "Failed to obtain stable measurement"
B64_ABOVE = 4096  # numeric input data with more values than this goes to perf_analyzer as base64
LOOSE = 1000  # -s for the retry of an unstable level: max/min of the last 3 windows within 11x


class PerfAnalyzerMissing(RuntimeError):
    pass


@dataclass
class PerfRow:
    """One concurrency level of a perf_analyzer report; latencies in microseconds."""

    concurrency: int
    throughput: float  # inferences per second
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    avg_us: float
    # where the time goes (perf_analyzer's server-side breakdown, microseconds per request)
    client_send_us: float = 0.0
    network_us: float = 0.0
    server_queue_us: float = 0.0
    server_compute_input_us: float = 0.0
    server_compute_infer_us: float = 0.0
    server_compute_output_us: float = 0.0
    client_recv_us: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


_COLUMNS = {
    "Concurrency": "concurrency",
    "Inferences/Second": "throughput",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Avg latency": "avg_us",
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_us",
    "Server Queue": "server_queue_us",
    "Server Compute Input": "server_compute_input_us",
    "Server Compute Infer": "server_compute_infer_us",
    "Server Compute Output": "server_compute_output_us",
    "Client Recv": "client_recv_us",
}


def parse_csv(text: str) -> list[PerfRow]:
    """perf_analyzer's `-f` CSV: one row per concurrency (or request rate), sorted by concurrency.

    Only the first table is read (with `--collect-metrics` perf_analyzer appends others after a blank line).
    """
    table = text.strip().split("\n\n")[0] if text.strip() else ""
    reader = csv.DictReader(io.StringIO(table))
    rows = []
    for raw in reader:
        if not raw.get("Inferences/Second"):
            continue
        values: dict = {}
        extra: dict = {}
        for key, value in raw.items():
            if key is None:
                continue
            name = _COLUMNS.get(key.strip())
            if name is None:
                extra[key.strip()] = value
                continue
            values[name] = int(float(value)) if name == "concurrency" else float(value or 0)
        values.setdefault("concurrency", int(float(raw.get("Request Rate") or 0)))
        for name in ("p50_us", "p90_us", "p95_us", "p99_us", "avg_us"):
            values.setdefault(name, float("nan"))
        rows.append(PerfRow(**values, extra=extra))
    return sorted(rows, key=lambda r: r.concurrency)


def merge_csv(texts: Sequence[str]) -> str:
    """Several one-level reports (one perf_analyzer run per concurrency) as one CSV with one header."""
    header, lines = None, []
    for text in texts:
        table = text.strip().split("\n\n")[0].splitlines() if text.strip() else []
        if not table:
            continue
        header = header or table[0]
        lines.extend(table[1:])
    return "" if header is None else "\n".join([header, *lines]) + "\n"


def _project_roots() -> list[Path]:
    here = Path(__file__).resolve()
    roots = [Path.cwd(), *Path.cwd().parents, *here.parents]
    seen, out = set(), []
    for root in roots:
        if root not in seen:
            seen.add(root)
            out.append(root)
    return out


def find_perf_analyzer() -> Path:
    """$GE_PERF_ANALYZER, else tools/bin/perf_analyzer of this checkout, else perf_analyzer on PATH."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise PerfAnalyzerMissing(f"{ENV_VAR}={explicit} is not a file")
        return path
    for root in _project_roots():
        candidate = root / "tools" / "bin" / "perf_analyzer"
        if candidate.is_file():
            return candidate
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return Path(on_path)
    installed = _install_into_checkout()
    if installed is not None:
        return installed
    raise PerfAnalyzerMissing(
        "perf_analyzer is not installed: run `make tools` (it unpacks it from the tritonclient 2.41.0 wheel "
        f"into tools/bin/), or set {ENV_VAR}"
    )


def _install_into_checkout() -> Path | None:
    """On a fresh checkout, do what `make tools` does (tools/install_perf_analyzer.sh), once, and say so."""
    import subprocess
    import sys

    for root in _project_roots():
        script = root / "tools" / "install_perf_analyzer.sh"
        if script.is_file():
            print(f"gebackend bench: perf_analyzer is missing; installing it with {script} (as `make tools` does)",
                  file=sys.stderr, flush=True)
            done = subprocess.run(["bash", str(script), sys.executable], cwd=root)
            binary = root / "tools" / "bin" / "perf_analyzer"
            if done.returncode == 0 and binary.is_file():
                return binary
    return None


def environment(binary: Path) -> dict[str, str]:
    """The binary's environment: its tools/lib (libcudart.so.12) first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    lib = binary.resolve().parent.parent / "lib"
    if lib.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(lib), *[p for p in [env.get("LD_LIBRARY_PATH")] if p]])
    return env


@dataclass(frozen=True)
class PerfSettings:
    measurement_interval_ms: int = 2000
    stability_percentage: int = 20  # perf_analyzer's default (10) rarely settles on a shared 2-core machine
    max_trials: int = 6
    percentile: int | None = None  # stabilise on this latency percentile instead of the average
    protocol: str = "grpc"
    timeout_s: float = 300.0  # for one perf_analyzer run


def command(
    binary: Path,
    model: str,
    url: str,
    concurrency: int,
    csv_path: Path,
    settings: PerfSettings,
    shapes: Mapping[str, Sequence[int]] = {},
    input_data: Path | None = None,
    batch_size: int = 1,
) -> list[str]:
    cmd = [
        str(binary), "-m", model, "-u", url, "-i", settings.protocol, "-b", str(batch_size),
        "--concurrency-range", f"{concurrency}:{concurrency}:1",
        "--measurement-interval", str(settings.measurement_interval_ms),
        "-s", str(settings.stability_percentage), "-r", str(settings.max_trials),
        "-f", str(csv_path),
    ]
    if settings.percentile:
        cmd += ["--percentile", str(settings.percentile)]
    for name, dims in shapes.items():
        cmd += ["--shape", f"{name}:{','.join(str(d) for d in dims)}"]
    if input_data is not None:
        cmd += ["--input-data", str(input_data)]
    return cmd


def write_input_data(path: Path, feeds: Mapping[str, np.ndarray]) -> Path:
    """perf_analyzer's --input-data JSON for one request (batch dim dropped): the bench's own valid inputs."""
    return write_input_entries(path, [{name: np.asarray(value)[0] for name, value in feeds.items()}])


def tensor_json(value) -> dict:
    """One input tensor of one request (no batch dim) as perf_analyzer 2.41's --input-data JSON reads it.

    numpy array: its values row-major in "content", and its "shape". BYTES (TYPE_STRING) elements: a `str` (or a
    list of them) goes in as JSON text, which perf_analyzer sends as its UTF-8 bytes; `bytes` (or a list of them,
    e.g. encoded JPEGs, which JSON text cannot carry) go in as {"b64": ...} of Triton's serialised form, each
    element a 4-byte little-endian length and then its bytes: perf_analyzer sends the decoded b64 as the raw
    tensor, so without the lengths the server reads the first 4 bytes of the file as one. A numeric array of more
    than B64_ABOVE values goes in as {"b64": ...} of its little-endian bytes too (perf_analyzer's binary form).
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    if items and all(isinstance(v, str) for v in items):
        return {"content": list(items), "shape": [len(items)]}
    if items and all(isinstance(v, (bytes, bytearray)) for v in items):
        raw = b"".join(struct.pack("<I", len(v)) + bytes(v) for v in items)
        return {"content": {"b64": base64.b64encode(raw).decode("ascii")}, "shape": [len(items)]}
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind in "SU":
        raise TypeError(f"BYTES input data must be str or bytes elements, not a {array.dtype} array")
    # an image tensor as JSON numbers is ~20 bytes a value, raw little-endian 4; perf_analyzer refuses bfloat16 as
    # numbers ("Can not use explicit tensor description for bf16 datatype"): its 16-bit pattern goes as b64 always
    if array.size > B64_ABOVE or array.dtype == BF16:
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        return {"content": {"b64": base64.b64encode(raw).decode("ascii")}, "shape": list(array.shape)}
    return {"content": array.ravel().tolist(), "shape": list(array.shape)}


def write_input_entries(path: Path, entries: Sequence[Mapping[str, object]]) -> Path:
    """--input-data JSON with one entry per request (perf_analyzer sends them round-robin); see tensor_json."""
    data = [{name: tensor_json(value) for name, value in entry.items()} for entry in entries]
    path.write_text(json.dumps({"data": data}, ensure_ascii=False), encoding="utf-8")
    return path


@dataclass
class PerfResult:
    rows: list[PerfRow]
    csv_text: str
    failures: list[str]  # one message per concurrency level that produced no row
    unstable: list[int] = field(default_factory=list)  # levels measured only with the loose retry (noisy machine)



def run_once(cmd: list[str], binary: Path, timeout_s: float) -> subprocess.CompletedProcess | None:
    """One perf_analyzer process; None when it ran over `timeout_s`."""
    try:
        return subprocess.run(cmd, env=environment(binary), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None

def run(
    binary: Path,
    model: str,
    url: str,
    concurrencies: Sequence[int],
    workdir: Path,
    settings: PerfSettings,
    shapes: Mapping[str, Sequence[int]] = {},
    input_data: Path | None = None,
    log=print,
) -> PerfResult:
    """One perf_analyzer run per concurrency level (a level that fails loses only itself)."""
    texts, failures, unstable = [], [], []
    for level in concurrencies:
        csv_path = workdir / f"perf_c{level}.csv"
        cmd = command(binary, model, url, level, csv_path, settings, shapes, input_data)
        log("bench:   $ " + " ".join(cmd))
        done = run_once(cmd, binary, settings.timeout_s)
        if done is None:
            failures.append(f"concurrency {level}: perf_analyzer ran over {settings.timeout_s:.0f}s")
            continue
        (workdir / f"perf_c{level}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0 and UNSTABLE in done.stdout + done.stderr and settings.stability_percentage < LOOSE:
            # A shared machine may never give 3 windows within s%: measure once more with windows twice as long,
            # accepting a spread of up to 10x, and say so rather than lose the level.
            loose = replace(settings, stability_percentage=LOOSE, max_trials=4,
                            measurement_interval_ms=2 * settings.measurement_interval_ms)
            cmd = command(binary, model, url, level, csv_path, loose, shapes, input_data)
            log(f"bench:   unstable; again with -s {LOOSE}: $ " + " ".join(cmd))
            done = run_once(cmd, binary, settings.timeout_s)
            if done is None:
                failures.append(f"concurrency {level}: perf_analyzer ran over {settings.timeout_s:.0f}s")
                continue
            (workdir / f"perf_c{level}.retry.log").write_text(done.stdout + done.stderr)
            if done.returncode == 0 and csv_path.is_file():
                unstable.append(level)
        if done.returncode != 0 or not csv_path.is_file():
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            failures.append(f"concurrency {level}: perf_analyzer exit {done.returncode}: {' | '.join(tail)}")
            continue
        texts.append(csv_path.read_text())
    merged = merge_csv(texts)
    return PerfResult(parse_csv(merged), merged, failures, unstable)
