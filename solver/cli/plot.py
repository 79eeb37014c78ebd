"""`mapsat plot`: PNG plots of a batch's results."""

from __future__ import annotations

import warnings
from pathlib import Path

import click

from costmodel.errors import InputError
from solver.cli.options import quiet_option, user_errors, warn
from solver.report.plots import KINDS, make_plots
from solver.study.store import RESULTS_JSONL, read_results


@click.command(name="plot")
@click.argument("results_dir", type=click.Path(file_okay=False))
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Plot kind, repeatable (default: every kind the results can fill): size, gpus, offload, "
                   "bandwidth = MFU against that; heatmap = MFU over two of them; summary = a bar per problem; breakdown = each problem's best mapping and where its time goes.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for the PNG files (default: RESULTS_DIR/plots).")
@quiet_option
@user_errors
def command(results_dir: str, kinds: tuple[str, ...], out_dir: str | None) -> None:
    """Draw PNG plots from the results of `mapsat batch` (RESULTS_DIR/results.jsonl).

    MFU against model size, GPU count, offload capacity and offload bandwidth, heatmaps
    over two of those, and one bar per problem; the kinds are chosen from what varies in
    the results. Infeasible problems show as × at 0 %. Works while a batch is still
    running (it reads the finished lines).

    \b
    Example:
      mapsat batch problems/paper/fig4-offload.yaml --out runs/fig4
      mapsat plot runs/fig4 --kind size --kind heatmap
    """
    dropped: list[int] = []
    records = read_results(results_dir, dropped)
    path = Path(results_dir) / RESULTS_JSONL
    if dropped:
        shown = ", ".join(map(str, dropped[:5])) + (", …" if len(dropped) > 5 else "")
        warn(f"{path}: skipped {len(dropped)} line(s) that are not result records (line {shown})")
    if not records:
        raise InputError(f"{path}: no results to plot (the file holds no complete record yet)")
    with warnings.catch_warnings():  # matplotlib's notes (a missing glyph, an empty legend) are not the user's
        warnings.simplefilter("ignore", UserWarning)
        paths = make_plots(records, out_dir or Path(results_dir) / "plots", list(kinds) or None)
    for path in paths:
        click.echo(str(path))
