"""Precision pass: lower an fp32 ONNX model to `precision_mode` int8 or fp16 for ONNX Runtime, or refuse bf16.

* int8, `quantization` resolved by `resolve_quantization` (auto: static when calibration_data is set, the engine has
  no dynamic int8, i.e. OpenVINO, or the weights live mostly in Conv, compile/int8_route.py; else dynamic, which
  measured 1.75x the peer on a transformer):
* int8 static: a calibrated QDQ file (compile/quantize_static.py: ONNX Runtime's quantize_static, or NNCF for
  OpenVINO) from samples (compile/calibration.py).
* int8 dynamic: onnxruntime's dynamic quantization (`quantize_dynamic`): weights quantized once, activations per
  run, no calibration data. Weights are QInt8 (activations uint8: MatMulInteger u8s8, the fast path on
  x86 with VNNI; QUInt8 weights measured slower), per channel, 7-bit (`reduce_range`) where the CPU's u8*s8
  saturates (compile/quantize_static.py `int8_range`: x86 without VNNI), as for static int8. With full 8-bit
  per-tensor weights on an AMD EPYC with AVX2 only, the 4-layer CN_CLIP image encoder came out at cosine 0.9947 to
  fp32 (its products saturated), 0.99985 so, at the same speed; the text encoder 0.99979 and 0.99962. Only MatMul
  and Gemm are quantized by default: ORT's
  ConvInteger kernel measured ~5x slower than the fp32 Conv on the example ResNet
  (bench/ort_tuning.py --what precision --model resnet).
* fp16: `onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)`: inputs and
  outputs stay fp32, so clients see no difference. ONNX Runtime's CPU provider lacks fp16 kernels for most
  ops and wraps them in Casts, so on a CPU this is usually slower than fp32; it is for accelerators, or
  for halving the weights' memory.
* bf16: ONNX Runtime's CPU provider has no general bf16 path (its bf16 GEMM fast-math mode is Arm-only),
  so the model does not load; OpenVINO runs bf16 natively on CPUs with AVX512-BF16/AMX.

The lowered model is written to a folder the caller owns and returned as a path: quantization works
on files, and the engines re-open the file when profiling starts. The server keeps it in a cache across
instances and restarts (compile/precision_cache.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import onnx

from gebackend.compile.untie import untie_constants
from gebackend.compile.unused_rows import kept_rows_only
from gebackend.config import light
from gebackend.errors import ModelLoadError

PRECISIONS = ("origin", "fp16", "bf16", "int8")
INT8_OP_TYPES = ("MatMul", "Gemm")
# ONNX Runtime's quantizers type each tensor they quantize by ONNX shape inference, which knows no com.microsoft
# operator: after the fused Attention, SkipLayerNormalization or FastGelu of a transformer optimized by ONNX Runtime
# (`optimum-cli export onnx --optimize O2`, onnxruntime.transformers' optimizer) tensors are untyped and the quantizer
# fails ("Unable to find data type for weight_name=..."). `quantizer_source` types such a graph with ONNX Runtime's
# symbolic shape inference; what stays untyped (a file too large to load, an inference that fails) is taken as float,
# the quantizer's own remedy.
QUANTIZER_EXTRA_OPTIONS = {"DefaultTensorType": onnx.TensorProto.FLOAT}

_BF16_REFUSAL = (
    "precision_mode=bf16 is not available with engine=onnxruntime: ONNX Runtime's CPU provider has no bf16 "
    "kernels (its bf16 fast-math GEMM is for Arm CPUs only). Use engine=openvino, which runs bf16 natively on "
    "CPUs with AVX512-BF16/AMX, or precision_mode=int8 (dynamic quantization) or fp16 with onnxruntime."
)


@contextlib.contextmanager
def _quiet():
    """onnxruntime's quantizer logs through the root logger ("consider pre-processing") and may print."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _large(path: Path) -> bool:
    """Models whose file (or external data) approaches protobuf's 2 GiB limit are saved with external data."""
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(f"{path.name}.data"))
    return size >= onnx.checker.MAXIMUM_PROTOBUF // 2


@contextlib.contextmanager
def quantizer_source(path: Path, scratch: Path, log: Callable[[str], None] = lambda message: None):
    """What to hand ONNX Runtime's quantizers for the model at `path`: the loaded model with its constants untied
    (compile/untie.py: a Constant node or an Identity of an initializer hides it from them; `log` hears how many) and
    computing only the rows of a sequence its outputs keep (compile/unused_rows.py), or for a
    model over 2 GB (which cannot be loaded whole, and is not untied) a path to it in a private folder under `scratch`.

    Given a path, the quantizers write `<stem>-inferred.onnx` beside it and delete it after. Beside the model that
    fails on a read-only repository, and two instances lowering the same file at once break each other (seen on
    CN_CLIP with 2 instances). The private folder holds a copy of the model's folder: onnx refuses external data
    reached through a symlink (it resolves outside the model's folder) or a hard link (a "hardlink attack"), so the
    copy costs the model's size in `scratch` for as long as the quantizer runs. A file of that scratch name in
    the repository is not copied."""
    if not _large(path):
        model = onnx.load(str(path))
        untied = untie_constants(model)
        if untied:
            log(f"precision int8: {untied} constant(s) the graph held in Constant nodes or shared through Identity "
                "nodes made initializers of their own, so the quantizer sees them as constants")
        yield _typed(kept_rows_only(model, log, "precision int8"), log)
        return
    scratch.mkdir(parents=True, exist_ok=True)
    inferred = f"{path.stem}-inferred{path.suffix}"
    with tempfile.TemporaryDirectory(prefix="quantize.", dir=scratch) as folder:
        view = Path(folder) / "model"
        shutil.copytree(path.parent, view,
                        ignore=lambda where, names: [inferred] if Path(where) == path.parent else [])
        yield str(view / path.name)


def _typed(model: onnx.ModelProto, log: Callable[[str], None]) -> onnx.ModelProto:
    """`model` with the outputs of its com.microsoft operators typed by ONNX Runtime's symbolic shape inference, which
    knows them (its quantization pre-processing runs the same); a graph without such operators as it is."""
    if not light.has_contrib_ops(model):
        return model
    try:
        with _quiet():
            typed = light.symbolic_shapes(model)
    except Exception as exc:  # noqa: BLE001 - the quantizer's fallback (DefaultTensorType) still applies
        typed, failure = None, f"{type(exc).__name__}: {exc}"
    else:
        failure = "it returned no model"
    if typed is None:
        log(f"precision int8: ONNX Runtime's symbolic shape inference could not type the graph's com.microsoft "
            f"operators ({failure}); the quantizer takes their untyped outputs as float")
        return model
    log("precision int8: the outputs of the graph's com.microsoft operators typed by ONNX Runtime's symbolic shape "
        "inference for the quantizer (ONNX shape inference does not know them)")
    return typed


def source_graph(source, path: Path) -> onnx.ModelProto:
    """The model as the quantizer sees it, from what `quantizer_source` yielded: that loaded (untied) model itself,
    or for a large model handed over as a path, its graph read without the external data."""
    return source if isinstance(source, onnx.ModelProto) else onnx.load(str(path), load_external_data=False)


def _count(model: onnx.ModelProto, op_types: tuple[str, ...], weighted: bool = False) -> int:
    """Nodes of these types; with `weighted`, only those with a constant (initializer) input."""
    constants = {init.name for init in model.graph.initializer} if weighted else set()
    return sum(1 for node in model.graph.node
               if node.op_type in op_types and (not weighted or any(i in constants for i in node.input)))


#: the ops of a file that is quantized already: QDQ (ONNX Runtime's quantize_static, NNCF, quantized PyTorch and
#: TensorFlow exports) and operator-oriented formats (QLinearConv, ConvInteger, ONNX Runtime's contrib int8 ops)
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "ConvInteger", "MatMulInteger", "QGemm", "QAttention", "DynamicQuantizeMatMul", "MatMulNBits")


def quantized_nodes(path: Path) -> int:
    """How many of QUANTIZED_OPS the file's main graph holds (its weights are not read)."""
    return _count(onnx.load(str(path), load_external_data=False), QUANTIZED_OPS)


def check_supported(mode: str) -> None:
    """Refuse a precision this lowering cannot make, before any work is done."""
    if mode not in PRECISIONS:
        raise ModelLoadError(f"precision_mode={mode!r}: expected one of {', '.join(PRECISIONS)}")
    if mode == "bf16":
        raise ModelLoadError(_BF16_REFUSAL)


def resolve_quantization(quantization: str, calibration_data: str, engine_kind, path: Path | None = None) -> str:
    """precision_mode=int8's `quantization` option as "dynamic" | "static" for an engine (`EngineKind`) and, given
    its `path`, the model (compile/int8_route.py: static where its weights live mostly in Conv)."""
    from gebackend.compile.int8_route import choose

    return choose(quantization, calibration_data, engine_kind, path)[0]


def lower_precision(
    path: Path,
    mode: str,
    out_dir: Path,
    log: Callable[[str], None] = lambda message: None,
    int8_op_types: tuple[str, ...] = INT8_OP_TYPES,
    quantization: str = "dynamic",
    quantizer: str = "onnxruntime",
    samples: Sequence[dict] | None = None,
    out_name: str = "",
) -> Path:
    """The model at `path` lowered to `mode`, written under `out_dir` (as `out_name` if given); `path` itself for
    origin. int8 with `quantization="static"` calibrates on `samples` with `quantizer` ("onnxruntime" | "nncf")."""
    check_supported(mode)
    if mode == "origin":
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / (out_name or f"{path.stem}.{mode}.onnx")
    started = time.perf_counter()
    try:
        if mode == "int8" and quantization == "static":
            from gebackend.compile.quantize_static import quantize

            quantize(quantizer, path, out, samples or (), log)
        elif mode == "int8":
            _int8(path, out, int8_op_types, log)
        else:
            _fp16(path, out)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"precision_mode={mode}: lowering {path.name} failed: {type(exc).__name__}: {exc}") from None
    log(f"precision {mode}: lowered {path.name} in {time.perf_counter() - started:.2f}s")
    return out


def _int8(path: Path, out: Path, op_types: tuple[str, ...], log: Callable[[str], None]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from gebackend.compile.quantize_static import int8_range

    reduced = int8_range() == "reduced"
    with quantizer_source(path, out.parent, log) as source, _quiet():
        if "MatMul" in op_types and isinstance(source, onnx.ModelProto):
            source = _patches_as_matmul(source, log)
        candidates = _count(source_graph(source, path), op_types, weighted=True)
        quantize_dynamic(
            source, str(out), op_types_to_quantize=list(op_types), weight_type=QuantType.QInt8, per_channel=True,
            reduce_range=reduced, use_external_data_format=_large(path), extra_options=dict(QUANTIZER_EXTRA_OPTIONS),
        )
    after = onnx.load(str(out), load_external_data=False)
    quantized = _count(after, ("MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QGemm", "MatMulIntegerToFloat"))
    bits = ("7-bit (reduce_range: an x86 CPU without VNNI, whose u8*s8 products saturate)" if reduced
            else "full 8-bit")
    log(f"precision int8: dynamic quantization (QInt8 weights per channel, {bits}; uint8 activations) of "
        f"{', '.join(op_types)}: {quantized} of {candidates} node(s) with constant weights quantized"
        + ("; none had constant weights, the model runs as fp32" if quantized == 0 else ""))


def _patches_as_matmul(model: onnx.ModelProto, log: Callable[[str], None]) -> onnx.ModelProto:
    """`model` with its patch embeddings' Convs as MatMuls (compile/patch_convolution.py), which the dynamic
    quantization then quantizes; `model` as it is where it has none or the rewrite fails."""
    from gebackend.compile.patch_convolution import patches_as_matmul

    try:
        rewritten, count = patches_as_matmul(model)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the model as it is still lowers
        log(f"precision int8: writing the patch embedding's convolution as a MatMul failed ({type(exc).__name__}: "
            f"{exc}); quantized as it is")
        return model
    if count:
        log(f"precision int8: {count} patch embedding convolution(s) (kernel = stride) written as MatMul, so the "
            "dynamic quantization quantizes them too")
    return rewritten


def _fp16(path: Path, out: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    large = _large(path)
    model = onnx.load(str(path))
    with _quiet():
        lowered = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=large)
    onnx.save_model(lowered, str(out), save_as_external_data=large, location=f"{out.name}.data")
