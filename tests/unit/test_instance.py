"""runtime/instance.ModelInstance: one instance loaded from a config, a version folder and an instance name, no Triton."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gebackend.errors import ConfigError, InvalidRequest
from gebackend.modelzoo import build_add_mul
from gebackend.runtime.instance import InstanceInfo, ModelInstance


class Log:
    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warn(self, message: str) -> None:
        self.lines.append(("warn", message))


def _config(name: str, **params: str) -> dict:
    """A config as Triton hands it over once completed (the add-mul model's tensors spelled out)."""
    tensors = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("x", "y")]
    outputs = [{"name": o.name, "data_type": "TYPE_FP32", "dims": [4]} for o in build_add_mul().graph.output]
    return {"name": name, "backend": "ge", "max_batch_size": 8, "input": tensors, "output": outputs,
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            "parameters": {k: {"string_value": v} for k, v in params.items()}}


@pytest.fixture
def version_dir(tmp_path):
    folder = tmp_path / "am" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_add_mul(), str(folder / "model.onnx"))
    return folder


@pytest.mark.parametrize("params", [{}, {"static_model": "1"}])
def test_an_instance_loads_runs_a_batch_and_isolates_a_bad_request(version_dir, params):
    log = Log()
    instance = ModelInstance.load(_config("am", **params), version_dir, InstanceInfo("am_0_0"), log, pin=False)
    try:
        assert instance.heartbeat is None and instance.ledger is None  # not under gebackend serve
        loaded = [m for level, m in log.lines if "instance 'am_0_0' loaded model.onnx" in m]
        assert len(loaded) == 1 and ("static graph" if params else "dynamic graph") in loaded[0]
        rng = np.random.default_rng(0)
        good = {"x": rng.standard_normal((2, 4)).astype(np.float32), "y": rng.standard_normal((2, 4)).astype(np.float32)}
        bad = {"x": np.zeros((1, 5), np.float32), "y": np.zeros((1, 5), np.float32)}
        results = instance.execute([good, bad, good])
        names = [o.name for o in build_add_mul().graph.output]
        want = ort.InferenceSession(str(version_dir / "model.onnx")).run(names, good)
        for result in (results[0], results[2]):
            for name, expected in zip(names, want):
                np.testing.assert_allclose(result[name], expected, rtol=1e-6)
        assert isinstance(results[1], InvalidRequest) and "'am'" in str(results[1])
    finally:
        instance.close()


def test_a_bad_option_fails_the_load_naming_the_model_and_the_key(version_dir):
    with pytest.raises(ConfigError) as error:
        ModelInstance.load(_config("am", static_model="perhaps"), version_dir, InstanceInfo("am_0_0"), Log(), pin=False)
    assert "static_model" in str(error.value) and "'am'" in str(error.value)


def test_a_load_holds_the_servers_timing_lock_shared_until_it_ends(version_dir, tmp_path, monkeypatch):
    """No other instance times its buckets while this one loads (control/timing_lock.py); once loaded, it may."""
    import fcntl

    from gebackend.control import timing_lock
    from gebackend.control.env import CONTROL_DIR
    from gebackend.runtime import instance as instance_module

    control = tmp_path / "control"
    monkeypatch.setenv(CONTROL_DIR, str(control))
    real = instance_module.load_executor
    seen = []

    def exclusive_refused() -> bool:
        with open(control / timing_lock.LOCK, "a") as other:  # another instance's timing, as flock sees it
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    def spying(*args, **kwargs):
        seen.append(exclusive_refused())
        return real(*args, **kwargs)

    monkeypatch.setattr(instance_module, "load_executor", spying)
    instance = ModelInstance.load(_config("am"), version_dir, InstanceInfo("am_0_0"), Log(), pin=False)
    try:
        assert seen == [True]  # while loading: another instance's timing would wait
        assert not exclusive_refused()  # loaded: nothing held
    finally:
        instance.close()
