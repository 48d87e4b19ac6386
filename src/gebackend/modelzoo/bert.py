"""BERT-style transformer text encoder built in code (random weights, dynamic batch and sequence).

Owns ``build_bert``: ``input_ids``/``attention_mask`` int64 ``[batch, sequence]`` ->
``last_hidden_state`` ``[batch, sequence, hidden]`` and ``pooler_output`` ``[batch, hidden]``.
"""

from __future__ import annotations

import numpy as np
import onnx

from ._graph import FLOAT, INT64, GraphBuilder, tensor_info


def build_bert(
    vocab_size: int = 1000,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    intermediate: int = 128,
    max_positions: int = 128,
    seed: int = 0,
) -> onnx.ModelProto:
    """Embeddings + ``layers`` post-LN encoder layers (MHA + Erf-GELU FFN) + tanh pooler on token 0."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    head_dim = hidden // heads
    g = GraphBuilder("bert", seed)
    i64 = np.int64
    zero, one = g.const(0, "zero", i64), g.const(1, "one", i64)
    one_f, half = g.const(1.0, "one_f"), g.const(0.5, "half")
    inv_sqrt2 = g.const(1.0 / np.sqrt(2.0), "inv_sqrt2")
    inv_sqrt_dk = g.const(1.0 / np.sqrt(head_dim), "inv_sqrt_dk")

    def linear(x: str, n_in: int, n_out: int, name: str) -> str:
        w = g.normal(f"{name}.weight", (n_in, n_out), np.sqrt(1.0 / n_in))
        b = g.const(np.zeros(n_out), f"{name}.bias")
        return g.op("Add", g.op("MatMul", x, w, name=f"{name}.matmul"), b, name=name)

    def layer_norm(x: str, name: str) -> str:
        scale = g.const(np.ones(hidden), f"{name}.weight")
        bias = g.const(np.zeros(hidden), f"{name}.bias")
        return g.op("LayerNormalization", x, scale, bias, name=name, axis=-1, epsilon=1e-12)

    # Dynamic shapes: [batch, sequence] from input_ids, used for positions and head reshapes.
    ids_shape = g.op("Shape", "input_ids", name="ids_shape")
    batch_seq = g.op("Slice", ids_shape, g.const([0], "zero_1d", i64), g.const([2], "two_1d", i64),
                     name="batch_seq")
    seq_len = g.op("Gather", ids_shape, one, name="seq_len", axis=0)
    heads_shape = g.op("Concat", batch_seq, g.const([heads, head_dim], "heads_dims", i64),
                       name="heads_shape", axis=0)
    merged_shape = g.op("Concat", batch_seq, g.const([hidden], "hidden_dim", i64),
                        name="merged_shape", axis=0)

    # Embeddings.
    tok = g.op("Gather", g.normal("embeddings.word", (vocab_size, hidden), 1.0), "input_ids",
               name="embeddings.tokens")
    positions = g.op("Range", zero, seq_len, one, name="positions")
    pos = g.op("Gather", g.normal("embeddings.position", (max_positions, hidden), 1.0), positions,
               name="embeddings.positions")
    x = layer_norm(g.op("Add", tok, pos, name="embeddings.sum"), "embeddings.layer_norm")

    # Additive attention mask (1 - mask) * -10000, shaped [batch, 1, 1, sequence] to broadcast over heads.
    mask = g.op("Cast", "attention_mask", name="mask_float", to=FLOAT)
    mask = g.op("Sub", one_f, mask, name="mask_inverted")
    mask = g.op("Mul", mask, g.const(-10000.0, "mask_fill"), name="mask_additive")
    mask = g.op("Unsqueeze", mask, g.const([1, 2], "mask_axes", i64), name="mask_4d")

    def split_heads(t: str, perm: list[int], name: str) -> str:
        return g.op("Transpose", g.op("Reshape", t, heads_shape, name=f"{name}.reshape"), name=name, perm=perm)

    for i in range(layers):
        p = f"encoder.{i}"
        q = split_heads(linear(x, hidden, hidden, f"{p}.query"), [0, 2, 1, 3], f"{p}.q_heads")
        k = split_heads(linear(x, hidden, hidden, f"{p}.key"), [0, 2, 3, 1], f"{p}.k_heads_t")
        v = split_heads(linear(x, hidden, hidden, f"{p}.value"), [0, 2, 1, 3], f"{p}.v_heads")
        scores = g.op("Mul", g.op("MatMul", q, k, name=f"{p}.qk"), inv_sqrt_dk, name=f"{p}.scaled")
        probs = g.op("Softmax", g.op("Add", scores, mask, name=f"{p}.masked"), name=f"{p}.probs", axis=-1)
        ctx = g.op("Transpose", g.op("MatMul", probs, v, name=f"{p}.ctx_heads"), name=f"{p}.ctx_t",
                   perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", ctx, merged_shape, name=f"{p}.ctx")
        attn = linear(ctx, hidden, hidden, f"{p}.attn_out")
        x = layer_norm(g.op("Add", attn, x, name=f"{p}.attn_residual"), f"{p}.attn_norm")

        h = linear(x, hidden, intermediate, f"{p}.ffn_in")
        # GELU(h) = 0.5 * h * (1 + erf(h / sqrt(2)))
        erf = g.op("Erf", g.op("Mul", h, inv_sqrt2, name=f"{p}.gelu_scaled"), name=f"{p}.gelu_erf")
        gate = g.op("Mul", g.op("Add", erf, one_f, name=f"{p}.gelu_1p"), half, name=f"{p}.gelu_gate")
        h = g.op("Mul", h, gate, name=f"{p}.gelu")
        h = linear(h, intermediate, hidden, f"{p}.ffn_out")
        x = layer_norm(g.op("Add", h, x, name=f"{p}.ffn_residual"), f"{p}.ffn_norm")

    g.op("Identity", x, name="last_hidden_state")
    first = g.op("Gather", x, zero, name="first_token", axis=1)
    pool_w = g.normal("pooler.weight", (hidden, hidden), np.sqrt(1.0 / hidden))
    pool_b = g.const(np.zeros(hidden), "pooler.bias")
    g.op("Tanh", g.op("Gemm", first, pool_w, pool_b, name="pooler.dense"), name="pooler_output")

    return g.build(
        [tensor_info("input_ids", INT64, ["batch", "sequence"]),
         tensor_info("attention_mask", INT64, ["batch", "sequence"])],
        [tensor_info("last_hidden_state", FLOAT, ["batch", "sequence", hidden]),
         tensor_info("pooler_output", FLOAT, ["batch", hidden])],
        doc="BERT-style encoder with random weights (gebackend example model).",
    )
