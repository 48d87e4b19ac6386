"""Small stand-ins for CN_CLIP's two encoders, with exactly their interface.

Built with onnx.helper and fixed seeded random weights (no torch), for CI and for trying the CN_CLIP repository
without the real encoders; they compute nothing meaningful. Their interface is the one cn_clip's own exports have
(`cn_clip/deploy/pytorch_to_onnx.py`, and `gebackend.modelzoo.bench_models`), with a variable batch dim:
  image encoder: `image` float32 [batch, 3, 224, 224] -> `unnorm_image_features` float32 [batch, 512]
                 (16x16 patch-embedding Conv, tanh, mean over patches, MatMul)
  text encoder:  `text` int64 [batch, 52] -> `unnorm_text_features` float32 [batch, 512]
                 (token embedding Gather, mean over the non-[PAD] (id != 0) positions, tanh, MatMul)
The example repository's builder then adds each one's normalised features as a second output
(`normalized_output.py`), as it does to the real encoders.
"""

from __future__ import annotations

import numpy as np
import onnx

from ._graph import FLOAT, INT64, GraphBuilder, tensor_info

STANDIN_MARK = "gebackend stand-in for CN_CLIP"  # starts the doc_string of both stand-in encoders
EMBED_DIM = 512
IMAGE_SIZE = 224
CONTEXT_LENGTH = 52
VOCAB_SIZE = 21128  # cn_clip's vocab.txt
WIDTH = 64


def build_cnclip_image_standin(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("cnclip_image_standin", seed)
    patches = g.op("Conv", "image", g.normal("patch_weight", (WIDTH, 3, 16, 16), 0.05), g.normal("patch_bias", (WIDTH,), 0.1),
                   name="patch_embed", kernel_shape=[16, 16], strides=[16, 16])
    pooled = g.op("ReduceMean", g.op("Tanh", patches, name="act"), name="pool", axes=[2, 3], keepdims=0)
    g.op("Add", g.op("MatMul", pooled, g.normal("proj", (WIDTH, EMBED_DIM), 0.2), name="project"),
         g.normal("proj_bias", (EMBED_DIM,), 0.05), name="unnorm_image_features")
    return g.build([tensor_info("image", FLOAT, ["batch", 3, IMAGE_SIZE, IMAGE_SIZE])],
                   [tensor_info("unnorm_image_features", FLOAT, ["batch", EMBED_DIM])],
                   doc=f"{STANDIN_MARK}'s image encoder: random weights, CN_CLIP's interface only.")


def build_cnclip_text_standin(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("cnclip_text_standin", seed)
    tokens = g.op("Gather", g.normal("token_embedding", (VOCAB_SIZE, WIDTH), 0.5), "text", name="embed", axis=0)
    keep = g.op("Cast", g.op("Not", g.op("Equal", "text", g.const(0, "pad_id", np.int64), name="is_pad"), name="not_pad"),
                name="mask", to=FLOAT)
    mask = g.op("Unsqueeze", keep, g.const([2], "mask_axes", np.int64), name="mask3")
    axis1 = g.const([1], "seq_axis", np.int64)
    total = g.op("ReduceSum", g.op("Mul", tokens, mask, name="masked"), axis1, name="sum", keepdims=0)
    count = g.op("Max", g.op("ReduceSum", mask, axis1, name="count", keepdims=0), g.const(1.0, "one"), name="count_min1")
    pooled = g.op("Tanh", g.op("Div", total, count, name="mean"), name="act")
    g.op("Add", g.op("MatMul", pooled, g.normal("proj", (WIDTH, EMBED_DIM), 0.2), name="project"),
         g.normal("proj_bias", (EMBED_DIM,), 0.05), name="unnorm_text_features")
    return g.build([tensor_info("text", INT64, ["batch", CONTEXT_LENGTH])],
                   [tensor_info("unnorm_text_features", FLOAT, ["batch", EMBED_DIM])],
                   doc=f"{STANDIN_MARK}'s text encoder: random weights, CN_CLIP's interface only.")


def is_standin(model: onnx.ModelProto) -> bool:
    return model.doc_string.startswith(STANDIN_MARK)
