"""Unit tests for gebackend.runtime.batching: grouping, concatenating and splitting requests."""

from __future__ import annotations

import numpy as np
import pytest

from gebackend.runtime.batching import BatchSplitError, concat, group_compatible, split


def _bert(rows: int, seq: int, dtype=np.int64, start: int = 0) -> dict[str, np.ndarray]:
    ids = (np.arange(rows * seq, dtype=np.int64).reshape(rows, seq) + start).astype(dtype)
    return {"input_ids": ids, "attention_mask": np.ones((rows, seq), dtype=dtype)}


def test_same_shapes_grouped_in_arrival_order():
    requests = [_bert(1, 8), _bert(3, 8), _bert(2, 8)]
    assert group_compatible(requests) == [[0, 1, 2]]


def test_different_sequence_lengths_split_apart():
    requests = [_bert(1, 8), _bert(2, 5), _bert(1, 8), _bert(4, 5), _bert(1, 7)]
    assert group_compatible(requests) == [[0, 2], [1, 3], [4]]


def test_different_dtypes_split_apart():
    requests = [_bert(1, 4), _bert(1, 4, dtype=np.int32), _bert(2, 4), _bert(2, 4, dtype=np.int32)]
    assert group_compatible(requests) == [[0, 2], [1, 3]]


def test_input_order_does_not_matter_but_input_set_does():
    a = {"x": np.zeros((1, 4), np.float32), "y": np.zeros((1, 4), np.float32)}
    b = {"y": np.zeros((2, 4), np.float32), "x": np.zeros((2, 4), np.float32)}
    c = {"x": np.zeros((1, 4), np.float32)}
    assert group_compatible([a, b, c]) == [[0, 1], [2]]


def test_empty_request_list():
    assert group_compatible([]) == []


def test_concat_split_round_trip_uneven_sizes():
    rng = np.random.default_rng(0)
    requests = [
        {"image": rng.standard_normal((n, 3, 4, 4)).astype(np.float32), "ids": rng.integers(0, 9, (n, 5))}
        for n in (1, 3, 2)
    ]
    feeds, sizes = concat(requests)
    assert sizes == [1, 3, 2]
    assert feeds["image"].shape == (6, 3, 4, 4)
    assert feeds["ids"].shape == (6, 5)
    np.testing.assert_array_equal(feeds["image"][1:4], requests[1]["image"])
    pieces = split(feeds, sizes)
    assert len(pieces) == 3
    for piece, request in zip(pieces, requests):
        assert set(piece) == set(request)
        for name in request:
            assert piece[name].dtype == request[name].dtype
            np.testing.assert_array_equal(piece[name], request[name])


def test_split_outputs_with_other_trailing_shapes():
    sizes = [1, 3, 2]
    outputs = {"hidden": np.arange(6 * 2 * 3).reshape(6, 2, 3), "pooled": np.arange(6.0)}
    pieces = split(outputs, sizes)
    np.testing.assert_array_equal(pieces[0]["pooled"], [0.0])
    np.testing.assert_array_equal(pieces[1]["pooled"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(pieces[2]["pooled"], [4.0, 5.0])
    np.testing.assert_array_equal(pieces[2]["hidden"], outputs["hidden"][4:6])


def test_single_request_passes_through():
    request = _bert(2, 3)
    feeds, sizes = concat([request])
    assert sizes == [2]
    assert feeds.keys() == request.keys()
    np.testing.assert_array_equal(feeds["input_ids"], request["input_ids"])
    [piece] = split({"out": np.ones((2, 7))}, sizes)
    assert piece["out"].shape == (2, 7)


@pytest.mark.parametrize(
    "bad",
    [np.float32(3.0) * np.ones(()), np.zeros((1, 4)), np.zeros((7, 4)), np.zeros((4, 6))],
    ids=["scalar", "reduced", "too_many_rows", "batch_moved"],
)
def test_split_raises_when_output_lost_batch_axis(bad):
    outputs = {"good": np.zeros((6, 4)), "bad": bad}
    with pytest.raises(BatchSplitError) as info:
        split(outputs, [1, 3, 2])
    message = str(info.value)
    assert "'bad'" in message
    assert str(list(bad.shape)) in message
    assert "6 rows" in message


def test_split_checks_single_request_too():
    with pytest.raises(BatchSplitError, match="'out'"):
        split({"out": np.zeros((3,))}, [2])
