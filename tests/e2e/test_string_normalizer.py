"""A scikit-learn style text model (ONNX's StringNormalizer) served through the real server whatever locales this
machine has: ONNX Runtime fails such a load when the node's locale (by default en_US.UTF-8) is not installed, as it
is not in slim images; `ge` serves it with C.UTF-8 and says so (config/normalizer_locale.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from gebackend.config.normalizer_locale import FALLBACK_LOCALE, ORT_DEFAULT_LOCALE, locale_installed
from gebackend.modelzoo.misc import build_string_normalizer

from .server import start_server

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not locale_installed(FALLBACK_LOCALE), reason="this C library has no C.UTF-8")]

NO_SUCH_LOCALE = "xx_NOWHERE.UTF-8"
TEXT = np.array(["élan", "Monday", "straße", "猫ab"], dtype=object)
WANT = ["ÉLAN", "STRAßE", "猫AB"]  # "monday" is a stopword (case-insensitive)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("norm")
    for name, locale in (("norm_default", None), ("norm_missing", NO_SUCH_LOCALE)):
        (root / "models" / name / "1").mkdir(parents=True)
        onnx.save(build_string_normalizer(locale, case_sensitive=False), str(root / "models" / name / "1" / "model.onnx"))
        (root / "models" / name / "config.pbtxt").write_text('backend: "ge"\n')
    running = start_server(root / "models", root / "serve.log")
    yield running
    running.stop()


def _normalize(client, model):
    tensor = httpclient.InferInput("text", [4], "BYTES")
    tensor.set_data_from_numpy(TEXT)
    result = client.infer(model, [tensor])
    return [v.decode() for v in result.as_numpy("normalized")]


def test_a_normalizer_answers_whatever_locales_are_installed(server):
    client = httpclient.InferenceServerClient(server.http_url)
    for model in ("norm_default", "norm_missing"):
        assert _normalize(client, model) == WANT, model
    client.close()
    log = server.output()
    said = f"StringNormalizer locale {NO_SUCH_LOCALE} is not installed here"
    assert said in log
    # the default locale is replaced only where this machine lacks it
    default_replaced = f"StringNormalizer locale {ORT_DEFAULT_LOCALE} is not installed here" in log
    assert default_replaced == (not locale_installed(ORT_DEFAULT_LOCALE)), log[-2000:]
