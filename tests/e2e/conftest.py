"""Fixtures that build a model repository and serve it through the real CLI and tritonserver."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

from gebackend.modelzoo import build_add_mul, build_bert, build_example_repository, build_row_scale

from .server import start_server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "model_repository"

ADD_MUL_CONFIG = """
backend: "ge"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""

# The config contradicts the ONNX file: x is FP32 there.
CONTRADICTS_CONFIG = """
backend: "ge"
max_batch_size: 4
input [ { name: "x", data_type: TYPE_INT32, dims: [ 4 ] } ]
"""


def add_model(repo: Path, name: str, config: str, model: onnx.ModelProto | bytes) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    path = version / "model.onnx"
    if isinstance(model, bytes):
        path.write_bytes(model)
    else:
        onnx.save(model, str(path))
    return path


def params(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())


BERT_BUCKETS = {
    "graph.ge.inputShape": "input_ids:-1,-1;attention_mask:-1,-1",
    "graph.ge.dynamicDims": "1,16,1,16;4,16,4,16;4,32,4,32",
}

# Twins of the example models in the other graph mode: static outputs must equal dynamic ones.
TWINS = {
    "resnet_ge_static": ("resnet_ge", 'backend: "ge"\nmax_batch_size: 8\n' + params(static_model="1")),
    "bert_ge_static": ("bert_ge", 'backend: "ge"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100000 }\n'
                       + params(static_model="1", bucket_paddable_dims="sequence", **BERT_BUCKETS)),
    "resnet_npu_ge_dynamic": ("resnet_npu_ge", 'backend: "npu_ge"\nmax_batch_size: 8\n' + params(static_model="0")),
    # buckets 2 and 4 only: a batch of 1 padded to 2 does twice a row's compute, which the dynamic graph does not
    "resnet_ge_static_gaps": ("resnet_ge", 'backend: "ge"\nmax_batch_size: 4\n' + params(
        static_model="1", **{"graph.ge.inputShape": "image:-1,3,64,64", "graph.ge.dynamicDims": "2;4"})),
    "bert_ge_fallback": ("bert_ge", 'backend: "ge"\nmax_batch_size: 4\n' + params(
        bucket_fallback="dynamic", **{"graph.ge.inputShape": "input_ids:-1,16;attention_mask:-1,16", "graph.ge.dynamicDims": "1,1;4,4"})),
}


# A [batch]-only input, as Triton users declare it for the onnxruntime backend: dims [1], reshaped away.
ROW_SCALE_CONFIG = """
backend: "ge"
max_batch_size: 8
input [ { name: "scale", data_type: TYPE_FP32, dims: [ 1 ], reshape: { shape: [ ] } } ]
"""


@pytest.fixture(scope="session")
def repository(tmp_path_factory) -> Path:
    """The example repository plus test models: one that batches slowly, one broken file, one bad config."""
    repo = tmp_path_factory.mktemp("repo") / "models"
    shutil.copytree(EXAMPLES, repo, ignore=shutil.ignore_patterns("[0-9]*"))
    build_example_repository(repo)
    add_model(repo, "add_mul", ADD_MUL_CONFIG, build_add_mul())
    add_model(repo, "broken", 'backend: "ge"\nmax_batch_size: 4\n', b"this is not an onnx file")
    add_model(repo, "contradicts", CONTRADICTS_CONFIG, build_add_mul())
    # bucket_plan=buckets: the profiling test counts the runs of one compiled shape, which the default plan may give
    # to the dynamic graph where that was timed faster at load (this tiny BERT: batch 1 by 8-13 % on an AVX2 EPYC)
    add_model(repo, "bert_profiled", 'backend: "ge"\nmax_batch_size: 4\n' + params(
        static_model="1", bucket_paddable_dims="sequence", bucket_plan="buckets", profiling="dynamic", dump_graph="1",
        profiling_dir=str(repo.parent / "dumps"), **BERT_BUCKETS), build_bert())
    add_model(repo, "resnet_profiled", 'backend: "ge"\nmax_batch_size: 8\n' + params(profiling="dynamic"),
              onnx.load(str(repo / "resnet_ge" / "1" / "model.onnx")))
    add_model(repo, "row_scale", ROW_SCALE_CONFIG, build_row_scale())
    add_model(repo, "row_scale_auto", 'backend: "ge"\nmax_batch_size: 8\n', build_row_scale())
    add_model(repo, "bert_static_unresolved", 'backend: "ge"\n' + params(static_model="1"), build_bert())
    for twin, (original, config) in TWINS.items():
        add_model(repo, twin, config, onnx.load(str(repo / original / "1" / "model.onnx")))
    return repo


@pytest.fixture(scope="session")
def server(repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    running = start_server(
        repository, log,
        ["--backend-config", "ge,intra_op_thread_count=2", "--backend-config", "ge,not_a_real_option=3"],
    )
    yield running
    running.stop()
