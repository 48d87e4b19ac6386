"""The ONNX operator test corpus run through plain engines and through gebackend's two graph modes, in-process.

Cases come from the onnx wheel: its `onnx/backend/test/data/node` folder when it ships one (model.onnx
and test_data_set_*/*.pb per case), else the case code (`onnx.backend.test.case.node.collect_testcases`),
which builds the same models and reference data in memory; then the wheel's whole-model cases (model_cases.py:
PyTorch exports, small hand-built models, nine model-zoo architectures). Each case runs

- on the plain engine: `onnxruntime.InferenceSession` on the file, or `openvino.Core().compile_model` on it
  with `INFERENCE_PRECISION_HINT=f32` (what `precision_mode=origin` asks; OpenVINO's default on a CPU with
  bf16 support is bf16, which no case's tolerance allows);
- through gebackend exactly as a Triton instance loads it: `runtime.instance.ModelInstance.load` with a config
  holding the case's input shapes (static mode: `static_model=1`, so every shape is fixed; dynamic mode: the dims
  the file leaves open stay -1), which makes the model copies a server makes (optional inputs as constants, a
  StringNormalizer's missing locale, ZipMap outputs, local functions for OpenVINO), then `runtime.loader.load_executor`
  (static: specialise -> upgrade -> fold -> engine through `compile/pipeline.compile_static` and
  `engines.create_static_engine`; dynamic: `engines.create_engine`), and `ModelInstance.execute` on one request, as
  the Triton adapter calls it.

Outputs are compared as onnx's own backend test runner does (`assert_similar_outputs`): same count, shapes
and dtypes, strings equal, numbers within the case's rtol/atol. A case gebackend cannot serve at all (a
sequence, optional or map input or output; an element type Triton has none for) is skipped with that reason.
Cases with an empty input tensor run like the others; in static mode their graph is compiled for a length of 1 where
the request has 0 (Triton's dims are >= 1 or -1) and the request runs on the dynamic fallback (`empty_buckets`).
Both engines use one thread (plain and ours alike): the outputs do not depend on it and it keeps session creation
cheap.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

ENGINES = ("onnxruntime", "openvino")
MODES = ("dynamic", "static")


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    inputs: list[Any]  # numpy arrays; lists for sequences, None for an empty optional
    outputs: list[Any]
    rtol: float
    atol: float


def corpus_source() -> str:
    """Where the cases come from: the data folder when the onnx wheel ships it, else its case code."""
    from onnx.backend.test import __file__ as test_init

    folder = Path(test_init).parent / "data" / "node"
    return str(folder) if folder.is_dir() else "onnx.backend.test.case.node.collect_testcases"


def _load_folder(folder: Path) -> list[Case]:
    from onnx import numpy_helper

    cases = []
    for case_dir in sorted(p for p in folder.iterdir() if (p / "model.onnx").is_file()):
        model = onnx.load(str(case_dir / "model.onnx"))
        data = sorted(glob.glob(str(case_dir / "test_data_set_*")))
        if not data:
            continue

        def read(kind: str) -> list[Any]:
            values = []
            for file in sorted(glob.glob(os.path.join(data[0], f"{kind}_*.pb")),
                               key=lambda f: int(Path(f).stem.split("_")[-1])):
                proto = onnx.TensorProto()
                proto.ParseFromString(Path(file).read_bytes())
                values.append(numpy_helper.to_array(proto))
            return values

        from .model_cases import _tolerances

        cases.append(Case(case_dir.name, model, read("input"), read("output"), *_tolerances(case_dir / "data.json")))
    return cases


def _array(value: Any) -> Any:
    """A case value as the corpus's .pb files hold it: numpy scalars (np.float32(1.0)) as 0-d arrays, TensorProtos
    (the Cast cases give those) as arrays; sequences and None kept."""
    if isinstance(value, onnx.TensorProto):
        from onnx import numpy_helper

        return numpy_helper.to_array(value)
    return value if value is None or isinstance(value, (list, tuple, np.ndarray)) else np.asarray(value)


def load_cases() -> list[Case]:
    """Every node test case, in name order (about 1,900 with onnx 1.23: ~7 s to build from the case code), then the
    wheel's model cases (model_cases.py: about 150 whole models)."""
    from .model_cases import load_model_cases

    return load_node_cases() + load_model_cases()


def load_node_cases() -> list[Case]:
    source = corpus_source()
    if source.endswith("node"):
        return _load_folder(Path(source))
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the case code overflows casts on purpose
        collected = node.collect_testcases(None)
    cases = []
    for tc in collected:
        if tc.model is None or not tc.data_sets:
            continue
        inputs, outputs = tc.data_sets[0]
        cases.append(Case(tc.name, tc.model, [_array(v) for v in inputs], [_array(v) for v in outputs], tc.rtol, tc.atol))
    return sorted(cases, key=lambda c: c.name)


# ------------------------------------------------------------------------------------------ comparison


def compare(want: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> str | None:
    """None when `got` matches the reference `want` as onnx's backend test runner checks it, else why not."""
    if len(got) != len(want):
        return f"{len(got)} outputs, the reference has {len(want)}"
    for index, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, (list, tuple)) or w is None:
            return f"output {index}: a sequence or optional (not comparable as a tensor)"
        g = np.asarray(g)
        if g.shape != w.shape:
            return f"output {index}: shape {list(g.shape)}, the reference has {list(w.shape)}"
        if w.dtype == object:
            if not np.array_equal(g.astype(object), w):
                return f"output {index}: strings differ"
            continue
        if g.dtype != w.dtype:
            return f"output {index}: dtype {g.dtype}, the reference has {w.dtype}"
        if w.dtype.kind == "V":  # bfloat16 (ml_dtypes): numpy's testing compares it as float32
            g, w = g.astype(np.float32), w.astype(np.float32)
        try:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        except AssertionError as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            detail = next((line for line in lines if line.startswith("Mismatched elements")), "values differ")
            return f"output {index}: {detail} (rtol={rtol}, atol={atol})"
    return None


def _first_line(exc: BaseException) -> str:
    """The exception in one line; OpenVINO's messages start with source locations, their last line says what failed."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    line = lines[-1] if lines and lines[0].startswith("Exception from src/") else (lines[0] if lines else "")
    text = f"{type(exc).__name__}: {line}"
    return text if len(text) <= 240 else text[:237] + "..."


# ------------------------------------------------------------------------------------------ running


class Workdir:
    """Each case's model written once, as a file (engines and the loader read files)."""

    def __init__(self):
        self._dir = tempfile.TemporaryDirectory(prefix="gebackend-conformance-")
        self._paths: dict[str, Path] = {}

    def path(self, case: Case) -> Path:
        path = self._paths.get(case.name)
        if path is None:
            path = Path(self._dir.name) / case.name / "model.onnx"
            path.parent.mkdir(parents=True)
            onnx.save(case.model, str(path))
            self._paths[case.name] = path
        return path

    def cleanup(self) -> None:
        self._dir.cleanup()


def input_names(model: onnx.ModelProto) -> list[str]:
    initializers = {i.name for i in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in initializers]


def feeds(case: Case) -> dict[str, Any]:
    return dict(zip(input_names(case.model), case.inputs))


def not_servable(case: Case, path: Path) -> str | None:
    """Why gebackend cannot serve this case at all (only tensors, with a Triton type), or None."""
    from gebackend.config.onnx_signature import read_signature
    from gebackend.errors import ConfigError

    for value in [*case.inputs, *case.outputs]:
        if value is None or isinstance(value, (list, tuple)):
            return "a sequence or optional input/output: only tensors can be served"
    try:
        read_signature(path)
    except ConfigError as exc:
        return f"not servable: {exc}"
    return None


def run_plain(engine: str, case: Case, path: Path, confirm: bool = True) -> str | None:
    """None when the plain engine reproduces the case's reference outputs, else why not. With `confirm` (the corpus
    asks for it where gebackend failed the case: a plain pass then makes it a regression) a pass must match twice,
    each on a model of its own: OpenVINO 2026.4 answers `test_tile` (repeats given as an input) from memory it never
    wrote (NaN in 12 of 12 runs alone here), which once held the right values in a CI run, and the case then counted
    as one gebackend failed. Where gebackend matched the reference in every mode, one plain run decides nothing more."""
    first = _run_plain_once(engine, case, path)
    return first if first is not None or not confirm else _run_plain_once(engine, case, path)


def _run_plain_once(engine: str, case: Case, path: Path) -> str | None:
    try:
        if engine == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 4
            options.intra_op_num_threads = 1
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        else:
            import openvino as ov

            from gebackend.engines.openvino import core

            compiled = core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": ov.Type.f32,
                                                               "INFERENCE_NUM_THREADS": 1})
    except Exception as exc:  # noqa: BLE001 - a plain failure is a result, not an error
        return f"load fails: {_first_line(exc)}"
    try:
        if engine == "onnxruntime":
            got = session.run(None, feeds(case))
        else:
            request = compiled.create_infer_request()
            request.infer({name: np.asarray(a) for name, a in feeds(case).items()})
            got = [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]
    except Exception as exc:  # noqa: BLE001
        return f"run fails: {_first_line(exc)}"
    return compare(case.outputs, got, case.rtol, case.atol)


def _config(case: Case, path: Path, static: bool) -> dict[str, Any]:
    """config.pbtxt as a dict: no batching, each input's dims from the case's data (-1 where dynamic mode keeps
    the file's open dim)."""
    from gebackend.config.onnx_signature import read_signature

    entries = []
    signature = {t.name: t for t in read_signature(path).inputs}
    for name, value in feeds(case).items():
        tensor = signature[name]
        shape = list(np.shape(value))
        if not static and len(tensor.shape) == len(shape):
            shape = [d if isinstance(d, int) else -1 for d in tensor.shape]
        shape = [-1 if d == 0 else d for d in shape]  # Triton's dims are >= 1 or -1
        entries.append({"name": name, "data_type": tensor.dtype.triton, "dims": shape})
    return {"name": case.name, "max_batch_size": 0, "input": entries}


def empty_buckets(case: Case) -> dict[str, str]:
    """Static mode, a case with an empty input: Triton's config cannot fix a dim to 0, so its static graph is
    compiled for 1 there (a shape bucket) and the request, which fits no bucket, runs on the dynamic fallback
    (`bucket_fallback=dynamic`), as a server serves it: config.pbtxt parameters. None for other cases."""
    shapes = {name: list(np.shape(value)) for name, value in feeds(case).items()}
    if not any(0 in shape for shape in shapes.values()):
        return {}
    return {"graph.ge.inputShape": ";".join(f"{name}:{','.join('-1' if d == 0 else str(d) for d in shape)}"
                                            for name, shape in shapes.items()),
            "graph.ge.dynamicDims": ",".join("1" for shape in shapes.values() for d in shape if d == 0),
            "bucket_fallback": "dynamic"}


def run_ours(engine: str, mode: str, case: Case, path: Path, log=None) -> str | None:
    """None when gebackend (load as a server does, then one request) reproduces the reference outputs, else why not."""
    from gebackend.errors import GeBackendError
    from gebackend.runtime.instance import InstanceInfo, ModelInstance

    lines: list[str] = [] if log is None else log
    static = mode == "static"
    parameters = {"engine": engine, "static_model": "1" if static else "0", "intra_op_thread_count": "1",
                  **(empty_buckets(case) if static else {})}
    config = {**_config(case, path, static), "backend": "ge",
              "parameters": {key: {"string_value": value} for key, value in parameters.items()}}

    class _Log:
        def info(self, message: str) -> None:
            lines.append(message)

        warn = info

    try:
        instance = ModelInstance.load(config, path.parent, InstanceInfo(f"{case.name}_0"), _Log(), pin=False)
    except GeBackendError as exc:
        return f"load refused: {exc}"
    except Exception as exc:  # noqa: BLE001 - exactly what must never happen
        return f"load CRASHED (a dependency's exception reached the caller): {_first_line(exc)}"
    try:
        try:
            (result,) = instance.execute([feeds(case)])
        except Exception as exc:  # noqa: BLE001
            return f"request CRASHED: {_first_line(exc)}"
        if isinstance(result, Exception):
            return f"request failed: {result}"
        return compare(case.outputs, [result.get(o.name) for o in case.model.graph.output], case.rtol, case.atol)
    finally:
        instance.close()


# ------------------------------------------------------------------------------------------ the whole corpus


def available_engines() -> list[str]:
    import importlib.util

    return [e for e in ENGINES if importlib.util.find_spec(e) is not None]


def run_share(worker: int, workers: int, engines: Sequence[str]) -> dict[str, dict[str, str | None]]:
    """Cases worker::workers (name order): {case: {"skip": why}} or {case: {"plain/<engine>": None | why, ...}}.

    Runs in a fresh process (spawned: engines' thread pools do not survive a fork), which reads the corpus itself.
    """
    import gc

    import onnxslim  # noqa: F401 - imported before the freeze below (onnxslim brings sympy: many objects)

    import gebackend.runtime.loader  # noqa: F401
    for engine in engines:
        __import__(engine)
    cases = load_cases()[worker::workers]
    # the corpus and the modules are long-lived: without this, the loader's gc.collect() after every static
    # build walks them all (24 ms a build, a minute of the run)
    gc.freeze()
    try:
        import onnxruntime as ort

        ort.set_default_logger_severity(4)  # failed runs are results here, not log lines
    except ImportError:
        pass
    workdir = Workdir()
    results: dict[str, dict[str, str | None]] = {}
    try:
        for case in cases:
            path = workdir.path(case)
            skip = not_servable(case, path)
            if skip is not None:
                results[case.name] = {"skip": skip}
                continue
            row: dict[str, str | None] = {}
            for engine in engines:
                for mode in MODES:
                    row[f"{mode}/{engine}"] = run_ours(engine, mode, case, path)
                ours_failed = any(row[f"{mode}/{engine}"] is not None for mode in MODES)
                row[f"plain/{engine}"] = run_plain(engine, case, path, confirm=ours_failed)
            results[case.name] = row
    finally:
        workdir.cleanup()
    return results


class Run:
    """The corpus running in `workers` spawned processes (each a share of the cases, see `run_share`) while the caller
    goes on; `results()` waits for them. `niceness` lowers the workers' CPU priority: at 19 they take only the
    cores the rest of a test run leaves idle."""

    def __init__(self, engines: Sequence[str] | None = None, workers: int | None = None, niceness: int = 0):
        import multiprocessing

        engines = list(engines or available_engines())
        workers = workers or max(1, min(2, os.cpu_count() or 1))
        self._pool = multiprocessing.get_context("spawn").Pool(workers, initializer=lower_priority, initargs=(niceness,))
        self._shares = [self._pool.apply_async(run_share, (w, workers, engines)) for w in range(workers)]

    def results(self) -> dict[str, dict[str, str | None]]:
        try:
            found: dict[str, dict[str, str | None]] = {}
            for share in self._shares:
                found.update(share.get())
        finally:
            self.cancel()
        return dict(sorted(found.items()))

    def cancel(self) -> None:
        self._pool.terminate()
        self._pool.join()


def lower_priority(niceness: int) -> None:
    """A worker's CPU priority. Linux's autogroup scheduling shares the CPU fairly between sessions first (a server
    started in a session of its own would get no more than these workers), so a lowered worker also starts a session
    of its own and gives that group the same niceness."""
    if niceness:
        with contextlib.suppress(OSError):
            os.setsid()
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(niceness))
    os.nice(niceness)


_early: Run | None = None


def start_early() -> None:
    """Start the whole corpus now, at the lowest CPU priority; the next `run_all()` with no arguments returns it."""
    global _early
    if _early is None:
        _early = Run(niceness=19)


def cancel_early() -> None:
    global _early
    if _early is not None:
        _early.cancel()
        _early = None


def run_all(engines: Sequence[str] | None = None, workers: int | None = None) -> dict[str, dict[str, str | None]]:
    """Every case through every engine (plain, dynamic, static), split over `workers` spawned processes (or the run
    `start_early` started)."""
    global _early
    if _early is not None and engines is None and workers is None:
        run, _early = _early, None
        return run.results()
    return Run(engines, workers).results()
