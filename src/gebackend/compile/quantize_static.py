"""Static (calibrated) int8 quantization: the two quantizers that write a QDQ ONNX file from calibration samples.

* engine=onnxruntime: `onnxruntime.quantization.quantize_static`, QDQ format, per-channel weights, MinMax calibration
  on the samples (compile/calibration.py). In a graph with attention (`is_transformer`) only the inputs of
  `ATTENTION_GRAPH_OPS` (Conv, MatMul, Gemm: the int8 products) are quantized, every other op kept in float, as NNCF
  keeps its transformer patterns: quantizing every op (its default: the residual Adds, QuickGELU's Sigmoid and Mul,
  the layer norms' pieces, Gather, Concat...) gave the 4-layer CN_CLIP image encoder cosine 0.980 to fp32, the
  product ops alone 0.9998, at the same speed (1 thread, AMD EPYC Zen 3: 85-87 ms, fp32 143); the text encoder
  0.9982 -> 0.9991, both 21.7 ms. A convolution model keeps every op: ResNet-50 ran 51 ms so, 55 with the products
  alone (its int8 flows through QLinearAdd), same cosine. The 8-bit types follow what this CPU has (`ort_types`, after the advice in
  quantize_static's own docstring, "Choosing parameters for CPU inference"): on x86 uint8 activations and int8
  weights (U8S8), with `reduce_range=True` (7-bit weights) where the CPU has no VNNI (`avx512_vnni`/`avx_vnni`),
  whose AVX2 u8*s8 instruction (VPMADDUBSW) can saturate, and without it where it has VNNI; on Arm int8 both (S8S8).
* engine=openvino: NNCF's post-training quantization (`nncf.quantize`) on the ONNX model (NNCF's ONNX backend),
  giving a QDQ ONNX file that OpenVINO reads like any ONNX file and runs as int8 kernels. Graphs with attention
  (a Softmax and a MatMul) are quantized as `ModelType.TRANSFORMER` with the MIXED preset (symmetric weights,
  asymmetric activations), the others with PERFORMANCE (symmetric both). Where the CPU has no VNNI, NNCF's
  `overflow_fix=ENABLE` (7-bit weights in every layer; NNCF's default fixes only the first) for the same
  saturation: measured on an AMD EPYC with AVX2 only, a small MLP went from cosine 0.988 to 0.996 against fp32.

`int8_range` is that one rule (full 8-bit weights, or 7-bit where u8*s8 saturates; dynamic int8 follows it too); the
precision cache keys on it, so a quantized file made on one CPU is not reused on a CPU that needs the other.

Both run quietly (their logs, prints and progress bars are swallowed; NNCF's telemetry is switched off, see
`_import_nncf`) and a failure inside them is a
`ModelLoadError` saying what failed and what to do, never their traceback. Both calibrate by running the model on
numpy arrays, which have no bfloat16: a model with bfloat16 inputs or outputs is quantized as a copy with float32
edges, which the quantized file then loses (compile/bf16_edges.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import platform
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from gebackend.compile import bf16_edges
from gebackend.cpu import VNNI_FLAGS
from gebackend.errors import ModelLoadError

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
ATTENTION_GRAPH_OPS = ("Conv", "MatMul", "Gemm")  # what ONNX Runtime's quantize_static quantizes in an attention graph
_NONE = "; nothing was quantized, the model runs as fp32"


@contextlib.contextmanager
def quiet():
    """Quantizers log through the root logger and their own loggers, print, and draw progress bars (rich, tqdm)."""
    root = logging.getLogger()
    loggers = [root] + [logging.getLogger(name) for name in ("nncf", "onnxruntime")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def count_qdq(model: onnx.ModelProto) -> int:
    return sum(1 for node in model.graph.node if node.op_type in QDQ_OPS)


def _large(path: Path) -> bool:
    from gebackend.compile.precision import _large as large

    return large(path)


# ------------------------------------------------------------------------------------------ onnxruntime


def _cpu(flags: Iterable[str] | None, machine: str | None) -> tuple[frozenset, str]:
    if flags is None:
        from gebackend import cpu

        flags = cpu.flags()
    return frozenset(flags), (machine or platform.machine()).lower()


def _arm(machine: str) -> bool:
    return machine in ("aarch64", "arm64") or machine.startswith("arm")


def int8_range(flags: Iterable[str] | None = None, machine: str | None = None) -> str:
    """"reduced" (7-bit weights) on an x86 CPU without VNNI, whose u8*s8 instruction (VPMADDUBSW) adds pairs of
    products into a saturating int16; else "full". Both static quantizers follow it (`ort_types`, `nncf_overflow_fix`),
    and ONNX Runtime's dynamic int8 (compile/precision.py)."""
    flags, machine = _cpu(flags, machine)
    return "reduced" if not _arm(machine) and not flags & VNNI_FLAGS else "full"


def ort_types(flags: Iterable[str] | None = None, machine: str | None = None) -> tuple[str, str, bool, str]:
    """(activation type, weight type, reduce_range, why) for ORT's quantize_static on this CPU."""
    flags, machine = _cpu(flags, machine)
    if _arm(machine):
        return "QInt8", "QInt8", False, "Arm CPU: int8 activations and weights (S8S8)"
    if int8_range(flags, machine) == "full":
        have = ", ".join(sorted(flags & VNNI_FLAGS))
        return "QUInt8", "QInt8", False, (f"x86 CPU with VNNI ({have}): uint8 activations, int8 weights (U8S8), "
                                          f"full 8-bit range")
    return "QUInt8", "QInt8", True, ("x86 CPU without VNNI: uint8 activations, int8 weights (U8S8) with "
                                     "reduce_range=True (7-bit weights), as ONNX Runtime advises, so AVX2's u8*s8 "
                                     "products do not saturate")


def nncf_overflow_fix(flags: Iterable[str] | None = None, machine: str | None = None) -> tuple[str, str]:
    """(NNCF OverflowFix member name, why) on this CPU: ENABLE (7-bit weights in every layer) where u8*s8 saturates,
    else NNCF's default FIRST_LAYER."""
    if int8_range(flags, machine) == "reduced":
        return "ENABLE", "overflow_fix=ENABLE (7-bit weights in every layer): x86 CPU without VNNI, whose u8*s8 saturates"
    return "FIRST_LAYER", "overflow_fix=FIRST_LAYER (NNCF's default): the CPU's int8 does not saturate"


class _Reader:
    """ORT's CalibrationDataReader over a list of samples (duck-typed: it checks `get_next`)."""

    def __init__(self, samples: Sequence[dict]):
        self._samples = list(samples)
        self._next = 0

    def get_next(self):
        if self._next >= len(self._samples):
            return None
        self._next += 1
        return self._samples[self._next - 1]

    def rewind(self):
        self._next = 0

    def __len__(self):
        return len(self._samples)


def quantize_onnxruntime(path: Path, out: Path, samples: Sequence[dict], log: Callable[[str], None]) -> int:
    """ORT static QDQ int8 of `path` written to `out`; the number of QuantizeLinear/DequantizeLinear nodes."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from gebackend.compile.precision import QUANTIZER_EXTRA_OPTIONS, quantizer_source, source_graph

    activation, weight, reduce_range, why = ort_types()
    large = _large(path)
    transformer = False
    try:
        with quantizer_source(path, out.parent, log) as source, quiet():
            source = _per_channel_opset(source, log)
            transformer = is_transformer(source_graph(source, path))
            quantize_static(
                source, str(out), _Reader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
                reduce_range=reduce_range, activation_type=getattr(QuantType, activation),
                weight_type=getattr(QuantType, weight), use_external_data_format=large,
                op_types_to_quantize=list(ATTENTION_GRAPH_OPS) if transformer else None,
                extra_options=dict(QUANTIZER_EXTRA_OPTIONS),
            )
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the quantizer's traceback is not the user's to read
        raise ModelLoadError(
            f"precision_mode=int8 quantization=static: ONNX Runtime's quantize_static failed on {path.name}: "
            f"{_short(exc)}; try quantization=dynamic, or precision_mode=origin, and report this model") from None
    nodes = count_qdq(onnx.load(str(out), load_external_data=False))
    only = (f"attention graph (Softmax and MatMul found): only {'/'.join(ATTENTION_GRAPH_OPS)} quantized, the other "
            "ops kept in float; " if transformer else "")
    log(f"precision int8: static quantization (ONNX Runtime quantize_static, QDQ, per-channel weights, MinMax over "
        f"{len(samples)} sample(s)): {activation} activations, {weight} weights, reduce_range={reduce_range}: {why}; "
        f"{only}{nodes} QuantizeLinear/DequantizeLinear node(s){_NONE if nodes == 0 else ''}")
    return nodes


# ------------------------------------------------------------------------------------------ NNCF


# ONNX Runtime's fused attention (its transformers optimizer writes them, Softmax inside)
_FUSED_ATTENTION = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"})


def is_transformer(model: onnx.ModelProto) -> bool:
    """Attention-like: a Softmax and a MatMul in the graph, or ONNX Runtime's fused attention (NNCF then keeps its
    transformer patterns in float)."""
    ops = {node.op_type for node in model.graph.node}
    fused = any(node.domain == "com.microsoft" and node.op_type in _FUSED_ATTENTION for node in model.graph.node)
    return fused or ("Softmax" in ops and "MatMul" in ops)


def _import_nncf():
    """NNCF with its telemetry off. It is on by default (no consent file counts as consent) and sends each quantize
    call from a forked multiprocessing.Process: inside a Triton Python stub that fork hangs the model's load, and a
    server has no business phoning home. NNCF reads NNCF_CI at import (nncf/telemetry/wrapper.py); the module
    attributes are swapped for its stub too, in case NNCF was imported before."""
    os.environ.setdefault("NNCF_CI", "1")
    try:
        with quiet():
            import nncf
            import nncf.telemetry.decorator as decorator
            import nncf.telemetry.wrapper as wrapper
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"precision_mode=int8 with engine=openvino needs NNCF, which does not import here: "
                             f"{_short(exc)}; install nncf (pyproject.toml pins it) or use engine=onnxruntime") from None
    if not isinstance(wrapper.telemetry, wrapper.NNCFTelemetryStub):
        wrapper.telemetry = decorator.telemetry = wrapper.NNCFTelemetryStub()
    return nncf


def quantize_nncf(path: Path, out: Path, samples: Sequence[dict], log: Callable[[str], None]) -> int:
    """NNCF static QDQ int8 of `path` (its ONNX backend) written to `out`; the number of QDQ nodes."""
    nncf = _import_nncf()
    large = _large(path)
    model = _nncf_source(path, log)
    transformer = is_transformer(model)
    preset = nncf.QuantizationPreset.MIXED if transformer else nncf.QuantizationPreset.PERFORMANCE
    kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    fix, why = nncf_overflow_fix()

    def run(model: onnx.ModelProto, smooth_quant: bool = True) -> onnx.ModelProto:
        from nncf.quantization.advanced_parameters import (AdvancedQuantizationParameters,
                                                           AdvancedSmoothQuantParameters, OverflowFix)

        off = {} if smooth_quant else {"smooth_quant_alphas": AdvancedSmoothQuantParameters(matmul=-1)}
        with quiet():
            nncf.set_log_level(logging.ERROR)
            return nncf.quantize(model, nncf.Dataset(list(samples)), preset=preset, subset_size=len(samples),
                                 advanced_parameters=AdvancedQuantizationParameters(overflow_fix=OverflowFix[fix], **off),
                                 **kwargs)

    try:
        try:
            quantized = run(model)
        except Exception as first:  # noqa: BLE001
            if not transformer:
                raise
            # NNCF's SmoothQuant (its transformer default) fails on a MatMul whose weight the graph computes (a tied
            # embedding's transpose as the LM head, in torch's dynamo exports): quantized again without it, from a
            # fresh copy of the file (the failed run may have changed the one it had)
            quantized = run(_nncf_source(path, lambda message: None), smooth_quant=False)
            log(f"precision int8: NNCF's SmoothQuant failed on this graph ({_short(first)}); quantized without it")
        with quiet():
            onnx.save_model(quantized, str(out), save_as_external_data=large, location=f"{out.name}.data")
    except Exception as exc:  # noqa: BLE001 - NNCF's traceback is not the user's to read
        raise ModelLoadError(
            f"precision_mode=int8: NNCF could not quantize {path.name} for OpenVINO: {_short(exc)}; serve it with "
            f"engine=onnxruntime (ONNX Runtime's quantizer), or precision_mode=origin, and report this model") from None
    nodes = count_qdq(quantized)
    log(f"precision int8: static quantization (NNCF {nncf.__version__}, QDQ for OpenVINO, "
        f"{'ModelType.TRANSFORMER, preset MIXED' if transformer else 'preset PERFORMANCE'} "
        f"({'Softmax and MatMul found' if transformer else 'no attention pattern'}), {len(samples)} calibration "
        f"sample(s)), {why}: {nodes} QuantizeLinear/DequantizeLinear node(s){_NONE if nodes == 0 else ''}")
    return nodes


def _nncf_source(path: Path, log: Callable[[str], None]) -> onnx.ModelProto:
    """The file as NNCF quantizes it: at an opset NNCF reads, computing only the rows its outputs keep."""
    from gebackend.compile.unused_rows import kept_rows_only

    return kept_rows_only(_nncf_opset(onnx.load(str(path)), log), log, "precision int8")


PER_CHANNEL_OPSET = 13  # DequantizeLinear's `axis` (per-channel weights) is opset 13's
NNCF_MIN_OPSET = 10  # NNCF's ONNX backend refuses older files ("ONNX models with opset version < 10 do not support ...")
UPGRADE_OPSET = 13  # what a file below either is converted to


def _upgraded(model: onnx.ModelProto, below: int, need: str,
              log: Callable[[str], None]) -> tuple[onnx.ModelProto, int | None, str]:
    """(`model` converted to opset 13 where its opset is below `below`, else as it is; its own opset; why the
    conversion failed, "" where it did not fail). A conversion done is said in the log, with `need` as the reason."""
    from gebackend.compile import upgrade

    opset = upgrade.default_opset(model)
    if opset is None or opset >= below:
        return model, opset, ""
    try:
        converted = upgrade.upgrade_opset(model, UPGRADE_OPSET)
    except Exception as exc:  # noqa: BLE001 - an adapter onnx.version_converter lacks, a free dim it refuses
        return model, opset, _short(exc)
    log(f"precision int8: {need}: the model's opset {opset} converted to {UPGRADE_OPSET} with onnx.version_converter "
        f"first")
    return converted, opset, ""


def _per_channel_opset(source, log: Callable[[str], None]):
    """The quantizer's source at opset 13 where it is older: ONNX Runtime's quantize_static writes per-channel
    DequantizeLinear nodes (an `axis`) into the file at its own opset, and ONNX Runtime then refuses to load a file
    below opset 13 with one (paddle2onnx writes opset 11: `Unrecognized attribute: axis for operator
    DequantizeLinear`). A large model's path, or a file the converter cannot convert, is handed on as it is."""
    if not isinstance(source, onnx.ModelProto):
        return source
    converted, opset, failed = _upgraded(source, PER_CHANNEL_OPSET,
                                         f"per-channel weights need opset {PER_CHANNEL_OPSET}", log)
    if failed:  # the quantizer says the rest
        log(f"precision int8: per-channel weights need opset {PER_CHANNEL_OPSET}, and converting the model's opset "
            f"{opset} failed ({failed}); quantized at opset {opset}")
    return converted


def _nncf_opset(model: onnx.ModelProto, log: Callable[[str], None]) -> onnx.ModelProto:
    """`model`, converted to opset 13 first when its opset is one NNCF refuses (model-zoo files are opset 7-9)."""
    converted, opset, failed = _upgraded(model, NNCF_MIN_OPSET, f"NNCF quantizes opset {NNCF_MIN_OPSET} and newer", log)
    if failed:
        raise ModelLoadError(
            f"precision_mode=int8: NNCF quantizes opset {NNCF_MIN_OPSET} and newer, and converting this model's opset "
            f"{opset} to {UPGRADE_OPSET} with onnx.version_converter failed: {failed}; serve it with "
            f"engine=onnxruntime (ONNX Runtime's quantizer), or precision_mode=origin")
    return converted


def _short(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1][:300]}" if lines else type(exc).__name__


def quantize(quantizer: str, path: Path, out: Path, samples: Sequence[dict], log: Callable[[str], None]) -> int:
    """The engine's static quantizer ("onnxruntime" | "nncf", engines/registry.py `static_quantizer`)."""
    if not samples:
        raise ModelLoadError("precision_mode=int8 quantization=static: no calibration sample")
    run = quantize_nncf if quantizer == "nncf" else quantize_onnxruntime
    samples = [{k: np.asarray(v) for k, v in s.items()} for s in samples]
    model = onnx.load(str(path), load_external_data=False)
    edges = bf16_edges.find(model)
    try:
        if not edges:
            return run(path, out, samples, log)
        with bf16_edges.float_copy(model, path, edges, out.parent) as copy:  # the quantizers calibrate with numpy arrays
            nodes = run(copy, out, edges.float_samples(samples), log)
    except ModelLoadError:
        if not edges:
            _check_sample_runs(path, samples[0])
        raise
    bf16_edges.restore_file(out, edges)
    log(f"precision int8: the bfloat16 input(s) and output(s) {', '.join(edges.inputs + edges.outputs)} were float32 "
        "for the quantizer (compile/bf16_edges.py) and are bfloat16 again in the quantized model")
    return nodes


def _check_sample_runs(path: Path, sample: Mapping[str, np.ndarray]) -> None:
    """After a quantizer failed: when the fp32 model itself cannot run the first calibration sample, that is the
    cause to report (seeded samples whose free dims took sizes the model does not take), not the quantizer's error."""
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - a file ONNX Runtime cannot open says nothing of the sample
        return
    try:
        session.run(None, dict(sample))
    except Exception as exc:  # noqa: BLE001 - the engine's traceback is not the user's to read
        shapes = " ".join(f"{name}:{list(np.shape(value))}" for name, value in sample.items())
        raise ModelLoadError(
            f"precision_mode=int8 quantization=static: the calibration sample ({shapes}) does not run on "
            f"{path.name} itself ({_short(exc)}): seeded samples (no calibration_data) give a free dim a size the "
            f"model may not take; give the sizes as dims in config.pbtxt, or set calibration_data") from None
