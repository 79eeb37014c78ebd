"""The picture of `mapsat explain`: for each dimension, the certified best MFU of each value,
the winner's value highlighted."""

from __future__ import annotations

import math
from pathlib import Path

from costmodel.inputs.load import ensure_parent
from solver.report.figure import pyplot
from solver.search.explain import Explanation


def plot_explanation(result: Explanation, path: str | Path, title: str) -> Path:
    """One small bar chart per dimension (MFU of the best mapping with each value; missing
    bars are values with no feasible mapping), in a grid, written to `path` (PNG)."""
    plt = pyplot()
    path = Path(path)
    ensure_parent(path, "--plot")
    dims: dict[str, list] = {}
    for row in result.rows:
        dims.setdefault(row.dimension, []).append(row)
    cols = 4
    rows_n = max(1, math.ceil(len(dims) / cols))
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 2.6 * rows_n), squeeze=False)
    best_mfu = result.winner.mfu
    top = max([r.best.mfu for r in result.rows if r.best is not None] + [best_mfu])
    for ax, (name, rows) in zip(axes.flat, dims.items()):
        labels = [r.label for r in rows]
        values = [100 * r.best.mfu if r.best is not None else 0.0 for r in rows]
        colours = ["tab:orange" if r.best is not None and r.best.mapping == result.winner.mapping else "tab:blue"
                   for r in rows]
        ax.bar(range(len(rows)), values, color=colours)
        ax.set_xticks(range(len(rows)), labels, rotation=45 if len(rows) > 6 else 0, fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, 100 * top * 1.1)
        ax.axhline(100 * best_mfu, color="tab:orange", linewidth=0.8, linestyle="--")
        ax.set_ylabel("best MFU (%)", fontsize=8)
    for ax in list(axes.flat)[len(dims):]:
        ax.axis("off")
    fig.suptitle(f"{title}\nbest MFU {best_mfu:.1%} (orange: the winner's value)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
