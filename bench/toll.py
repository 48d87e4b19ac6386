"""The Python backend's toll: where one request's time goes between Triton and the engine, layer by layer.

One server, one run, every layer measured in the same interleaved rounds (concurrency 1, batch 1, gRPC; with
`--batch B`, B requests sent together and the dynamic batcher holding each model's execute until it has B, so
every execute carries B requests: what the toll of a batch is, and whether it is paid per execute or per request):

  null        a Python-backend model that returns precomputed outputs: Triton core + gRPC + the backend stub's
              shared-memory round trip + pb_utils tensors, and no work (the transport floor of any Python model)
  naive       the 30-line Python model (gebackend.bench.naive_model): a default onnxruntime session per request
  ge_dynamic  backend "ge", defaults (dynamic graph, dynamic batching on)
  ge_1thread  the same with intra_op_thread_count=1 (no intra-op thread pool)
  ge_nospin   the same with allow_spinning=off (the pool's threads sleep between runs instead of spinning)
  ge_static   backend "ge", static_model=1 with batch buckets 1/2/4/8
  peer        Triton's C++ onnxruntime backend on the same ONNX file, where one is installed or built (`make peer`,
              --peer-backend-dir; gebackend.bench.peer): the yardstick, with no stub in between

For each: the client's p50 (tritonclient gRPC, one request at a time) and, from Triton's per-model statistics
(gebackend.bench.triton_stats), the server's compute_infer per request (the Python backend's execute round trip as
Triton times it). In the bench process, the same ge configs loaded as the backend loads them
(runtime.instance.ModelInstance): the engine call alone, the runner (routing, padding), and the instance's
execute (validation, grouping, heartbeat). The differences are the toll of each layer:

  stub transport   null's compute_infer            (Triton -> stub -> Triton, pb_utils tensors)
  ours (bridge)    ge compute_infer - null compute_infer - instance.execute
  ours (instance)  instance.execute - engine

Where the peer ran, each row also says how far its client p50 and its compute_infer are from the peer's: what the
issue's "p50 within the peer's + 0.2 ms" is measured on, split into the layers above.

With `--batch B` the server-side times are per execute (a batch of B requests: Triton counts a batch's compute once
for each of its requests), the in-process ones are the engine's and the runner's run of B rows and the instance's
execute of B requests, and the report says how many requests an execute carried.

Writes toll.json, toll.md and toll.png into --out and prints the table. Never asserted anywhere: read as ratios.

    .venv/bin/python bench/toll.py [--models tiny,resnet_small] [--rounds 5] [--requests 300] [--out bench/results/toll]
                                   [--peer-backend-dir DIR] [--batch B]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from gebackend.bench import peer as bench_peer
from gebackend.bench import runner as bench_runner
from gebackend.bench import server as bench_server
from gebackend.bench import triton_stats
from gebackend.compile.accuracy import random_feeds
from gebackend.config import dtypes
from gebackend.config.onnx_signature import read_signature
from gebackend.modelzoo import build_add_mul
from gebackend.modelzoo.resnet import build_resnet
from gebackend.runtime import bucket_costs

NAIVE = Path(bench_runner.__file__).with_name("naive_model.py")

GE_LAYERS = ("ge_dynamic", "ge_1thread", "ge_nospin", "ge_static")
NULL_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.outputs = {o["name"]: np.load(args["model_repository"] + "/1/" + o["name"] + ".npy") for o in config["output"]}

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in self.outputs.items()])
                for _ in requests]
'''

BATCHER = "dynamic_batching { preferred_batch_size: [ %d ] max_queue_delay_microseconds: 1000000 }\n"
PARAMETER = 'parameters { key: "%s" value: { string_value: "%s" } }\n'
STATIC = ('parameters { key: "static_model" value: { string_value: "1" } }\n'
          'parameters { key: "graph.ge.inputShape" value: { string_value: "%s" } }\n'
          'parameters { key: "graph.ge.dynamicDims" value: { string_value: "%s" } }\n')


def _models(names: list[str]) -> dict[str, onnx.ModelProto]:
    built = {"tiny": build_add_mul, "resnet_small": build_resnet}
    return {name: built[name]() for name in names}


def _tensor_lines(kind: str, tensors, batched: bool) -> str:
    entries = []
    for t in tensors:
        dims = [d if isinstance(d, int) and d > 0 else -1 for d in (t.shape[1:] if batched else t.shape)]
        entries.append(f'{{ name: "{t.name}" data_type: {t.dtype.triton} dims: {dims} }}')
    return f"{kind} [ {', '.join(entries)} ]\n"


def build_repository(repo: Path, name: str, model: onnx.ModelProto, with_peer: bool = False,
                     batch: int = 1) -> tuple[dict[str, Path], dict[str, np.ndarray]]:
    """The layers' models of one ONNX file (the peer's too, `with_peer`), and the request they all get; with `batch`
    above 1, every layer's dynamic batcher waits (up to a second) for that many requests before it executes."""
    path = repo / "_source" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    signature = read_signature(path)
    feeds = random_feeds(path)  # batch 1, seeded
    import onnxruntime as ort

    outputs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    io = _tensor_lines("input", signature.inputs, True) + _tensor_lines("output", signature.outputs, True)
    dims = ";".join(",".join([str(b)] * len(signature.inputs)) for b in (1, 2, 4, 8))
    shape = ";".join(f"{t.name}:-1," + ",".join(str(d) for d in t.shape[1:]) for t in signature.inputs)
    configs = {
        "null": f'backend: "python"\nmax_batch_size: 8\n{io}',
        "naive": f'backend: "python"\nmax_batch_size: 8\n{io}',
        "ge_dynamic": 'backend: "ge"\nmax_batch_size: 8\n',
        "ge_1thread": 'backend: "ge"\nmax_batch_size: 8\n' + PARAMETER % ("intra_op_thread_count", "1"),
        "ge_nospin": 'backend: "ge"\nmax_batch_size: 8\n' + PARAMETER % ("allow_spinning", "off"),
        "ge_static": 'backend: "ge"\nmax_batch_size: 8\n' + STATIC % (shape, dims),
    }
    if with_peer:  # the peer's defaults, as its users write it (no batcher: one request at a time here anyway)
        configs["peer"] = f'backend: "{bench_peer.BACKEND}"\nmax_batch_size: 8\n{io}'
    dirs = {}
    for layer, config in configs.items():
        model_dir = repo / f"{name}_{layer}"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(config)
        if layer == "null":
            (model_dir / "1" / "model.py").write_text(NULL_MODEL)
            for out, value in zip(signature.outputs, outputs):
                np.save(model_dir / "1" / f"{out.name}.npy", value)
        else:
            shutil.copy(path, model_dir / "1" / "model.onnx")
            if layer == "naive":
                shutil.copy(NAIVE, model_dir / "1" / "model.py")
        if batch > 1:
            with open(model_dir / "config.pbtxt", "a") as config_file:
                config_file.write(BATCHER % batch)
        dirs[layer] = model_dir
    shutil.rmtree(path.parent)
    return dirs, feeds


def _wire(dtype: np.dtype) -> str:
    return dtypes.from_onnx(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))).wire


def _client_round(client, model: str, inputs, requests: int, batch: int = 1) -> list[float]:
    """Each request's round trip; with `batch` above 1, requests go `batch` at a time (one thread each: the gRPC
    client's async_infer never called back here), and each group's time is the time of its last answer."""
    from concurrent.futures import ThreadPoolExecutor

    times = []
    with ThreadPoolExecutor(batch) as senders:
        for _ in range(max(1, requests // batch)):
            started = time.perf_counter_ns()
            if batch == 1:
                client.infer(model, inputs)
            else:
                list(senders.map(lambda _n: client.infer(model, inputs), range(batch)))
            times.append((time.perf_counter_ns() - started) / 1000)
    return times


def measure_server(repo: Path, models: dict[str, tuple[dict, dict]], rounds: int, requests: int, log: Path,
                   peer: bench_peer.Peer | None = None, batch: int = 1) -> dict:
    import tritonclient.grpc as grpcclient

    server = bench_server.start(repo, log, extra_backends=peer.extra_backends if peer is not None else None)
    try:
        if server.failures():
            raise SystemExit(f"toll: models failed to load: {server.failures()}")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results = {}
        prepared = {}
        for name, (dirs, feeds) in models.items():
            inputs = []
            for input_name, value in feeds.items():
                tensor = grpcclient.InferInput(input_name, list(value.shape), _wire(value.dtype))
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            for layer in dirs:
                prepared[f"{name}_{layer}"] = inputs
                _client_round(client, f"{name}_{layer}", inputs, 20 * batch, batch)  # warm-up
        for _ in range(rounds):  # interleaved: every model once per round
            for model, inputs in prepared.items():
                before = triton_stats.snapshot(server.http_url, [model])
                times = _client_round(client, model, inputs, requests, batch)
                step = triton_stats.step(triton_stats.delta(before, triton_stats.snapshot(server.http_url, [model]))[model])
                entry = results.setdefault(model, {"client_p50_us": [], "compute_infer_us": [], "server_us": [],
                                                   "requests_per_execute": []})
                entry["client_p50_us"].append(float(np.percentile(times, 50)))
                entry["compute_infer_us"].append(step["compute_infer_us"])
                entry["server_us"].append(step["time_us"])
                entry["requests_per_execute"].append(step["avg_batch"])
        return results
    finally:
        server.stop()


def measure_in_process(model_dir: Path, feeds: dict, rounds: int, requests: int, batch: int = 1) -> dict:
    """The engine, the runner and the instance of a ge config, each timed `requests` times per round, interleaved;
    with `batch` above 1, the engine and the runner run `batch` rows at once and the instance executes `batch`
    requests of one row each (what the batcher hands it)."""
    from gebackend.bench.inprocess import Ceiling

    ceiling = Ceiling(model_dir, log=lambda _m: None)
    instance = ceiling.instances_here[0]
    runner = instance.executor.runner
    engine = runner.engines()[0]
    static = hasattr(runner, "router")
    names = runner.output_names
    rows = {name: np.concatenate([value] * batch) for name, value in feeds.items()}
    if static:  # the bucket of `batch` rows
        bucket = next(i for i, shapes in enumerate(instance.spec.static_shapes)
                      if bucket_costs.batch_and_inner(shapes)[0] == batch)
    calls = {
        "engine": (lambda: engine.run_bucket(bucket, rows, names)) if static else (lambda: engine.run(rows, names)),
        "runner": lambda: runner.run(rows),
        "instance": lambda: instance.execute([feeds] * batch),
    }
    out = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(20):
            call()
    for _ in range(rounds):
        for name, call in calls.items():
            times = []
            for _ in range(max(1, requests // batch)):
                started = time.perf_counter_ns()
                call()
                times.append((time.perf_counter_ns() - started) / 1000)
            out[name].append(float(np.percentile(times, 50)))
    instance.close()
    return out


def _median(values) -> float:
    return float(statistics.median(v for v in values if v is not None))


def _spread(values) -> float:
    kept = [v for v in values if v is not None]
    return (max(kept) - min(kept)) / 2 if kept else 0.0


def summarise(name: str, server: dict, inprocess: dict) -> list[dict]:
    """One row per layer: medians over rounds (and half the range), and the toll derived from them."""
    null = _median(server[f"{name}_null"]["compute_infer_us"])
    rows = []
    peer = server.get(f"{name}_peer")
    if peer:
        peer_p50, peer_compute = _median(peer["client_p50_us"]), _median(peer["compute_infer_us"])
    for layer in ("null", "naive", *GE_LAYERS, *(("peer",) if peer else ())):
        entry = server[f"{name}_{layer}"]
        row = {"model": name, "layer": layer,
               "client_p50_us": _median(entry["client_p50_us"]), "client_spread_us": _spread(entry["client_p50_us"]),
               "requests_per_execute": _median(entry.get("requests_per_execute") or [1.0]),
               "compute_infer_us": _median(entry["compute_infer_us"]),
               "compute_spread_us": _spread(entry["compute_infer_us"])}
        if layer in inprocess:
            inner = {k: _median(v) for k, v in inprocess[layer].items()}
            row.update({f"{k}_us": v for k, v in inner.items()})
            row["toll_stub_us"] = null
            row["toll_bridge_us"] = row["compute_infer_us"] - null - inner["instance"]
            row["toll_instance_us"] = inner["instance"] - inner["engine"]
        if peer:
            row["over_peer_p50_us"] = row["client_p50_us"] - peer_p50
            row["over_peer_compute_us"] = row["compute_infer_us"] - peer_compute
        rows.append(row)
    return rows


def _fmt(value) -> str:
    return "" if value is None else f"{value:.0f}"


def _signed(value) -> str:
    return "" if value is None else f"{value:+.0f}"


def write_report(rows: list[dict], out: Path, meta: dict) -> str:
    batch = meta.get("batch", 1)
    sent = "one request at a time" if batch == 1 else (
        f"{batch} requests at a time, each execute held for {batch}: server and in-process times per execute, "
        f"client p50 per group of {batch}")
    lines = [f"Machine: {meta['machine']}; {meta['rounds']} rounds x {meta['requests']} requests per layer, "
             f"interleaved, {sent}; medians (± half the range of the per-round medians), microseconds.", "",
             "| model | layer | requests per execute | client p50 | server compute_infer | engine | runner | instance.execute "
             "| stub transport | ours: bridge | ours: instance | p50 − peer's | compute − peer's |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layer']} | {r.get('requests_per_execute', 1.0):.1f} "
                     f"| {_fmt(r['client_p50_us'])} ± {_fmt(r['client_spread_us'])} "
                     f"| {_fmt(r['compute_infer_us'])} ± {_fmt(r['compute_spread_us'])} | {_fmt(r.get('engine_us'))} "
                     f"| {_fmt(r.get('runner_us'))} | {_fmt(r.get('instance_us'))} | {_fmt(r.get('toll_stub_us'))} "
                     f"| {_fmt(r.get('toll_bridge_us'))} | {_fmt(r.get('toll_instance_us'))} "
                     f"| {_signed(r.get('over_peer_p50_us'))} | {_signed(r.get('over_peer_compute_us'))} |")
    if not any("over_peer_p50_us" in r for r in rows):
        lines.append(f"\nNo peer: {meta.get('peer') or 'not looked for'}")
    text = "\n".join(lines) + "\n"
    (out / "toll.md").write_text(text)
    (out / "toll.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    _plot(rows, out / "toll.png", batch)
    return text


def _plot(rows: list[dict], path: Path, batch: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ge = [r for r in rows if "engine_us" in r]
    labels = [f"{r['model']}\n{r['layer']}" for r in ge]
    parts = [("engine", [r["engine_us"] for r in ge]), ("ours: instance", [r["toll_instance_us"] for r in ge]),
             ("ours: bridge", [max(0.0, r["toll_bridge_us"]) for r in ge]),
             ("stub transport", [r["toll_stub_us"] for r in ge])]
    fig, ax = plt.subplots(figsize=(1.8 * len(ge) + 2, 4))
    bottom = np.zeros(len(ge))
    for label, values in parts:
        ax.bar(labels, values, bottom=bottom, label=label)
        bottom += np.array(values)
    ax.set_ylabel("microseconds per request (server side)" if batch == 1 else
                  f"microseconds per execute of {batch} requests (server side)")
    ax.set_title("Where a request's time goes inside Triton (concurrency 1, batch 1)" if batch == 1 else
                 f"Where a batch's time goes inside Triton ({batch} requests per execute)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,resnet_small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("bench/results/toll"))
    parser.add_argument("--peer-backend-dir", type=Path, metavar="DIR",
                        help="Triton's onnxruntime backend (as for gebackend bench); default: $GE_PEER_BACKEND_DIR or "
                             "NGC's /opt/tritonserver/backends where present, else no peer row")
    parser.add_argument("--batch", type=int, default=1, choices=(1, 2, 4, 8),
                        help="requests per execute: sent together, each model's batcher holding its execute for them")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    peer, no_peer = bench_peer.lookup(args.peer_backend_dir)
    if peer is None and args.peer_backend_dir is not None:
        raise SystemExit(f"toll: {no_peer}")
    work = Path(tempfile.mkdtemp(prefix="gebackend-toll-"))
    try:
        models = {name: build_repository(work / "repo", name, proto, with_peer=peer is not None, batch=args.batch)
                  for name, proto in _models(args.models.split(",")).items()}
        server = measure_server(work / "repo", models, args.rounds, args.requests, args.out / "server.log", peer,
                                args.batch)
        rows = []
        for name, (dirs, feeds) in models.items():
            inprocess = {layer: measure_in_process(dirs[layer], feeds, args.rounds, args.requests, args.batch)
                         for layer in GE_LAYERS}
            rows += summarise(name, server, inprocess)
        meta = {"machine": bench_runner.machine(), "rounds": args.rounds, "requests": args.requests, "batch": args.batch,
                "loadavg": bench_runner._loadavg(),
                "peer": str(peer.library) if peer is not None else no_peer}
        print(write_report(rows, args.out, meta))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
