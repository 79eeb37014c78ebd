"""The picture of `mapsat codesign --pareto`: the best MFU against each varied knob, one line
per value of the first knob of the order (e.g. MFU against offload capacity for each HBM size)."""

from __future__ import annotations

from pathlib import Path

from costmodel.inputs.load import ensure_parent
from solver.report.figure import pyplot
from solver.search.codesign import CodesignResult, Grid


def plot_pareto(result: CodesignResult, grid: Grid, path: str | Path, title: str) -> Path:
    """One panel per varied knob: x the knob's value, y the best MFU over the other knobs
    (0: no feasible mapping), a line per value of the order's first knob; the target MFU
    and the chosen system marked. Written to `path` (PNG)."""
    plt = pyplot()
    path = Path(path)
    ensure_parent(path, "--pareto")
    knobs = list(grid.order)
    first = knobs[0]
    fig, axes = plt.subplots(1, len(knobs), figsize=(4.5 * len(knobs), 3.4), squeeze=False)
    target_mfu = None
    if result.reference is not None and result.target_time_s:
        target_mfu = result.reference.mfu * result.reference.iteration_time_s / result.target_time_s
    for ax, knob in zip(axes.flat, knobs):
        group = first if knob != first and len(knobs) > 1 else None
        for value, line in result.front(knob, group).items():
            xs, ys = zip(*line)
            label = f"{group}={value:g}" if group else "best over the other knobs"
            ax.plot(xs, [100 * y for y in ys], marker="o", label=label)
        if target_mfu is not None:
            ax.axhline(100 * target_mfu, color="grey", linestyle="--", linewidth=0.8)
        if result.system is not None:
            ax.axvline(result.system[knob], color="tab:orange", linestyle=":", linewidth=1.0)
        ax.set_xlabel(knob)
        ax.set_ylabel("best MFU (%)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}: best MFU per knob (dashed: target; dotted: the least system)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
