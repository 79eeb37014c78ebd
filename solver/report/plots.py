"""PNG plots of batch results (matplotlib, Agg): MFU against model size, GPU count, offload
capacity and bandwidth, heatmaps over two of those, and a bar per problem.

A record's plottable dimensions come from its resolved problem (`DIMENSIONS`). A plot of MFU
against dimension X draws one line per combination of the other dimensions that vary in the
results; when that would be more than `MAX_LINES` lines it makes one file per value of the
varying dimension with the fewest values. Infeasible problems are drawn as × at 0 % (the
model does not fit); errors are left out and counted in the title.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from costmodel.errors import InputError
from costmodel.inputs.load import ensure_directory
from solver.report.breakdown_plot import plot_breakdown
from solver.report.documents import gpu_hours_per_million_tokens, tokens_per_s_per_gpu
from solver.report.figure import params_text, pyplot, save

MAX_LINES = 8
MAX_FILES_PER_KIND = 12
SOLVED = ("optimal", "feasible")


@dataclass(frozen=True)
class Dimension:
    name: str
    axis_label: str
    value: Callable[[dict], object]  # record -> value (None when absent)
    label: Callable[[object], str]   # value -> legend text
    log: bool = False


def _problem(record: dict) -> dict:
    return record.get("problem") or {}


def _system(record: dict) -> dict:
    return _problem(record).get("system") or {}


def _gbps(record: dict) -> float | None:
    """Offload bandwidth, GB/s: None without offload memory, inf when unbounded."""
    system = _system(record)
    if system.get("offload_unbounded"):
        return math.inf
    return system.get("offload_gbps")


def _gbps_text(value) -> str:
    return "none" if value is None else ("unbounded" if value == math.inf else f"{value:g}")


def _gbps_label(value) -> str:
    if value is None:
        return "no offload"
    return "offload bandwidth unbounded" if value == math.inf else f"offload {value:g} GB/s"


DIMENSIONS: dict[str, Dimension] = {d.name: d for d in (
    Dimension("params", "model size (parameters)", lambda r: (_problem(r).get("model") or {}).get("params"),
              lambda v: f"{params_text(v)} params", log=True),
    Dimension("gpus", "GPUs", lambda r: _problem(r).get("gpus"), lambda v: f"{v} GPUs", log=True),
    Dimension("offload_gib", "offload capacity per GPU (GiB)", lambda r: _system(r).get("offload_gib"),
              lambda v: "no offload" if not v else f"offload {v:g} GiB", log=True),
    Dimension("offload_gbps", "offload bandwidth per GPU per direction (GB/s)", _gbps, _gbps_label, log=True),
    Dimension("hbm_gib", "HBM per GPU (GiB)", lambda r: _system(r).get("hbm_gib"), lambda v: f"HBM {v:g} GiB"),
    Dimension("nvlink_size", "NVLink domain (GPUs)", lambda r: _system(r).get("nvlink_size"),
              lambda v: f"NVLink {v}", log=True),
    Dimension("datatype", "datatype", lambda r: _problem(r).get("datatype"), str),
    Dimension("space", "mapping space", lambda r: _problem(r).get("space"), lambda v: f"space {v}"),
    Dimension("attention", "attention kernel", lambda r: _problem(r).get("attention", "fused"),
              lambda v: f"{v} attention"),
    Dimension("grad_datatype", "gradient datatype", lambda r: _problem(r).get("grad_datatype", "float32"),
              lambda v: "16-bit gradients" if v == "16bit" else "float32 gradients"),
    Dimension("max_batch", "max batch", lambda r: _problem(r).get("max_batch"), lambda v: f"batch ≤ {v}"),
    Dimension("system", "system", lambda r: _system(r).get("name"), str),
    Dimension("shape", "model shape", lambda r: (_problem(r).get("model") or {}).get("name"), str),
)}
def _offload(record: dict) -> tuple[float, float]:
    """Offload capacity and bandwidth as one value (0, 0 without offload memory)."""
    gib = _system(record).get("offload_gib") or 0
    return (gib, (_gbps(record) or 0) if gib else 0)


def _offload_label(value: tuple[float, float]) -> str:
    gib, gbps = value
    if not gib:
        return "no offload"
    return f"{gib:g} GiB @ " + ("unbounded" if gbps == math.inf else f"{gbps:g} GB/s")


OFFLOAD = Dimension("offload", "offload memory per GPU (capacity @ bandwidth)", _offload, _offload_label)
"""Heatmaps only: capacity and bandwidth together, one column per variant."""

LINE_KINDS = {"size": "params", "gpus": "gpus", "offload": "offload_gib", "bandwidth": "offload_gbps"}
KINDS = (*LINE_KINDS, "heatmap", "summary", "breakdown")
HEATMAP_PAIRS = (("offload", "params"), ("offload_gib", "offload_gbps"), ("hbm_gib", "params"), ("gpus", "params"),
                 ("offload", "gpus"), ("nvlink_size", "gpus"))


def _dimension(dim: str) -> Dimension:
    return OFFLOAD if dim == "offload" else DIMENSIONS[dim]


def _value(record: dict, dim: str):
    return _dimension(dim).value(record)


def _mfu(record: dict) -> float | None:
    return ((record.get("best") or {}).get("mfu")) if record.get("status") in SOLVED else None


def varying(records: list[dict]) -> list[str]:
    """Dimensions with more than one value among the records. The model name ("shape")
    counts only when the parameter count does not already tell the models apart."""
    out = []
    for name in DIMENSIONS:
        values = {_key(_value(r, name)) for r in records}
        if len(values) > 1:
            out.append(name)
    if "params" in out and "shape" in out:
        out.remove("shape")
    return out


def _key(value):
    return (value is None, value if value is not None else 0)


def _group_key(parts: tuple[tuple[str, object], ...]) -> list:
    return [(name, _key(value) if not isinstance(value, str) else (False, 0, value)) for name, value in parts]


def available_kinds(records: list[dict]) -> list[str]:
    """The plot kinds these results can fill."""
    vary = varying(records)
    kinds = [kind for kind, dim in LINE_KINDS.items() if dim in vary and _lines(records, dim, vary)]
    if _heatmap_pair(vary, records):
        kinds.append("heatmap")
    if records:
        kinds.append("summary")
    if any((r.get("best") or {}).get("time") for r in records):
        kinds.append("breakdown")
    return kinds


def _lines(records: list[dict], axis: str, vary: list[str]) -> dict[tuple, list[dict]]:
    others = [d for d in vary if d != axis and not (axis == "params" and d == "shape")]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if _value(r, axis) is not None or axis == "offload_gbps":
            groups[tuple((d, _value(r, d)) for d in others)].append(r)
    return {k: v for k, v in groups.items() if len({_key(_value(r, axis)) for r in v}) > 1}


def _heatmap_pair(vary: list[str], records: list[dict]) -> tuple[str, str] | None:
    """The first pair of HEATMAP_PAIRS whose two dimensions vary ("offload" varies when its
    capacity or its bandwidth does) independently: a pair in which one value decides the
    other (no offload memory has no bandwidth) fills only a diagonal, which lines show better."""
    vary = set(vary) | ({"offload"} if {"offload_gib", "offload_gbps"} & set(vary) else set())

    def crossed(first: str, second: str) -> bool:
        pairs = {(_key(_value(r, first)), _key(_value(r, second))) for r in records}
        return len(pairs) > max(len({p[0] for p in pairs}), len({p[1] for p in pairs}))

    return next(((a, b) for a, b in HEATMAP_PAIRS if a in vary and b in vary and crossed(a, b)), None)


def _facets(records: list[dict], used: list[str], vary: list[str], lines: int) -> list[tuple[str, list[dict]]]:
    """Split records into files when one file would hold too many lines."""
    if lines <= MAX_LINES:
        return [("", records)]
    candidates = [d for d in vary if d not in used]
    if not candidates:
        return [("", records)]
    facet = min(candidates, key=lambda d: len({_key(_value(r, d)) for r in records}))
    values = sorted({_value(r, facet) for r in records}, key=_key)
    return [(f"--{facet}-{_slug(facet, v)}", [r for r in records if _value(r, facet) == v]) for v in values]


def _slug(dim: str, value) -> str:
    """A file-name part: 1e12 parameters -> '1T', 1024.0 -> '1024', inf -> 'unbounded'."""
    if dim == "params" and value is not None:
        return params_text(value)
    if dim == "offload_gbps":
        return _gbps_text(value)
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in text)


def plot_line(records: list[dict], kind: str, out_dir: Path) -> list[Path]:
    plt = pyplot()
    x = LINE_KINDS[kind]
    vary = varying(records)
    paths = []
    for suffix, part in _facets(records, [x], vary, len(_lines(records, x, vary)))[:MAX_FILES_PER_KIND]:
        part_vary = varying(part)
        lines = _lines(part, x, part_vary)
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(8, 5))
        all_x = sorted({_value(r, x) for rs in lines.values() for r in rs}, key=_key)
        categorical = x == "offload_gbps"
        position = {v: i for i, v in enumerate(all_x)} if categorical else None
        styles = itertools.cycle(zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], itertools.cycle("os^Dv<>p")))
        for (label_parts, rs), (color, marker) in zip(sorted(lines.items(), key=lambda kv: _group_key(kv[0])), styles):
            rs = sorted(rs, key=lambda r: _key(_value(r, x)))
            xs = [position[_value(r, x)] if categorical else _value(r, x) for r in rs]
            ys = [_mfu(r) for r in rs]
            label = legend_label(label_parts, rs[0])
            solved = [b is not None for b in ys]
            if any(solved):  # NaN where nothing was solved: the line breaks there
                ax.plot(xs, [100 * b if b is not None else math.nan for b in ys], marker=marker, color=color,
                        label=label, alpha=0.85)
            infeasible = [a for a, r in zip(xs, rs) if r.get("status") == "infeasible"]
            if infeasible:
                ax.plot(infeasible, [0] * len(infeasible), "x", color=color, markersize=9,
                        label=None if any(solved) else label)
        if categorical:
            ax.set_xticks(range(len(all_x)), [_gbps_text(v) for v in all_x])
        elif DIMENSIONS[x].log:
            ax.set_xscale("log", base=2 if x in ("gpus", "offload_gib", "nvlink_size") else 10)
            if x != "params":
                ax.set_xticks([v for v in all_x if v], [f"{v:g}" for v in all_x if v])
            else:                                          # 1T, 10T, 100T rather than 10^12
                ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: params_text(v)))
        ax.set_xlabel(DIMENSIONS[x].axis_label)
        ax.set_ylabel("MFU (%, causal attention halved)")
        ax.set_ylim(*_mfu_axis([_mfu(r) for rs in lines.values() for r in rs]))
        ax.grid(True, alpha=0.3)
        fixed = _fixed_text(part, part_vary)
        errors = sum(r.get("status") == "error" for r in part)
        ax.set_title(f"MFU vs {DIMENSIONS[x].axis_label.split(' (')[0]}" + (f"\n{fixed}" if fixed else "")
                     + (f" ({errors} errors not shown)" if errors else ""), fontsize=10)
        ax.legend(fontsize=8, title="× = no feasible mapping", title_fontsize=8)
        paths.append(save(fig, out_dir / f"mfu-vs-{kind}{suffix}.png"))
    return paths


def _mfu_axis(mfus: list[float | None]) -> tuple[float, float]:
    """MFU axis (%) fitted to the data with a margin; down to just below 0 when some points
    have no feasible mapping (drawn as × at 0)."""
    values = [100 * m for m in mfus if m is not None]
    if not values:
        return -3.0, 100.0
    low, high = min(values), max(values)
    margin = max(2.0, 0.1 * (high - low))
    bottom = -3.0 if any(m is None for m in mfus) else max(0.0, low - margin)
    return bottom, min(100.0, high + margin)


def legend_label(parts: tuple[tuple[str, object], ...], record: dict | None = None) -> str:
    """Legend text for a line; offload capacity and bandwidth read as one phrase, and a model
    size names its model (two shapes can have nearly the same size)."""
    values = dict(parts)
    texts = []
    for name, value in parts:
        if name == "offload_gbps" and "offload_gib" in values:
            continue
        if name == "offload_gib" and value and "offload_gbps" in values:
            gbps = values["offload_gbps"]
            texts.append(f"offload {value:g} GiB @ " + ("unbounded bandwidth" if gbps == math.inf else f"{gbps:g} GB/s"))
            continue
        if name == "params" and record is not None:
            texts.append(_model_text(record))
            continue
        texts.append(DIMENSIONS[name].label(value))
    return ", ".join(texts) or "all"


def _model_text(record: dict) -> str:
    return f"{_value(record, 'shape')} ({params_text(_value(record, 'params'))})"


def _fixed_text(records: list[dict], vary: list[str]) -> str:
    if not records:
        return ""
    first = records[0]
    parts = []
    for name in ("shape", "system", "gpus", "datatype", "attention", "hbm_gib", "offload_gbps", "nvlink_size"):
        if name not in vary and (name != "shape" or "params" not in vary):
            value = _value(first, name)
            if value is not None or name == "offload_gbps" and "offload_gib" in vary:
                parts.append(DIMENSIONS[name].label(value))
    return ", ".join(parts)


def plot_heatmap(records: list[dict], out_dir: Path) -> list[Path]:
    plt = pyplot()
    vary = varying(records)
    pair = _heatmap_pair(vary, records)
    if pair is None:
        return []
    x, y = pair
    covered = {x, y, "shape"} | ({"offload_gib", "offload_gbps"} if "offload" in (x, y) else set())
    rest = [d for d in vary if d not in covered]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[tuple((d, _value(r, d)) for d in rest)].append(r)
    paths = []
    drawable = {k: v for k, v in groups.items() if any(r.get("status") != "error" for r in v)}
    for facet, rs in sorted(drawable.items(), key=lambda kv: _group_key(kv[0]))[:MAX_FILES_PER_KIND]:
        xs = sorted({_value(r, x) for r in rs}, key=_key)
        ys = sorted({_value(r, y) for r in rs}, key=_key)
        grid = np.full((len(ys), len(xs)), np.nan)
        text = [["" for _ in xs] for _ in ys]
        for r in rs:
            i, j = ys.index(_value(r, y)), xs.index(_value(r, x))
            mfu = _mfu(r)
            if mfu is not None:
                grid[i, j] = 100 * mfu
                text[i][j] = f"{100 * mfu:.0f}"
            else:
                text[i][j] = {"infeasible": "×", "error": "err"}.get(r.get("status"), r.get("status", "")[:4])
        fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 3, 0.45 * len(ys) + 2.5))
        cmap = plt.get_cmap("viridis").with_extremes(bad="#e8e8e8")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=max(80, np.nanmax(grid) if np.isfinite(grid).any() else 80),
                          aspect="auto", origin="lower")
        for i, j in itertools.product(range(len(ys)), range(len(xs))):
            value = grid[i, j]
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8,
                    color="white" if np.isfinite(value) and value < 45 else "black")
        ax.set_xticks(range(len(xs)), [_tick(x, v) for v in xs],
                      rotation=30, ha="right", fontsize=8)
        names = {_value(r, "params"): _model_text(r) for r in rs}
        ax.set_yticks(range(len(ys)), [names[v] if y == "params" else _tick(y, v) for v in ys], fontsize=8)
        ax.set_xlabel(_dimension(x).axis_label)
        ax.set_ylabel(_dimension(y).axis_label)
        fig.colorbar(image, ax=ax, label="MFU (%, causal attention halved)")
        title = ", ".join(filter(None, [legend_label(facet) if facet else "", _fixed_text(rs, vary)]))
        ax.set_title(f"MFU (%), × = no feasible mapping\n{title}", fontsize=10)
        suffix = "".join(f"--{d}-{_slug(d, v)}" for d, v in facet)
        paths.append(save(fig, out_dir / f"heatmap-{x}-by-{y}{suffix}.png"))
    return paths


def _tick(dim: str, value) -> str:
    return _dimension(dim).label(value) if value is not None or dim == "offload_gbps" else "none"


def plot_summary(records: list[dict], out_dir: Path, limit: int = 60) -> list[Path]:
    """One horizontal bar per problem: MFU, beside it the step time and tokens/s per GPU (what
    MFU hides across GPUs: a faster GPU at the same MFU trains faster), and the mapping count."""
    plt = pyplot()
    rs = records[:limit]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rs) + 1.5))
    ys = range(len(rs))
    values = [100 * (_mfu(r) or 0) for r in rs]
    ax.barh(list(ys), values, color=["tab:blue" if _mfu(r) is not None else "lightgray" for r in rs])
    for i, r in enumerate(rs):
        note = f"{values[i]:.1f}%" if _mfu(r) is not None else r.get("status", "")
        if _mfu(r) is not None and tokens_per_s_per_gpu(r) is not None:
            note += (f", step {r['best']['iteration_time_s']:.3g} s, {tokens_per_s_per_gpu(r):,.0f} tokens/s/GPU, "
                     f"{gpu_hours_per_million_tokens(r):.3g} GPU-h per 1M tokens")
        if r.get("mappings"):
            note += f"  ({r['mappings']:,} mappings)"
        ax.text(values[i] + 0.5, i, note, va="center", fontsize=8)
    ax.set_yticks(list(ys), [r["id"] for r in rs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("MFU (%)")
    ax.set_xlim(0, max(100, max(values, default=0) + 25))
    more = f" (first {limit} of {len(records)})" if len(records) > limit else ""
    ax.set_title(f"MFU per problem, with step time and tokens/s per GPU{more}", fontsize=10)
    return [save(fig, out_dir / "summary.png")]


def make_plots(records: list[dict], out_dir: str | Path, kinds: list[str] | None = None) -> list[Path]:
    """Draw the requested kinds (default: every kind the results can fill) into `out_dir`."""
    if not records:
        raise InputError("no results to plot")
    available = available_kinds(records)
    for kind in kinds or []:
        if kind not in available:
            raise InputError(f"--kind {kind}: these results cannot fill it (available: {', '.join(available)})")
    out_dir = ensure_directory(out_dir, "--out")
    paths = []
    for kind in kinds or available:
        if kind in LINE_KINDS:
            paths += plot_line(records, kind, out_dir)
        elif kind == "heatmap":
            paths += plot_heatmap(records, out_dir)
        elif kind == "breakdown":
            paths += plot_breakdown(records, out_dir)
        else:
            paths += plot_summary(records, out_dir)
    return paths
