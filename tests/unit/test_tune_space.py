"""`gebackend tune`'s space: which candidates exist for given cores, engines, OpenVINO capabilities and max_batch_size,
and in which order (nothing here starts a server or measures anything)."""

from __future__ import annotations

from dataclasses import replace

import onnx

from gebackend.compile.precision import quantized_nodes
from gebackend.modelzoo import build_qdq_resnet, build_resnet
from gebackend.tune import space
from gebackend.tune.space import PRECISIONS, PrecisionRung, buckets_for, instance_layouts
from gebackend.tune.tuned_model import TunedModel
from gebackend.tune.tuner import TuneSettings, machine_space

BOTH = ("onnxruntime", "openvino")
AVX2_CAPS = ("FP32", "INT8", "BIN", "EXPORT_IMPORT")  # what OpenVINO reports on an AVX2-only CPU
BF16_CAPS = ("BF16", "FP32", "INT8")


def rungs(cands) -> set[tuple[str, str]]:
    return {c.numerics for c in cands}


def test_no_bf16_or_fp16_rung_without_the_capability():
    cands = space.space(2, BOTH, AVX2_CAPS, 8, 4)
    assert rungs(cands) == {("onnxruntime", "origin"), ("openvino", "origin"), ("onnxruntime", "int8"),
                            ("openvino", "int8-static"), ("onnxruntime", "int8-static")}
    with_bf16 = space.space(2, BOTH, BF16_CAPS, 8, 4)
    assert ("openvino", "bf16") in rungs(with_bf16)
    assert ("openvino", "fp16") not in rungs(with_bf16)  # FP16 is not in those capabilities
    assert ("openvino", "fp16") in rungs(space.space(2, BOTH, (*BF16_CAPS, "FP16"), 8, 4))


def test_engines_not_installed_and_features_missing_give_no_candidates():
    cands = space.space(2, ("onnxruntime",), BF16_CAPS, 8, 4, available=lambda feature: feature != "int8")
    assert rungs(cands) == {("onnxruntime", "origin")}


def test_full_space_is_the_product_of_the_dimensions_in_prior_order():
    cands = space.space(4, BOTH, BF16_CAPS, 8, 4)
    # numerics: ort origin, ov bf16, ort int8, ov int8-static, ov origin, ort int8-static; graph 2; layouts 1x4, 4x1,
    # 2x2; delays 0/100/500
    assert len(cands) == 6 * 2 * 3 * 3
    assert len({c.key for c in cands}) == len(cands)
    first = cands[0]
    assert first.key == "ort-static-origin-1x4-d0"
    assert first.scenario.static and first.scenario.buckets == (1, 2, 4, 8)
    assert first.scenario.preferred_batch_sizes == (2, 4, 8)
    scores = [sum(c.ranks) for c in cands]
    assert scores == sorted(scores)
    assert cands[-1].key == "ort-dynamic-int8-static-2x2-d500"
    # each rung on its preferred engine first; a rung's other engines (origin on OpenVINO: rarely faster than ONNX
    # Runtime's) after every preferred one
    order = [n for n in dict.fromkeys(c.numerics for c in sorted(cands, key=lambda c: c.ranks))]
    assert order == [("onnxruntime", "origin"), ("openvino", "bf16"), ("onnxruntime", "int8"),
                     ("openvino", "int8-static"), ("openvino", "origin"), ("onnxruntime", "int8-static")]


def test_pinned_layouts_divide_the_cores_and_stop_at_the_concurrency():
    assert instance_layouts(4, 4) == [(1, 4), (4, 1), (2, 2)]
    assert instance_layouts(4, 2) == [(1, 4), (2, 2)]
    assert instance_layouts(6, 8) == [(1, 6), (6, 1), (3, 2), (2, 3)]
    assert instance_layouts(1, 4) == [(1, 1)]
    pinned = next(c for c in space.space(4, ("onnxruntime",), (), 8, 4) if c.scenario.instances == 2)
    assert (pinned.scenario.cores_per_instance, pinned.scenario.intra_op_threads) == (2, 2)
    assert pinned.scenario.requires == ("pinning",)
    single = space.space(4, ("onnxruntime",), (), 8, 4)[0]
    assert (single.scenario.instances, single.scenario.cores_per_instance) == (1, 0)


def test_buckets_are_capped_by_max_batch_size_and_no_batching_without_it():
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(16) == (1, 2, 4, 8)
    assert buckets_for(4) == (1, 2, 4)
    assert buckets_for(3) == (1, 2, 3)
    assert buckets_for(0) == ()
    cands = space.space(2, ("onnxruntime",), (), 4, 2)
    static = next(c for c in cands if c.scenario.static)
    assert static.scenario.buckets == (1, 2, 4) and static.scenario.preferred_batch_sizes == (2, 4)
    assert {c.choices()["delay"] for c in cands} == {0, 100, 500}
    unbatched = space.space(2, ("onnxruntime",), (), 0, 2)
    assert {c.choices()["delay"] for c in unbatched} == {None}
    assert not any(c.scenario.dynamic_batching for c in unbatched)


def test_static_left_out_when_the_model_cannot_have_it():
    cands = space.space(2, ("onnxruntime",), (), 8, 2, static_ok=False)
    assert cands and not any(c.scenario.static for c in cands)


def test_quick_is_the_best_guess_and_one_change_of_each_dimension():
    cands = space.quick_set(space.space(2, BOTH, BF16_CAPS, 8, 2))
    assert 4 <= len(cands) <= 6
    base = cands[0].choices()
    assert cands[0].key == "ort-static-origin-1x2-d0"
    changed = []
    for cand in cands[1:]:
        diff = [d for d, v in cand.choices().items() if v != base[d]]
        assert len(diff) == 1, cand.key
        changed.append(diff[0])
    assert set(changed) == {"graph", "instances", "delay", "numerics"}
    assert {c.numerics for c in cands} >= {("onnxruntime", "int8"), ("openvino", "bf16")}


def test_quick_set_moves_to_the_best_usable_guess():
    pool = space.space(2, BOTH, BF16_CAPS, 8, 2)
    first = space.quick_set(pool)
    assert first[0].numerics == ("onnxruntime", "origin")
    lowered = next(c.numerics for c in first if c.numerics != first[0].numerics)
    # the guard timed that lowered rung fastest (numerics_order re-ranks it 0) and the exact one is not usable
    reranked = [replace(c, ranks=(0 if c.numerics == lowered else c.ranks[0] + 1,) + c.ranks[1:]) for c in pool]
    moved = space.quick_set(reranked, usable=lambda c: c.numerics != ("onnxruntime", "origin"))
    assert moved[0].numerics == lowered and moved[0].choices()["graph"] == "static"
    neighbours = [c for c in moved[1:] if c.numerics == lowered]
    assert len(neighbours) == 3 and all(
        sum(v != moved[0].choices()[d] for d, v in c.choices().items()) == 1 for c in neighbours)
    # other rungs at the guess's other values: the fastest usable one, the last place kept for the exact precision
    # (OpenVINO's: ONNX Runtime's is not usable; 6 served in all), and the unusable exact one (never served; the
    # report says why)
    others = [c for c in moved if c.numerics != lowered]
    assert all(c.choices()["instances"] == moved[0].choices()["instances"] for c in others)
    assert ("onnxruntime", "origin") in rungs(others)
    usable = sorted((c for c in pool if c.numerics not in (lowered, ("onnxruntime", "origin"))
                     and c.choices()["graph"] == "static" and c.ranks[1:] == moved[0].ranks[1:]),
                    key=lambda c: c.ranks)
    exact = next(c for c in usable if c.rung.name == "origin")
    assert usable[0] is not exact and usable[1] is not exact  # by speed alone it would not have been served
    assert [c.key for c in others if c.numerics != ("onnxruntime", "origin")] == [usable[0].key, exact.key]
    assert len({c.key for c in moved}) == len(moved) == 7
    assert space.quick_set([]) == []


def test_a_quick_tune_around_a_lowered_guess_serves_the_exact_precision_too():
    """The exact rung, timed slowest in process, still has the last served place beside a lowered guess (the report
    then says what the exact graph serves); it takes no extra place when it is the guess or came first anyway."""
    pool = space.space(2, ("onnxruntime",), (), 8, 2)
    slowest_first = {("onnxruntime", "int8"): 0, ("onnxruntime", "int8-static"): 1, ("onnxruntime", "origin"): 2}
    reranked = [replace(c, ranks=(slowest_first[c.numerics],) + c.ranks[1:]) for c in pool]
    served = space.quick_set(reranked)
    assert served[0].numerics == ("onnxruntime", "int8") and len(served) == space.QUICK_SERVED
    assert [c.numerics for c in served[1:] if c.numerics != served[0].numerics] == [
        ("onnxruntime", "int8-static"), ("onnxruntime", "origin")]
    anchored = space.quick_set(pool)  # the exact guess: the others by speed, no place kept
    assert anchored[0].rung.name == "origin" and len(anchored) == space.QUICK_SERVED
    # with more lowered rungs than places, the exact one still comes last, in place of the slowest lowered one
    table = (*space.PRECISIONS, space.PrecisionRung("int4", "int4", ("onnxruntime",), prior=2))
    wider = space.space(2, ("onnxruntime",), (), 8, 2, table=table)
    order = {("onnxruntime", "int8"): 0, ("onnxruntime", "int8-static"): 1, ("onnxruntime", "int4"): 2,
             ("onnxruntime", "origin"): 3}
    picked = space.quick_set([replace(c, ranks=(order[c.numerics],) + c.ranks[1:]) for c in wider])
    assert [c.numerics[1] for c in picked if c.numerics != picked[0].numerics] == ["int8-static", "origin"]


def test_a_new_precision_rung_is_one_line_in_the_table():
    static_int8 = PrecisionRung("int8-static", "int8", ("onnxruntime",), parameters=(("quantization", "static"),), prior=2)
    table = (*PRECISIONS, static_int8)
    cands = space.space(2, ("onnxruntime",), (), 8, 2, table=table)
    assert ("onnxruntime", "int8-static") in rungs(cands)
    one = next(c for c in cands if c.rung.name == "int8-static")
    assert one.scenario.precision == "int8" and one.key.startswith("ort-static-int8-static-")


def test_accuracy_groups_name_each_engine_and_rung_once():
    cands = space.space(2, BOTH, BF16_CAPS, 8, 2)
    groups = space.accuracy_groups(cands)
    assert [(e, r.name) for e, r in groups] == [("onnxruntime", "origin"), ("openvino", "bf16"),
                                                ("onnxruntime", "int8"), ("openvino", "int8-static"),
                                                ("openvino", "origin"), ("onnxruntime", "int8-static")]
    assert space.accuracy_groups([replace(cands[0], kind="baseline")]) == []


def test_labels_say_engine_graph_precision_layout_and_delay():
    cands = space.space(2, BOTH, BF16_CAPS, 8, 2)
    labels = {c.key: c.label for c in cands}
    assert labels["ort-static-int8-2x1-d100"] == "onnxruntime static int8 2x1 core delay 100us"
    assert labels["ov-dynamic-bf16-1x2-d0"] == "openvino dynamic bf16 1x2 cores delay 0us"


def test_a_rung_expected_to_lose_here_is_measured_last_not_left_out():
    """NNCF's int8 of a MatMul model without VNNI measured about half OpenVINO's f32 on an AVX2 EPYC: tune keeps the
    rung but orders it after every other (engine, rung) pair, the rungs' second engines included."""
    def slow(engine, rung):
        return "half speed here" if engine == "openvino" and rung.precision_mode == "int8" else ""

    plain = [(engine, rung.name) for engine, rung in space.numerics(BOTH, AVX2_CAPS)]
    late = [(engine, rung.name) for engine, rung in space.numerics(BOTH, AVX2_CAPS, slow=slow)]
    # before: NNCF first, its preferred engine
    assert plain.index(("openvino", "int8-static")) < plain.index(("onnxruntime", "int8-static"))
    assert sorted(late) == sorted(plain) and late[-1] == ("openvino", "int8-static")
    assert late[:-1] == [pair for pair in plain if pair != ("openvino", "int8-static")]
    cands = space.space(2, BOTH, AVX2_CAPS, 8, 4, slow=slow)
    assert rungs(cands) == rungs(space.space(2, BOTH, AVX2_CAPS, 8, 4))  # nothing left out
    first = next(i for i, c in enumerate(cands) if c.numerics == ("openvino", "int8-static"))
    ort_static = [i for i, c in enumerate(cands) if c.numerics == ("onnxruntime", "int8-static")]
    assert min(ort_static) < first  # ONNX Runtime's static int8 now comes before NNCF's


def test_rungs_this_cpu_runs_natively_are_measured_first_in_their_order():
    """With VNNI and BF16 (an AMD EPYC with AVX512-VNNI/BF16: NNCF's int8 3.3-3.75x fp32 in process, bf16 ~2x) the
    favoured rungs come before the exact one, in the order `favoured` gives; a slow rung is never favoured."""
    order = {("openvino", "int8-static"): 0, ("onnxruntime", "int8"): 1, ("openvino", "bf16"): 2}

    def favoured(engine, rung):
        place = order.get((engine, rung.name))
        return None if place is None else (place, "native here")

    plain = [(engine, rung.name) for engine, rung in space.numerics(BOTH, BF16_CAPS)]
    first = [(engine, rung.name) for engine, rung in space.numerics(BOTH, BF16_CAPS, favoured=favoured)]
    assert plain[0] == ("onnxruntime", "origin")
    assert first[:3] == [("openvino", "int8-static"), ("onnxruntime", "int8"), ("openvino", "bf16")]
    assert first[3:] == [pair for pair in plain if pair not in order]  # the rest keep their order
    cands = space.space(2, BOTH, BF16_CAPS, 8, 4, favoured=favoured)
    assert cands[0].key == "ov-static-int8-static-1x2-d0"  # the usual best guess is now the lowered rung
    assert rungs(cands) == rungs(space.space(2, BOTH, BF16_CAPS, 8, 4))
    quick = space.quick_set(cands)
    assert quick[0].numerics == ("openvino", "int8-static")
    assert ("onnxruntime", "int8") in rungs(quick) and len({c.key for c in quick}) == len(quick) <= 6
    # where the accuracy guard rejects every lowered rung, the quick set is built around the exact one
    exact = space.quick_set(cands, usable=lambda c: c.rung.name == "origin")
    assert exact[0].numerics == ("onnxruntime", "origin")

    def slow(engine, rung):
        return "half speed here" if (engine, rung.name) == ("openvino", "int8-static") else ""

    both = [(engine, rung.name) for engine, rung in space.numerics(BOTH, BF16_CAPS, slow=slow, favoured=favoured)]
    assert both[:2] == [("onnxruntime", "int8"), ("openvino", "bf16")] and both[-1] == ("openvino", "int8-static")


def test_no_queue_delay_is_tried_at_concurrency_1_where_nothing_can_join_the_one_request():
    assert space.queue_delays(8, 1) == [0]
    assert space.queue_delays(8, 4) == list(space.DELAYS_US)
    assert space.queue_delays(0, 4) == [None]  # no batching: no dynamic_batching at all
    alone = space.space(2, BOTH, AVX2_CAPS, 8, 1)
    assert {c.scenario.max_queue_delay_us for c in alone} == {0} and all(c.scenario.dynamic_batching for c in alone)
    assert len(space.space(2, BOTH, AVX2_CAPS, 8, 4)) == 3 * len(alone) * 2  # and 2 layouts instead of 1


def test_a_file_quantized_already_gets_no_int8_rungs(tmp_path):
    """`ge` serves a QDQ file as its producer quantized it, so its int8 rungs measured the origin rung again."""
    def int8_rungs(build, name):
        (tmp_path / name / "1").mkdir(parents=True)
        onnx.save(build(), str(tmp_path / name / "1" / "model.onnx"))
        (tmp_path / name / "config.pbtxt").write_text('backend: "ge"\nmax_batch_size: 8\n')
        model = TunedModel.load(tmp_path / name)
        candidates = machine_space(TuneSettings(tmp_path / name), model, lambda engine, rung: "",
                                   quantized=quantized_nodes(model.onnx_path))
        return {c.rung.name for c in candidates if c.rung.precision_mode == "int8"}, len(candidates)

    plain, _ = int8_rungs(build_resnet, "resnet")
    quantized, count = int8_rungs(build_qdq_resnet, "qdq_resnet")
    assert plain and "int8" in plain  # ONNX Runtime's dynamic int8 at least, wherever onnxruntime is installed
    assert quantized == set() and count > 0
