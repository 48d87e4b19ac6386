"""What `precision_mode=auto` and `engine=auto` become for one model on this CPU, and why (said in the load log).

`precision_mode=auto` asks for the fastest precision this CPU runs natively, guarded by accuracy:

* bf16 where the engine can run it natively: OpenVINO reporting `BF16` in its CPU plugin's
  OPTIMIZATION_CAPABILITIES (AVX512-BF16 or AMX; never on an AVX2-only CPU, which reports `FP32, INT8`);
* else int8 on an x86 CPU with AVX2 (VNNI makes it faster; without it int8 still beat fp32 on the bench models:
  ONNX Runtime's dynamic int8 1.75x the peer on the CN_CLIP text encoder, NNCF's int8 1.98x f32 on ResNet-50, both
  on an AVX2-only AMD, though on a second AVX2-only AMD EPYC ONNX Runtime's int8 was only 1.04x its fp32 on the
  4-layer text encoder), except on OpenVINO for a MatMul model on a CPU without VNNI: NNCF's int8 of the 4-layer
  CN_CLIP text and image encoders (attention, MatMul) ran at 0.45x and 0.52x OpenVINO's own f32 on that EPYC, so
  there it is origin (engine=auto picks ONNX Runtime's dynamic int8 for those models instead);
* else origin (fp32).

An automatic lossy precision comes with a guard: the loader compares the lowered model with fp32 on the accuracy
check's input (compile/accuracy.py) and serves fp32 instead when the cosine similarity is below
`AUTO_MIN_COSINE` (the `precision_min_cosine` option sets another bound, for explicit precisions too).

`engine=auto` (registry.auto for an explicit precision) and, for int8, by what the model is made of: a model whose
weighted ops are mostly convolutions runs on OpenVINO (NNCF's static int8: ONNX Runtime's dynamic int8 quantizes
only MatMul/Gemm and leaves convolutions in fp32; without OpenVINO, ONNX Runtime's static int8), one of mostly
MatMul/Gemm on ONNX Runtime (dynamic int8, no calibration needed). A model OpenVINO cannot read (an operator it
has no conversion for, a convolution over a tensor of unknown rank) is never given to it: engine=auto takes ONNX
Runtime, which runs every ONNX operator, and chooses precision_mode=auto again for it, saying why. An int8 that
would quantize nothing (no Conv, MatMul or Gemm with a constant weight) is never chosen by precision_mode=auto.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from gebackend.compile.int8_route import weighted_op_counts
from gebackend.engines import registry
from gebackend.cpu import VNNI_FLAGS

AUTO_MIN_COSINE = 0.99


@dataclass(frozen=True)
class Choice:
    engine: str
    precision_mode: str
    why: str  # one line for the load log; empty when nothing was automatic
    refused: str = ""  # engine=auto: why OpenVINO, which it would have taken, cannot serve the model


def auto_precision(engine: str, cpu_flags: Iterable[str], openvino_capabilities: Callable[[], Iterable[str]],
                   path: Path | None = None) -> tuple[str, str]:
    """The precision `precision_mode=auto` runs on `engine` ("auto": either engine) for the model at `path`, and why."""
    flags = frozenset(cpu_flags)
    may_openvino = engine in ("auto", "openvino") and registry.installed("openvino")
    if may_openvino:
        capabilities = tuple(openvino_capabilities())
        if "BF16" in capabilities:
            return "bf16", f"OpenVINO's CPU plugin reports BF16 ({', '.join(capabilities)})"
    if "avx2" in flags:
        vnni = sorted(flags & VNNI_FLAGS)
        slow = openvino_int8_slow(flags, path) if engine == "openvino" else ""
        if slow:
            return "origin", f"{slow}: exact fp32 (engine=auto would run ONNX Runtime's dynamic int8)"
        if path is not None and weighted_op_counts(path) == (0, 0):
            return "origin", "int8 would quantize nothing here (no Conv, MatMul or Gemm with a constant weight): exact fp32"
        where = "no native bf16 here" if may_openvino else f"{engine} runs no bf16 on the CPU here"
        return "int8", f"{where}; int8 with " + ("/".join(vnni) if vnni else "AVX2 kernels (no VNNI)")
    return "origin", "this CPU has no AVX2 and no native bf16: exact fp32"


def openvino_int8_slow(cpu_flags: Iterable[str], path: Path | None) -> str:
    """Why OpenVINO's int8 (NNCF) is expected to run slower than its f32 for the model at `path` on this CPU, or "".

    On an AVX2 CPU without VNNI, NNCF's int8 of MatMul models ran at about half OpenVINO's f32 (the 4-layer CN_CLIP
    encoders on an AMD EPYC: 0.45x and 0.52x); convolution models still gained. `precision_mode=auto` on
    engine=openvino keeps such a model exact, and `gebackend tune` measures that rung last."""
    flags = frozenset(cpu_flags)
    if path is None or "avx2" not in flags or flags & VNNI_FLAGS:
        return ""
    convs, matmuls = weighted_op_counts(path)
    if matmuls < convs:
        return ""
    return (f"OpenVINO's int8 (NNCF) on a MatMul model ({matmuls} MatMul/Gemm vs {convs} Conv) without VNNI measured "
            "about half its f32 speed on AVX2")


def auto_engine(precision_mode: str, path: Path | None) -> tuple[str, str]:
    """The engine `engine=auto` runs `precision_mode` on for the model at `path`, and why."""
    if precision_mode != "int8" or path is None:
        chosen = registry.auto(precision_mode)
        return chosen, ("OpenVINO runs bf16/fp16 natively" if chosen == "openvino" else "")
    convs, matmuls = weighted_op_counts(path)
    if convs > matmuls and registry.installed("openvino") and _nncf_installed():
        return "openvino", f"int8 on a convolution model ({convs} Conv vs {matmuls} MatMul/Gemm): NNCF's static int8"
    return registry.DEFAULT, (f"int8 on a MatMul model ({matmuls} MatMul/Gemm vs {convs} Conv): ONNX Runtime's "
                              "dynamic int8" if matmuls >= convs else
                              "int8: OpenVINO/NNCF are not installed: ONNX Runtime's static int8 (QDQ)")


def _nncf_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("nncf") is not None


def openvino_refusal(path: Path) -> str:
    """Why OpenVINO cannot read the model at `path`, or "" (also where OpenVINO is not installed, and for a file of
    ONNX local functions, which the file OpenVINO is given has inlined: config/local_functions.py); read once per file
    version."""
    if not registry.installed("openvino"):
        return ""
    stat = Path(path).stat()
    return _openvino_refusal(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _openvino_refusal(path: str, size: int, mtime_ns: int) -> str:
    import onnx

    if onnx.load(path, load_external_data=False).functions:
        return ""
    from gebackend.engines.openvino import read_refusal

    return read_refusal(Path(path))


def resolve(engine: str, precision_mode: str, path: Path | None, cpu_flags: Iterable[str],
            openvino_capabilities: Callable[[], Iterable[str]],
            openvino_reads: Callable[[Path], str] | None = None) -> Choice:
    """The concrete engine and precision for the options as written (either may be "auto"). Where engine=auto would
    take OpenVINO for a model it cannot read (`openvino_reads`: why not, or ""; `openvino_refusal` by default), ONNX
    Runtime instead, precision_mode=auto chosen again for it, and `Choice.refused` says why."""
    flags = frozenset(cpu_flags)
    chosen = _resolve(engine, precision_mode, path, flags, openvino_capabilities)
    if engine != "auto" or chosen.engine != "openvino" or path is None:
        return chosen
    refused = (openvino_reads or openvino_refusal)(path)
    if not refused:
        return chosen
    again = _resolve(registry.DEFAULT, precision_mode, path, flags, openvino_capabilities)
    note = f"engine=auto: OpenVINO cannot serve this model ({refused}); {registry.DEFAULT} instead"
    return Choice(again.engine, again.precision_mode, "; ".join(w for w in (again.why, note) if w), refused)


def _resolve(engine: str, precision_mode: str, path: Path | None, cpu_flags: frozenset,
             openvino_capabilities: Callable[[], Iterable[str]]) -> Choice:
    reasons = []
    if precision_mode == "auto":
        precision_mode, why = auto_precision(engine, cpu_flags, openvino_capabilities, path)
        reasons.append(f"precision_mode=auto -> {precision_mode} ({why})")
    if engine == "auto":
        engine, why = auto_engine(precision_mode, path)
        reasons.append(f"engine=auto -> {engine}" + (f" ({why})" if why else ""))
    return Choice(engine, precision_mode, "; ".join(reasons))
