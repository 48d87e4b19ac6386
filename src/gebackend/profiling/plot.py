"""PNG charts of a profiling capture: the top ops by total time (`plot_top_ops`) and per-run kernel vs host
time with a Gantt of the first runs (`plot_timeline`).

All data comes from `report.load_capture` / `report.op_rows`; this module only draws. matplotlib is an
optional dependency (the ``bench`` extra) and is imported when a chart is drawn, with the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

from gebackend.errors import GeBackendError

from .report import OpRow, Run, load_capture, op_rows

MODE_COLORS = {"static": "#2a9d8f", "dynamic": "#e76f51"}
KERNEL_COLOR, HOST_COLOR = "#264653", "#f4a261"
GANTT_RUNS = 3
MAX_BARS = 400  # runs drawn in the per-run chart; longer captures show their first MAX_BARS runs


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise GeBackendError("profiling charts need matplotlib: pip install 'gebackend[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(row: OpRow, graphs: int) -> str:
    text = f"{row.name} ({row.op_type})"
    return f"{text} [{row.graph}]" if graphs > 1 else text


def plot_top_ops(capture: str | Path, top: int = 15) -> Path:
    """Write ``<capture>/top_ops.png``: a horizontal bar per op, longest first, colored static/dynamic."""
    cap = load_capture(capture)
    rows = op_rows(cap)[:top]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.35 * len(rows)))
    labels = [_label(r, len(cap.graphs())) for r in rows][::-1]
    values = [r.total_us / 1000 for r in rows][::-1]
    ax.barh(labels, values, color=[MODE_COLORS[r.mode] for r in rows][::-1])
    for y, (row, value) in enumerate(zip(rows[::-1], values)):
        ax.annotate(f" {row.calls} calls, {row.share_pct:.1f}%", (value, y), va="center", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in MODE_COLORS.values()]
    ax.legend(handles, [f"{m} shapes" for m in MODE_COLORS], loc="lower right")
    ax.set_xlabel("total kernel time (ms), all instances")
    ax.set_title(f"top {len(rows)} ops: {cap.title}")
    ax.margins(x=0.25)
    return _save(fig, plt, cap.path / "top_ops.png")


def _per_run_bars(ax, runs: list[Run]) -> None:
    shown = runs[:MAX_BARS]
    x = range(len(shown))
    kernel = [r.kernel_us for r in shown]
    ax.bar(x, kernel, color=KERNEL_COLOR, label="kernels", width=1.0)
    ax.bar(x, [max(r.host_us, 0) for r in shown], bottom=kernel, color=HOST_COLOR, label="host-side", width=1.0)
    ax.set_xlabel(f"run (time order{', first %d' % MAX_BARS if len(runs) > MAX_BARS else ''})")
    ax.set_ylabel("µs per model_run")
    ax.set_title("per run: kernel vs host-side time")
    ax.legend(loc="upper right")


def _gantt(ax, runs: list[Run]) -> None:
    """One row per run; each kernel drawn at its offset from the run's start."""
    for y, run in enumerate(runs):
        ax.broken_barh([(0, run.dur_us)], (y - 0.4, 0.8), color=HOST_COLOR)
        spans = [(run.session.abs_us(k["ts"]) - run.start_us, k["dur"]) for k in run.kernels]
        ax.broken_barh(spans, (y - 0.3, 0.6), color=KERNEL_COLOR, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(runs)), [f"{r.session.instance}\n{r.session.graph[:30]}" for r in runs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("µs from model_run start (orange = host-side gaps)")
    ax.set_title(f"{len(runs)} early runs in time order (the very first run, with warm-up, is skipped)")


def plot_timeline(capture: str | Path) -> Path:
    """Write ``<capture>/timeline.png``: stacked kernel/host µs per run, and a Gantt of the first few runs."""
    cap = load_capture(capture)
    runs = cap.runs()
    if not runs:
        raise GeBackendError(f"{cap.path}: no model_run events to plot")
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [3, 2]})
    _per_run_bars(top, runs)
    first = runs[1:1 + GANTT_RUNS] if len(runs) > GANTT_RUNS else runs[:GANTT_RUNS]  # skip the warm-up run
    _gantt(bottom, first)
    fig.suptitle(cap.title)
    return _save(fig, plt, cap.path / "timeline.png")


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["plot_timeline", "plot_top_ops"]
