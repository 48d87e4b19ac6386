"""StringNormalizer naming a locale this machine lacks: served with C.UTF-8 from a copy (config/normalizer_locale.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from gebackend.config.normalizer_locale import FALLBACK_LOCALE, locale_installed, served_locale
from gebackend.config.onnx_signature import read_signature
from gebackend.modelzoo.misc import build_string_normalizer

NO_SUCH_LOCALE = "xx_NOWHERE.UTF-8"  # no C library has it


def normalizer(path, locale=None):
    onnx.save(build_string_normalizer(locale), str(path))
    return path


def test_the_c_library_is_asked_without_touching_this_process_locale():
    assert locale_installed("C") and not locale_installed(NO_SUCH_LOCALE)


@pytest.mark.skipif(not locale_installed(FALLBACK_LOCALE), reason="this C library has no C.UTF-8 to fall back on")
def test_a_missing_locale_is_served_as_c_utf8_with_unicode_case_mapping(tmp_path):
    path = normalizer(tmp_path / "model.onnx", NO_SUCH_LOCALE)
    with pytest.raises(Exception, match="Failed to construct locale"):  # what ONNX Runtime does with the file
        ort.InferenceSession(str(path))
    lines = []
    served = served_locale(path, read_signature(path), lines.append, tmp_path)
    assert served != path and len(lines) == 1
    assert lines[0].startswith(f"StringNormalizer locale {NO_SUCH_LOCALE} is not installed here"), lines
    text = np.array(["élan", "monday", "Straße", "猫ab"], dtype=object)
    (got,) = ort.InferenceSession(str(served)).run(None, {"text": text})
    assert got.tolist() == ["ÉLAN", "STRAßE", "猫AB"], got  # "monday" is a stopword; towupper keeps ß


def test_an_installed_locale_and_a_model_without_strings_keep_their_file(tmp_path):
    path = normalizer(tmp_path / "model.onnx", "C")
    assert served_locale(path, read_signature(path)) == path
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    plain = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])), str(plain))
    assert served_locale(plain, read_signature(plain)) == plain
