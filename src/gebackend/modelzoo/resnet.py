"""ResNet-style CNN image classifier built in code (random He-initialised weights).

Owns ``build_resnet``: image ``[batch, 3, H, W]`` float32 -> ``logits`` ``[batch, num_classes]``, and
``build_qdq_resnet``: the same model as ONNX Runtime's ``quantize_static`` writes it (a user's int8 file).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from ._graph import FLOAT, GraphBuilder, tensor_info


def build_resnet(
    num_classes: int = 10,
    width: int = 16,
    blocks: Sequence[int] = (1, 1, 1),
    image_size: int = 64,
    seed: int = 0,
) -> onnx.ModelProto:
    """Stem conv + residual basic-block stages (stride 2 between stages) + GAP + Flatten + Gemm."""
    g = GraphBuilder("resnet", seed)

    def conv(x: str, cin: int, cout: int, kernel: int, stride: int, name: str, gain: float = 2.0) -> str:
        w = g.normal(f"{name}.weight", (cout, cin, kernel, kernel), np.sqrt(gain / (cin * kernel * kernel)))
        b = g.const(np.zeros(cout), f"{name}.bias")
        pad = kernel // 2
        return g.op("Conv", x, w, b, name=name, kernel_shape=[kernel, kernel],
                    strides=[stride, stride], pads=[pad] * 4)

    x = g.op("Relu", conv("image", 3, width, 3, 1, "stem"), name="stem.relu")
    cin = width
    for stage, n_blocks in enumerate(blocks):
        cout = width * 2**stage
        for block in range(n_blocks):
            prefix = f"layer{stage + 1}.{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            h = g.op("Relu", conv(x, cin, cout, 3, stride, f"{prefix}.conv1"), name=f"{prefix}.relu1")
            # Smaller gain on the last conv of the residual branch keeps activations bounded with depth.
            h = conv(h, cout, cout, 3, 1, f"{prefix}.conv2", gain=1.0)
            skip = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, f"{prefix}.downsample", 1.0)
            x = g.op("Relu", g.op("Add", h, skip, name=f"{prefix}.add"), name=f"{prefix}.relu2")
            cin = cout

    pooled = g.op("Flatten", g.op("GlobalAveragePool", x, name="avgpool"), name="flatten", axis=1)
    fc_w = g.normal("fc.weight", (num_classes, cin), np.sqrt(1.0 / cin))
    fc_b = g.const(np.zeros(num_classes), "fc.bias")
    g.op("Gemm", pooled, fc_w, fc_b, name="logits", transB=1)

    return g.build(
        [tensor_info("image", FLOAT, ["batch", 3, image_size, image_size])],
        [tensor_info("logits", FLOAT, ["batch", num_classes])],
        doc="ResNet-style classifier with random weights (gebackend example model).",
    )


def build_qdq_resnet(width: int = 8, image_size: int = 32, samples: int = 4) -> onnx.ModelProto:
    """``build_resnet(width, image_size)`` quantized by ONNX Runtime's ``quantize_static`` (QDQ, int8 per-channel
    weights) on ``samples`` seeded random images."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    feeds = iter([{"image": np.random.default_rng(i).standard_normal((1, 3, image_size, image_size)).astype(np.float32)}
                  for i in range(samples)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    with tempfile.TemporaryDirectory() as scratch:
        source, quantized = Path(scratch) / "fp32.onnx", Path(scratch) / "int8.onnx"
        onnx.save(build_resnet(width=width, image_size=image_size), str(source))
        quantize_static(str(source), str(quantized), Reader(), quant_format=QuantFormat.QDQ,
                        weight_type=QuantType.QInt8, per_channel=True)
        return onnx.load(str(quantized))

