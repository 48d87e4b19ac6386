"""The scenarios `gebackend bench` measures: each one a generated Triton model repository (config.pbtxt + files).

The ladder, each rung adding one thing to the one before:
  naive          a plain Triton Python-backend model wrapping a default onnxruntime session (naive_model.py)
  ge_dynamic     backend "ge", dynamic graph, the defaults (dynamic batching switched on, no queue delay)
  ge_static      + static_model=1 with batch buckets (graph.ge.inputShape / graph.ge.dynamicDims)
  ge_batching    + dynamic_batching with preferred_batch_size aligned with the buckets and a small queue delay
  ge_pinned      + 2 instances, each pinned to its own cores (cores_per_instance) with 1 engine thread
  ge_bf16        + engine=openvino, precision_mode=bf16
  ge_int8        + precision_mode=int8 (ONNX Runtime dynamic quantization)
Side scenarios: ge_openvino (ge_batching on the OpenVINO engine, fp32), ge_delay_2ms (ge_dynamic with a
2 ms max_queue_delay: the low-concurrency batching-delay trap of docs/tuning.md), ge_dyn_batching /
ge_dyn_pinned (the batching and pinned rungs on the dynamic graph), ge_dyn_lend (ge_dyn_pinned with
lend_idle_cores), and ge_int8_static / ge_openvino_int8 (ge_pinned with static, calibrated int8: ONNX Runtime's
QDQ, and NNCF's QDQ on OpenVINO).

The peer (gebackend.bench.peer; only where Triton's C++ onnxruntime backend is installed, nothing of it is shipped):
  peer           the same model and ONNX file on Triton's onnxruntime backend: 1 instance, no dynamic batching
  peer_batching  the same with ge_dyn_batching's dynamic batching (preferred 2/4/8, 100 us delay)
  peer_default_instances  peer_batching without instance_group: Triton's default count, 2 CPU instances for it
Every scenario's throughput is reported over the peer's at the same concurrency (report.peer_ratios).

Any ge scenario followed by `+ensemble` (e.g. `ge_bf16+ensemble`) serves a CN_CLIP encoder model as that
scenario inside its CN_CLIP ensemble (bytes or text -> preprocessing -> encoder, which also gives the
L2-normalised features) and measures the ensemble next to the bare encoder in the same server
(gebackend.bench.ensemble and ensemble_runner).

A scenario that needs a feature this installation lacks is reported as "not available" instead of failing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from gebackend.modelzoo.bench_models import BenchModel
from gebackend.config import dtypes
from gebackend.config.onnx_signature import Signature, read_signature
from gebackend.config import engine_names

BUCKETS = (1, 2, 4, 8)
PEER_BACKEND = "onnxruntime"  # gebackend.bench.peer.BACKEND (not imported: this module stays import-light)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    backend: str = "ge"  # "ge", "python" (the naive baseline) or "onnxruntime" (the peer: Triton's C++ backend)
    static: bool = False
    buckets: tuple[int, ...] = ()
    dynamic_batching: bool = True  # ge: Triton's dynamic batcher (the backend switches it on by default too)
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instances: int = 1  # 0: no instance_group in config.pbtxt, so Triton's default count for the backend
    cores_per_instance: int = 0
    intra_op_threads: int = 0
    engine: str = engine_names.DEFAULT
    precision: str = "origin"
    quantization: str = ""  # precision int8: the `quantization` option ("" leaves it to the backend: auto)
    requires: tuple[str, ...] = ()  # features: "openvino", "precision", "int8", "nncf", "pinning", "peer"
    notes: str = ""
    ensemble: bool = False  # served as the encoder of the model's CN_CLIP ensemble (`NAME+ensemble`)
    trim_padding: bool = False  # ge: trim_padding on the model's token-id input (models without one: not available)
    options: tuple[tuple[str, str], ...] = ()  # ge: further backend options, as config.pbtxt parameters

    @property
    def is_ge(self) -> bool:
        return self.backend not in ("python", PEER_BACKEND)

    @property
    def is_peer(self) -> bool:
        return self.backend == PEER_BACKEND


def _ladder() -> list[Scenario]:
    naive = Scenario("naive", "naive Python backend (default onnxruntime session)", backend="python",
                     dynamic_batching=False)
    dynamic = Scenario("ge_dynamic", "ge dynamic graph (defaults)")
    static = replace(dynamic, name="ge_static", title="ge static graph, buckets 1/2/4/8", static=True, buckets=BUCKETS)
    batching = replace(static, name="ge_batching", title="+ dynamic batching (preferred 2/4/8, 100 us delay)",
                       preferred_batch_sizes=(2, 4, 8), max_queue_delay_us=100)
    pinned = replace(batching, name="ge_pinned", title="+ 2 pinned instances x 1 core", instances=2,
                     cores_per_instance=1, intra_op_threads=1, requires=("pinning",))
    bf16 = replace(pinned, name="ge_bf16", title="+ OpenVINO bf16", engine="openvino", precision="bf16",
                   requires=("pinning", "openvino", "precision"))
    int8 = replace(pinned, name="ge_int8", title="+ int8 (onnxruntime dynamic quantization)", precision="int8",
                   requires=("pinning", "precision", "int8"))
    openvino = replace(batching, name="ge_openvino", title="ge_batching on OpenVINO (fp32)", engine="openvino",
                       requires=("openvino",))
    delay = replace(dynamic, name="ge_delay_2ms", title="ge dynamic + 2 ms max_queue_delay (no preferred sizes)",
                    max_queue_delay_us=2000)
    # The same rungs on the dynamic graph, for models whose static compile fails or does not pay.
    dyn_batching = replace(dynamic, name="ge_dyn_batching", title="ge dynamic + dynamic batching (preferred 2/4/8, 100 us delay)",
                           preferred_batch_sizes=(2, 4, 8), max_queue_delay_us=100)
    dyn_pinned = replace(dyn_batching, name="ge_dyn_pinned", title="ge dynamic + batching + 2 pinned instances x 1 core",
                         instances=2, cores_per_instance=1, intra_op_threads=1, requires=("pinning",))
    # Static (calibrated, seeded random samples) int8 beside the ladder's dynamic int8: ONNX Runtime's QDQ, and NNCF's
    # QDQ run by OpenVINO (which has no dynamic int8)
    int8_static = replace(int8, name="ge_int8_static", title="ge_pinned + int8 static (onnxruntime QDQ, calibrated)",
                          quantization="static")
    openvino_int8 = replace(pinned, name="ge_openvino_int8", title="ge_pinned on OpenVINO + int8 static (NNCF QDQ)",
                            engine="openvino", precision="int8", quantization="static",
                            requires=("pinning", "openvino", "precision", "int8", "nncf"))
    # Text encoders: each batch cut to its longest text (trim_padding); the bench's inputs decide what there is to cut
    # (--texts captions: real Chinese captions padded to the context, as the tokenizer sends them)
    trim = replace(dynamic, name="ge_trim", title="ge dynamic + trim_padding (each batch cut to its longest text)",
                   trim_padding=True)
    trim_pinned = replace(dyn_pinned, name="ge_trim_pinned", title="ge_dyn_pinned + trim_padding", trim_padding=True)
    int8_trim = replace(dyn_pinned, name="ge_int8_trim", title="ge_dyn_pinned + int8 (onnxruntime dynamic) + trim_padding",
                        precision="int8", trim_padding=True, requires=("pinning", "precision", "int8"))
    # The static graph's buckets each on a thread pool of their own, spinning only within a run (the default before
    # shared_thread_pool), beside ge_static's one pool shared by the buckets
    own_pools = replace(static, name="ge_static_own_pools", title="ge_static, a thread pool per bucket (shared_thread_pool=off)",
                        options=(("shared_thread_pool", "off"),))
    # The static graph kept to its buckets (pad or split, measured), beside ge_static, which also runs a batch size on
    # the dynamic graph where that was measured faster at load
    buckets_only = replace(static, name="ge_static_buckets_only",
                           title="ge_static, buckets only (bucket_plan=buckets: no batch size on the dynamic graph)",
                           options=(("bucket_plan", "buckets"),))
    # The pinned instances lending their idle cores to each other (runtime/lending.py); alone among pinned scenarios in
    # an --interleave server, or the ledger makes their cores shared and they lend nothing
    lend = replace(dyn_pinned, name="ge_dyn_lend", options=(("lend_idle_cores", "on"),),
                   title="ge_dyn_pinned + lend_idle_cores (a batch runs on an idle sibling's core too)")
    return [naive, dynamic, static, batching, pinned, bf16, int8, openvino, delay, dyn_batching, dyn_pinned,
            int8_static, openvino_int8, trim, trim_pinned, int8_trim, own_pools, buckets_only, lend]


def _peers(batching: Scenario) -> list[Scenario]:
    """The peer, Triton's C++ onnxruntime backend, configured as the comparable rungs are (same model and ONNX file)."""
    peer = Scenario("peer", "Triton's onnxruntime backend (C++), 1 instance, no dynamic batching", backend=PEER_BACKEND,
                    dynamic_batching=False, requires=("peer",))
    peer_batching = replace(peer, name="peer_batching", dynamic_batching=True,
                            title="Triton's onnxruntime backend + dynamic batching (preferred 2/4/8, 100 us delay)",
                            preferred_batch_sizes=batching.preferred_batch_sizes,
                            max_queue_delay_us=batching.max_queue_delay_us)
    # A config without instance_group, as many of the backend's users write it: Triton gives the onnxruntime backend
    # 2 CPU instances by default (1 to a Python-based backend such as ge), each with ONNX Runtime's default threads
    peer_default = replace(peer_batching, name="peer_default_instances", instances=0,
                           title="peer_batching without instance_group (Triton's default for this backend: 2 CPU instances)")
    return [peer, peer_batching, peer_default]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in _ladder()}  # ours (ge and the naive baseline)
# The peer's scenarios, apart from ours: they run only where the peer is found (gebackend.bench.peer).
PEERS: dict[str, Scenario] = {s.name: s for s in _peers(SCENARIOS["ge_dyn_batching"])}
LADDER = ("naive", "ge_dynamic", "ge_static", "ge_batching", "ge_pinned", "ge_bf16", "ge_int8")
PEER_SCENARIOS = ("peer", "peer_batching")  # run beside the ladder by default where the peer is found


# ----------------------------------------------------------------------------------------- features
def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _source_mentions(text: str, folders: Sequence[str] = ("engines", "compile", "runtime")) -> bool:
    for folder in folders:
        for path in (_package_root() / folder).glob("*.py"):
            try:
                if text in path.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def feature_missing(feature: str, peer_dir: Path | None = None) -> str | None:
    """Why `feature` is not available here, or None when it is (`peer_dir`: --peer-backend-dir, for "peer")."""
    if feature == "openvino":
        if importlib.util.find_spec("openvino") is None:
            return "the openvino package is not installed"
        if importlib.util.find_spec("gebackend.engines.openvino") is None:
            return "gebackend has no OpenVINO engine yet (gebackend/engines/openvino.py)"
        return None
    if feature == "precision":
        if not _source_mentions("precision_mode"):
            return "no engine reads precision_mode yet (the option parses, but nothing lowers precision)"
        return None
    if feature == "int8":
        if importlib.util.find_spec("onnxruntime.quantization") is None:
            return "onnxruntime.quantization is not installed"
        if not _source_mentions("quantiz"):
            return "gebackend does not quantize to int8 yet"
        return None
    if feature == "nncf":
        if importlib.util.find_spec("nncf") is None:
            return "nncf is not installed (OpenVINO's static int8 quantizer)"
        return None
    if feature == "pinning":
        if importlib.util.find_spec("gebackend.runtime.pinning") is None:
            return "gebackend.runtime.pinning is not there yet"
        return None
    if feature == "peer":
        from gebackend.bench import peer

        return peer.missing(peer_dir)
    return f"unknown feature {feature!r}"


def availability(scenario: Scenario, peer_dir: Path | None = None, model: BenchModel | None = None
                 ) -> tuple[Scenario, str | None]:
    """The scenario to run (pinning falls back to unpinned instances) and why it cannot run, if it cannot (on `model`,
    when given: trim_padding needs a token-id input)."""
    if scenario.trim_padding and model is not None and model.token_input is None:
        return scenario, f"not available: trim_padding cuts token ids, and {model.name} has no integer input"
    for feature in scenario.requires:
        reason = feature_missing(feature, peer_dir) if feature == "peer" else feature_missing(feature)
        if reason is None:
            continue
        if feature == "pinning":
            # Two instances without pinning still measure something real; say so in the title.
            scenario = replace(scenario, cores_per_instance=0,
                               title=scenario.title.replace("pinned instances", "instances (NOT pinned)"),
                               notes=f"not pinned: {reason}")
            continue
        return scenario, f"not available: {reason}"
    return scenario, None


# ------------------------------------------------------------------------------------------- configs
def _triton_type(numpy_dtype: str) -> str:
    import numpy as np
    from onnx import helper

    return dtypes.from_onnx(helper.np_dtype_to_tensor_dtype(np.dtype(numpy_dtype))).triton


def _dims_text(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _output_dims(signature: Signature) -> list[tuple[str, str, list[int]]]:
    out = []
    for t in signature.outputs:
        dims = [d if isinstance(d, int) else -1 for d in t.shape[1:]]
        out.append((t.name, t.dtype.triton, dims))
    return out


def bucket_parameters(model: BenchModel, buckets: Sequence[int]) -> dict[str, str]:
    """ge-backend's shape buckets over the batch dim: graph.ge.inputShape and graph.ge.dynamicDims."""
    shape = ";".join(f"{i.name}:-1,{','.join(str(d) for d in i.dims)}" for i in model.inputs)
    dims = ";".join(",".join([str(b)] * len(model.inputs)) for b in buckets)
    return {"graph.ge.inputShape": shape, "graph.ge.dynamicDims": dims}


def peer_parameters(scenario: Scenario) -> dict[str, str]:
    """The onnxruntime backend's own parameters (its names, not ours); none by default: ONNX Runtime's defaults."""
    return {"intra_op_thread_count": str(scenario.intra_op_threads)} if scenario.intra_op_threads else {}


def parameters(model: BenchModel, scenario: Scenario) -> dict[str, str]:
    if scenario.is_peer:
        return peer_parameters(scenario)
    if not scenario.is_ge:
        return {}
    params: dict[str, str] = {}
    if scenario.static:
        params["static_model"] = "1"
        if scenario.buckets:
            params.update(bucket_parameters(model, scenario.buckets))
    if scenario.intra_op_threads:
        params["intra_op_thread_count"] = str(scenario.intra_op_threads)
    if scenario.cores_per_instance:
        params["cores_per_instance"] = str(scenario.cores_per_instance)
    if scenario.engine != engine_names.DEFAULT:
        params["engine"] = scenario.engine
    if scenario.precision != "origin":
        params["precision_mode"] = scenario.precision
    if scenario.quantization:
        params["quantization"] = scenario.quantization
    if scenario.trim_padding and model.token_input is not None:
        params["trim_padding"] = model.token_input
    params.update(scenario.options)
    return params


def config_text(model: BenchModel, scenario: Scenario, signature: Signature) -> str:
    """config.pbtxt for `model` served as `scenario` (inputs and outputs spelled out)."""
    lines = [
        f"# generated by gebackend bench: scenario {scenario.name} ({scenario.title})",
        f'name: "{model.name}"',
        f'backend: "{scenario.backend}"',
        f"max_batch_size: {model.max_batch_size}",
        "input [",
    ]
    entries = [f'  {{ name: "{i.name}", data_type: {_triton_type(i.dtype)}, dims: {_dims_text(i.dims)} }}'
               for i in model.inputs]
    lines.append(",\n".join(entries))
    lines.append("]")
    lines.append("output [")
    lines.append(",\n".join(f'  {{ name: "{n}", data_type: {t}, dims: {_dims_text(d)} }}' for n, t, d in _output_dims(signature)))
    lines.append("]")
    if scenario.instances:
        lines.append(f"instance_group [ {{ kind: KIND_CPU, count: {scenario.instances} }} ]")
    if scenario.dynamic_batching and scenario.backend != "python":
        body = []
        if scenario.preferred_batch_sizes:
            body.append(f"  preferred_batch_size: [ {', '.join(str(b) for b in scenario.preferred_batch_sizes)} ]")
        body.append(f"  max_queue_delay_microseconds: {scenario.max_queue_delay_us}")
        lines += ["dynamic_batching {", *body, "}"]
    for key, value in parameters(model, scenario).items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def _link(source: Path, target: Path) -> None:
    if target.exists() or target.is_symlink():
        target.unlink()
    try:
        os.symlink(source.resolve(), target)
    except OSError:
        shutil.copy2(source, target)


def write_repository(root: Path, model: BenchModel, scenario: Scenario, onnx_path: Path) -> Path:
    """`root/<model>/config.pbtxt` and `root/<model>/1/model.onnx` (a link to the cache); returns `root`."""
    model_dir = root / model.name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    _link(onnx_path, version / "model.onnx")
    data = onnx_path.with_name(onnx_path.name + ".data")
    if data.is_file():
        _link(data, version / data.name)
    if scenario.backend == "python":
        shutil.copyfile(Path(__file__).with_name("naive_model.py"), version / "model.py")
    (model_dir / "config.pbtxt").write_text(config_text(model, scenario, read_signature(onnx_path)))
    return root


ENSEMBLE_SUFFIX = "+ensemble"


def as_ensemble(scenario: Scenario) -> Scenario:
    """`scenario` with the encoder served inside its CN_CLIP ensemble, measured next to the bare encoder."""
    return replace(scenario, name=scenario.name + ENSEMBLE_SUFFIX, ensemble=True,
                   title=f"CN_CLIP ensemble around the encoder as {scenario.name} ({scenario.title})")


def select(names: Sequence[str]) -> list[Scenario]:
    """The scenarios named; `NAME+ensemble` is ge scenario NAME as the encoder of the model's CN_CLIP ensemble."""
    known = {**SCENARIOS, **PEERS}
    chosen, unknown = [], []
    for name in names:
        base = name.removesuffix(ENSEMBLE_SUFFIX)
        if base not in known:
            unknown.append(name)
        elif base != name and not known[base].is_ge:
            raise ValueError(f"{name}: only ge scenarios can be the encoder of an ensemble ({base} is not one)")
        else:
            chosen.append(as_ensemble(known[base]) if base != name else known[base])
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)} "
                         f"(each ge one also as NAME{ENSEMBLE_SUFFIX})")
    return chosen


__all__ = ["BUCKETS", "ENSEMBLE_SUFFIX", "LADDER", "PEERS", "PEER_BACKEND", "PEER_SCENARIOS", "SCENARIOS", "Scenario",
           "as_ensemble", "availability", "config_text", "feature_missing", "parameters", "peer_parameters", "select",
           "write_repository"]
