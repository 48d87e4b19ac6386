"""Whether int8 really lowers a model, and how: ONNX Runtime's dynamic quantization quantizes only MatMul and Gemm
with a constant weight, so on a convolution model (a detector, a ResNet) it quantizes nothing; `quantization=auto`
(`choose`) is therefore static (calibrated QDQ, compile/quantize_static.py) where `calibration_data` is set, where the
engine has no dynamic int8 (OpenVINO), and where the weights live mostly in Conv (`weighted_op_counts`, which
engines/auto_choice.py asks too), dynamic otherwise (1.75x the peer on a transformer, no calibration).
`nothing_to_quantize` says why a quantization would quantize nothing in a file, and `quantized_in` counts what a
quantized file did quantize, from its graph: the loader serves fp32 in both cases and says why, never a load line
saying int8 over an fp32 graph."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import onnx

from gebackend.errors import ModelLoadError

# the ops whose weight int8 quantizes, by the family the load line names
FAMILIES = {"Conv": "Conv", "ConvTranspose": "Conv", "MatMul": "MatMul/Gemm", "Gemm": "MatMul/Gemm"}
# the int8 ops ONNX Runtime's quantizers write in place of a float op (QOperator and dynamic formats)
INTEGER_OPS = {"ConvInteger": "Conv", "QLinearConv": "Conv", "MatMulInteger": "MatMul/Gemm",
               "DynamicQuantizeMatMul": "MatMul/Gemm", "MatMulIntegerToFloat": "MatMul/Gemm", "QGemm": "MatMul/Gemm",
               "QLinearMatMul": "MatMul/Gemm"}
# what may stand between a stored weight and its op in a quantized file
_WEIGHT_PATH = ("DequantizeLinear", "QuantizeLinear", "Identity", "Transpose", "Cast", "Reshape")


def weighted_op_counts(path: Path) -> tuple[int, int]:
    """(Conv/ConvTranspose, MatMul/Gemm) nodes with a constant weight input in the ONNX file at `path`; read once per
    file as it is (its size and modification time): `tune` and a load with `auto` options ask more than once."""
    stat = Path(path).stat()
    return _weighted_op_counts(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _weighted_op_counts(path: str, size: int, mtime_ns: int) -> tuple[int, int]:
    model = onnx.load(path, load_external_data=False)
    constants = _constant_names(model.graph)
    for node in model.graph.node:  # a weight the exporter shares through an Identity (compile/untie.py unties it)
        if node.op_type == "Identity" and node.input and node.input[0] in constants:
            constants.update(node.output)
    convs = matmuls = 0
    for node in model.graph.node:
        if any(name in constants for name in node.input[1:2]):
            convs += FAMILIES.get(node.op_type) == "Conv"
            matmuls += FAMILIES.get(node.op_type) == "MatMul/Gemm"
    return convs, matmuls


def _constant_names(graph: onnx.GraphProto) -> set[str]:
    """The tensors stored in the graph: its initializers and its Constant nodes' outputs."""
    names = {init.name for init in graph.initializer}
    return names | {out for node in graph.node if node.op_type == "Constant" for out in node.output}


def choose(quantization: str, calibration_data: str, engine_kind, path: Path | None = None) -> tuple[str, str]:
    """(`quantization` as "dynamic" | "static" for `engine_kind` and the model at `path`, why auto chose it or "")."""
    if quantization != "auto":
        if quantization not in engine_kind.quantizations:
            raise ModelLoadError(
                f"precision_mode=int8 quantization={quantization} is not available with engine={engine_kind.name} (it "
                f"runs {' or '.join(engine_kind.quantizations)} int8 only: OpenVINO has no dynamic int8); use "
                f"quantization=static (or auto), or engine=onnxruntime for dynamic quantization")
        return quantization, ""
    if calibration_data:
        return "static", "calibration_data is set"
    if "dynamic" not in engine_kind.quantizations:
        return "static", f"engine={engine_kind.name} has no dynamic int8"
    convs, matmuls = weighted_op_counts(path) if path is not None else (0, 0)
    if convs > matmuls:
        return "static", (f"the weights live in {convs} Conv against {matmuls} MatMul/Gemm, and dynamic quantization "
                          "quantizes MatMul/Gemm only")
    return "dynamic", ""


def nothing_to_quantize(path: Path, quantization: str) -> str:
    """Why `quantization` ("dynamic" | "static") would quantize nothing in the model at `path`, or ""."""
    convs, matmuls = weighted_op_counts(path)
    if quantization == "dynamic" and not matmuls:
        return ("dynamic quantization quantizes MatMul/Gemm with a constant weight and the model has none"
                + (f"; its {convs} Conv need quantization=static (or auto)" if convs else ""))
    if not convs and not matmuls:
        return "the model has no Conv, MatMul or Gemm with a constant weight"
    return ""


@dataclass(frozen=True)
class Quantized:
    """What a quantized file quantized: per family ("Conv", "MatMul/Gemm"), (quantized, of so many)."""

    counts: tuple[tuple[str, int, int], ...]

    @property
    def quantized(self) -> int:
        return sum(done for _, done, _ in self.counts)

    @property
    def total(self) -> int:
        return sum(of for _, _, of in self.counts)

    def describe(self) -> str:
        """"3 of 3 Conv, 1 of 1 MatMul/Gemm quantized"; "0 of 0 Conv or MatMul/Gemm quantized" for none."""
        if not self.counts:
            return "0 of 0 Conv or MatMul/Gemm quantized"
        return ", ".join(f"{done} of {of} {family}" for family, done, of in self.counts) + " quantized"


def quantized_in(path: Path) -> Quantized:
    """Count, in a quantized file's graph (its weights are not read), the weighted ops that run int8: an integer op of
    ONNX Runtime's, or a float op whose stored weight comes through a DequantizeLinear (QDQ); of all weighted ops."""
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = _constant_names(graph)
    producer = {out: node for node in graph.node for out in node.output}

    def stored(name: str, depth: int = 0) -> bool:
        node = producer.get(name)
        return name in constants or (node is not None and depth < 4 and node.op_type in _WEIGHT_PATH
                                     and bool(node.input) and stored(node.input[0], depth + 1))

    counts: dict[str, list[int]] = {}
    for node in graph.node:
        family = INTEGER_OPS.get(node.op_type)
        if family:
            tally = counts.setdefault(family, [0, 0])
            tally[0], tally[1] = tally[0] + 1, tally[1] + 1
        elif node.op_type in FAMILIES and len(node.input) > 1 and stored(node.input[1]):
            tally = counts.setdefault(FAMILIES[node.op_type], [0, 0])
            weight = producer.get(node.input[1])
            tally[0] += weight is not None and weight.op_type == "DequantizeLinear"
            tally[1] += 1
    return Quantized(tuple((family, done, of) for family, (done, of) in sorted(counts.items())))
