"""The tune's warning where its winner is a static int8 calibrated and checked on seeded random images or audio."""

from __future__ import annotations

from types import SimpleNamespace

from gebackend.config import dtypes
from gebackend.tune.space import PRECISIONS
from gebackend.tune.tuner import seeded_calibration

STATIC = next(rung for rung in PRECISIONS if rung.name == "int8-static")
DYNAMIC = next(rung for rung in PRECISIONS if rung.name == "int8")


def _model(dtype: str, calibration: str = ""):
    tensor = SimpleNamespace(name="images" if dtype == "TYPE_FP32" else "input_ids", dtype=dtypes.from_triton(dtype))
    return SimpleNamespace(inputs=(tensor,), calibration=calibration)


def _winner(rung):
    return SimpleNamespace(rung=rung)


def test_a_static_int8_winner_calibrated_on_seeded_images_is_warned_about():
    warning = seeded_calibration(_model("TYPE_FP32"), _winner(STATIC))
    assert "calibrated and checked on seeded random images" in warning and "--input-data" in warning


def test_no_warning_where_the_calibration_is_real_or_needs_none():
    assert seeded_calibration(_model("TYPE_FP32", calibration="requests.json"), _winner(STATIC)) == ""
    assert seeded_calibration(_model("TYPE_INT64"), _winner(STATIC)) == ""  # random token ids are requests like any
    assert seeded_calibration(_model("TYPE_FP32"), _winner(DYNAMIC)) == ""  # dynamic int8 calibrates nothing
    assert seeded_calibration(_model("TYPE_FP32"), None) == ""
