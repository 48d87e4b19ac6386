"""Unit tests for gebackend.config.index_bounds and the checks built on it: an integer input that indexes a table
stored in the model is bounded by the table's rows, through the ops that keep its values, and nowhere else; an axis
whose length numbers a position table is at most as long as it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gebackend.config.index_bounds import IndexBound, LengthLimit, index_bounds, length_limits, out_of_bounds
from gebackend.config.onnx_signature import signature_of
from gebackend.config.options import BackendOptions, parse_options
from gebackend.config.spec import build_model_spec
from gebackend.errors import ConfigError, InvalidRequest
from gebackend.modelzoo import build_bert
from gebackend.runtime.validation import RequestValidator

ROWS, WIDTH = 50, 4


def _model(nodes, inputs, initializers=(), ir_version=8, outputs=None, extra_inputs=()):
    graph = helper.make_graph(
        nodes, "g", [*inputs, *extra_inputs],
        outputs or [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def _table(name="table", rows=ROWS):
    return numpy_helper.from_array(np.arange(rows * WIDTH, dtype=np.float32).reshape(rows, WIDTH), name)


def _ids(name="ids", elem=TensorProto.INT64):
    return helper.make_tensor_value_info(name, elem, ["batch", "seq"])


def test_an_embedding_gather_bounds_its_ids_by_the_tables_rows():
    model = _model([helper.make_node("Gather", ["table", "ids"], ["out"], name="embed")], [_ids()], [_table()])
    assert index_bounds(model) == {"ids": IndexBound(-ROWS, ROWS - 1, "table", "embed")}


@pytest.mark.parametrize("nodes,elem", [
    ([helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT64)], TensorProto.INT32),  # widening
    ([helper.make_node("Unsqueeze", ["ids", "axes"], ["c"])], TensorProto.INT64),
    ([helper.make_node("Reshape", ["ids", "shape"], ["r"]), helper.make_node("Identity", ["r"], ["c"])], TensorProto.INT64),
    ([helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT64)], TensorProto.UINT16),  # unsigned into wider signed
])
def test_the_bound_follows_ops_that_keep_every_value(nodes, elem):
    consts = [numpy_helper.from_array(np.array([0], np.int64), "axes"), numpy_helper.from_array(np.array([-1], np.int64), "shape")]
    model = _model([*nodes, helper.make_node("Gather", ["table", "c"], ["out"], name="g")], [_ids(elem=elem)],
                   [_table(), *consts])
    assert index_bounds(model)["ids"].high == ROWS - 1


@pytest.mark.parametrize("node", [
    helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT32),  # narrowing: wraps, the values are not the request's
    helper.make_node("Add", ["ids", "one"], ["c"]),  # changes the values
    helper.make_node("Slice", ["ids", "zero", "one"], ["c"]),  # keeps only some of them
])
def test_no_bound_through_ops_that_change_or_drop_values(node):
    consts = [numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64), "zero")]
    model = _model([node, helper.make_node("Gather", ["table", "c"], ["out"], name="g")], [_ids()], [_table(), *consts])
    assert index_bounds(model) == {}


def test_the_smallest_table_bounds_an_input_read_by_two():
    model = _model([helper.make_node("Gather", ["table", "ids"], ["a"], name="words"),
                    helper.make_node("Gather", ["types", "ids"], ["b"], name="types_of"),
                    helper.make_node("Add", ["a", "b"], ["out"])],
                   [_ids()], [_table(), _table("types", rows=2)])
    assert index_bounds(model)["ids"] == IndexBound(-2, 1, "types", "types_of")


def test_gather_along_axis_one_counts_that_axis():
    table = numpy_helper.from_array(np.zeros((3, 7), np.float32), "table")
    model = _model([helper.make_node("Gather", ["table", "ids"], ["out"], name="g", axis=1)], [_ids()], [table])
    assert index_bounds(model)["ids"] == IndexBound(-7, 6, "table", "g")


def test_constant_and_dequantized_tables_bound_too():
    constant = helper.make_node("Constant", [], ["table"], value=_table("v"))
    model = _model([constant, helper.make_node("Gather", ["table", "ids"], ["out"], name="g")], [_ids()])
    assert index_bounds(model)["ids"].high == ROWS - 1
    q = numpy_helper.from_array(np.zeros((ROWS, WIDTH), np.int8), "q")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    model = _model([helper.make_node("DequantizeLinear", ["q", "scale"], ["table"]),
                    helper.make_node("Gather", ["table", "ids"], ["out"], name="g")], [_ids()], [q, scale])
    assert index_bounds(model)["ids"] == IndexBound(-ROWS, ROWS - 1, "table", "g")


def test_a_table_a_request_may_replace_bounds_nothing():
    table_input = helper.make_tensor_value_info("table", TensorProto.FLOAT, [ROWS, WIDTH])
    nodes = [helper.make_node("Gather", ["table", "ids"], ["out"], name="g")]
    assert index_bounds(_model(nodes, [_ids()], [_table()], extra_inputs=[table_input])) == {}
    # IR < 4 lists every initializer as an input, and none may be replaced there
    assert index_bounds(_model(nodes, [_ids()], [_table()], ir_version=3, extra_inputs=[table_input]))["ids"].high == ROWS - 1


def test_inputs_that_are_not_indices_have_no_bound():
    floats = helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTH])
    model = _model([helper.make_node("Gather", ["x", "ids"], ["out"], name="g")], [floats, _ids()])  # data from a request
    assert index_bounds(model) == {}


def test_out_of_bounds_finds_the_first_value_and_where():
    bound = IndexBound(-5, 4, "t", "g")
    assert out_of_bounds(np.array([[0, 4, -5]]), bound) is None
    assert out_of_bounds(np.array([[0, 4], [5, -6]]), bound) == (5, (1, 0))
    assert out_of_bounds(np.zeros((0, 3), np.int64), bound) is None


@pytest.fixture(scope="module")
def bert_validator():
    spec = build_model_spec({"name": "bert_ge", "max_batch_size": 4}, signature_of(build_bert()), Path("b.onnx"),
                            BackendOptions())
    return RequestValidator(spec)


def test_the_bundled_bert_refuses_token_ids_outside_its_vocabulary(bert_validator):
    spec = bert_validator.spec
    assert spec.input("input_ids").bound.high == 999 and spec.input("attention_mask").bound is None
    mask = np.ones((2, 4), np.int64)
    bert_validator.check({"input_ids": np.array([[1, 2, 999, -1000]] * 2), "attention_mask": mask})
    for bad, where in ((1000, "[1, 2]"), (-1001, "[1, 2]")):
        ids = np.array([[1, 2, 3, 4], [1, 2, bad, 4]])
        with pytest.raises(InvalidRequest) as info:
            bert_validator.check({"input_ids": ids, "attention_mask": mask})
        message = str(info.value)
        assert "model 'bert_ge', input 'input_ids'" in message and f"value {bad} at {where}" in message, message
        assert "[-1000, 999]" in message, message


def test_onnxruntime_fails_on_what_the_check_refuses_and_runs_what_it_lets_through():
    """The bound is the engine's own: ONNX Runtime runs the edges of the range and fails one past them."""
    model = build_bert()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mask = np.ones((1, 3), np.int64)
    session.run(None, {"input_ids": np.array([[0, 999, -1000]]), "attention_mask": mask})
    for bad in (1000, -1001):
        with pytest.raises(Exception):
            session.run(None, {"input_ids": np.array([[0, bad, 1]]), "attention_mask": mask})


# ---------------------------------------------------------------- length limits: a numbering of positions


def _positions(numbering_nodes, initializers=(), rows=ROWS):
    """ids [batch, seq] -> Gather(positions table, numbering of seq): the graph of a text model's position embedding."""
    nodes = [*numbering_nodes, helper.make_node("Gather", ["pos_table", "numbers"], ["out"], name="positions")]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", 0), ("one", 1), ("two", 2), ("one_1d", [1]), ("zero_1d", [0]))]
    return _model(nodes, [_ids()], [_table("pos_table", rows), *consts, *initializers])


SEQ_LENGTH = [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["length"])]


def test_a_range_over_an_inputs_length_limits_that_axis_to_the_tables_rows():
    limits = length_limits(_positions([*SEQ_LENGTH, helper.make_node("Range", ["zero", "length", "one"], ["r"]),
                                       helper.make_node("Unsqueeze", ["r", "zero_1d"], ["u"]),
                                       helper.make_node("Expand", ["u", "shape"], ["numbers"])]))
    assert limits == {"ids": (LengthLimit(1, ROWS, "pos_table", "positions"),)}


def test_shape_with_start_and_end_gives_the_length_too():
    nodes = [helper.make_node("Shape", ["ids"], ["len_1d"], start=1, end=2),
             helper.make_node("Squeeze", ["len_1d"], ["length"]),
             helper.make_node("Range", ["zero", "length", "one"], ["numbers"])]
    assert length_limits(_positions(nodes))["ids"][0].axis == 1


CUT_TO_LENGTH = [*SEQ_LENGTH, helper.make_node("Unsqueeze", ["length", "zero_1d"], ["end"]),
                 helper.make_node("Slice", ["buffer", "zero_1d", "end", "one_1d"], ["numbers"])]


def _buffer(values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64)[None, :], "buffer")


def test_a_stored_numbering_cut_to_the_length_limits_to_the_shorter_of_it_and_the_table():
    """Hugging Face's BERT: a stored `position_ids` [1, N] sliced to the length (a longer cut stops at its end)."""
    limits = length_limits(_positions(CUT_TO_LENGTH, [_buffer(np.arange(30))]))
    assert limits == {"ids": (LengthLimit(1, 30, "pos_table", "positions", "buffer"),)}
    assert limits["ids"][0].describe().startswith("30 (the length of the stored 'buffer' cut to it"), limits
    # a numbering longer than the table: the cut may be as long as its numbers stay inside the table's rows
    assert length_limits(_positions(CUT_TO_LENGTH, [_buffer(np.arange(80))]))["ids"][0].most == ROWS


def test_a_stored_buffer_of_zeros_cut_to_the_length_limits_only_to_its_own_length():
    """Hugging Face's RoBERTa: its `token_type_ids` buffer [1, 130] of zeros sliced to the length and gathered from
    a table of 2 rows. Any length up to 130 reads row 0: the table's 2 rows limit nothing (they did, refusing every
    request longer than 2 tokens)."""
    limits = length_limits(_positions(CUT_TO_LENGTH, [_buffer(np.zeros(130))], rows=2))
    assert limits == {"ids": (LengthLimit(1, 130, "pos_table", "positions", "buffer"),)}
    session = ort.InferenceSession(_positions(CUT_TO_LENGTH, [_buffer(np.zeros(130))], rows=2).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    session.run(None, {"ids": np.zeros((2, 7), np.int64)})  # what ONNX Runtime runs, the check lets through


def test_a_buffer_whose_values_are_not_stored_in_the_file_limits_nothing():
    buffer = _buffer(np.zeros(130))
    buffer.data_location = TensorProto.EXTERNAL
    assert length_limits(_positions(CUT_TO_LENGTH, [buffer], rows=2)) == {}


@pytest.mark.parametrize("start,step", [("one", "one"), ("zero", "two")])
def test_a_numbering_not_from_zero_in_steps_of_one_limits_nothing(start, step):
    nodes = [*SEQ_LENGTH, helper.make_node("Range", [start, "length", step], ["numbers"])]
    assert length_limits(_positions(nodes)) == {}


def test_the_bundled_bert_refuses_requests_longer_than_its_positions(bert_validator):
    """128 positions: 128 tokens run on ONNX Runtime, 129 fail there and are refused up front here."""
    model = build_bert()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ones = np.ones((1, 128), np.int64)
    session.run(None, {"input_ids": ones, "attention_mask": ones})
    bert_validator.check({"input_ids": ones, "attention_mask": ones})
    longer = np.ones((1, 129), np.int64)
    with pytest.raises(Exception):
        session.run(None, {"input_ids": longer, "attention_mask": longer})
    with pytest.raises(InvalidRequest) as info:
        bert_validator.check({"input_ids": longer, "attention_mask": longer})
    assert "model 'bert_ge', input 'input_ids': dim 1 is 129" in str(info.value)
    assert "at most 128" in str(info.value), str(info.value)


def test_a_shape_bucket_longer_than_the_positions_is_a_config_error():
    config = {"name": "bert_long", "max_batch_size": 4}
    options = parse_options("bert_long", {}, {"graph.ge.inputShape": "input_ids:-1,-1;attention_mask:-1,-1",
                                              "graph.ge.dynamicDims": "1,64,1,64;1,256,1,256"}, config).options
    with pytest.raises(ConfigError) as info:
        build_model_spec(config, signature_of(build_bert()), Path("b.onnx"), options)
    message = str(info.value)
    assert "model 'bert_long': bucket 2 gives input 'input_ids' shape [1,256]" in message and "at most 128" in message
