"""The ONNX Runtime static engine's graph files (engines/static_weights.py): the weights the buckets share are written
once, to one file every bucket's graph names as external data; the graphs hold only their own; a session built from
a graph file alone (no weights handed in) answers as the model does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from gebackend.compile.pipeline import compile_static
from gebackend.config.options import BackendOptions
from gebackend.engines.onnxruntime_static import OrtStaticEngine
from gebackend.engines.static_weights import ALIGN, WEIGHTS_FILE
from gebackend.modelzoo import build_bert


def test_shared_weights_are_written_once_and_every_graph_file_runs_on_its_own(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_bert(hidden=64), str(path))
    shapes = [{"input_ids": (b, 16), "attention_mask": (b, 16)} for b in (1, 2, 4)]
    graphs, _ = compile_static(path, shapes, 1 << 20)
    engine = OrtStaticEngine(graphs, BackendOptions(), temp_parent=tmp_path)
    try:
        (workdir,) = [p for p in tmp_path.iterdir() if p.name.startswith("gebackend-static-")]
        weights = workdir / WEIGHTS_FILE
        shared = engine.shared_weight_bytes
        assert shared > 200_000
        count = len(engine._shared)
        assert shared <= weights.stat().st_size <= shared + count * ALIGN  # each once, page-aligned
        files = sorted(workdir.glob("static*.onnx"))
        assert len(files) == 3 and all(f.stat().st_size < shared // 4 for f in files)
        rng = np.random.default_rng(0)
        plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in plain.get_outputs()]
        for number, (graph_file, bucket) in enumerate(zip(files, shapes)):
            feeds = {"input_ids": rng.integers(0, 1000, bucket["input_ids"], dtype=np.int64),
                     "attention_mask": np.ones(bucket["attention_mask"], np.int64)}
            want = plain.run(names, feeds)
            alone = ort.InferenceSession(str(graph_file), providers=["CPUExecutionProvider"])  # weights from the file
            for got in (alone.run(names, feeds), engine.run(feeds, names)):
                for g, w in zip(got, want):
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    finally:
        engine.close()
