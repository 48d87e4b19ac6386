"""`gebackend tune` on a model whose inputs have a variable dim (a sequence length): its static candidates compile their
buckets at the dims every request sends (the seeded requests', or the user's --input-data when they all agree), or,
for requests of several lengths along one named dim, at those lengths (at most 4: else at the requests' quartiles)
with each request padded up to the next (bucket_paddable_dims, checked at load); other dims run on the dynamic graph
(bucket_fallback=dynamic). Requests of several shapes otherwise, or of shapes the file does not say, leave static
candidates out, saying why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gebackend.config.pbtxt import load_model_config
from gebackend.modelzoo import build_bert
from gebackend.tune import config_writer, space, tuned_model


def build_pool(features: int = 8, batch: int | str = "batch", seq: str | None = "seq") -> onnx.ModelProto:
    """y = mean over the sequence of x @ w: x [batch, seq, 8] -> y [batch, 16]."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((features, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def model_dir(tmp_path: Path, config: str = 'name: "pool"\nbackend: "ge"\nmax_batch_size: 8\n',
              model: onnx.ModelProto | None = None) -> Path:
    folder = tmp_path / (model.graph.name if model is not None else "pool")
    (folder / "1").mkdir(parents=True)
    onnx.save(model or build_pool(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(config)
    return folder


def written(tmp_path: Path, model: tuned_model.TunedModel, static: bool) -> dict:
    cand = next(c for c in space.space(2, ("onnxruntime",), (), model.max_batch_size, 2, static_ok=not model.static_problem)
                if c.scenario.static == static)
    path = tmp_path / f"{cand.key}.pbtxt"
    path.write_text(config_writer.config_text(model, cand))
    return {k: v["string_value"] for k, v in load_model_config(path).get("parameters", {}).items()}


def test_a_variable_dim_is_compiled_at_the_seeded_requests_dims_and_other_dims_fall_back(tmp_path):
    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    assert model.static_problem == "" and model.sent_dims == {"x": (tuned_model.VARIABLE_DIM, 8)}
    assert model.request_dims(model.inputs[0]) == (1, tuned_model.VARIABLE_DIM, 8)
    static = written(tmp_path, model, True)
    assert static["graph.ge.inputShape"] == f"x:-1,{tuned_model.VARIABLE_DIM},8" and static["bucket_fallback"] == "dynamic"
    assert "bucket_fallback" not in written(tmp_path, model, False)


def test_the_users_requests_set_the_compiled_dims_when_they_all_agree(tmp_path):
    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    entries = [{"x": {"content": [0.5] * 96, "shape": [12, 8]}}, {"x": {"content": [1.0] * 96, "shape": [12, 8]}}]
    sent = model.with_requests(entries)
    assert sent.static_problem == "" and sent.sent_dims == {"x": (12, 8)}
    assert sent.request_dims(sent.inputs[0]) == (1, 12, 8)
    assert written(tmp_path, sent, True)["graph.ge.inputShape"] == "x:-1,12,8"


def _requests(lengths, name="x", features=8):
    return [{name: {"content": [0.0] * n * features, "shape": [n, features]}} for n in lengths]


def test_requests_of_several_lengths_of_a_named_dim_compile_those_lengths_padded(tmp_path):
    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    several = model.with_requests(_requests((5, 12, 5, 30)))
    assert several.static_problem == "" and (several.pad_dim, several.pad_lengths) == ("seq", (5, 12, 30))
    assert several.sent_dims == {"x": (30, 8)}  # the seeded accuracy check runs the longest
    static = written(tmp_path, several, True)
    assert static["graph.ge.inputShape"] == "x:-1,-1,8" and static["bucket_paddable_dims"] == "seq"
    assert static["graph.ge.dynamicDims"] == ";".join(f"{b},{n}" for b in (1, 2, 4, 8) for n in (5, 12, 30))
    assert static["bucket_fallback"] == "dynamic" and "bucket_paddable_dims" not in written(tmp_path, several, False)
    # more than 4 lengths: the lengths at the requests' quartiles, the longest last (a quarter padded up to each)
    many = model.with_requests(_requests((3, 4, 6, 7, 9, 10, 12, 13)))
    assert many.pad_lengths == (4, 7, 10, 13)
    short = model.with_requests(_requests((3, 6, 3)))  # lengths under the feature dim (8): still the longest, 6
    assert short.pad_lengths == (3, 6) and short.sent_dims == {"x": (6, 8)}


def test_requests_of_several_shapes_otherwise_or_none_readable_leave_static_out(tmp_path):
    unnamed = tuned_model.TunedModel.load(model_dir(tmp_path / "u", model=build_pool(seq=None)))
    several = unnamed.with_requests(_requests((5, 12, 5, 30)))
    assert several.static_problem == ("your requests send input x (a variable dim) in 3 shapes ([5, 8], [12, 8], "
                                      "[30, 8]): a static candidate compiles the one shape requests send, or the "
                                      "lengths of one named dim (such as a sequence) padded up; the dynamic graph "
                                      "takes them all")
    assert several.sent_dims == {} and not any(c.scenario.static for c in space.space(
        2, ("onnxruntime",), (), 8, 2, static_ok=not several.static_problem))
    bert = tuned_model.TunedModel.load(model_dir(tmp_path / "b", 'name: "bert"\nbackend: "ge"\nmax_batch_size: 8\n',
                                                 build_bert()))
    mismatched = [{"input_ids": {"content": [1] * n, "shape": [n]}, "attention_mask": {"content": [1] * m, "shape": [m]}}
                  for n, m in ((5, 5), (7, 6))]  # one request's ids and mask of different lengths
    assert bert.with_requests(mismatched).static_problem.startswith("your requests send input ")
    model = tuned_model.TunedModel.load(model_dir(tmp_path))
    unreadable = model.with_requests([{"x": {"content": {"b64": "AAAA"}}}])
    assert unreadable.static_problem.startswith("the shape your requests send to input x (a variable dim) cannot be "
                                                "read from --input-data")
    wrong_rank = model.with_requests([{"x": {"content": [0.0] * 8, "shape": [8]}}])
    assert wrong_rank.static_problem.startswith("the shape your requests send to input x")


def test_a_fixed_model_compiles_its_own_dims_and_a_variable_one_without_batching_has_no_static(tmp_path):
    fixed = tuned_model.TunedModel.load(model_dir(tmp_path, 'name: "pool"\nbackend: "ge"\nmax_batch_size: 8\n'
                                            'input [ { name: "x", data_type: TYPE_FP32, dims: [ 4, 8 ] } ]\n'))
    assert fixed.sent_dims == {} and fixed.static_problem == ""
    assert "bucket_fallback" not in written(tmp_path, fixed, True)
    # a file whose dim 0 is fixed (2) does not batch: no batch buckets to compile the variable dim in
    unbatched = tuned_model.TunedModel.load(model_dir(tmp_path / "u", 'name: "pool"\nbackend: "ge"\n', build_pool(batch=2)))
    assert unbatched.max_batch_size == 0 and unbatched.sent_dims == {}
    assert unbatched.static_problem == "input x has a variable dim (dims [2, -1, 8]) and the model does not batch"


def test_seeded_requests_send_the_sizes_the_graph_needs(tmp_path):
    """A vision export's free `num_channels` is sent as the channels its Conv reads (16 failed every request), and
    a KV cache's mask named `past_sequence_length + sequence_length` as that sum (compile/free_dims.py)."""
    from tests.unit.test_free_dims import _kv_cache_model, _patch_model

    pixels = tuned_model.TunedModel.load(model_dir(tmp_path / "a", 'name: "g"\nbackend: "ge"\n', _patch_model()))
    assert pixels.sent_dims == {"pixels": (3, tuned_model.VARIABLE_DIM, tuned_model.VARIABLE_DIM)}
    cache = tuned_model.TunedModel.load(model_dir(tmp_path / "b", 'name: "g"\nbackend: "ge"\n', _kv_cache_model()))
    past, new, mask = (cache.sent_dims[n] for n in ("past", "new", "mask"))
    assert past[1] == new[1] == tuned_model.VARIABLE_DIM and mask == (2 * tuned_model.VARIABLE_DIM,)
