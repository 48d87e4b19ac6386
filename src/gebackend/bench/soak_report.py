"""The soak's report (`gebackend bench --soak`, bench/soak.py): soak.md and the two plots, from its result."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping


def markdown(result: Mapping) -> str:
    meta = result["meta"]
    lines = [f"# Soak: {meta['elapsed_s'] / 60:.1f} min, concurrency {meta['concurrency_per_model']} per model "
             f"({meta['protocol']}){' (interrupted)' if meta['interrupted'] else ''}", "",
             f"**{'PASSED' if result.get('passed') else 'FAILED'}**: target 0 failed requests and RSS growth "
             f"< {meta['max_growth']:.0%} after the {meta['warmup_s']:.0f} s warm-up in every process.", ""]
    if result.get("problems"):
        lines += [f"- {problem}" for problem in result["problems"]] + [""]
    lines += ["| model | served as | requests ok | failed | infer/s mean (min-max) | p99 max |",
              "| --- | --- | ---: | ---: | --- | ---: |"]
    for name, m in result["models"].items():
        lines.append(f"| {name} | {m['served_as']} | {m['succeeded']:,.0f} | {m['failed']:,.0f} | "
                     f"{m['throughput_mean']:.1f} ({m['throughput_min']:.1f}-{m['throughput_max']:.1f}) | {m['p99_ms_max']:.1f} ms |")
    lines += ["", "| process | RSS at start | after warm-up | end | peak | growth after warm-up | slope | restarts |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, p in result["processes"].items():
        mem = p["memory"]
        if not mem:
            continue
        lines.append(f"| {name} | {mem['start_mib']:.1f} MiB | {mem['baseline_mib']:.1f} MiB | {mem['end_mib']:.1f} MiB | "
                     f"{mem['peak_mib']:.1f} MiB | {mem['growth']:+.2%} | {mem['slope_mib_per_min']:+.2f} MiB/min | "
                     f"{p['restarts']} |")
    return "\n".join(lines) + "\n"


def plot(result: Mapping, out_dir: Path) -> list[Path]:
    """soak_rss.png (RSS of every process over time) and soak_throughput.png (each perf_analyzer run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, p in result["processes"].items():
        if p["rss"]:
            ax.plot([t / 60 for t, _ in p["rss"]], [v for _, v in p["rss"]], label=name, marker=".", markersize=3)
    ax.axvline(result["meta"]["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("Soak: resident memory of each server process")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    written.append(out_dir / "soak_rss.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4))
    for name, m in result["models"].items():
        runs = [r for r in m["runs"] if r["throughput"] > 0]
        ax.plot([(r["started"] + r["ended"]) / 120 for r in runs], [r["throughput"] for r in runs], marker="o",
                label=f"{name} ({m['served_as']})")
    ax.set_xlabel("minutes")
    ax.set_ylabel("inferences / s (one perf_analyzer run)")
    ax.set_ylim(bottom=0)
    ax.set_title("Soak: throughput over time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(out_dir / "soak_throughput.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
