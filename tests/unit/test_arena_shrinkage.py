"""`memory.enable_memory_arena_shrinkage` (config/arena_shrinkage.py), Triton's onnxruntime backend's key: parsed,
narrowed to the arenas a session has (the peer fails every run otherwise), and carried by every ONNX Runtime run of
both graph modes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from gebackend.config.options import parse_options
from gebackend.config.arena_shrinkage import RUN_CONFIG_KEY, run_entries
from gebackend.errors import ConfigError
from gebackend.modelzoo import build_add_mul


def test_the_key_parses_as_the_peer_writes_it_and_refuses_what_onnx_runtime_cannot_read():
    parsed = parse_options("m", {}, {RUN_CONFIG_KEY: " CPU:0 ; gpu:1 "})
    assert parsed.options.session.arena_shrinkage == "cpu:0;gpu:1" and parsed.unknown == ()
    with pytest.raises(ConfigError, match=rf"model 'm'.*{RUN_CONFIG_KEY}.*'bogus'.*expected device:id entries"):
        parse_options("m", {}, {RUN_CONFIG_KEY: "bogus"})


def test_entries_without_an_arena_are_dropped_saying_why():
    assert run_entries("cpu:0", True, None) == ({RUN_CONFIG_KEY: "cpu:0"}, f"{RUN_CONFIG_KEY}=cpu:0")
    assert run_entries("cpu:0;gpu:0", True, 0)[0] == {RUN_CONFIG_KEY: "cpu:0;gpu:0"}
    assert run_entries("cpu:0;gpu:0", True, None) == (
        {RUN_CONFIG_KEY: "cpu:0"}, f"{RUN_CONFIG_KEY}=cpu:0 (gpu:0 dropped: this session runs on the CPU only)")
    assert run_entries("cpu:0;gpu:1", False, 0) == ({}, f"{RUN_CONFIG_KEY}=none (cpu:0 dropped: enable_mem_arena is "
                                                        f"off; gpu:1 dropped: this session's device is gpu:0)")
    assert run_entries("", True, None) == ({}, "")


def load_add_mul(tmp_path, params: dict[str, str]):
    """(executor, load line) of the add/mul model with these config.pbtxt parameters, max_batch_size 8."""
    from gebackend.config.onnx_signature import read_signature
    from gebackend.config.spec import build_model_spec
    from gebackend.runtime.loader import load_executor

    path = tmp_path / "am" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build_add_mul(), str(path))
    tensors = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("x", "y")]
    config = {"name": "am", "max_batch_size": 8, "input": tensors}
    return load_executor(build_model_spec(config, read_signature(path), path, parse_options("am", {}, params).options))


@pytest.mark.parametrize("static", [False, True])
def test_every_run_carries_the_entry_and_answers_the_same(tmp_path, static):
    params = {RUN_CONFIG_KEY: "cpu:0;gpu:0", **({"static_model": "1"} if static else {})}
    executor, how = load_add_mul(tmp_path, params)
    assert f"{RUN_CONFIG_KEY}=cpu:0 (gpu:0 dropped: this session runs on the CPU only)" in how, how
    engine = executor.runner.engines()[0]
    runs = [b.run_options for b in engine._swap.serving.values()] if static else [engine.run_options]
    assert runs and {run.get_run_config_entry(RUN_CONFIG_KEY) for run in runs} == {"cpu:0"}
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    if not static:  # the options reach the run itself (the static graph's bound runs carry theirs: ort_binding.py)
        session, passed = engine._swap.serving, []
        real_run = session.run
        session.run = lambda names, feeds, options=None: passed.append(options) or real_run(names, feeds, options)
    got = executor.execute([{"x": x, "y": x}])[0]
    if not static:
        assert [o.get_run_config_entry(RUN_CONFIG_KEY) for o in passed] == ["cpu:0"]
    plain = load_add_mul(tmp_path, {k: v for k, v in params.items() if k != RUN_CONFIG_KEY})[0]
    want = plain.execute([{"x": x, "y": x}])[0]
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
