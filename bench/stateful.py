"""Stateful models side by side: `ge` and Triton's onnxruntime backend serving the same sequence-batched config.

One server holds each model as `<model>_ge` (backend "ge") and, where Triton's onnxruntime backend is installed or
built (`make peer`, --peer-backend-dir), as `<model>_peer` (backend "onnxruntime", the same config.pbtxt otherwise);
`_b1` twins of both say max_batch_size 1 (one sequence per run: no batching delay at low concurrency). Each config
lists its outputs, the output state not among them (the peer fails to split batches otherwise), and has
`sequence_batching` with
START/END/READY/CORRID controls where the model takes them, an implicit `state`, the oldest strategy (or
`--strategy direct`) batching up to 8 sequences, and one instance. perf_analyzer sends sequences of
`--sequence-length` requests to each (it reads the config); concurrency N is N sequences at once. Rounds interleave
the rows; medians and the range of the per-round values are reported, each over the faster peer row that answered.
Before measuring, one sequence is sent to `ge` and the peer and their answers compared (the largest absolute
difference is in the report).

  accumulator     gebackend.modelzoo.build_accumulator: no compute, every control; the toll of a stateful request
  streaming_gru   gebackend.modelzoo.build_streaming_gru: a GRU over 16 frames of 80 features, hidden 512 (0.5 ms
                  a chunk alone, 2 ms for 8), its hidden state carried between chunks

Writes stateful.json, stateful.md and stateful.png under --out, naming the machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
import tritonclient.grpc as grpcclient

from gebackend.bench import peer as bench_peer
from gebackend.bench import perf_analyzer
from gebackend.bench import runner as bench_runner
from gebackend.bench import server as bench_server
from gebackend.modelzoo import ACCUMULATOR_CONTROLS, build_accumulator, build_streaming_gru

MODELS = {  # name -> (builder, input dims, state dims, controls, the outputs config.pbtxt lists)
    "accumulator": (build_accumulator, [4], [4], ACCUMULATOR_CONTROLS,
                    'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }, '
                    '{ name: "ECHO" data_type: TYPE_FP32 dims: [ 2 ] } ]'),
    "streaming_gru": (build_streaming_gru, [16, 80], [1, 512], "",
                      'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 16, 128 ] } ]'),
}


STRATEGIES = {  # the sequence batcher's strategy, for a max_batch_size
    "oldest": "oldest {{ max_candidate_sequences: 16 preferred_batch_size: [ {0} ] max_queue_delay_microseconds: 1000 }}",
    "direct": "direct {{ max_queue_delay_microseconds: 1000 }}",
}


# row -> (backend, max_batch_size); the _b1 rows run one sequence at a time: no batching delay at low concurrency
VARIANTS = {"ge": ("ge", 8), "ge_b1": ("ge", 1), "peer": ("onnxruntime", 8), "peer_b1": ("onnxruntime", 1)}


def config(backend: str, dims: list[int], state: list[int], controls: str, outputs: str, strategy: str = "oldest",
           max_batch_size: int = 8) -> str:
    """Outputs are listed, the output state not among them: the peer (r24.10) fails every batch of two or more
    sequences whose output state is also an output, as its auto-complete makes it when `output` is left out."""
    d, s = ", ".join(map(str, dims)), ", ".join(map(str, state))
    return (f'backend: "{backend}"\nmax_batch_size: {max_batch_size}\ninput [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {d} ] }} ]\n{outputs}\n'
            f'sequence_batching {{\n  max_sequence_idle_microseconds: 60000000\n'
            f'  {STRATEGIES[strategy].format(max_batch_size)}\n'
            f'{controls}\n  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 '
            f'dims: [ {s} ] initial_state {{ data_type: TYPE_FP32 dims: [ {s} ] zero_data: true name: "zeros" }} }} ]\n}}\n'
            f'instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n')


def answers(url: str, model: str, dims: list[int], steps: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    with grpcclient.InferenceServerClient(url) as client:
        for i in range(steps):
            tensor = grpcclient.InferInput("INPUT", [1, *dims], "FP32")
            tensor.set_data_from_numpy(rng.standard_normal((1, *dims)).astype(np.float32))
            result = client.infer(model, [tensor], sequence_id=77, sequence_start=i == 0, sequence_end=i == steps - 1)
            out.append(result.as_numpy("OUTPUT"))
    return out


def measure(binary: Path, url: str, model: str, concurrency: int, length: int, interval_ms: int, work: Path) -> dict:
    csv = work / f"{model}_c{concurrency}.csv"
    cmd = [str(binary), "-m", model, "-u", url, "-i", "grpc", "--concurrency-range", f"{concurrency}:{concurrency}:1",
           "--sequence-length", str(length), "--measurement-interval", str(interval_ms), "-s", "25", "-r", "6",
           "-f", str(csv)]
    done = perf_analyzer.run_once(cmd, binary, 300)
    if done is None or done.returncode != 0 or not csv.is_file():
        tail = "" if done is None else " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        return {"error": f"perf_analyzer failed: {tail or 'timed out'}"}
    row = perf_analyzer.parse_csv(csv.read_text())[0]
    return {"throughput": row.throughput, "p50_us": row.p50_us, "p99_us": row.p99_us}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="oldest",
                        help="the sequence batcher's strategy, batching up to 8 sequences (default: oldest)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequence-length", type=int, default=20)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/stateful"))
    parser.add_argument("--peer-backend-dir", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    found, why_not = bench_peer.lookup(args.peer_backend_dir)
    peer_dirs, backends = (found.extra_backends, list(VARIANTS)) if found else (None, ["ge", "ge_b1"])
    if found is None:
        print(f"stateful: no peer ({why_not}); measuring ge alone")
    binary = perf_analyzer.find_perf_analyzer()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo, work = Path(tmp) / "repo", Path(tmp) / "work"
        work.mkdir()
        for model in models:
            build, dims, state, controls, outputs = MODELS[model]
            for backend in backends:
                folder = repo / f"{model}_{backend}"
                (folder / "1").mkdir(parents=True)
                onnx.save(build(), str(folder / "1" / "model.onnx"))
                name, max_batch = VARIANTS[backend]
                (folder / "config.pbtxt").write_text(config(name, dims, state, controls, outputs, args.strategy,
                                                                       max_batch))
        server = bench_server.start(repo, work / "serve.log", extra_backends=peer_dirs)
        url = f"127.0.0.1:{server.grpc_port}"
        try:
            agree = {}
            if "peer" in backends:
                for model in models:
                    ge, peer = (answers(url, f"{model}_{b}", MODELS[model][1]) for b in ("ge", "peer"))
                    agree[model] = max(float(np.abs(a - b).max()) for a, b in zip(ge, peer))
            samples: dict[tuple, list[dict]] = {}
            for round_ in range(args.rounds):
                for model in models:
                    for level in levels:
                        for backend in backends if round_ % 2 == 0 else backends[::-1]:
                            got = measure(binary, url, f"{model}_{backend}", level, args.sequence_length, args.interval_ms, work)
                            print(f"stateful: round {round_ + 1} {model} {backend} c={level}: {got}")
                            samples.setdefault((model, backend, level), []).append(got)
        finally:
            server.stop()
    rows = []
    for (model, backend, level), got in samples.items():
        ok = [g for g in got if "error" not in g]
        row = {"model": model, "backend": backend, "concurrency": level, "rounds": len(ok),
               "errors": [g["error"] for g in got if "error" in g]}
        for key in ("throughput", "p50_us", "p99_us"):
            values = [g[key] for g in ok]
            row[key] = statistics.median(values) if values else None
            row[key + "_range"] = [min(values), max(values)] if values else None
        rows.append(row)
    for row in rows:
        peers = [r for r in rows if r["backend"].startswith("peer") and r["model"] == row["model"]
                 and r["concurrency"] == row["concurrency"] and r["throughput"]]
        if peers and row["throughput"]:
            best = max(peers, key=lambda r: r["throughput"])
            row["x_peer"], row["peer_row"] = row["throughput"] / best["throughput"], best["backend"]
    meta = {"machine": bench_runner.machine(), "strategy": args.strategy, "sequence_length": args.sequence_length, "rounds": args.rounds,
            "interval_ms": args.interval_ms, "max_abs_diff_ge_vs_peer": agree}
    (args.out / "stateful.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"Machine: {meta['machine']}; {args.strategy} strategy, {args.rounds} interleaved rounds, sequences of {args.sequence_length}, "
             f"medians (range of rounds); ge vs peer max |difference| of one sequence's answers: {agree or 'no peer'}", "",
             "| model | backend | sequences at once | infer/s | p50 ms | p99 ms | × faster peer |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["concurrency"], r["backend"])):
        if r["throughput"] is None:
            lines.append(f"| {r['model']} | {r['backend']} | {r['concurrency']} | failed: {r['errors'][0][:160]} | | | |")
            continue
        lo, hi = r["throughput_range"]
        lines.append(f"| {r['model']} | {r['backend']} | {r['concurrency']} | {r['throughput']:.0f} ({lo:.0f}–{hi:.0f}) "
                     f"| {r['p50_us'] / 1e3:.2f} | {r['p99_us'] / 1e3:.2f} | "
                     + (f"{r['x_peer']:.2f} ({r['peer_row']}) |" if "x_peer" in r else "|"))
    (args.out / "stateful.md").write_text("\n".join(lines) + "\n")
    _plot(rows, args.out / "stateful.png")
    print("\n".join(lines))
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["throughput"]]
    labels = [f"{r['model']}\n{r['backend']} c={r['concurrency']}" for r in done]
    fig, ax = plt.subplots(figsize=(1.3 * len(done) + 2, 4))
    ax.bar(labels, [r["throughput"] for r in done],
           yerr=[[r["throughput"] - r["throughput_range"][0] for r in done], [r["throughput_range"][1] - r["throughput"] for r in done]],
           color=["tab:blue" if r["backend"].startswith("ge") else "tab:gray" for r in done])
    ax.set_ylabel("inferences per second (median of rounds)")
    ax.set_title("Stateful models through Triton's sequence batcher: ge and the onnxruntime backend")
    plt.setp(ax.get_xticklabels(), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
