"""What every plot shares: matplotlib on the file-only Agg backend, saving, and sizes in units
people read (78B, 1.1T parameters)."""

from __future__ import annotations

from pathlib import Path

from costmodel.errors import InputError
from costmodel.inputs.load import ensure_parent


def pyplot():
    """matplotlib with the file-only Agg backend, imported when a plot is drawn (it is slow
    to import, and commands that never plot should not pay for it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def image_path(path: str | Path, option: str) -> Path:
    """An image file the user named with `option` (--plot, --pareto), checked before the work
    that draws it: a format matplotlib writes, by its suffix (none: PNG), and its missing
    parent directories created."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    suffix = path.suffix.lower().removeprefix(".")
    if suffix and suffix not in FigureCanvasBase.get_supported_filetypes():
        raise InputError(f"{option} {path}: matplotlib does not write .{suffix} files (give .png, .svg or .pdf)")
    return ensure_parent(path, option)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def params_text(count: float) -> str:
    """A parameter count with its unit: 7.8e10 -> '78B', 1.1e12 -> '1.1T', 3.5e8 -> '350M'."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.3g}"
