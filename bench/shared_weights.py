"""What `share_weights` saves: PSS of the whole server (the CLI, tritonserver, every stub) with 1 and N instances of
one model, its weights shared (`share_weights=on`) or each instance's own (`off`), and the throughput each serves.

Every configuration runs on a fresh `gebackend serve` of a repository of its own, rounds interleaved (off, on, off,
on, ...) so the machine's noise hits both alike; medians and spread are reported, ratios within one run. PSS is read
after a warm-up of requests (every instance has run), from /proc through psutil.

    .venv/bin/python bench/shared_weights.py [--onnx FILE] [--mib 192] [--instances 1,2] [--rounds 2]

Writes shared_weights.json, shared_weights.md and shared_weights.png into --out (default bench/results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import tritonclient.http as httpclient

from gebackend import cpu
from gebackend.bench import server as bench_server
from gebackend.config.onnx_signature import read_signature
from gebackend.files import link_or_copy
from gebackend.modelzoo import build_weights_mlp

ROOT = Path(__file__).resolve().parents[1]


def request_inputs(path: Path, batch: int = 1) -> list[httpclient.InferInput]:
    """One seeded request for every input (free dims 1, except a free last dim of 16)."""
    rng = np.random.default_rng(1)
    inputs = []
    for tensor in read_signature(path).inputs:
        shape = [batch] + [d if isinstance(d, int) and d > 0 else 16 for d in tensor.shape[1:]]
        value = rng.standard_normal(shape).astype(tensor.dtype.numpy) if tensor.dtype.numpy.kind == "f" else \
            rng.integers(1, 100, shape).astype(tensor.dtype.numpy)
        inputs.append(httpclient.InferInput(tensor.name, shape, tensor.dtype.triton.removeprefix("TYPE_")))
        inputs[-1].set_data_from_numpy(value)
    return inputs


def tree_pss(pid: int) -> int:
    processes = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def measure(model: Path, share: str, instances: int, work: Path, seconds: float) -> dict:
    repo = Path(tempfile.mkdtemp(prefix=f"shared-{share}-{instances}-", dir=work))
    folder = repo / "model"
    (folder / "1").mkdir(parents=True)
    link_or_copy(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        f'backend: "ge"\nmax_batch_size: 8\ninstance_group [ {{ count: {instances}, kind: KIND_CPU }} ]\n'
        f'parameters {{ key: "share_weights" value: {{ string_value: "{share}" }} }}\n')
    server = bench_server.start(repo, repo / "serve.log")
    try:
        inputs = request_inputs(model)
        done, stop = [0], time.monotonic() + seconds

        def client_loop():
            client = httpclient.InferenceServerClient(server.http_url)
            while time.monotonic() < stop:
                client.infer("model", inputs)
                done[0] += 1

        threads = [threading.Thread(target=client_loop) for _ in range(2 * instances)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        throughput = done[0] / (time.monotonic() - started)
        pss = tree_pss(server.process.pid)
        loaded = [line for line in server.output().splitlines() if " loaded " in line]
    finally:
        server.stop()
    return {"share_weights": share, "instances": instances, "pss_mib": pss / 2**20, "infer_per_s": throughput,
            "shared": any("share_weights:" in line and "mapped from" in line for line in loaded)}


def summarize(rows: list[dict], instance_counts: list[int]) -> list[dict]:
    table = []
    for n in instance_counts:
        entry = {"instances": n}
        for share in ("off", "on"):
            mine = [r for r in rows if r["instances"] == n and r["share_weights"] == share]
            pss = [r["pss_mib"] for r in mine]
            speed = [r["infer_per_s"] for r in mine]
            entry[share] = {"pss_mib": statistics.median(pss), "pss_spread": max(pss) - min(pss),
                            "infer_per_s": statistics.median(speed), "shared": all(r["shared"] for r in mine)}
        table.append(entry)
    return table


def report(table: list[dict], meta: dict) -> str:
    lines = [f"share_weights on {meta['model']} ({meta['weights_mib']:.0f} MiB of files), {meta['cpu']}, "
             f"{meta['rounds']} rounds interleaved, medians", "",
             "| instances | PSS off (MiB) | PSS on (MiB) | on / off | infer/s off | infer/s on | on / off |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in table:
        off, on = row["off"], row["on"]
        lines.append(f"| {row['instances']} | {off['pss_mib']:.0f} | {on['pss_mib']:.0f} | "
                     f"{on['pss_mib'] / off['pss_mib']:.2f} | {off['infer_per_s']:.1f} | {on['infer_per_s']:.1f} | "
                     f"{on['infer_per_s'] / off['infer_per_s']:.2f} |")
    first = table[0]
    for row in table[1:]:
        for share in ("off", "on"):
            lines.append(f"\n{row['instances']} instances / 1, share_weights={share}: "
                         f"{row[share]['pss_mib'] / first[share]['pss_mib']:.2f}x the PSS")
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [row["instances"] for row in table]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.35
    for k, share in enumerate(("off", "on")):
        ax.bar([i + (k - 0.5) * width for i in range(len(counts))], [row[share]["pss_mib"] for row in table], width,
               label=f"share_weights={share}")
    ax.set_xticks(range(len(counts)), [f"{n} instance(s)" for n in counts])
    ax.set_ylabel("PSS of the server tree (MiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onnx", type=Path, help="the model to serve (default: an MLP of --mib MiB built here)")
    parser.add_argument("--mib", type=int, default=192)
    parser.add_argument("--instances", default="1,2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="the load each configuration serves")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    counts = [int(n) for n in args.instances.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shared-weights-") as work:
        model = args.onnx
        if model is None:
            model = Path(work) / "mlp.onnx"
            onnx.save(build_weights_mlp(args.mib), str(model))
        rows = []
        for round_ in range(args.rounds):
            for n in counts:
                for share in ("off", "on"):
                    rows.append({"round": round_, **measure(model, share, n, Path(work), args.seconds)})
                    print(json.dumps(rows[-1]), flush=True)
        meta = {"model": str(args.onnx or f"mlp {args.mib} MiB"), "weights_mib": model.stat().st_size / 2**20,
                "cpu": cpu.describe(), "rounds": args.rounds}
    table = summarize(rows, counts)
    (args.out / "shared_weights.json").write_text(json.dumps({"meta": meta, "rows": rows, "table": table}, indent=1))
    text = report(table, meta)
    (args.out / "shared_weights.md").write_text(text)
    plot(table, args.out / "shared_weights.png")
    print(text)


if __name__ == "__main__":
    main()
