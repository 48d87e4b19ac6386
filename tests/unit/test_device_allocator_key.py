"""`session.use_device_allocator_for_initializers`, Triton's onnxruntime backend's `parameters` key since 2025: parsed
as a boolean, handed to every ONNX Runtime session of both graph modes as the session config entry, said in the
load line, and the answers unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from gebackend.config.options import parse_options
from gebackend.engines.onnxruntime import DEVICE_ALLOCATOR_KEY
from gebackend.errors import ConfigError
from tests.unit.test_arena_shrinkage import load_add_mul


@pytest.mark.parametrize("text, want", [("1", "1"), ("true", "1"), (" On ", "1"), ("0", "0"), ("false", "0")])
def test_the_key_parses_as_a_boolean_entry(text, want):
    parsed = parse_options("m", {}, {DEVICE_ALLOCATOR_KEY: text})
    assert parsed.options.session.device_allocator_for_initializers == want and parsed.unknown == ()


def test_a_value_that_is_no_boolean_fails_naming_the_model_and_key():
    with pytest.raises(ConfigError, match=rf"model 'm': option {DEVICE_ALLOCATOR_KEY}='maybe'.*expected one of"):
        parse_options("m", {}, {DEVICE_ALLOCATOR_KEY: "maybe"})


def test_unset_leaves_onnx_runtime_its_default():
    from gebackend.engines.onnxruntime import session_options

    so = session_options(parse_options("m", {}, {}).options.session)
    with pytest.raises(RuntimeError, match="does not have configuration with key"):  # not set: ORT's default, off
        so.get_session_config_entry(DEVICE_ALLOCATOR_KEY)


@pytest.mark.parametrize("static", [False, True])
def test_every_session_gets_the_entry_and_answers_the_same(tmp_path, static):
    params = {DEVICE_ALLOCATOR_KEY: "true", **({"static_model": "1"} if static else {})}
    executor, how = load_add_mul(tmp_path, params)
    assert f"{DEVICE_ALLOCATOR_KEY}=1" in how, how
    engine = executor.runner.engines()[0]
    sessions = [b.session for b in engine._swap.serving.values()] if static else [engine._swap.serving]
    assert sessions and {s.get_session_options().get_session_config_entry(DEVICE_ALLOCATOR_KEY)
                         for s in sessions} == {"1"}
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = executor.execute([{"x": x, "y": x + 1}])[0]
    np.testing.assert_array_equal(got["sum"], x + x + 1)
    np.testing.assert_array_equal(got["product"], x * (x + 1))
