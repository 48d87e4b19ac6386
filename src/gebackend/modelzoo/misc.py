"""Tiny test models: ``build_add_mul`` (dynamic batch, two outputs), ``build_identity_fixed`` (static, no batch dim),
``build_spin`` (runs as long as asked), ``build_row_scale`` (an input with only the batch dim),
the graph-pass fixtures ``build_mod_constant``, ``build_constant_of_shape_weight`` and ``build_nonzero``, and
``build_string_normalizer`` (a scikit-learn style text step), ``build_zipmap_classifier`` (a scikit-learn
classifier as skl2onnx exports it by default) and ``build_weights_mlp`` (a model whose memory is its weights).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import FLOAT, INT64, GraphBuilder, tensor_info


def build_add_mul(seed: int = 0) -> onnx.ModelProto:
    """``sum = x + y`` and ``product = x * y`` for ``x``, ``y`` float32 ``[batch, 4]``. ``seed`` is unused (no weights)."""
    g = GraphBuilder("add_mul", seed)
    g.op("Add", "x", "y", name="sum")
    g.op("Mul", "x", "y", name="product")
    return g.build(
        [tensor_info("x", FLOAT, ["batch", 4]), tensor_info("y", FLOAT, ["batch", 4])],
        [tensor_info("sum", FLOAT, ["batch", 4]), tensor_info("product", FLOAT, ["batch", 4])],
        doc="Elementwise add and multiply (gebackend test model).",
    )


def build_identity_fixed() -> onnx.ModelProto:
    """``y = Identity(x)`` with ``x`` float32 ``[2, 3]``: a fully static model without a batch dimension."""
    g = GraphBuilder("identity_fixed")
    g.op("Identity", "x", name="y")
    return g.build(
        [tensor_info("x", FLOAT, [2, 3])],
        [tensor_info("y", FLOAT, [2, 3])],
        doc="Static-shape identity (gebackend test model).",
    )


def build_mod_constant() -> onnx.ModelProto:
    """``y = x[:, (3 + -1) % 3]`` for ``x`` float32 ``[batch, 4]``: a foldable ``Add`` -> ``Mod`` subgraph (always 2)
    feeds a ``Gather`` index, like the head-count arithmetic in CN_CLIP's ``nn.MultiheadAttention`` export.
    """
    g = GraphBuilder("mod_constant")
    three = g.const(3, "c3", np.int64)
    minus_one = g.const(-1, "c_minus1", np.int64)
    index = g.op("Mod", g.op("Add", three, minus_one, name="/attn/Add"), three, name="/attn/Mod")
    g.op("Gather", "x", index, name="y", axis=1)
    return g.build(
        [tensor_info("x", FLOAT, ["batch", 4])],
        [tensor_info("y", FLOAT, ["batch"])],
        doc="Constant Add/Mod subgraph used as a Gather index (gebackend test model).",
    )


def build_constant_of_shape_weight(n: int = 1024) -> onnx.ModelProto:
    """``y = x @ W`` for ``x`` float32 ``[batch, n]``, where ``W = ConstantOfShape([n, n], 0.01)`` is computed in the
    graph (``4 * n * n`` bytes once folded; 4 MiB for the default ``n``).
    """
    g = GraphBuilder("constant_of_shape_weight")
    shape = g.fresh("weight_shape")
    g.nodes.append(helper.make_node(
        "Constant", [], [shape], name=shape,
        value=helper.make_tensor(shape, INT64, [2], [n, n]),
    ))
    weight = g.op("ConstantOfShape", shape, name="weight",
                  value=helper.make_tensor("value", FLOAT, [1], [0.01]))
    g.op("MatMul", "x", weight, name="y")
    return g.build(
        [tensor_info("x", FLOAT, ["batch", n])],
        [tensor_info("y", FLOAT, ["batch", n])],
        doc="MatMul with a weight built by ConstantOfShape (gebackend test model).",
    )


def build_nonzero() -> onnx.ModelProto:
    """``indices = Transpose(NonZero(x))`` (shape ``[nnz, 2]``, known only at run time) and ``doubled = x + x`` for
    ``x`` float32 ``[batch, 4]``.
    """
    g = GraphBuilder("nonzero")
    g.op("Add", "x", "x", name="doubled")
    g.op("Transpose", g.op("NonZero", "x", name="nz"), name="indices", perm=[1, 0])
    return g.build(
        [tensor_info("x", FLOAT, ["batch", 4])],
        [tensor_info("doubled", FLOAT, ["batch", 4]), tensor_info("indices", INT64, ["nnz", 2])],
        doc="NonZero: an output shape that depends on the data (gebackend test model).",
    )


def build_spin() -> onnx.ModelProto:
    """``y = x + max(iterations)`` for ``x`` float32 ``[batch, 4]`` and ``iterations`` int64 ``[batch, 1]``, computed by a
    ``Loop`` adding 1 that many times: a request's own input sets how long the engine runs (a request that "hangs").
    """
    g = GraphBuilder("spin")
    trips = g.op("ReduceMax", "iterations", name="trips", keepdims=0)
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "body_one"], ["acc_out"], name="step"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")],
        "spin_body",
        [tensor_info("i", INT64, []), helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
         tensor_info("acc_in", FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []), tensor_info("acc_out", FLOAT, ["batch", 4])],
        [helper.make_tensor("body_one", FLOAT, [], [1.0])],
    )
    y = g.fresh("y")
    g.nodes.append(helper.make_node("Loop", [trips, "", "x"], [y], name="spin", body=body))
    return g.build(
        [tensor_info("x", FLOAT, ["batch", 4]), tensor_info("iterations", INT64, ["batch", 1])],
        [tensor_info("y", FLOAT, ["batch", 4])],
        doc="Loop whose trip count is an input: runs as long as the request asks (gebackend test model).",
    )


def build_row_scale() -> onnx.ModelProto:
    """``y = x * scale[:, None]`` for ``x`` float32 ``[batch, 4]`` and ``scale`` float32 ``[batch]``: an input with only
    the batch dim, which Triton can serve only through ``reshape`` (``dims: [1]``, ``reshape: { shape: [] }``)."""
    g = GraphBuilder("row_scale")
    axes = g.const([1], "axes", np.int64)
    g.op("Mul", "x", g.op("Unsqueeze", "scale", axes, name="column"), name="y")
    return g.build(
        [tensor_info("x", FLOAT, ["batch", 4]), tensor_info("scale", FLOAT, ["batch"])],
        [tensor_info("y", FLOAT, ["batch", 4])],
        doc="Scales each row by its own scalar input (gebackend test model).",
    )


def build_bf16_affine() -> onnx.ModelProto:
    """``y = x * 2 + 1`` in float32 for a bfloat16 ``x`` of shape ``[batch, 4]``: ``y`` bfloat16 (the input and output
    type Triton calls TYPE_BF16) and ``y32`` float32. CPU kernels compute in float32, so the graph casts at its edges."""
    g = GraphBuilder("bf16_affine")
    y32 = g.op("Add", g.op("Mul", g.op("Cast", "x", to=onnx.TensorProto.FLOAT), g.const(2.0, "two")),
               g.const(1.0, "one"), name="y32")
    g.op("Cast", y32, to=onnx.TensorProto.BFLOAT16, name="y")
    bf16 = onnx.TensorProto.BFLOAT16
    return g.build([tensor_info("x", bf16, ["batch", 4])],
                   [tensor_info("y", bf16, ["batch", 4]), tensor_info("y32", FLOAT, ["batch", 4])],
                   doc="bfloat16 in and out, float32 inside (gebackend test model).")


def build_bf16_mlp(seed: int = 0) -> onnx.ModelProto:
    """A two-layer perceptron (64 -> 128 -> 32, Relu between, random weights) in float32 between a bfloat16 input
    ``x`` ``[batch, 64]`` and a bfloat16 output ``y`` ``[batch, 32]``, with ``y32`` the same in float32: products
    a quantizer turns into int8, behind edges a numpy array cannot carry."""
    g = GraphBuilder("bf16_mlp", seed)
    hidden = g.op("Relu", g.op("Add", g.op("MatMul", g.op("Cast", "x", to=onnx.TensorProto.FLOAT),
                                            g.normal("w1", [64, 128], 0.125)), g.normal("b1", [128], 0.1)))
    y32 = g.op("Add", g.op("MatMul", hidden, g.normal("w2", [128, 32], 0.09)), g.normal("b2", [32], 0.1), name="y32")
    g.op("Cast", y32, to=onnx.TensorProto.BFLOAT16, name="y")
    bf16 = onnx.TensorProto.BFLOAT16
    return g.build([tensor_info("x", bf16, ["batch", 64])],
                   [tensor_info("y", bf16, ["batch", 32]), tensor_info("y32", FLOAT, ["batch", 32])],
                   doc="bfloat16 in and out, a float32 MLP inside (gebackend test model).")


def build_weights_mlp(mib: int = 64, width: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """Float32 MatMul layers ``[width, 4*width]`` then back to ``width``, Relu between, about ``mib`` MiB of random
    weights (32 MiB a layer at width 1024): a model whose memory is its weights. ``x`` ``[batch, width]`` -> ``y``."""
    g = GraphBuilder("weights_mlp", seed)
    layers = max(1, round(mib * 2**20 / (2 * width * 4 * width * 4)))
    x = "x"
    for _ in range(layers):
        x = g.op("MatMul", g.op("Relu", g.op("MatMul", x, g.normal("w", [width, 4 * width], 0.02))),
                 g.normal("w", [4 * width, width], 0.02))
    g.op("Identity", x, name="y")
    return g.build([tensor_info("x", FLOAT, ["batch", width])], [tensor_info("y", FLOAT, ["batch", width])],
                   doc="MatMul layers whose weights are the model's memory (gebackend test model).")


CONTRIB = "ai.onnx.contrib"  # onnxruntime-extensions' operator domain


def build_custom_negpos() -> onnx.ModelProto:
    """``y = 2 * max(x, 0) + min(x, 0)`` for float32 ``x`` of shape ``[batch, 4]``, through onnxruntime-extensions'
    custom operator ``NegPos`` (domain ``ai.onnx.contrib``): ONNX Runtime runs it only with that library registered
    (config.pbtxt ``model_operations { op_library_filename }``)."""
    nodes = [onnx.helper.make_node("NegPos", ["x"], ["neg", "pos"], domain=CONTRIB, name="negpos"),
             onnx.helper.make_node("Add", ["pos", "pos"], ["pos2"], name="double"),
             onnx.helper.make_node("Add", ["pos2", "neg"], ["y"], name="sum")]
    graph = onnx.helper.make_graph(nodes, "custom_negpos", [tensor_info("x", FLOAT, ["batch", 4])],
                                   [tensor_info("y", FLOAT, ["batch", 4])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid(CONTRIB, 1)],
                                   producer_name="gebackend.modelzoo")
    model.ir_version = 8
    onnx.checker.check_model(model)  # no full check: onnx has no schema for a custom domain's ops
    return model


def build_string_normalizer(locale: str | None = None, action: str = "UPPER", case_sensitive: bool = True) -> onnx.ModelProto:
    """``normalized = StringNormalizer(text)`` for ``text`` STRING ``[4]``: case changed to ``action``, the stopword
    "monday" removed; ``locale`` None leaves the attribute out (ONNX Runtime then takes en_US.UTF-8)."""
    attributes = {"case_change_action": action, "stopwords": ["monday"], "is_case_sensitive": int(case_sensitive)}
    if locale is not None:
        attributes["locale"] = locale
    graph = helper.make_graph([helper.make_node("StringNormalizer", ["text"], ["normalized"], **attributes)], "norm",
                              [helper.make_tensor_value_info("text", onnx.TensorProto.STRING, [4])],
                              [helper.make_tensor_value_info("normalized", onnx.TensorProto.STRING, [None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build_zipmap_classifier(labels: tuple = ("setosa", "versicolor", "virginica")) -> onnx.ModelProto:
    """``label`` [N] and ``probabilities`` (a ZipMap: a sequence of maps, class label -> probability) of a linear
    classifier over ``features`` float32 [N, 4], as skl2onnx exports a LogisticRegression by default."""
    rng = np.random.default_rng(3)
    string_labels = isinstance(labels[0], str)
    linear = helper.make_node(
        "LinearClassifier", ["features"], ["label", "probability_tensor"], domain="ai.onnx.ml",
        coefficients=rng.standard_normal(4 * len(labels)).round(3).tolist(), intercepts=[0.1] * len(labels),
        post_transform="SOFTMAX", multi_class=1,
        **({"classlabels_strings": list(labels)} if string_labels else {"classlabels_ints": list(labels)}))
    zipmap = helper.make_node("ZipMap", ["probability_tensor"], ["probabilities"], domain="ai.onnx.ml",
                              **({"classlabels_strings": list(labels)} if string_labels
                                 else {"classlabels_int64s": list(labels)}))
    key = onnx.TensorProto.STRING if string_labels else onnx.TensorProto.INT64
    graph = helper.make_graph(
        [linear, zipmap], "zipmap_classifier", [helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("label", key, ["N"]),
         helper.make_value_info("probabilities", helper.make_sequence_type_proto(
             helper.make_map_type_proto(key, helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, []))))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
