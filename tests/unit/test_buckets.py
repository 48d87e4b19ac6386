"""Bucket routing, padding and slicing (pure logic), and the bucket runner around a fake engine."""

from __future__ import annotations

import numpy as np
import pytest

from gebackend.engines.base import Engine, EngineInputError, StaticEngine
from gebackend.errors import InvalidRequest
from gebackend.runtime.buckets import DYNAMIC, BucketRouter, Chunk, cheapest_cover, inner_key
from gebackend.runtime.runners import BucketRunner

IMAGE_BUCKETS = [{"image": (b, 3, 8, 8)} for b in (1, 2, 4, 8)] + [{"image": (2, 3, 16, 16)}]


def image_router():
    return BucketRouter(IMAGE_BUCKETS, True, {"image": [None, None, None]}, {"logits": [None]})


@pytest.mark.parametrize("rows,expected", [(1, [(0, 1)]), (2, [(1, 2)]), (3, [(2, 3)]), (4, [(2, 4)]), (5, [(3, 5)]), (8, [(3, 8)])])
def test_batch_goes_to_smallest_bucket_that_holds_it(rows, expected):
    plan = image_router().plan({"image": (rows, 3, 8, 8)})
    assert [(c.bucket, c.rows) for c in plan] == expected


def test_oversize_batch_is_split_into_several_runs():
    plan = image_router().plan({"image": (19, 3, 8, 8)})
    assert plan == [Chunk(3, 0, 8), Chunk(3, 8, 16), Chunk(2, 16, 19)]


# Measured costs of one run of buckets 1/2/4/8 (8x8 images) and of the 16x16 one: a compute-bound model on 2 cores,
# whose run costs ~ a row's compute times its batch, plus a small fixed cost.
LINEAR_COSTS = [1.1, 2.1, 4.1, 8.1, 4.0]


def costed_router(costs):
    return BucketRouter(IMAGE_BUCKETS, True, {"image": [None, None, None]}, {"logits": [None]}, costs=costs)


@pytest.mark.parametrize("rows,expected", [
    (1, [(0, 1)]), (2, [(1, 2)]), (3, [(1, 2), (0, 1)]), (4, [(2, 4)]), (5, [(2, 4), (0, 1)]),
    (6, [(2, 4), (1, 2)]),
    (7, [(3, 7)]),  # 4+2+1 costs 7.3 against 8.1 padded: under the 10 % margin, so it pads
    (8, [(3, 8)]), (19, [(3, 8), (3, 8), (2, 3)]),  # 8+8+2+1 saves under 5 % against 8+8+4
])
def test_measured_costs_split_a_batch_where_padding_would_cost_more(rows, expected):
    plan = costed_router(LINEAR_COSTS).plan({"image": (rows, 3, 8, 8)})
    assert [(c.bucket, c.rows) for c in plan] == expected
    assert [c.start for c in plan] == [sum(r for _, r in expected[:k]) for k in range(len(expected))]  # rows in order


def test_measured_costs_pad_where_a_run_costs_more_than_its_rows():
    # A small model on many threads: a run's fixed cost dominates, so padding 3 to 4 beats running 2 and 1.
    plan = costed_router([1.0, 1.05, 1.1, 1.3, 1.0]).plan({"image": (3, 3, 8, 8)})
    assert [(c.bucket, c.rows) for c in plan] == [(2, 3)]
    plan = costed_router([1.0, 1.05, 1.1, 1.3, 1.0]).plan({"image": (5, 3, 8, 8)})
    assert [(c.bucket, c.rows) for c in plan] == [(3, 5)]


def test_a_gain_within_the_margin_of_noise_does_not_split():
    # Costs timed while 13 models loaded side by side on 2 cores (a real load log): per row, bucket 1 looked 5 %
    # cheaper than bucket 2 and bucket 4 2 % cheaper than bucket 8. Neither is a reason to run 2 as 1+1 or 8 as 4+4.
    router = costed_router([36.82, 77.89, 132.76, 271.95, 100.0])
    for rows, expected in [(2, [(1, 2)]), (8, [(3, 8)]), (4, [(2, 4)])]:
        assert [(c.bucket, c.rows) for c in router.plan({"image": (rows, 3, 8, 8)})] == expected, rows


def test_the_cheapest_cover_takes_the_fewest_runs_on_a_tie():
    assert cheapest_cover(4, [1, 2, 4], [1.0, 2.0, 4.0]) == [2]  # 4 = 2+2 = 1+1+1+1 at the same cost: one run
    assert cheapest_cover(0, [1, 2], [1.0, 2.0]) == []
    assert cheapest_cover(3, [4], [5.0]) == [0]


def test_non_batch_axes_must_match_exactly():
    router = image_router()
    assert router.plan({"image": (1, 3, 16, 16)}) == [Chunk(4, 0, 1)]
    assert router.plan({"image": (3, 3, 16, 16)}) == [Chunk(4, 0, 2), Chunk(4, 2, 3)]
    assert router.plan({"image": (1, 3, 12, 12)}) is None  # no padding along unnamed axes


def text_router():
    buckets = [{"ids": (b, s), "mask": (b, s)} for b in (1, 4) for s in (8, 16)]
    return BucketRouter(
        buckets, True, {"ids": ["sequence"], "mask": ["sequence"]},
        {"hidden": ["sequence", None], "pooled": [None]}, paddable=["sequence"],
    )


def test_paddable_named_dim_goes_to_the_tightest_bucket():
    router = text_router()
    plan = router.plan({"ids": (3, 5), "mask": (3, 5)})
    assert [router.buckets[c.bucket]["ids"] for c in plan] == [(4, 8)]
    plan = router.plan({"ids": (1, 9), "mask": (1, 9)})
    assert [router.buckets[c.bucket]["ids"] for c in plan] == [(1, 16)]
    assert router.plan({"ids": (1, 17), "mask": (1, 17)}) is None


def test_an_empty_paddable_axis_is_not_padded_up_to_a_bucket():
    router = text_router()
    assert router.plan({"ids": (2, 0), "mask": (2, 0)}) is None  # a run of padding alone answers nothing sent
    zero = BucketRouter([{"ids": (2, 0)}], True, {"ids": ["sequence"]}, {"pooled": [None]}, paddable=["sequence"])
    assert [zero.buckets[c.bucket]["ids"] for c in zero.plan({"ids": (1, 0)})] == [(2, 0)]  # a bucket of 0 takes it


def test_a_request_giving_a_paddable_dim_two_sizes_is_padded_nowhere():
    router = text_router()
    assert router.plan({"ids": (1, 5), "mask": (1, 7)}) is None  # cut back by which size? neither: the fallback runs
    [chunk] = router.plan({"ids": (1, 8), "mask": (1, 8)})
    assert router.buckets[chunk.bucket]["ids"] == (1, 8)


def test_pad_and_unpad_round_trip():
    router = text_router()
    ids = np.arange(15, dtype=np.int64).reshape(3, 5) + 1
    feeds = {"ids": ids, "mask": np.ones_like(ids)}
    [chunk] = router.plan({"ids": ids.shape, "mask": ids.shape})
    padded = router.pad(feeds, chunk)
    assert padded["ids"].shape == (4, 8)
    np.testing.assert_array_equal(padded["ids"][:3, :5], ids)
    assert padded["ids"][3:].sum() == 0 and padded["ids"][:, 5:].sum() == 0 and padded["mask"][:, 5:].sum() == 0
    outputs = {"hidden": np.random.rand(4, 8, 2), "pooled": np.random.rand(4, 2)}
    cut = router.unpad(outputs, chunk.rows, router.sizes_by_label({"ids": ids.shape}))
    assert cut["hidden"].shape == (3, 5, 2) and cut["pooled"].shape == (3, 2)
    np.testing.assert_array_equal(cut["hidden"], outputs["hidden"][:3, :5])


def test_exact_fit_is_not_copied():
    router = image_router()
    image = np.ones((2, 3, 8, 8), np.float32)
    [chunk] = router.plan({"image": image.shape})
    assert router.pad({"image": image}, chunk)["image"] is image


def test_non_batching_model_single_bucket():
    router = BucketRouter([{"x": (2, 3)}], False, {"x": [None, None]}, {"y": [None, None]})
    assert router.plan({"x": (2, 3)}) == [Chunk(0, 0, 1)]
    assert router.plan({"x": (3, 3)}) is None


class RowSum(StaticEngine):
    """A fake static engine: runs the bucket it is handed, whose shapes the feeds must have; logits = per-row sum."""

    def __init__(self, buckets):
        super().__init__(buckets)
        self.calls = []
        self.buckets_run = []

    def run_bucket(self, bucket, feeds, output_names):
        shape = feeds["image"].shape
        assert shape == self.bucket_shapes[bucket]["image"], (bucket, shape)
        self.calls.append(shape[0])
        self.buckets_run.append(bucket)
        return [feeds["image"].reshape(shape[0], -1).sum(axis=1, keepdims=True).repeat(2, axis=1)]


def test_bucket_runner_pads_runs_and_slices_back():
    engine = RowSum(IMAGE_BUCKETS)
    runner = BucketRunner("m", image_router(), engine, ["logits"])
    image = np.random.rand(11, 3, 8, 8).astype(np.float32)
    out = runner.run({"image": image})["logits"]
    np.testing.assert_allclose(out[:, 0], image.reshape(11, -1).sum(axis=1), rtol=1e-5)
    assert engine.calls == [8, 4]
    assert [IMAGE_BUCKETS[b]["image"][0] for b in engine.buckets_run] == [8, 4]  # the router's buckets, by index
    assert runner.padded_rows == 1 and runner.rows == 12
    assert sum(runner.runs_per_bucket.values()) == 2


def test_with_measured_costs_the_runner_splits_instead_of_padding():
    engine = RowSum(IMAGE_BUCKETS)
    runner = BucketRunner("m", costed_router(LINEAR_COSTS), engine, ["logits"])
    image = np.random.rand(6, 3, 8, 8).astype(np.float32)
    out = runner.run({"image": image})["logits"]
    np.testing.assert_allclose(out[:, 0], image.reshape(6, -1).sum(axis=1), rtol=1e-5)  # rows back in order
    assert engine.calls == [4, 2] and runner.padded_rows == 0 and runner.rows == 6


def test_a_request_that_is_a_bucket_runs_as_is_and_counts():
    engine = RowSum(IMAGE_BUCKETS)
    runner = BucketRunner("m", image_router(), engine, ["logits"])
    image = np.random.rand(4, 3, 8, 8).astype(np.float32)
    out = runner.run({"image": image})["logits"]
    np.testing.assert_allclose(out[:, 0], image.reshape(4, -1).sum(axis=1), rtol=1e-5)
    assert engine.calls == [4] and out.shape == (4, 2)
    assert runner.padded_rows == 0 and runner.rows == 4 and sum(runner.runs_per_bucket.values()) == 1


def test_bucket_runner_error_names_shapes_sent_and_compiled():
    runner = BucketRunner("m", image_router(), RowSum(IMAGE_BUCKETS), ["logits"])
    with pytest.raises(InvalidRequest) as info:
        runner.run({"image": np.zeros((1, 3, 12, 12), np.float32)})
    message = str(info.value)
    assert "model 'm'" in message and "image:[1, 3, 12, 12]" in message and "image:[8, 3, 8, 8]" in message


class Dynamic(Engine):
    """A fake dynamic engine: logits = 7 per row, and how many rows each run had."""

    def __init__(self):
        self.calls = []

    def run(self, feeds, output_names):
        self.calls.append(feeds["image"].shape[0])
        return [np.full((feeds["image"].shape[0], 2), 7.0)]


def test_bucket_runner_falls_back_to_dynamic_engine():
    runner = BucketRunner("m", image_router(), RowSum(IMAGE_BUCKETS), ["logits"], fallback=Dynamic())
    out = runner.run({"image": np.zeros((1, 3, 12, 12), np.float32)})
    assert runner.fallback_runs == 1
    np.testing.assert_array_equal(out["logits"], np.full((1, 2), 7.0))


SMALL = inner_key({"image": (1, 3, 8, 8)})  # the 8x8 buckets' shapes without the batch axis


def dynamic_router(dynamic_costs, costs=LINEAR_COSTS):
    return BucketRouter(IMAGE_BUCKETS, True, {"image": [None, None, None]}, {"logits": [None]}, costs=costs,
                        dynamic_costs=dynamic_costs)


def test_a_batch_size_measured_faster_on_the_dynamic_graph_runs_there_whole():
    # Plans from LINEAR_COSTS: 3 as 2+1 (3.2), 5 as 4+1 (5.2), 7 padded to 8 (8.1), 4 exact (4.1)
    router = dynamic_router({SMALL: {3: 2.9, 4: 4.0, 5: 5.0, 7: 7.6, 9: 1.0}})
    assert router.dynamic_rows == {SMALL: (3, 7)}  # 4 and 5: within the 5 % margin; 9: above the largest bucket
    assert router.plan({"image": (3, 3, 8, 8)}) == [Chunk(DYNAMIC, 0, 3)]
    assert router.plan({"image": (7, 3, 8, 8)}) == [Chunk(DYNAMIC, 0, 7)]
    assert [(c.bucket, c.rows) for c in router.plan({"image": (5, 3, 8, 8)})] == [(2, 4), (0, 1)]
    assert [(c.bucket, c.rows) for c in router.plan({"image": (3, 3, 16, 16)})] == [(4, 2), (4, 1)]  # other shape
    assert router.plan({"image": (3, 3, 12, 12)}) is None  # fits nothing: still the fallback's (or a 400)


def test_the_batch_sizes_on_the_dynamic_graph_are_said_per_inner_shape_where_there_are_several():
    assert dynamic_router({SMALL: {3: 2.9, 7: 7.6}}).describe_dynamic() == "3,7"
    assert dynamic_router({}).describe_dynamic() == ""
    large = inner_key({"image": (1, 3, 16, 16)})
    router = BucketRouter(IMAGE_BUCKETS + [{"image": (4, 3, 16, 16)}], True, {"image": [None, None, None]},
                          {"logits": [None]}, costs=LINEAR_COSTS + [7.9], dynamic_costs={SMALL: {3: 2.9}, large: {3: 5.0}})
    assert router.describe_dynamic() == "3 at image:[3, 8, 8], 3 at image:[3, 16, 16]"


def test_without_bucket_costs_or_batching_nothing_runs_on_the_dynamic_graph():
    assert dynamic_router({SMALL: {3: 0.1}}, costs=None).dynamic_rows == {}
    unbatched = BucketRouter([{"x": (4,)}], False, {"x": [None]}, {"y": [None]}, costs=[1.0],
                             dynamic_costs={(): {1: 0.1}})
    assert unbatched.dynamic_rows == {} and unbatched.plan({"x": (4,)}) == [Chunk(0, 0, 1)]


def test_the_runner_runs_a_dynamic_batch_size_unpadded_on_the_dynamic_engine_and_counts_it():
    engine, dynamic = RowSum(IMAGE_BUCKETS), Dynamic()
    runner = BucketRunner("m", dynamic_router({SMALL: {3: 2.9}}), engine, ["logits"], dynamic=dynamic)
    out = runner.run({"image": np.zeros((3, 3, 8, 8), np.float32)})
    np.testing.assert_array_equal(out["logits"], np.full((3, 2), 7.0))
    assert dynamic.calls == [3] and engine.calls == []
    assert runner.runs_per_bucket[DYNAMIC] == 1 and runner.rows == 3 and runner.padded_rows == 0
    assert runner.fallback_runs == 0
    runner.run({"image": np.zeros((5, 3, 8, 8), np.float32)})  # a size the buckets run
    assert dynamic.calls == [3] and engine.calls == [4, 1]
    assert runner.engines() == [engine, dynamic]
    same = BucketRunner("m", dynamic_router({SMALL: {3: 2.9}}), engine, ["logits"], fallback=dynamic, dynamic=dynamic)
    assert same.engines() == [engine, dynamic]  # one engine for both jobs, closed once


def test_plans_are_computed_once_per_request_shape():
    router = BucketRouter([{"x": (1, 4)}, {"x": (4, 4)}], True, {"x": [None]}, {"y": [None]})
    first = router.plan({"x": (3, 4)})
    assert [(c.bucket, c.start, c.stop) for c in first] == [(1, 0, 3)]
    assert router.plan({"x": (3, 4)}) is first  # from the cache
    assert [(c.bucket, c.start, c.stop) for c in router.plan({"x": (1, 4)})] == [(0, 0, 1)]
    assert router.plan({"x": (3, 5)}) is None and router.plan({"x": (3, 5)}) is None


def test_a_static_engine_run_without_a_router_finds_its_bucket_or_names_the_compiled_shapes():
    engine = RowSum(IMAGE_BUCKETS)
    image = np.ones((4, 3, 8, 8), np.float32)
    np.testing.assert_allclose(engine.run({"image": image}, ["logits"])[0][:, 0], np.full(4, 192.0))
    assert [IMAGE_BUCKETS[b]["image"] for b in engine.buckets_run] == [(4, 3, 8, 8)]
    with pytest.raises(EngineInputError) as info:
        engine.run({"image": np.ones((3, 3, 8, 8), np.float32)}, ["logits"])
    assert "no static graph was compiled for input shapes {'image': [3, 3, 8, 8]}; compiled: [{'image': [1, 3, 8, 8]}" in str(info.value)
