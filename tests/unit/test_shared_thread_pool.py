"""shared_thread_pool: a static graph's bucket sessions on the process's one ONNX Runtime thread pool.

The pool is ONNX Runtime's global one, made once per process, and once it exists ONNX Runtime refuses any session
asking for a pool of its own: so the decision is tested as pure logic here, and the pool itself in a fresh Python
process (never in the test process, whose later sessions, ONNX Runtime's quantization tools among them, make their
own pools)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gebackend.compile.ort_session import shared_thread_pool
from gebackend.config.option_groups import OrtSessionOptions
from gebackend.engines import onnxruntime as ort_engine
from gebackend.engines.onnxruntime_static import _thread_pool


@pytest.mark.parametrize("options, buckets, cpu, stub, expected", [
    ({}, 4, True, True, "shared"),  # auto, in a Triton stub: shared among the buckets
    ({}, 4, True, False, "own"),  # auto elsewhere (tests, the bench in process): the process is not the instance's
    ({}, 1, True, True, "own"),  # one bucket: nothing to share
    ({}, 4, False, True, "own"),  # an accelerator's sessions keep their own
    ({"allow_spinning": "off"}, 4, True, True, "own"),  # pinned instances sharing cores: no spinning pool
    ({"force_spinning_stop": "off"}, 4, True, True, "own"),  # the user's spinning setting, kept per session
    ({"shared_thread_pool": "off"}, 4, True, True, "own"),
    ({"shared_thread_pool": "on"}, 1, True, False, "shared"),  # asked for: anywhere
])
def test_when_the_buckets_share_one_pool(options, buckets, cpu, stub, expected):
    assert _thread_pool(OrtSessionOptions(**options), buckets, cpu, stub) == expected


def test_the_test_process_has_no_shared_pool():
    """Nothing the suite loads in this process may make the global pool (later sessions here would be refused)."""
    assert not ort_engine.owns_process()
    assert shared_thread_pool() is None


def test_shared_thread_pool_is_a_backend_option():
    from gebackend.config.options import parse_options
    from gebackend.errors import ConfigError

    assert parse_options("m", {}, {"shared_thread_pool": "0"}, {}).options.session.shared_thread_pool == "off"
    assert parse_options("m", {"shared_thread_pool": "on"}, {}, {}).options.session.shared_thread_pool == "on"
    with pytest.raises(ConfigError) as error:
        parse_options("m", {}, {"shared_thread_pool": "sometimes"}, {})
    assert "shared_thread_pool" in str(error.value) and "'m'" in str(error.value)


_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import numpy as np, onnx, onnxruntime as ort
    sys.modules["triton_python_backend_utils"] = object()  # as in a Triton backend stub
    from gebackend.compile import ort_session
    from gebackend.compile.accuracy import reference_outputs
    from gebackend.modelzoo import build_resnet
    from gebackend.runtime.instance import ModelInstance, InstanceInfo

    folder = Path(sys.argv[1]) / "rs" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_resnet(), str(folder / "model.onnx"))
    plain = ort.SessionOptions()  # the reference: a session of its own, made before the pool exists
    reference = ort.InferenceSession(str(folder / "model.onnx"), plain, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in reference.get_outputs()]
    params = {"static_model": "1", "graph.ge.inputShape": "image:-1,3,64,64", "graph.ge.dynamicDims": "1;2;4;8"}
    config = {"name": "rs", "backend": "ge", "max_batch_size": 8,
              "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, 64, 64]}],
              "parameters": {k: {"string_value": v} for k, v in params.items()}}
    lines = []
    class Log:
        def info(self, m): lines.append(m)
        warn = info
    instance = ModelInstance.load(config, folder, InstanceInfo("rs_0_0"), Log(), pin=False)
    rng = np.random.default_rng(0)
    worst = 0.0
    for rows in (1, 3, 8, 2, 5):
        feeds = {"image": rng.standard_normal((rows, 3, 64, 64)).astype(np.float32)}
        got = instance.execute([feeds])[0]
        want = reference.run(outputs, feeds)
        worst = max(worst, max(float(np.abs(got[n] - w).max()) for n, w in zip(outputs, want)))
    # a session gebackend makes for itself after the pool exists (the accuracy check's) runs on it too
    again = reference_outputs(folder / "model.onnx", {"image": np.ones((1, 3, 64, 64), np.float32)})
    instance.close()
    print(json.dumps({"pool": ort_session.shared_thread_pool(), "worst": worst, "again": len(again),
                      "loaded": [l for l in lines if "loaded model.onnx" in l]}))
""")


def test_in_a_stub_the_buckets_run_on_one_shared_pool_and_answer_as_onnxruntime(tmp_path):
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["pool"] == 0  # made, at ONNX Runtime's default size (intra_op_thread_count unset)
    assert len(result["loaded"]) == 1 and "on one thread pool shared by the buckets" in result["loaded"][0]
    assert "force_spinning_stop" not in result["loaded"][0]  # the shared pool spins as ONNX Runtime's default does
    assert result["worst"] < 1e-4
    assert result["again"] >= 1
